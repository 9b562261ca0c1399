"""keras-hub presets both ways, with parity to keras-hub's own backbones.

The reference is keras-hub itself (`keras_hub.models.Backbone`), run in a
fresh interpreter under PyTorch: random backbones of the five families are
saved with their own `save_to_preset` (the real format) and their outputs on
fixed images recorded; keras_vit must reproduce them from the folders. The
other way, keras_vit models are written with `save_to_preset` and keras-hub's
`Backbone.from_preset` must compute what they compute.
"""

import importlib.util
import json
import os

import keras
import numpy as np
import pytest

import keras_vit
from keras_vit.models import from_checkpoint
from tests.conftest import artifact_maker, run_python, shared_artifact

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(
        importlib.util.find_spec("keras_hub") is None or importlib.util.find_spec("torch") is None,
        reason="the reference needs keras-hub (and torch, the backend it runs on)",
    ),
]

FAMILIES = ("vit", "deit", "dinov2", "dinov2_resampled", "dinov3", "dinov3_gated", "siglip")
# The references' architecture (the backbones' `common` below, and their MLP width).
ARCH = dict(patch_size=4, hidden_dim=16, num_layers=2, num_heads=2, mlp_dim=32)
# A model to refuse or write at once: one block, 16-px images, exact GELU.
ONE_BLOCK = dict(ARCH, num_layers=1, input_shape=(16, 16, 3), approximate_gelu=False)

REFERENCE = """
import json, os, numpy as np, keras, keras_hub
keras.utils.set_random_seed(0)  # the same reference every run (keras-hub's initializers)
M = keras_hub.models
root = {root!r}
common = dict(patch_size=4, num_layers=2, num_heads=2, hidden_dim=16)
backbones = dict(
    vit=lambda: M.ViTBackbone(image_shape=(16, 16, 3), mlp_dim=32, layer_norm_epsilon=1e-5,
                              **common),
    deit=lambda: M.DeiTBackbone(image_shape=(16, 16, 3), intermediate_dim=32, **common),
    dinov2=lambda: M.DINOV2Backbone(intermediate_dim=32, num_register_tokens=2,
                                    image_shape=(16, 16, 3), position_embedding_shape=(16, 16, 3),
                                    **common),
    # Its table kept at another size, resampled to the images' when loaded.
    dinov2_resampled=lambda: M.DINOV2Backbone(intermediate_dim=32, image_shape=(16, 16, 3),
                                              position_embedding_shape=(28, 28, 3), **common),
    dinov3=lambda: M.DINOV3Backbone(intermediate_dim=32, num_register_tokens=3,
                                    image_shape=(16, 16, 3), rope_theta=50.0, **common),
    # S+ and H+: a gated MLP, SiLU.
    dinov3_gated=lambda: M.DINOV3Backbone(intermediate_dim=24, image_shape=(16, 16, 3),
                                          use_gated_mlp=True, hidden_activation="silu", **common),
    siglip=lambda: M.SigLIPVisionEncoder(intermediate_dim=32, image_shape=(16, 16, 3), **common),
)
rng = np.random.default_rng(0)
x = rng.normal(size=(2, 16, 16, 3)).astype("float32")
np.save(os.path.join(root, "images.npy"), x)
for name, make in backbones.items():
    backbone = make()
    for weight in backbone.weights:  # non-trivial values everywhere (LayerScale, norms)
        if weight.dtype.startswith("float"):
            weight.assign(weight.numpy() + 0.3 * rng.normal(size=weight.shape))
    folder = os.path.join(root, name)
    backbone.save_to_preset(folder)
    backbone = M.Backbone.from_preset(folder)  # what a user of the folder gets
    np.save(os.path.join(folder, "outputs.npy"), keras.ops.convert_to_numpy(backbone(x)))
# A preset with its image converter: ImageNet's mean and std.
std, mean = np.array([0.229, 0.224, 0.225]), np.array([0.485, 0.456, 0.406])
keras_hub.layers.ViTImageConverter(
    image_size=(16, 16), scale=list(1 / (255 * std)), offset=list(-mean / std)
).save_to_preset(os.path.join(root, "vit"))
"""


@artifact_maker("keras_hub_references", __file__)
def _make_references(root):
    run_python(REFERENCE.format(root=root), backend="torch", timeout=600)


@pytest.fixture(scope="module")
def references(tmp_path_factory):
    return shared_artifact("keras_hub_references", _make_references, tmp_path_factory)


def _features(model, name):
    """The output of the model's `name` layer (keras-hub backbones end at the last LayerNorm)."""
    return keras.Model(model.input, model.get_layer(name).output)


