"""Shared fixtures. The suite runs once per backend (KERAS_BACKEND)."""

import importlib.util
import json
import os
import subprocess
import sys
import textwrap

import keras
import numpy as np
import pytest

BACKEND = keras.backend.backend()
ALL_BACKENDS = ("tensorflow", "jax", "torch")
INSTALLED_BACKENDS = tuple(
    b for b in ALL_BACKENDS if importlib.util.find_spec(b) is not None
)

# A ViT small enough to build and run in milliseconds.
TINY = dict(
    patch_size=4,
    hidden_dim=32,
    num_layers=2,
    num_heads=4,
    mlp_dim=64,
    input_shape=(16, 16, 3),
    classes=5,
)


@pytest.fixture(autouse=True)
def _reset_keras_state():
    """Each test starts with float32, a fixed seed and a clean session."""
    keras.config.set_dtype_policy("float32")
    keras.utils.set_random_seed(1234)
    yield
    keras.config.set_dtype_policy("float32")
    keras.backend.clear_session()


@pytest.fixture
def images():
    """A small batch of 0..255 float images of TINY's input shape."""
    return np.random.default_rng(0).uniform(0, 255, (4, 16, 16, 3)).astype("float32")


def randomize_weights(model, seed=0, scale=0.2):
    """Sets every weight to random values, so no output is trivially zero."""
    rng = np.random.default_rng(seed)
    model.set_weights(
        [rng.normal(0, scale, w.shape).astype("float32") for w in model.get_weights()]
    )
    return model


def run_python(code, backend=BACKEND, timeout=300):
    """Runs `code` in a fresh interpreter under `backend`; returns stdout."""
    env = dict(os.environ, KERAS_BACKEND=backend, TF_CPP_MIN_LOG_LEVEL="3")
    result = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)],
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
    )
    if result.returncode:
        raise AssertionError(
            f"subprocess under {backend} failed ({result.returncode}):\n"
            f"{result.stderr[-4000:]}"
        )
    return result.stdout


def last_json_line(stdout):
    return json.loads(stdout.strip().splitlines()[-1])
