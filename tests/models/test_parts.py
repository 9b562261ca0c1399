"""The model's parts: each checks its own fields, they map to the flat arguments and back,
and the model they assemble is the one the flat arguments build."""

import dataclasses

import keras
import numpy as np
import pytest

import keras_vit
from keras_vit.models import parts
from keras_vit.models.parts import Encoder, Head, ImageInput, Patches, Positions, TokenLayout
from tests.conftest import TINY, randomize_weights


@pytest.mark.backend_independent
@pytest.mark.parametrize(
    "make, message",
    [
        (lambda: Encoder(hidden_dim=30, num_heads=4), "hidden_dim 30 is not divisible by"),
        (lambda: Encoder(remat="yes"), "remat='yes'"),
        (lambda: Encoder(patch_dropout_rate=1.0), "patch_dropout_rate"),
        (lambda: Head(pooling="cls"), "pooling='cls'"),
        (lambda: Head(include_top=True, pooling=None), "pooling=None"),
        (lambda: Head(classes=0), "classes=0"),
        (lambda: TokenLayout(num_register_tokens=-1), "num_register_tokens=-1"),
        (lambda: TokenLayout(num_register_tokens=True), "num_register_tokens=True"),
        (lambda: Positions(kind="rotary"), "position_embedding='rotary'"),
        (lambda: Positions(kind="rope", rope_base=0.5), "rope_base=0.5"),
        (lambda: Encoder(mlp="geglu"), "mlp='geglu'"),
        (lambda: Positions(resample_method="nearest"), "resample_method='nearest'"),
        (lambda: Patches(patch_size=0), "patch_size"),
        (lambda: ImageInput(data_format="NHWC"), "data_format='NHWC'"),
    ],
)
def test_each_part_refuses_a_bad_field_naming_it(make, message):
    with pytest.raises((ValueError, TypeError), match=message):
        make()


@pytest.mark.backend_independent
def test_flat_arguments_and_parts_map_one_to_one():
    arguments = {
        **TINY,
        "position_embedding": "sincos2d",
        "num_register_tokens": 2,
        "pooling": "gap",
        "drop_path_rate": 0.1,
    }
    made = parts.parts_from_arguments(arguments)
    assert made["positions"].kind == "sincos2d"  # (its flat name is position_embedding)
    assert made["tokens"] == TokenLayout(num_register_tokens=2)
    assert made["encoder"].drop_path_rate == 0.1 and made["head"].pooling == "gap"
    flat = parts.arguments_of(made)
    assert set(flat) == set(parts.PART_ARGUMENTS)
    assert {name: flat[name] for name in arguments} == {
        **arguments,
        "patch_size": (4, 4),  # (a part normalises its own field)
    }
    assert parts.parts_from_arguments(flat) == made
    with pytest.raises(TypeError, match=r"\['hidden_size'\]"):
        parts.parts_from_arguments({"hidden_size": 32})


@pytest.mark.backend_independent
def test_every_field_of_every_part_is_one_flat_argument():
    names = [name for part in parts.PARTS.values() for name, _ in parts._fields(part)]
    assert len(names) == len(set(names)) == len(parts.PART_ARGUMENTS)


def test_the_model_from_parts_is_the_model_from_flat_arguments():
    flat = keras_vit.ViT(**TINY, num_register_tokens=1, pooling="gap", seed=3)
    from_parts = keras_vit.VisionTransformer(
        Encoder(hidden_dim=32, num_layers=2, num_heads=4, mlp_dim=64, seed=3),
        image=ImageInput(input_shape=(16, 16, 3)),
        patches=Patches(patch_size=4),
        tokens=TokenLayout(num_register_tokens=1),
        head=Head(pooling="gap", classes=5),
    )
    assert from_parts.get_config() == flat.get_config()
    randomize_weights(flat)
    from_parts.set_weights(flat.get_weights())
    x = np.random.default_rng(0).uniform(0, 255, (2, 16, 16, 3)).astype("float32")
    np.testing.assert_array_equal(
        keras.ops.convert_to_numpy(from_parts(x)), keras.ops.convert_to_numpy(flat(x))
    )
    assert from_parts.parts["tokens"].num_register_tokens == 1
    with pytest.raises(TypeError):
        from_parts.parts["head"] = Head()  # (read-only)
    with pytest.raises(dataclasses.FrozenInstanceError):
        from_parts.parts["head"].classes = 3


def test_a_rule_between_parts_is_checked_before_any_layer():
    with pytest.raises(ValueError, match="pooling='token' needs a class token"):
        keras_vit.VisionTransformer(
            Encoder(hidden_dim=32, num_layers=1, num_heads=4, mlp_dim=64),
            tokens=TokenLayout(class_token=False),
        )
    with pytest.raises(ValueError, match="patch_dropout_rate needs a fixed input size"):
        keras_vit.ViT(**{**TINY, "input_shape": (None, None, 3)}, patch_dropout_rate=0.5)


@pytest.mark.backend_independent
def test_the_model_class_has_no_metaclass_of_its_own():
    assert type(keras_vit.VisionTransformer) is type(keras.Model)
    with pytest.raises(TypeError):
        keras_vit.VisionTransformer(weights="imagenet")  # (the builders load weights)


def test_construction_leaves_keras_global_dtype_policy_alone(monkeypatch):
    def refuse(policy):
        raise AssertionError(f"the global dtype policy was set to {policy!r}")

    monkeypatch.setattr(keras.config, "set_dtype_policy", refuse)
    monkeypatch.setattr(keras.mixed_precision, "set_global_policy", refuse)
    model = keras_vit.ViT(**TINY, dtype="mixed_bfloat16")
    assert keras.config.dtype_policy().name == "float32"
    assert model.get_layer("encoderblock_0").dtype_policy.name == "mixed_bfloat16"
    assert model.get_layer("head").dtype_policy.name == "float32"  # (logits in float32)
    assert model.get_config()["dtype"] == "mixed_bfloat16"