def test_the_five_backbones_presets_load_with_keras_hubs_outputs(references):
    x = np.load(os.path.join(references, "images.npy"))
    errors = {}
    for family in FAMILIES:
        folder = os.path.join(references, family)
        model = from_checkpoint(folder, include_rescaling=False)
        output = "map_head" if family == "siglip" else "encoder_norm"
        got = _features(model, output).predict(x, verbose=0)
        errors[family] = float(np.abs(got - np.load(os.path.join(folder, "outputs.npy"))).max())
    print(f"max abs error vs keras-hub: {errors}")
    assert max(errors.values()) <= 1e-5, errors
    # What the configs say: registers, rotation base, epsilon, GELU form.
    dinov3 = from_checkpoint(os.path.join(references, "dinov3"))
    assert dinov3.get_layer("rotary_embedding").base == 50.0
    assert dinov3.get_layer("register_tokens").num_tokens == 3
    assert (
        from_checkpoint(os.path.join(references, "dinov2")).get_layer("register_tokens").num_tokens
        == 2
    )
    vit_block = from_checkpoint(os.path.join(references, "vit")).get_layer("encoderblock_0")
    assert (vit_block.layer_norm_epsilon, vit_block.approximate_gelu) == (1e-5, False)
    gated = from_checkpoint(os.path.join(references, "dinov3_gated")).get_layer("encoderblock_0")
    assert gated.mlp == "swiglu"
    siglip_block = from_checkpoint(os.path.join(references, "siglip")).get_layer("encoderblock_0")
    assert siglip_block.approximate_gelu  # its "gelu_approximate"


def test_a_presets_image_converter_is_its_pixels_and_a_builder_takes_the_folder(references):
    folder = os.path.join(references, "vit")
    scale = np.asarray(from_checkpoint(folder).get_layer("rescaling").scale)
    np.testing.assert_allclose(scale, 1 / (255 * np.array([0.229, 0.224, 0.225])))
    # Without one, the family's own pixels (DINOv3's presets: ImageNet's).
    scale = np.asarray(
        from_checkpoint(os.path.join(references, "dinov3")).get_layer("rescaling").scale
    )
    np.testing.assert_allclose(scale, 1 / (255 * np.array([0.229, 0.224, 0.225])))
    built = keras_vit.ViT(
        **ARCH,
        weights=folder,
        include_top=False,
        include_rescaling=False,
        pooling=None,
    )
    x = np.load(os.path.join(references, "images.npy"))
    expected = np.load(os.path.join(folder, "outputs.npy"))
    assert np.abs(built.predict(x, verbose=0) - expected).max() <= 1e-5
    with pytest.raises(ValueError, match=r"layer_norm_epsilon=1e-06 contradicts"):
        keras_vit.ViT(**ARCH, weights=folder, layer_norm_epsilon=1e-6)


WRITTEN = dict(
    vit=dict(layer_norm_epsilon=1e-5),
    deit=dict(distillation_token=True),
    dinov2=dict(num_register_tokens=2, layer_scale_init=0.5),
    dinov3=dict(
        num_register_tokens=2,
        layer_scale_init=0.5,
        position_embedding="rope",
        rope_base=50.0,
        layer_norm_epsilon=1e-5,
    ),
    dinov3_gated=dict(num_register_tokens=4, position_embedding="rope", mlp="swiglu"),
    siglip=dict(class_token=False, pooling="map", approximate_gelu=True),
)


