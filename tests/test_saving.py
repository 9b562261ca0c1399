"""`.keras` files round-trip: a model's configuration is its builder's arguments."""

import json
import os

import keras
import numpy as np
import pytest

import keras_vit
from keras_vit.weights.readers import keras_model_config
from tests.conftest import TINY, randomize_weights, run_python


@pytest.mark.slow
def test_keras_file_round_trips_in_a_fresh_process(tmp_path, images):
    model = randomize_weights(keras_vit.ViT(**TINY, drop_path_rate=0.1, dropout_rate=0.1))
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
        """,
        cold=True,  # an interpreter that imported keras_vit and nothing else
    )
    expected = model.predict(images, verbose=0)
    np.testing.assert_array_equal(np.load(os.path.join(tmp_path, "out.npy")), expected)


def test_loaded_model_keeps_its_architecture(tmp_path):
    model = keras_vit.ViT(**TINY, layer_scale_init=1e-4, approximate_gelu=False)
    path = os.path.join(tmp_path, "vit.keras")
    model.save(path)
    loaded = keras.saving.load_model(path)
    # Equal up to JSON's tuple -> list, which Keras' own build_config undergoes.
    assert json.dumps(loaded.get_config()) == json.dumps(model.get_config())
    block = loaded.get_layer("encoderblock_1")
    assert isinstance(block, keras_vit.layers.TransformerBlock)
    assert block.layer_scale_init == 1e-4 and block.approximate_gelu is False


def test_from_checkpoint_rebuilds_a_keras_file_at_another_size_and_class_count(tmp_path, images):
    from keras_vit.models import from_checkpoint

    model = randomize_weights(
        keras_vit.ViT(
            **{**TINY, "patch_size": 1},
            stem_filters=(4, 8),
            stem_strides=(1, 2),
            pooling="gap",
            class_token=False,
            normalization=((0.3, 0.4, 0.5), (0.2, 0.25, 0.3)),
            approximate_gelu=False,
        )
    )
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


def test_a_models_configuration_is_its_arguments_and_rebuilds_it(tmp_path, images):
    model = randomize_weights(
        keras_vit.ViT(
            **TINY, num_register_tokens=2, layer_scale_init=1e-4, approximate_gelu=False, seed=3
        )
    )
    config = model.get_config()
    assert {name: config[name] for name in TINY} == {**TINY, "patch_size": (4, 4)}
    assert (config["num_register_tokens"], config["approximate_gelu"], config["seed"]) == (
        2,
        False,
        3,
    )
    assert "weights" not in config and "input_tensor" not in config
    path = str(tmp_path / "vit.keras")
    model.save(path)
    saved = keras_model_config(path)
    assert saved["class_name"] == "VisionTransformer" and "layers" not in saved["config"]
    loaded = keras.saving.load_model(path)
    assert type(loaded) is keras_vit.VisionTransformer
    np.testing.assert_array_equal(
        loaded.predict(images, verbose=0), model.predict(images, verbose=0)
    )
    # Data a program can edit: the same model with another head.
    edited = keras_vit.VisionTransformer.from_config({**config, "classes": 3})
    assert (
        edited.output_shape == (None, 3) and len(edited.get_layer("register_tokens").weights) == 1
    )


def test_a_model_built_from_a_checkpoint_records_the_checkpoints_function(tmp_path):
    source = keras_vit.ViT(
        **TINY, approximate_gelu=False, normalization="imagenet", layer_norm_epsilon=1e-5
    )
    path = str(tmp_path / "source.keras")
    source.save(path)
    config = keras_vit.ViT(**TINY, weights=path).get_config()
    assert (config["approximate_gelu"], config["normalization"], config["layer_norm_epsilon"]) == (
        False,
        "imagenet",
        1e-5,
    )
    os.remove(path)  # the configuration rebuilds the function without the file
    rebuilt = keras_vit.VisionTransformer.from_config(config)
    assert rebuilt.get_layer("encoderblock_0").approximate_gelu is False
    assert rebuilt.get_layer("encoder_norm").epsilon == 1e-5


def test_files_of_plain_functional_models_still_load_and_serve_as_checkpoints(tmp_path, images):
    # What earlier versions of keras_vit saved: a plain functional model of the same layers.
    model = randomize_weights(keras_vit.ViT(**TINY, approximate_gelu=False))
    earlier = keras.Model(model.inputs, model.outputs, name=model.name)
    path = str(tmp_path / "earlier.keras")
    earlier.save(path)
    assert keras_model_config(path)["class_name"] == "Functional"
    expected = model.predict(images, verbose=0)
    loaded = keras.saving.load_model(path)
    np.testing.assert_array_equal(loaded.predict(images, verbose=0), expected)
    rebuilt = keras_vit.from_checkpoint(path)
    assert isinstance(rebuilt, keras_vit.VisionTransformer)
    assert rebuilt.get_config()["approximate_gelu"] is False
    np.testing.assert_allclose(rebuilt.predict(images, verbose=0), expected, atol=1e-6)


def test_a_model_changed_after_it_was_built_saves_its_graph(tmp_path, images):
    model = randomize_weights(keras_vit.ViT(**TINY))
    model.get_layer("encoderblock_0").trainable = False
    assert "layers" in model.get_config()
    path = str(tmp_path / "frozen.keras")
    model.save(path)
    loaded = keras.saving.load_model(path)
    assert loaded.get_layer("encoderblock_0").trainable is False
    np.testing.assert_array_equal(
        loaded.predict(images, verbose=0), model.predict(images, verbose=0)
    )
    # Grafted onto layers before its input: the graph holds them.
    pixels = keras.Input((16, 16, 3))
    darker = keras.layers.Rescaling(0.5, name="darker")(pixels)
    grafted = keras_vit.ViT(**{**TINY, "input_shape": None}, input_tensor=darker)
    path = str(tmp_path / "grafted.keras")
    grafted.save(path)
    assert keras.saving.load_model(path).get_layer("darker").scale == 0.5


def test_a_mixed_precision_model_rebuilds_under_its_own_policy(tmp_path):
    keras.config.set_dtype_policy("mixed_bfloat16")
    try:
        model = keras_vit.ViT(**TINY)
    finally:
        keras.config.set_dtype_policy("float32")
    assert model.get_config()["dtype"] == "mixed_bfloat16"
    path = str(tmp_path / "mixed.keras")
    model.save(path)
    loaded = keras.saving.load_model(path)
    assert loaded.get_layer("encoderblock_0").dtype_policy.name == "mixed_bfloat16"
    assert keras.config.dtype_policy().name == "float32"
