import keras
import numpy as np
import pytest
from keras import ops

import keras_vit
from keras_vit.layers import RotaryPositionEmbedding2D, TokenMergingBlock, TransformerBlock
from keras_vit.models import largest_merge, merge_tokens
from tests.conftest import BACKEND, TINY, on_one_backend, randomize_weights

# A pretrained checkpoint's function: exact GELU, LayerScale, the class token's head.
FUNCTION = dict(TINY, approximate_gelu=False, layer_scale_init=0.1, classifier_activation=None)


def images(count=4):
    return np.random.default_rng(1).uniform(0, 255, (count, 16, 16, 3)).astype("float32")


# DINOv3's layout: rotary positions, registers, LayerScale, the class token's head.
ROPE_LAYOUT = dict(position_embedding="rope", num_register_tokens=2)


def test_each_block_merges_r_pairs_and_the_model_saves_and_loads(tmp_path):
    model = randomize_weights(keras_vit.ViT(**FUNCTION), scale=0.5)
    merged = merge_tokens(model, 3)
    # 16 patches and the class token: 3 fewer after each of the two blocks.
    assert [merged.get_layer(f"encoderblock_{i}").output[0].shape[1] for i in (0, 1)] == [14, 11]
    assert merged.output.shape == model.output.shape
    outputs = ops.convert_to_numpy(merged(images()))
    assert np.abs(outputs - ops.convert_to_numpy(model(images()))).max() < 0.5
    # A model of its own: on JAX, models sharing variables break each other's calls.
    assert not {id(v) for v in merged.weights} & {id(v) for v in model.weights}
    for each in (model, merge_tokens(model, 2), merged, model):
        assert each.predict(images(), verbose=0).shape == (4, TINY["classes"])
    path = str(tmp_path / "merged.keras")
    merged.save(path)
    np.testing.assert_allclose(
        ops.convert_to_numpy(keras.saving.load_model(path)(images())), outputs, atol=1e-6
    )


def test_a_map_heads_probe_attends_to_each_merged_token_as_the_patches_it_stands_for(tmp_path):
    # SigLIP's layout: no class token, a MAP head over every patch token.
    model = randomize_weights(
        keras_vit.ViT(**{**FUNCTION, "approximate_gelu": True}, pooling="map", class_token=False),
        scale=0.5,
    )
    merged = merge_tokens(model, 3)
    assert [merged.get_layer(f"encoderblock_{i}").output[0].shape[1] for i in (0, 1)] == [13, 10]
    outputs = ops.convert_to_numpy(merged(images()))
    unmerged = ops.convert_to_numpy(model(images()))
    # (Approximate, as ToMe is: 6 of the 16 patches merged away.)
    assert 1e-3 < np.abs(outputs - unmerged).max() < 0.2 * np.abs(unmerged).max()
    # Proportional attention: a token given twice (one patch each) pools as
    # that token given once for two patches; with no sizes, every token is one.
    head = merged.get_layer("map_head")
    tokens = np.random.default_rng(2).normal(size=(2, 5, TINY["hidden_dim"])).astype("float32")
    twice = np.concatenate([tokens, tokens[:, -1:]], axis=1)
    sizes = np.array([[1, 1, 1, 1, 2]] * 2, "float32")
    np.testing.assert_allclose(
        ops.convert_to_numpy(head(tokens, sizes=sizes)),
        ops.convert_to_numpy(head(twice)),
        rtol=1e-5,
        atol=1e-5,
    )
    assert np.abs(ops.convert_to_numpy(head(tokens) - head(tokens, sizes=sizes))).max() > 1e-4
    # And the merged model's head is given the last block's sizes.
    parts = keras.Model(
        merged.input,
        [
            merged.get_layer("encoder_norm").output,
            merged.get_layer("encoderblock_1").output[1],
            merged.get_layer("map_head").output,
        ],
    )
    normed, last_sizes, pooled = (ops.convert_to_numpy(t) for t in parts(images()))
    assert last_sizes.sum(axis=1).tolist() == [16.0] * 4  # every patch, in 10 tokens
    np.testing.assert_allclose(
        ops.convert_to_numpy(head(normed, sizes=last_sizes)), pooled, rtol=1e-5, atol=1e-5
    )
    path = str(tmp_path / "merged.keras")
    merged.save(path)
    np.testing.assert_allclose(
        ops.convert_to_numpy(keras.saving.load_model(path)(images())), outputs, atol=1e-6
    )


