"""Inspecting a ViT: attention maps, rollout, attention distance, embeddings, figures."""

import os

import keras
import numpy as np
import pytest
import tensorflow as tf

import keras_vit
from keras_vit import inspect as vit_inspect
from tests.conftest import TINY, randomize_weights


@pytest.fixture
def model():
    vit = keras_vit.ViT(**TINY, seed=0)
    randomize_weights(vit, seed=1)
    return vit


def pixels(count=3, size=16):
    return np.random.default_rng(0).uniform(0, 255, (count, size, size, 3)).astype("float32")


def layer_norm(x, layer):
    gamma, beta = (keras.ops.convert_to_numpy(w) for w in layer.weights)
    mean = x.mean(-1, keepdims=True)
    variance = ((x - mean) ** 2).mean(-1, keepdims=True)
    return (x - mean) / np.sqrt(variance + layer.epsilon) * gamma + beta


def test_attention_rows_sum_to_one_and_match_a_manual_computation(model):
    images = pixels()
    attention = vit_inspect.attention_maps(model, images)
    assert attention.shape == (2, 3, TINY["num_heads"], 17, 17)
    np.testing.assert_allclose(attention.sum(-1), 1.0, atol=1e-5)

    tokens = keras.ops.convert_to_numpy(vit_inspect.block_inputs_model(model)(images)[1])
    block = model.get_layer("encoderblock_1")
    x = layer_norm(tokens.astype("float64"), block.attention_norm)
    kernel = keras.ops.convert_to_numpy(block.attention.qkv.kernel).astype("float64")
    bias = keras.ops.convert_to_numpy(block.attention.qkv.bias).astype("float64")
    qkv = np.einsum("btd,dshe->bsthe", x, kernel) + bias.transpose(0, 1, 2)[None, :, None]
    query, key = qkv[:, 0], qkv[:, 1]
    logits = np.einsum("bqhe,bkhe->bhqk", query, key) / np.sqrt(kernel.shape[-1])
    expected = np.exp(logits - logits.max(-1, keepdims=True))
    expected /= expected.sum(-1, keepdims=True)
    np.testing.assert_allclose(attention[1], expected, atol=1e-5)


def test_the_model_is_untouched_by_inspection(model):
    images = pixels()
    before = keras.ops.convert_to_numpy(model(images))
    vit_inspect.attention_maps(model, images)
    np.testing.assert_array_equal(keras.ops.convert_to_numpy(model(images)), before)


def test_uniform_attention_gives_uniform_rollout_and_the_grid_mean_distance(model):
    for block in keras_vit.models.encoder_blocks(model):
        block.attention.qkv.kernel.assign(np.zeros(block.attention.qkv.kernel.shape))
        block.attention.qkv.bias.assign(np.zeros(block.attention.qkv.bias.shape))
    attention = vit_inspect.attention_maps(model, pixels())
    np.testing.assert_allclose(attention, 1 / 17, atol=1e-6)
    prefix, grid, patch = vit_inspect.token_layout(model)
    assert (prefix, grid, patch) == (1, (4, 4), (4, 4))
    rollout = vit_inspect.attention_rollout(attention, prefix, grid)
    np.testing.assert_allclose(rollout, rollout[0, 0, 0], rtol=1e-5)
    distances = vit_inspect.mean_attention_distance(attention, grid, patch, prefix)
    # The mean distance between the centres of a 4x4 grid of 4-pixel patches.
    centres = np.array([(4 * i, 4 * j) for i in range(4) for j in range(4)], float)
    analytic = np.mean(np.linalg.norm(centres[:, None] - centres[None], axis=-1))
    np.testing.assert_allclose(distances, analytic, rtol=1e-5)


def test_a_max_pool_stem_model_is_inspected_on_its_rounded_up_grid(tmp_path):
    # The main job's geometry: 28 px -> 14 -> 7 -> 4 tokens a side.
    model = keras_vit.ViT(
        **{**TINY, "patch_size": 1, "input_shape": (28, 28, 1)},
        stem_filters=(4, 4, 8),
        stem_downsampling=("max_pool", "max_pool", "convolution"),
        class_token=False,
        pooling="gap",
    )
    prefix, grid, _ = vit_inspect.token_layout(model)
    assert (prefix, grid) == (0, (4, 4))
    images = np.random.default_rng(0).uniform(0, 255, (2, 28, 28, 1)).astype("float32")
    attention = vit_inspect.attention_maps(model, images)
    assert attention.shape[-1] == 16
    assert vit_inspect.attention_rollout(attention, prefix, grid).shape == (2, 4, 4)
    paths = vit_inspect.write_figures(model, images, str(tmp_path))
    assert all(os.path.isfile(path) for path in paths.values())


