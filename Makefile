# The two commands of the README: `make demo` and `make test`. Both set up
# everything on a fresh Debian machine with Python 3.11: the virtual
# environment, the pinned dependencies, and the Debian package with the
# real Fashion-MNIST data.

PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
BACKENDS ?= tensorflow jax torch
PYTEST_ARGS ?=
FASHION_MNIST := /usr/share/datasets/fashion-mnist/train-images-idx3-ubyte.gz
SUDO := $(shell [ "$$(id -u)" = 0 ] || echo sudo)
# The machine's local CPU wheel of torch, where there is one.
FIND_LINKS := $(if $(wildcard /opt/wheels),--find-links /opt/wheels)

.PHONY: demo test setup clean

demo: setup
	$(BIN)/keras-vit demo

# Runs the whole suite once per backend, then fails if any backend failed.
test: setup
	@failed=""; \
	for backend in $(BACKENDS); do \
	  echo "=== pytest with KERAS_BACKEND=$$backend"; \
	  KERAS_BACKEND=$$backend $(BIN)/python -m pytest $(PYTEST_ARGS) || failed="$$failed $$backend"; \
	done; \
	if [ -n "$$failed" ]; then echo "FAILED on:$$failed"; exit 1; fi; \
	echo "all backends passed: $(BACKENDS)"

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
