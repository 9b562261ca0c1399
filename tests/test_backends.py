"""The same weights give the same outputs on TensorFlow, JAX and torch."""

import os

import numpy as np
import pytest

import keras_vit
from tests.conftest import BACKEND, INSTALLED_BACKENDS, TINY, randomize_weights, run_python

# Each check loads the weights on another backend, in a fresh interpreter.
pytestmark = pytest.mark.slow

# Two configurations that between them use every option of the blocks.
CONFIGS = {
    "paper": dict(TINY, classifier_activation=None),
    "variants": dict(
        TINY,
        classifier_activation=None,
        approximate_gelu=False,
        layer_scale_init=0.5,
        pooling="gap",
        representation_size=16,
        position_embedding="sincos2d",
    ),
}


def next_backend():
    """The installed backend after this one, in a cycle (tensorflow, jax, torch).

    Each suite saves on its backend and loads on the next one: over the
    three suites every backend's weights load elsewhere and every backend's
    outputs are compared with two others' (one process each, not two).
    """
    others = INSTALLED_BACKENDS[INSTALLED_BACKENDS.index(BACKEND) + 1 :] + INSTALLED_BACKENDS
    return next((b for b in others if b != BACKEND), None)


@pytest.mark.skipif(next_backend() is None, reason="one backend installed")
def test_weights_saved_here_give_the_same_outputs_on_another_backend(tmp_path, images):
    other = next_backend()
    expected = {}
    for name, config in CONFIGS.items():
        model = randomize_weights(keras_vit.ViT(**config), seed=1)
        model.save_weights(os.path.join(tmp_path, f"{name}.weights.h5"))
        expected[name] = model.predict(images, verbose=0)
        assert np.abs(expected[name]).max() > 0.1  # not trivially zero
    np.save(os.path.join(tmp_path, "images.npy"), images)
    run_python(
        f"""
        import os, numpy as np, keras_vit
        from tests.test_backends import CONFIGS
        images = np.load(os.path.join({str(tmp_path)!r}, "images.npy"))
        for name, config in CONFIGS.items():
            model = keras_vit.ViT(**config)
            model.load_weights(os.path.join({str(tmp_path)!r}, name + ".weights.h5"))
            np.save(os.path.join({str(tmp_path)!r}, name + ".npy"),
                    model.predict(images, verbose=0))
        """,
        backend=other,
    )
    for name in CONFIGS:
        got = np.load(os.path.join(tmp_path, f"{name}.npy"))
        np.testing.assert_allclose(got, expected[name], rtol=1e-5, atol=1e-5, err_msg=name)
