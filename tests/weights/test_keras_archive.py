"""A `.keras` file's weights are read from its archive, named as the model names them."""

import json
import zipfile

import keras
import numpy as np
import pytest

import keras_vit
from keras_vit.pretraining import objectives
from keras_vit.weights.keras_archive import read_keras_weights
from keras_vit.weights.readers import read_tensors
from tests.conftest import randomize_weights

TINY = dict(patch_size=4, hidden_dim=16, num_layers=2, num_heads=2, mlp_dim=32)
# Every layer kind a keras_vit model has: stem, registers, LayerScale, MAP head,
# distillation token and its head, pre_logits.
MODELS = {
    "pre_logits": lambda: keras_vit.ViT(
        **TINY, input_shape=(16, 16, 3), classes=5, representation_size=8
    ),
    "stem_registers_layer_scale_map": lambda: keras_vit.ViT(
        **{**TINY, "patch_size": 2},
        input_shape=(16, 16, 3),
        classes=5,
        stem_filters=(4, 8),
        pooling="map",
        num_register_tokens=2,
        layer_scale_init=0.1,
    ),
    "distillation_token": lambda: keras_vit.ViT(
        **TINY, input_shape=(16, 16, 3), classes=5, distillation_token=True
    ),
    "bfloat16": lambda: keras_vit.ViT(**TINY, input_shape=(16, 16, 3), classes=5, dtype="bfloat16"),
    "mpp": lambda: objectives.get_objective("mpp").build(_encoder()),
    "mae": lambda: objectives.get_objective(
        "mae", decoder_dim=8, decoder_depth=1, decoder_heads=2
    ).build(_encoder()),
}


def _encoder():
    return keras_vit.ViT(**TINY, input_shape=(16, 16, 3), include_top=False, pooling=None)


@pytest.mark.parametrize("kind", sorted(MODELS))
def test_the_archive_gives_every_weight_by_its_path_without_building_a_model(
    kind, tmp_path, monkeypatch
):
    model = randomize_weights(MODELS[kind]())
    path = str(tmp_path / f"{kind}.keras")
    model.save(path)

    def no_model(*args, **kwargs):
        raise AssertionError("a model was built to read the weights")

    monkeypatch.setattr(keras.saving, "load_model", no_model)
    monkeypatch.setattr(keras.models, "load_model", no_model)
    tensors = read_tensors(path)
    expected = {w.path: keras.ops.convert_to_numpy(w) for w in model.weights}
    assert sorted(tensors) == sorted(expected)
    for name, value in expected.items():
        assert tensors[name].shape == value.shape, name
        np.testing.assert_array_equal(np.asarray(tensors[name], "float32"), value.astype("float32"))


def test_a_layer_changed_after_it_was_built_is_refused_by_name(tmp_path):
    model = keras_vit.ViT(**TINY, input_shape=(16, 16, 3), classes=5)
    model.get_layer("head").quantize("int8")  # an int8 kernel and its scales
    path = str(tmp_path / "quantized.keras")
    model.save(path)
    # Its configuration's quantized policies taken out: the variables alone tell.
    with zipfile.ZipFile(path) as archive:
        entries = {name: archive.read(name) for name in archive.namelist()}
    config = json.loads(entries["config.json"])
    config["config"]["dtype"] = "float32"
    entries["config.json"] = json.dumps(config).encode()
    with zipfile.ZipFile(path, "w") as archive:
        for name, data in entries.items():
            archive.writestr(name, data)
    with pytest.raises(ValueError, match=r"quantized\.keras.*layer 'head' holds 3 variables"):
        read_tensors(path)


def test_a_keras_quantized_model_file_is_refused_as_a_checkpoint_saying_what_to_do(tmp_path):
    model = keras_vit.ViT(**TINY)
    model.quantize("int8")
    model.save(tmp_path / "int8.keras")
    for load in (read_keras_weights, keras_vit.from_checkpoint):
        with pytest.raises(ValueError, match=r"quantized with Keras' `quantize` \(int8\)") as error:
            load(str(tmp_path / "int8.keras"))
        assert "float model it was quantized from" in str(error.value)
        assert "not a readable" not in str(error.value)
    keras_vit.ViT(**TINY).save(tmp_path / "float.keras")
    assert read_keras_weights(str(tmp_path / "float.keras"))  # (a float file reads)