def test_a_distilled_models_two_heads_read_their_tokens_after_merging():
    model = randomize_weights(keras_vit.ViT(**FUNCTION, distillation_token=True), scale=0.5)
    merged = merge_tokens(model, 3)
    # 16 patches and the two tokens that are never merged: 3 fewer patches a block.
    assert merged.get_layer("encoderblock_1").output[0].shape[1] == 2 + 16 - 6
    tokens = keras.Model(merged.input, merged.get_layer("encoder_norm").output)(images())
    heads = [merged.get_layer(name) for name in ("head", "head_dist")]
    expected = sum(ops.convert_to_numpy(head(tokens[:, index])) for index, head in enumerate(heads))
    np.testing.assert_allclose(
        ops.convert_to_numpy(merged(images())), expected / 2, rtol=1e-5, atol=1e-5
    )


def test_the_largest_r_leaves_every_block_half_its_patches_to_merge_into():
    assert largest_merge(256, 12) == 19  # ViT-S/14 at 224 px: 28 tokens left at the end
    assert largest_merge(16, 2) == 5
    for patches, blocks in ((196, 12), (16, 2), (64, 3), (10, 1)):
        r = largest_merge(patches, blocks)
        remaining = [patches - i * r for i in range(blocks)]
        assert all(r <= n // 2 for n in remaining)
        assert any(r + 1 > (patches - i * (r + 1)) // 2 for i in range(blocks))


def test_merge_tokens_refuses_what_it_cannot_merge():
    model = keras_vit.ViT(**FUNCTION)
    with pytest.raises(ValueError, match=r"from 1 to 5: .* 2 blocks .* 16 patch tokens. .*r=6"):
        merge_tokens(model, 6)
    with pytest.raises(ValueError, match="r=0"):
        merge_tokens(model, 0)
    with pytest.raises(ValueError, match="pooling='token'.*'map'.*pooling 'gap'"):
        merge_tokens(keras_vit.ViT(**TINY, pooling="gap", class_token=False), 2)
    with pytest.raises(ValueError, match="fixed input size"):
        merge_tokens(keras_vit.ViT(**{**TINY, "input_shape": (None, None, 3)}), 2)


def rope_block(r, num_prefix_tokens=1, **kwargs):
    block = TokenMergingBlock(
        r=r,
        num_prefix_tokens=num_prefix_tokens,
        rope_base=100.0,
        grid_size=(4, 4),
        num_heads=2,
        mlp_dim=32,
        layer_scale_init=0.5,
        **kwargs,
    )
    block.build((None, num_prefix_tokens + 16, 16))
    return randomize_weights(block, scale=0.5)


def test_under_rotary_positions_a_block_turns_each_token_where_it_sits():
    rng = np.random.default_rng(3)
    tokens = rng.normal(size=(2, 17, 16)).astype("float32")
    # Unmerged (r=0): the plain block's attention under the model's rotation of the grid.
    block = rope_block(0)
    plain = TransformerBlock(num_heads=2, mlp_dim=32, layer_scale_init=0.5)
    plain.build((None, 17, 16))
    plain.set_weights(block.get_weights())
    rotation = RotaryPositionEmbedding2D(8, 100.0, num_prefix_tokens=1)(grid=(4, 4))
    merged_tokens, sizes, coordinates = block(tokens)
    np.testing.assert_allclose(
        ops.convert_to_numpy(merged_tokens),
        ops.convert_to_numpy(plain(tokens, rotation=rotation)),
        atol=2e-5,
    )
    # The patches' centres, where no coordinates are given.
    centres = ops.convert_to_numpy(RotaryPositionEmbedding2D(8).coordinates((4, 4)))
    np.testing.assert_array_equal(ops.convert_to_numpy(coordinates), np.stack([centres] * 2))
    assert sizes.shape == (2, 16)
    # The rotation follows the coordinates given: elsewhere, other answers.
    elsewhere = ops.convert_to_numpy(block([tokens, sizes, 2.0 * coordinates])[0])
    assert np.abs(elsewhere - ops.convert_to_numpy(merged_tokens)).max() > 1e-2


def test_under_rotary_positions_a_merged_token_sits_at_its_patches_size_weighted_centre():
    rng = np.random.default_rng(4)
    # No prefix token (each one sits unturned, whatever the patches' places).
    tokens = rng.normal(size=(2, 16, 16)).astype("float32")
    sizes = rng.integers(1, 4, (2, 16)).astype("float32")  # tokens of earlier merges
    coordinates = rng.uniform(-1, 1, (2, 16, 2)).astype("float32")
    block = rope_block(5, num_prefix_tokens=0)
    merged, new_sizes, new_coordinates = (
        ops.convert_to_numpy(t) for t in block([tokens, sizes, coordinates])
    )
    assert merged.shape == (2, 11, 16) and new_coordinates.shape == (2, 11, 2)
    # Every patch is somewhere, once: the sizes and the size-weighted sum of
    # the places are what they were.
    np.testing.assert_allclose(new_sizes.sum(1), sizes.sum(1))
    np.testing.assert_allclose(
        (new_sizes[..., None] * new_coordinates).sum(1),
        (sizes[..., None] * coordinates).sum(1),
        atol=1e-5,
    )
    # Turning every token by one more angle leaves each query-key product:
    # the same tokens come out, each one place further on (a place is a
    # weighted mean of places).
    shift = np.array([0.3, -0.2], "float32")
    shifted = [ops.convert_to_numpy(t) for t in block([tokens, sizes, coordinates + shift])]
    np.testing.assert_allclose(shifted[0], merged, atol=2e-5)
    np.testing.assert_allclose(shifted[2], new_coordinates + shift, atol=1e-6)


def test_a_rotary_models_merged_copy_merges_in_each_block_and_saves_and_loads(tmp_path):
    model = randomize_weights(keras_vit.ViT(**FUNCTION, **ROPE_LAYOUT), scale=0.5)
    merged = merge_tokens(model, 3)
    # 16 patches, the class token and two registers: 3 fewer after each block.
    assert [merged.get_layer(f"encoderblock_{i}").output[0].shape[1] for i in (0, 1)] == [16, 13]
    assert "rotary_embedding" not in [layer.name for layer in merged.layers]
    outputs = ops.convert_to_numpy(merged(images()))
    unmerged = ops.convert_to_numpy(model(images()))
    assert 1e-3 < np.abs(outputs - unmerged).max() < 0.2 * np.abs(unmerged).max()
    path = str(tmp_path / "merged.keras")
    merged.save(path)
    np.testing.assert_allclose(
        ops.convert_to_numpy(keras.saving.load_model(path)(images())), outputs, atol=1e-6
    )


@on_one_backend("tensorflow", "TensorFlow converts every backend's model")
@pytest.mark.parametrize("head", ["token", "map", "rope"])
def test_exports_keep_the_merging(tmp_path, head):
    import onnxruntime

    layout = {
        "token": {},
        "map": dict(pooling="map", class_token=False),  # SigLIP's
        "rope": ROPE_LAYOUT,  # DINOv3's
    }[head]
    model = randomize_weights(keras_vit.ViT(**FUNCTION, **layout), scale=0.5)
    merged = merge_tokens(model, 5)
    expected = ops.convert_to_numpy(merged(images()))
    path = str(tmp_path / "merged.onnx")
    keras_vit.export.onnx(merged, path)
    session = onnxruntime.InferenceSession(path, providers=["CPUExecutionProvider"])
    served = session.run(None, {session.get_inputs()[0].name: images()})[0]
    # (float32's rounding, on logits of up to ~50)
    np.testing.assert_allclose(served, expected, atol=1e-5 * max(1.0, np.abs(expected).max()))
    # Not the unmerged model's answers: the file merges.
    assert np.abs(served - ops.convert_to_numpy(model(images()))).max() > 1e-3
    if BACKEND != "tensorflow":
        return  # LiteRT and SavedModel: as above, from TensorFlow
    import tensorflow as tf

    path = str(tmp_path / "merged.tflite")
    keras_vit.export.tflite(merged, path)
    report = keras_vit.export.check_tflite(path, merged, images(), latency_runs=1)
    assert report["max_abs_error"] < 1e-5 * max(1.0, np.abs(expected).max()), report
    folder = keras_vit.export.saved_model(merged, str(tmp_path / "serving"), warmup=False)
    serve = tf.saved_model.load(folder).signatures["serving_default"]
    probabilities = serve(images=tf.constant(images()))["probabilities"].numpy()
    np.testing.assert_allclose(probabilities, tf.nn.softmax(expected).numpy(), atol=1e-6)
