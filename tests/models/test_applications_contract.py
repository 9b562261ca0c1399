"""keras.applications' contract for a builder, on every backend and both data formats.

Written from the expectations of `keras/src/applications/applications_test.py`
(the keras wheel), on `ViTTi16`, the smallest published builder. What a ViT
must do differently is adapted, and each adaptation says why:

- `pooling=None` with `include_top=False` outputs the tokens `(batch, tokens,
  width)`, where a CNN outputs its last feature map `(batch, height, width,
  channels)`: a ViT's last block has no image grid of channels to lay out, so
  the output is the same in both data formats. The builders default to their
  checkpoint's pooling (the class token), so the unpooled output is asked for
  by name.
- A side that is not a multiple of the patch size (Keras' test uses 123 and
  100) needs `pad_to_patches=True`: a ViT tiles the image with patches, where
  a CNN's convolutions pad as they go; unasked, the builder refuses the size.
- Keras' test with `weights="imagenet"` downloads the weights and an image;
  offline, its serialization half is kept (the weights are
  tests/weights/test_checkpoints.py's).
"""

import keras
import numpy as np
import pytest

import keras_vit
from tests.conftest import BACKEND, on_one_backend, randomize_weights

WIDTH = 192  # ViT-Ti/16's: Keras' `last_dim`
DATA_FORMATS = ("channels_first", "channels_last")


def shapes_only():
    """Builds models whose shapes alone are checked, their weights left uninitialised.

    (On JAX each new weight shape's random initialiser is a compilation.)
    """
    return keras.StatelessScope(initialize_variables=False)


@pytest.fixture(params=DATA_FORMATS)
def data_format(request):
    original = keras.config.image_data_format()
    keras.config.set_image_data_format(request.param)
    yield request.param
    keras.config.set_image_data_format(original)


def image_shape(data_format, height, width, channels):
    if data_format == "channels_first":
        return (channels, height, width)
    return (height, width, channels)


def test_notop_variable_input_channels(data_format):
    with shapes_only():
        for channels in (1, 4):
            model = keras_vit.ViTTi16(
                weights=None,
                include_top=False,
                input_shape=image_shape(data_format, None, None, channels),
                pooling=None,  # (the tokens: see the module's docstring)
            )
            assert list(model.outputs[0].shape) == [None, None, WIDTH]


def test_notop_custom_input_shape(data_format):
    with shapes_only():
        shape = image_shape(data_format, 123, 123, 3)
        model = keras_vit.ViTTi16(
            weights=None, include_top=False, input_shape=shape, pad_to_patches=True
        )
        last_dim_axis = 1 if data_format == "channels_first" else -1
        assert list(model.outputs[0].shape)[last_dim_axis] == WIDTH
        # 123 px: 8x8 patches of 16 px, the last row and column padded with zeros.
        assert model.get_layer("position_embedding").grid_size == (8, 8)
        with pytest.raises(ValueError, match="image height 123 is not divisible by patch size 16"):
            keras_vit.ViTTi16(weights=None, include_top=False, input_shape=shape)


def test_notop_custom_input_tensor(data_format):
    with shapes_only():
        inputs = keras.Input(shape=image_shape(data_format, 200, 200, 4), name="custom_input")
        inputs = keras.layers.Conv2D(3, (2, 2), padding="valid", strides=(2, 2))(inputs)
        model = keras_vit.ViTTi16(
            weights=None, include_top=False, input_tensor=inputs, pad_to_patches=True
        )
        last_dim_axis = 1 if data_format == "channels_first" else -1
        assert list(model.outputs[0].shape)[last_dim_axis] == WIDTH
        assert model.inputs[0].shape[1:] == image_shape(data_format, 200, 200, 4)


@pytest.mark.parametrize("pooling", ["max", "avg"])
def test_pooling(data_format, pooling):
    with shapes_only():
        model = keras_vit.ViTTi16(weights=None, include_top=False, pooling=pooling)
        assert list(model.outputs[0].shape) == [None, WIDTH]
        assert model.inputs[0].shape[1:] == image_shape(data_format, 224, 224, 3)


def test_classifier_activation():
    with shapes_only():
        model = keras_vit.ViTTi16(weights=None, include_top=True, classifier_activation="softmax")
        assert model.layers[-1].activation.__name__ == "softmax"


def test_base_serializes_and_deserializes(data_format):
    model = keras_vit.ViTTi16(weights=None, input_shape=image_shape(data_format, 32, 32, 3))
    config = keras.saving.serialize_keras_object(model)
    reconstructed = keras.saving.deserialize_keras_object(config)
    assert len(model.weights) == len(reconstructed.weights)
    assert reconstructed.get_config()["data_format"] == data_format


