# The two commands of the README: `make demo` and `make test`. Both set up
# everything on a fresh Debian machine with Python 3.11: the virtual
# environment, the pinned dependencies, and the Debian package with the
# real Fashion-MNIST data.

PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
BACKENDS ?= tensorflow jax torch
PYTEST_ARGS ?=
PARALLEL ?= 1
FASHION_MNIST := /usr/share/datasets/fashion-mnist/train-images-idx3-ubyte.gz
SUDO := $(shell [ "$$(id -u)" = 0 ] || echo sudo)
# The machine's local CPU wheel of torch, where there is one.
FIND_LINKS := $(if $(wildcard /opt/wheels),--find-links /opt/wheels)

.PHONY: demo test test-keras setup clean

demo: setup
	$(BIN)/keras-vit demo

# Runs the whole suite once per backend, the backends side by side (much of
# a test's time is single-threaded: start-up, Python, small models, so two
# cores serve three suites in about half the time of one after another;
# PARALLEL=0 runs them in turn, with live output), prints each backend's
# log, then fails if any backend failed.
test: setup
	@mkdir -p .test-logs; rm -f .test-logs/*.rc .test-logs/*.log; \
	for backend in $(BACKENDS); do \
	  if [ "$(PARALLEL)" = 0 ]; then \
	    echo "=== pytest with KERAS_BACKEND=$$backend"; \
	    KERAS_BACKEND=$$backend $(BIN)/python -m pytest $(PYTEST_ARGS); echo $$? > .test-logs/$$backend.rc; \
	  else \
	    ( KERAS_BACKEND=$$backend $(BIN)/python -m pytest $(PYTEST_ARGS) > .test-logs/$$backend.log 2>&1; \
	      echo $$? > .test-logs/$$backend.rc; echo "=== $$backend finished: exit $$(cat .test-logs/$$backend.rc)" ) & \
	  fi; \
	done; \
	wait; \
	failed=""; \
	for backend in $(BACKENDS); do \
	  if [ "$(PARALLEL)" != 0 ]; then echo "=== pytest with KERAS_BACKEND=$$backend"; cat .test-logs/$$backend.log; fi; \
	  [ "$$(cat .test-logs/$$backend.rc)" = 0 ] || failed="$$failed $$backend"; \
	done; \
	if [ -n "$$failed" ]; then echo "FAILED on:$$failed"; exit 1; fi; \
	echo "all backends passed: $(BACKENDS)"

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

$(VENV)/.installed: pyproject.toml requirements.lock
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q $(FIND_LINKS) -r requirements.lock
	$(BIN)/python -m pip install -q --no-deps -e .
	touch $@

$(FASHION_MNIST):
	$(SUDO) apt-get update -qq
	$(SUDO) apt-get install -y -qq dataset-fashion-mnist

clean:
	rm -rf $(VENV) build *.egg-info
