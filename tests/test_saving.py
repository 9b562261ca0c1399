"""`.keras` files round-trip, in a fresh process that only imports keras_vit."""

import json
import os

import keras
import numpy as np
import pytest

import keras_vit
from tests.conftest import TINY, randomize_weights, run_python


@pytest.mark.slow
def test_keras_file_round_trips_in_a_fresh_process(tmp_path, images):
    model = randomize_weights(
        keras_vit.VisionTransformer(**TINY, drop_path_rate=0.1, dropout_rate=0.1)
    )
    path = os.path.join(tmp_path, "vit.keras")
    model.save(path)
    np.save(os.path.join(tmp_path, "images.npy"), images)
    run_python(
        f"""
        import os, keras, numpy as np
        import keras_vit  # registers the layers; nothing else is needed
        model = keras.saving.load_model({path!r})
        images = np.load(os.path.join({str(tmp_path)!r}, "images.npy"))
        np.save(os.path.join({str(tmp_path)!r}, "out.npy"), model.predict(images, verbose=0))
        """
    )
    expected = model.predict(images, verbose=0)
    np.testing.assert_array_equal(np.load(os.path.join(tmp_path, "out.npy")), expected)


def test_loaded_model_keeps_its_architecture(tmp_path):
    model = keras_vit.VisionTransformer(**TINY, layer_scale_init=1e-4, approximate_gelu=False)
    path = os.path.join(tmp_path, "vit.keras")
    model.save(path)
    loaded = keras.saving.load_model(path)
    # Equal up to JSON's tuple -> list, which Keras' own build_config undergoes.
    assert json.dumps(loaded.get_config()) == json.dumps(model.get_config())
    block = loaded.get_layer("encoderblock_1")
    assert isinstance(block, keras_vit.layers.TransformerBlock)
    assert block.layer_scale_init == 1e-4 and block.approximate_gelu is False


def test_from_checkpoint_rebuilds_a_keras_file_at_another_size_and_class_count(tmp_path, images):
    from keras_vit.weights import from_checkpoint

    model = randomize_weights(keras_vit.VisionTransformer(
        **{**TINY, "patch_size": 1}, stem_filters=(4, 8), stem_strides=(1, 2),
        pooling="gap", class_token=False, normalization=((0.3, 0.4, 0.5), (0.2, 0.25, 0.3)),
        approximate_gelu=False,
    ))
    for weight in model.weights:  # BatchNorm variances must stay positive
        if weight.path.endswith("moving_variance"):
            weight.assign(keras.ops.abs(weight) + 0.5)
    path = os.path.join(tmp_path, "vit.keras")
    model.save(path)
    same = from_checkpoint(path)
    np.testing.assert_allclose(
        same.predict(images, verbose=0), model.predict(images, verbose=0), atol=1e-6
    )
    bigger = from_checkpoint(path, input_shape=(24, 24, 3), classes=3)
    assert bigger.get_layer("position_embedding").grid_size == (12, 12)
    assert bigger.output_shape == (None, 3)
    assert bigger.get_layer("encoderblock_0").approximate_gelu is False
    np.testing.assert_array_equal(
        keras.ops.convert_to_numpy(bigger.get_layer("stem").weights[0]),
        keras.ops.convert_to_numpy(model.get_layer("stem").weights[0]),
    )