def test_a_head_that_attends_to_itself_has_distance_zero():
    tokens, grid = 1 + 9, (3, 3)
    attention = np.full((2, 1, 2, tokens, tokens), 1 / tokens)
    attention[:, :, 0] = np.eye(tokens)
    distances = vit_inspect.mean_attention_distance(attention, grid, (8, 8))
    np.testing.assert_allclose(distances[:, 0], 0.0, atol=1e-7)
    assert np.all(distances[:, 1] > 8)


def test_position_similarity_and_embedding_filters(model):
    similarity = vit_inspect.position_similarity(model)
    assert similarity.shape == (4, 4, 4, 4)
    flat = similarity.reshape(16, 16)
    np.testing.assert_allclose(np.diag(flat), 1.0, atol=1e-5)
    np.testing.assert_allclose(flat, flat.T, atol=1e-6)
    filters = vit_inspect.embedding_filters(model, components=5)
    # Each component spread over the whole colour range on its own.
    assert filters.shape == (5, 4, 4, 3)
    np.testing.assert_allclose(filters.min(axis=(1, 2, 3)), 0.0, atol=1e-6)
    np.testing.assert_allclose(filters.max(axis=(1, 2, 3)), 1.0, atol=1e-6)
    stem = keras_vit.ViT(**{**TINY, "patch_size": 1}, stem_filters=(8, 8), stem_strides=(2, 2))
    with pytest.raises(ValueError, match="convolutional stem"):
        vit_inspect.embedding_filters(stem)


def png_size(path):
    with open(path, "rb") as f:
        assert f.read(8) == b"\x89PNG\r\n\x1a\n"
    return os.path.getsize(path)


def test_figures_are_written(model, tmp_path):
    paths = vit_inspect.write_figures(model, pixels(2), str(tmp_path / "figures"), ["a", "b"])
    assert sorted(paths) == [
        "attention_distance",
        "attention_rollout",
        "embedding_filters",
        "position_similarity",
    ]
    assert all(png_size(path) > 2000 for path in paths.values())


def test_inspect_command(model, tmp_path, capsys):
    from keras_vit.cli import main

    model.save(tmp_path / "model.keras")
    image = tmp_path / "image.png"
    image.write_bytes(tf.io.encode_png(pixels(1)[0].astype("uint8")).numpy())
    out = tmp_path / "out"
    assert main(["inspect", str(tmp_path / "model.keras"), str(image), "--out", str(out)]) == 0
    assert "attention_rollout" in capsys.readouterr().out
    assert png_size(out / "attention_rollout.png") > 2000
    with pytest.raises(SystemExit, match="no such image"):
        main(["inspect", str(tmp_path / "model.keras"), str(tmp_path / "missing.png")])


def test_attention_distance_figure_has_integer_layers_a_colour_per_head_and_no_hidden_point():
    from keras_vit.inspect import figures

    distances = np.random.default_rng(0).uniform(2, 20, (12, 6))
    figure = figures.attention_distance_plot(distances, image_size=(28, 28), patch_size=(4, 4))
    axis = figure.axes[0]
    assert list(axis.get_xticks()) == list(range(1, 13))
    assert "pixels of the 28\u00d728 image" in axis.get_ylabel()
    collections = axis.collections
    assert len(collections) == 6  # one scatter per head, every layer in it
    assert all(len(c.get_offsets()) == 12 for c in collections)
    colours = {tuple(np.round(c.get_facecolor()[0], 3)) for c in collections}
    assert len(colours) == 6
    legend = axis.get_legend()
    assert [t.get_text() for t in legend.get_texts()] == [f"head {h}" for h in range(1, 7)]
    figure.canvas.draw()
    renderer = figure.canvas.get_renderer()
    # The legend lies beside the axes, not over any point.
    assert legend.get_window_extent(renderer).x0 >= axis.get_window_extent(renderer).x1
    assert axis.get_ylim()[0] == 0 and axis.get_ylim()[1] >= distances.max()
    figures.save(figure, os.devnull)