# Beyond Keras' test: the data format is the input's layout, nothing else.


def outputs(model, images):
    return keras.ops.convert_to_numpy(model(images, training=False))  # eager: no compilation


def tiny(**kwargs):
    return keras_vit.ViT(
        patch_size=4, hidden_dim=16, num_layers=1, num_heads=2, mlp_dim=32, classes=3, **kwargs
    )


def test_a_channels_first_model_computes_the_channels_last_ones_function(tmp_path):
    rng = np.random.default_rng(0)
    images = rng.uniform(0, 255, (2, 14, 10, 3)).astype("float32")  # 14x10: padded to 4x3 patches
    last = tiny(input_shape=(14, 10, 3), data_format="channels_last", pad_to_patches=True)
    randomize_weights(last)
    first = tiny(input_shape=(3, 14, 10), data_format="channels_first", pad_to_patches=True)
    assert [w.path for w in first.weights] == [w.path for w in last.weights]
    first.set_weights(last.get_weights())
    expected = outputs(last, images)
    np.testing.assert_allclose(outputs(first, images.transpose(0, 3, 1, 2)), expected, atol=1e-6)
    # A checkpoint loads the same weights into either layout.
    last.save(tmp_path / "last.keras")
    loaded = keras_vit.from_checkpoint(tmp_path / "last.keras", data_format="channels_first")
    assert loaded.input_shape == (None, 3, 14, 10)
    np.testing.assert_allclose(outputs(loaded, images.transpose(0, 3, 1, 2)), expected, atol=1e-6)
    # Padding is zeros after the normalisation: the same as padding the input
    # with the pixel value that normalises to zero, then no padding.
    grey = np.full((2, 16, 12, 3), 127.5, "float32")
    grey[:, :14, :10] = images
    exact = tiny(input_shape=(16, 12, 3))
    exact.set_weights(last.get_weights())
    np.testing.assert_allclose(outputs(exact, grey), expected, atol=1e-6)


def test_a_model_of_any_size_pads_each_batch_to_whole_patches():
    model = tiny(input_shape=(None, None, 3), pad_to_patches=True)
    randomize_weights(model)
    images = np.random.default_rng(1).uniform(0, 255, (1, 13, 7, 3)).astype("float32")
    grey = np.full((1, 16, 8, 3), 127.5, "float32")
    grey[:, :13, :7] = images
    np.testing.assert_allclose(outputs(model, images), outputs(model, grey), atol=1e-6)


def test_a_bad_data_format_is_named():
    with pytest.raises(ValueError, match="data_format='NHWC'"):
        tiny(input_shape=(8, 8, 3), data_format="NHWC")


def channels_first_model():
    model = tiny(input_shape=(3, 8, 8), data_format="channels_first", approximate_gelu=False)
    randomize_weights(model)
    images = np.random.default_rng(2).uniform(0, 255, (4, 8, 8, 3)).astype("float32")
    return model, images


@on_one_backend("tensorflow", "TensorFlow converts every backend's model")
@pytest.mark.slow
def test_a_channels_first_model_converts_to_litert_taking_channels_last_images(tmp_path):
    model, images = channels_first_model()
    written = keras_vit.export.tflite(model, tmp_path / "model.tflite")
    report = keras_vit.export.check_tflite(written["path"], model, images, latency_runs=1)
    assert report["top1_agreement"] == 1.0 and report["max_abs_error"] < 1e-5


# Every exporter puts the same Keras transpose before the model (and each
# backend's export path is tests/export's, for every model): the other two
# formats here on one backend, JAX's, whose path (jax2tf) has the most steps.
@pytest.mark.slow
@pytest.mark.skipif(BACKEND != "jax", reason="the JAX suite checks these formats")
def test_onnx_and_saved_model_exports_of_a_channels_first_model_take_channels_last_images(
    tmp_path,
):
    model, images = channels_first_model()
    written = keras_vit.export.onnx(model, tmp_path / "model.onnx")
    report = keras_vit.export.check_onnx(written["path"], model, images, latency_runs=1)
    assert report["input"]["shape"] == [-1, 8, 8, 3]
    assert report["top1_agreement"] == 1.0 and report["max_abs_error"] < 1e-5
    version = keras_vit.export.saved_model(model, tmp_path / "serving", version=1, warmup=False)
    report = keras_vit.export.check_saved_model(version, model, images)
    assert "images: float32 (-1, 8, 8, 3)" in report["signatures"]
    assert report["serving_default"]["top1_agreement"] == 1.0
