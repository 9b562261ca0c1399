"""A ViT with its residual stream rotated: the same function, the outlier channel spread out."""

import json
import re

import keras
import numpy as np
import pytest

import keras_vit
from keras_vit.models.rotation import rotated_copy, unrotatable_weights
from tests.conftest import BACKEND, TINY, randomize_weights

# Every layout the rewrite knows, as pretrained files bring them.
LAYOUTS = {
    "exact GELU, LayerScale, registers, distillation token": dict(
        approximate_gelu=False, layer_scale_init=0.1, num_register_tokens=2, distillation_token=True
    ),
    "average pooling, no LayerScale": dict(pooling="gap"),
    "heads of 12 channels (no Hadamard matrix)": dict(hidden_dim=24, num_heads=2),
    "SigLIP's: no class token, a MAP head": dict(pooling="map", class_token=False),
}


def with_outlier_channel(model, channel=3, size=10.0):
    """`model` (random weights) whose residual stream carries one large channel, as real ones do."""
    randomize_weights(model, scale=0.5)
    table = model.get_layer("position_embedding").embeddings
    values = np.array(keras.ops.convert_to_numpy(table))
    values[..., channel] += size
    table.assign(values)
    return model


def channel_imbalance(model, images):
    """The largest channel's RMS over the median channel's, in the stream the first block reads."""
    stream = keras.Model(model.input, model.get_layer("encoderblock_0").input)
    values = keras.ops.convert_to_numpy(stream(images))
    rms = np.sqrt(np.mean(values.reshape(-1, values.shape[-1]) ** 2, axis=0))
    return rms.max() / np.median(rms)


@pytest.mark.parametrize("layout", list(LAYOUTS))
def test_a_rotated_copy_computes_the_same_outputs_without_the_outlier_channel(layout):
    model = with_outlier_channel(
        keras_vit.ViT(**{**TINY, "classifier_activation": None, **LAYOUTS[layout]})
    )
    images = np.random.default_rng(1).uniform(0, 255, (4, 16, 16, 3)).astype("float32")
    expected = keras.ops.convert_to_numpy(model(images))
    weights = [np.array(w) for w in model.get_weights()]

    rotated = rotated_copy(model)

    served = keras.ops.convert_to_numpy(rotated(images))
    # Far closer than the images' outputs are to each other.
    differences = np.ptp(expected, axis=0).max()
    assert np.abs(served - expected).max() < differences / 100, differences
    for before, after in zip(weights, model.get_weights()):
        np.testing.assert_array_equal(after, before)  # the original is left alone
    assert channel_imbalance(rotated, images) < channel_imbalance(model, images) / 2
    folded = {w.path: keras.ops.convert_to_numpy(w) for w in rotated.weights}
    np.testing.assert_array_equal(folded["encoderblock_1/mlp_norm/gamma"], 1.0)
    np.testing.assert_array_equal(folded["encoder_norm/beta"], 0.0)


def test_layouts_outside_the_rewrite_are_named_and_refused():
    for options, named, argument in (
        (dict(stem_filters=(8,), patch_size=2), "stem", "stem_filters=(8,)"),
        (dict(include_top=False, pooling="token"), "no head/kernel", "include_top=False"),
    ):
        model = keras_vit.ViT(**{**TINY, **options})
        assert any(named in path for path in unrotatable_weights(model)), options
        with pytest.raises(ValueError, match=re.escape(argument)):
            rotated_copy(model)
    assert unrotatable_weights(keras_vit.ViT(**TINY)) == []
    # Every weight in place, but a function that a rotation would change (a
    # max over features) or a head that reads the stream twice: refused too.
    for pooling in ("max", "token_gap"):
        with pytest.raises(ValueError, match=f"pooling='{pooling}' is outside it"):
            rotated_copy(keras_vit.ViT(**TINY, pooling=pooling))


@pytest.mark.slow
@pytest.mark.skipif(BACKEND != "tensorflow", reason="the conversion runs on TensorFlow")
def test_int8_tflite_of_a_model_with_an_outlier_channel_is_closer_to_keras_rotated(tmp_path):
    model = with_outlier_channel(
        keras_vit.ViT(**{**TINY, "classifier_activation": None, "layer_scale_init": 0.1}),
        size=60.0,
    )
    rng = np.random.default_rng(2)
    calibration = rng.uniform(0, 255, (64, 16, 16, 3)).astype("float32")
    images = rng.uniform(0, 255, (32, 16, 16, 3)).astype("float32")
    errors = {}
    for rotate in (False, True):
        path = str(tmp_path / f"rotate_{rotate}.tflite")
        result = keras_vit.export.tflite(
            model, path, quantization="int8", representative_data=calibration, rotate=rotate
        )
        assert result["rotated"] is rotate
        assert json.load(open(tmp_path / f"rotate_{rotate}.tflite.json"))["rotated"] is rotate
        report = keras_vit.export.check_tflite(path, model, images, latency_runs=1)
        errors[rotate] = report["max_abs_error"]
    assert errors[True] < 0.7 * errors[False], errors
    with pytest.raises(TypeError, match="rotate='yes'"):
        keras_vit.export.tflite(model, tmp_path / "x.tflite", rotate="yes")


@pytest.mark.skipif(BACKEND != "tensorflow", reason="the conversion runs on TensorFlow")
def test_a_rotated_copy_that_changes_the_answers_is_not_quantised(tmp_path, monkeypatch):
    from keras_vit.models import rotation

    model = with_outlier_channel(keras_vit.ViT(**{**TINY, "classifier_activation": None}))

    def off_by_one(model, seed=0):
        copy = rotated_copy(model, seed)
        head = copy.get_layer("head")
        head.bias.assign(keras.ops.convert_to_numpy(head.bias) + 1.0)
        return copy

    monkeypatch.setattr(rotation, "rotated_copy", off_by_one)
    calibration = np.random.default_rng(3).uniform(0, 255, (8, 16, 16, 3)).astype("float32")
    with pytest.warns(UserWarning, match=r"differs from it by 1 on the calibration images"):
        result = keras_vit.export.tflite(
            model, tmp_path / "vit.tflite", quantization="int8", representative_data=calibration
        )
    assert result["rotated"] is False
    report = keras_vit.export.check_tflite(tmp_path / "vit.tflite", model, calibration)
    assert report["max_abs_error"] < 0.5  # the model's own answers, not the shifted ones
