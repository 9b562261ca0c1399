"""timm ViTs with a MAP head (`global_pool="map"`) load with parity to timm's definition.

The reference is timm's `VisionTransformer(class_token=False, global_pool="map")`
forward, written in NumPy from its definition (`tests/reference.py`) and run
on the file's own tensors; the file is written in timm's names and shapes.
"""

import os

import keras
import numpy as np
import pytest

import keras_vit
from keras_vit.models import from_checkpoint
from tests.layers.test_attention_pooling import timm_pool_tensors
from tests.reference import timm_vit_map

DIM, DEPTH, HEADS, MLP, PATCH, SIZE, CLASSES = 32, 2, 4, 64, 4, 16, 5


def timm_map_tensors(seed=0):
    rng = np.random.default_rng(seed)
    shapes = {
        "patch_embed.proj.weight": (DIM, 3, PATCH, PATCH),
        "patch_embed.proj.bias": (DIM,),
        "pos_embed": (1, (SIZE // PATCH) ** 2, DIM),
        "norm.weight": (DIM,),
        "norm.bias": (DIM,),
        "head.weight": (CLASSES, DIM),
        "head.bias": (CLASSES,),
    }
    for i in range(DEPTH):
        p = f"blocks.{i}."
        shapes.update(
            {
                p + "norm1.weight": (DIM,),
                p + "norm1.bias": (DIM,),
                p + "attn.qkv.weight": (3 * DIM, DIM),
                p + "attn.qkv.bias": (3 * DIM,),
                p + "attn.proj.weight": (DIM, DIM),
                p + "attn.proj.bias": (DIM,),
                p + "norm2.weight": (DIM,),
                p + "norm2.bias": (DIM,),
                p + "mlp.fc1.weight": (MLP, DIM),
                p + "mlp.fc1.bias": (MLP,),
                p + "mlp.fc2.weight": (DIM, MLP),
                p + "mlp.fc2.bias": (DIM,),
            }
        )
    tensors = {name: rng.normal(0, 0.2, shape).astype("float32") for name, shape in shapes.items()}
    tensors.update(timm_pool_tensors(DIM, HEADS, MLP, seed=seed + 1))
    return tensors


@pytest.fixture(scope="module")
def map_checkpoint(tmp_path_factory):
    from safetensors.numpy import save_file

    tensors = timm_map_tensors()
    path = str(tmp_path_factory.mktemp("timm_map") / "model.safetensors")
    save_file(tensors, path)
    images = np.random.default_rng(5).normal(size=(3, SIZE, SIZE, 3)).astype("float32")
    expected = timm_vit_map(
        images.astype("float64"), {k: v.astype("float64") for k, v in tensors.items()}, HEADS, PATCH
    )
    return path, images, expected


def test_timm_map_checkpoint_parity_through_from_checkpoint_and_the_builder(map_checkpoint):
    path, images, expected = map_checkpoint
    model = from_checkpoint(
        path, num_heads=HEADS, include_rescaling=False, classifier_activation=None
    )
    assert model.get_layer("map_head").num_heads == HEADS
    assert not any(layer.name == "class_token" for layer in model.layers)
    error = float(np.abs(model.predict(images, verbose=0) - expected).max())
    print(f"max abs error vs timm's MAP ViT: {error:.2e}")
    assert error <= 1e-5
    built = keras_vit.ViT(
        patch_size=PATCH,
        hidden_dim=DIM,
        num_layers=DEPTH,
        num_heads=HEADS,
        mlp_dim=MLP,
        input_shape=(SIZE, SIZE, 3),
        classes=CLASSES,
        include_rescaling=False,
        classifier_activation=None,
        weights=path,
    )  # pooling and tokens: the file's
    np.testing.assert_allclose(built.predict(images, verbose=0), expected, atol=1e-5)


@pytest.mark.slow
def test_map_model_trains_saves_and_loads(map_checkpoint, tmp_path):
    path, images, expected = map_checkpoint
    model = from_checkpoint(
        path, num_heads=HEADS, include_rescaling=False, classifier_activation=None
    )
    saved = os.path.join(tmp_path, "map.keras")
    model.save(saved)
    loaded = keras.saving.load_model(saved)
    np.testing.assert_allclose(loaded.predict(images, verbose=0), expected, atol=1e-5)
    again = from_checkpoint(saved)  # a keras_vit file says its pooling in its config
    assert again.get_layer("map_head").mlp_dim == MLP
    fresh = keras_vit.ViT(
        patch_size=PATCH,
        hidden_dim=DIM,
        num_layers=DEPTH,
        num_heads=HEADS,
        mlp_dim=MLP,
        input_shape=(SIZE, SIZE, 3),
        classes=CLASSES,
        pooling="map",
        class_token=False,
    )
    fresh.compile(optimizer="adam", loss="sparse_categorical_crossentropy")
    probe = fresh.get_layer("map_head").probe
    before = keras.ops.convert_to_numpy(probe).copy()
    fresh.fit(
        np.random.default_rng(0).uniform(0, 255, (8, SIZE, SIZE, 3)).astype("float32"),
        np.arange(8) % CLASSES,
        batch_size=2,
        epochs=1,
        verbose=0,
    )  # the zero head first
    assert np.abs(keras.ops.convert_to_numpy(probe) - before).max() > 0  # the probe learns


def test_attention_pools_keras_vit_cannot_build_are_refused(tmp_path):
    from safetensors.numpy import save_file

    tensors = timm_map_tensors()
    tensors["attn_pool.q_norm.weight"] = np.ones(DIM // HEADS, "float32")
    path = str(tmp_path / "qk_norm.safetensors")
    save_file(tensors, path)
    with pytest.raises(ValueError, match="attn_pool.q_norm.weight"):
        from_checkpoint(path, num_heads=HEADS)
