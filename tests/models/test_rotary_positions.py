"""Models of rotary positions (DINOv3's RoPE): no table, any grid, each tool or a clear error."""

import keras
import numpy as np
import pytest
from keras import ops

import keras_vit
from keras_vit.layers.rotary_position_embedding import rotate
from tests.conftest import TINY, on_one_backend

# Features (a classifier's head starts at zero: its outputs would not tell).
ROPE = {
    **TINY,
    "position_embedding": "rope",
    "num_register_tokens": 2,
    "layer_scale_init": 0.5,
    "include_top": False,
}


def rope_model(size=16, **kwargs):
    keras.utils.set_random_seed(0)
    return keras_vit.ViT(**{**ROPE, "input_shape": (size, size, 3), **kwargs})


def images(size, count=2, seed=0):
    return np.random.default_rng(seed).uniform(0, 255, (count, size, size, 3)).astype("float32")


def test_a_rotary_model_has_no_table_and_takes_any_grid_with_the_same_weights():
    model = rope_model()
    names = [layer.name for layer in model.layers]
    assert "position_embedding" not in names and "rotary_embedding" in names
    rotary = model.get_layer("rotary_embedding")
    assert (rotary.num_prefix_tokens, rotary.base) == (3, 100.0)  # class token and registers
    # One model of any size computes what fixed-size models of its weights do,
    # at 16 and 24 px (and non-square grids), with nothing resampled.
    any_size = rope_model(size=None)
    any_size.set_weights(model.get_weights())
    for height, width in ((16, 16), (24, 24), (16, 24)):
        fixed = keras_vit.ViT(**{**ROPE, "input_shape": (height, width, 3)})
        fixed.set_weights(model.get_weights())
        x = np.random.default_rng(1).uniform(0, 255, (2, height, width, 3)).astype("float32")
        np.testing.assert_allclose(
            any_size.predict(x, verbose=0), fixed.predict(x, verbose=0), atol=1e-6
        )
    # The configuration rebuilds it, its rotation base included.
    config = model.get_config()
    assert (config["position_embedding"], config["rope_base"]) == ("rope", 100.0)
    clone = keras_vit.VisionTransformer.from_config({**config, "rope_base": 50.0})
    clone.set_weights(model.get_weights())
    assert clone.get_layer("rotary_embedding").base == 50.0
    x = images(16)
    differs = np.abs(clone.predict(x, verbose=0) - model.predict(x, verbose=0)).max()
    assert differs > 1e-4  # (the base turns the queries and keys: it is not ignored)


def test_attention_maps_of_a_rotary_model_are_its_rotated_queries_and_keys():
    from keras_vit.inspect import attention_maps
    from keras_vit.inspect.maps import block_inputs_model

    model = rope_model(size=None)
    x = images(24, count=1)
    maps = attention_maps(model, x)
    assert maps.shape == (ROPE["num_layers"], 1, ROPE["num_heads"], 3 + 36, 3 + 36)
    # Block 1's probabilities, from its own projections turned by the rotation
    # of the images' 6 x 6 grid.
    block = model.get_layer("encoderblock_1")
    tokens = block_inputs_model(model).predict(x, verbose=0)[1]
    query, key, _ = block.attention.project(block.attention_norm(tokens))
    rotation = model.get_layer("rotary_embedding")(grid=(6, 6))
    query, key = (ops.convert_to_numpy(rotate(t, rotation)) for t in (query, key))
    logits = np.einsum("bqhd,bkhd->bhqk", query, key) / np.sqrt(query.shape[-1])
    expected = np.exp(logits - logits.max(-1, keepdims=True))
    expected /= expected.sum(-1, keepdims=True)
    np.testing.assert_allclose(maps[1], expected, atol=1e-5)


def test_tools_that_cannot_apply_to_rotary_positions_say_so_and_name_the_part():
    with pytest.raises(ValueError, match=r"patch_dropout_rate drops patch tokens.*'rope'"):
        keras_vit.ViT(**ROPE, patch_dropout_rate=0.25)
    with pytest.raises(ValueError, match=r"rope_base.*above 1.*rope_base=1"):
        keras_vit.ViT(**ROPE, rope_base=1)
    with pytest.raises(
        ValueError, match=r"position_embedding.*one of.*Received: position_embedding"
    ):
        keras_vit.ViT(**TINY, position_embedding="rotary")
    model = rope_model()
    # What does apply: LoRA, and Keras' quantization.
    x = images(16)
    before = model.predict(x, verbose=0)
    model.enable_lora(2)
    np.testing.assert_allclose(model.predict(x, verbose=0), before, atol=1e-6)
    quantized = rope_model()
    quantized.quantize("int8")
    assert np.abs(quantized.predict(x, verbose=0) - before).max() < 0.1


@on_one_backend("tensorflow", "TensorFlow converts a model of any backend")
@pytest.mark.slow
def test_exports_of_a_rotary_model_agree_with_keras(tmp_path):
    from keras_vit import export

    model = rope_model(include_top=True)
    head = model.get_layer("head")
    head.kernel.assign(np.random.default_rng(2).normal(size=head.kernel.shape))
    x = images(16, count=8)
    version = export.saved_model(model, str(tmp_path / "served"))
    served = export.check_saved_model(version, model, x)["serving_default"]
    assert served["top1_agreement"] == 1.0 and served["max_abs_error"] < 1e-5
    litert = export.tflite(model, str(tmp_path / "rope.tflite"))
    assert not [op for op in litert["op_counts"] if op.startswith("Flex") or op == "CUSTOM"]
    checked = export.check_tflite(litert["path"], model, x, latency_runs=1)
    assert checked["top1_agreement"] == 1.0 and checked["max_abs_error"] < 1e-5
    onnx = export.onnx(model, str(tmp_path / "rope.onnx"))
    checked = export.check_onnx(onnx["path"], model, x, latency_runs=1)
    assert checked["top1_agreement"] == 1.0 and checked["max_abs_error"] < 1e-5