def test_save_to_preset_writes_what_keras_hub_loads_with_the_same_outputs(tmp_path):
    keras.utils.set_random_seed(1)  # the same models every run
    rng = np.random.default_rng(1)
    x = rng.normal(size=(2, 16, 16, 3)).astype("float32")
    np.save(tmp_path / "images.npy", x)
    expected, classes = {}, {}
    for family, settings in WRITTEN.items():
        model = keras_vit.ViT(
            **ARCH,
            input_shape=(16, 16, 3),
            include_top=False,
            **{"approximate_gelu": False, **settings},
        )
        for weight in model.weights:
            weight.assign(weight.numpy() + 0.3 * rng.normal(size=weight.shape))
        classes[family] = model.save_to_preset(tmp_path / family)
        features = _features(model, "map_head" if family == "siglip" else "encoder_norm")
        # (keras-hub's backbones take the pixels its image converter gives.)
        pixels = keras.ops.convert_to_numpy(model.get_layer("rescaling")(x))
        expected[family] = features.predict(x, verbose=0)
        np.save(tmp_path / f"{family}_pixels.npy", pixels)
        # keras_vit reads its own preset back.
        again = _features(
            from_checkpoint(tmp_path / family), "map_head" if family == "siglip" else "encoder_norm"
        )
        np.testing.assert_allclose(again.predict(x, verbose=0), expected[family], atol=1e-6)
    assert classes == {
        "vit": "ViTBackbone",
        "deit": "DeiTBackbone",
        "dinov2": "DINOV2Backbone",
        "dinov3": "DINOV3Backbone",
        "dinov3_gated": "DINOV3Backbone",
        "siglip": "SigLIPVisionEncoder",
    }
    outputs = run_python(
        f"""
        import json, numpy as np, keras, keras_hub
        result = {{}}
        for family in {list(WRITTEN)!r}:
            folder = {str(tmp_path)!r} + "/" + family
            backbone = keras_hub.models.Backbone.from_preset(folder)
            pixels = np.load(folder + "_pixels.npy")
            # (Deserialized as `from_preset` does: SigLIP's converter class names
            # the two-tower backbone, so `ImageConverter.from_preset` finds none
            # for a vision encoder's folder, keras-hub's own too.)
            with open(folder + "/image_converter.json") as f:
                converter = keras.saving.deserialize_keras_object(json.load(f))
            images = np.load({str(tmp_path)!r} + "/images.npy")
            converted = keras.ops.convert_to_numpy(converter(images))
            np.save(folder + "_theirs.npy", keras.ops.convert_to_numpy(backbone(pixels)))
            result[family] = [type(backbone).__name__, float(np.abs(converted - pixels).max())]
        print(json.dumps(result))
        """,
        backend="torch",
    )
    loaded = json.loads(outputs.strip().splitlines()[-1])
    errors = {}
    for family in WRITTEN:
        assert loaded[family][0] == classes[family]
        assert loaded[family][1] <= 1e-4, loaded  # the converter normalises as the model
        theirs = np.load(tmp_path / f"{family}_theirs.npy")
        errors[family] = float(np.abs(theirs - expected[family]).max())
    print(f"max abs error, keras-hub on keras_vit's presets: {errors}")
    assert max(errors.values()) <= 1e-5, errors


@pytest.mark.parametrize(
    "settings, part",
    [
        (dict(stem_filters=(8,)), r"a convolutional stem \(stem_filters="),
        (dict(input_shape=(None, None, 3)), r"images of any size"),
        (dict(mlp="swiglu", approximate_gelu=False), r"a gated MLP \(mlp='swiglu'\)"),
        (dict(approximate_gelu=True), r"tanh GELU \(approximate_gelu=True\)"),
    ],
)
def test_a_model_without_a_keras_hub_equivalent_is_refused_naming_the_part(
    tmp_path, settings, part
):
    model = keras_vit.ViT(**{**ONE_BLOCK, **settings})
    with pytest.raises(ValueError, match=part):
        model.save_to_preset(tmp_path / "preset")
    assert not (tmp_path / "preset").exists()  # refused before anything is written


def test_a_quantized_or_lora_model_is_refused_and_a_merged_one_written(tmp_path):
    quantized = keras_vit.ViT(**ONE_BLOCK)
    quantized.quantize("int8")
    with pytest.raises(ValueError, match=r"it is quantized"):
        quantized.save_to_preset(tmp_path / "quantized")
    adapted = keras_vit.ViT(**ONE_BLOCK)
    adapted.enable_lora(2)
    with pytest.raises(ValueError, match=r"has LoRA adapters: merge them first"):
        adapted.save_to_preset(tmp_path / "lora")
    assert not (tmp_path / "quantized").exists() and not (tmp_path / "lora").exists()
    merged = keras_vit.models.merge_lora(adapted)
    assert merged.save_to_preset(tmp_path / "merged") == "ViTBackbone"
    np.testing.assert_allclose(
        _features(from_checkpoint(tmp_path / "merged"), "encoder_norm").predict(
            np.zeros((1, 16, 16, 3)), verbose=0
        ),
        _features(merged, "encoder_norm").predict(np.zeros((1, 16, 16, 3)), verbose=0),
        atol=1e-6,
    )


def test_a_folder_with_files_is_not_written_into(tmp_path):
    folder = tmp_path / "preset"
    folder.mkdir()
    (folder / "notes.txt").write_text("mine")
    model = keras_vit.ViT(**ONE_BLOCK)
    with pytest.raises(ValueError, match=r"exists and is not an empty folder"):
        model.save_to_preset(folder)
    assert os.listdir(folder) == ["notes.txt"]
