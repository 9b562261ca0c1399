"""A keras_vit model as a keras-hub preset: `model.save_to_preset(DIR)`.

keras-hub's `Backbone.from_preset(DIR)` reads three files: `config.json`
(the backbone's class and configuration, as `keras.saving` serializes it),
`model.weights.h5` (the weights as Keras saves them, grouped by each layer's
place in its parent) and `metadata.json`. This module writes them for the
backbone that computes what the model's encoder computes, chosen by its parts
(`backbone_of`); the weights' places are the reader's table read backwards
(`keras_vit.weights.converters.keras_hub`). Writing needs no keras-hub.

A keras-hub backbone ends at the encoder's last LayerNorm (SigLIP's at its
pooling head): the preset holds the model's encoder and, as keras-hub's
`image_converter.json`, its pixel normalisation; a classifier's head and
`pre_logits` layer are not part of a backbone and are not written.
"""

import datetime
import importlib.metadata
import json
import os
import re

import h5py
import keras
import numpy as np

from keras_vit import _compat
from keras_vit.models import lora
from keras_vit.models.image_input import pixel_rescaling
from keras_vit.models.parts import arguments_of
from keras_vit.weights.converters import keras_hub

# The modules keras-hub registers its classes from (`config.json`'s "module").
_MODULES = {
    "ViTBackbone": ("vit.vit_backbone", "vit.vit_image_converter", "ViTImageConverter"),
    "DeiTBackbone": ("deit.deit_backbone", "deit.deit_image_converter", "DeiTImageConverter"),
    "DINOV2Backbone": (
        "dinov2.dinov2_backbone",
        "dinov2.dinov2_image_converter",
        "DINOV2ImageConverter",
    ),
    "DINOV3Backbone": (
        "dinov3.dinov3_backbone",
        "dinov3.dinov3_image_converter",
        "DINOV3ImageConverter",
    ),
    "SigLIPVisionEncoder": (
        "siglip.siglip_vision_encoder",
        "siglip.siglip_image_converter",
        "SigLIPImageConverter",
    ),
}


def _snake_case(name):
    """A class name as Keras names its objects (`ViTBackbone` -> `vi_t_backbone`)."""
    name = re.sub("(.)([A-Z][a-z]+)", r"\1_\2", name)
    return re.sub("([a-z0-9])([A-Z])", r"\1_\2", name).lower()


def _refuse(model, what):
    raise ValueError(
        f"Model {model.name!r} has no keras-hub backbone equivalent: {what}. keras-hub's "
        "ViT, DeiT, DINOv2, DINOv3 and SigLIP backbones are plain pre-norm ViTs of one image "
        "size with a patch-embedding convolution."
    )


def backbone_of(model):
    """`(class_name, config)`: the keras-hub backbone that computes the model's encoder.

    Raises:
        ValueError: naming the part of the model that no keras-hub backbone has.
    """
    a = arguments_of(model.parts)
    if model.qat is not None:
        _refuse(model, f"it simulates LiteRT's quantization (qat={model.qat!r})")
    if any(layer.quantization_mode for layer in _compat.all_layers(model)):
        _refuse(model, "it is quantized (model.quantize); save the float model")
    if lora.lora_settings(model) is not None:
        raise ValueError(
            f"Model {model.name!r} has LoRA adapters: merge them first "
            "(keras_vit.models.merge_lora(model)) and save the merged model."
        )
    if a["stem_filters"] is not None:
        _refuse(model, f"a convolutional stem (stem_filters={a['stem_filters']!r})")
    if None in a["input_shape"][:2] or a["pad_to_patches"]:
        _refuse(model, f"images of any size (input_shape={a['input_shape']!r}); build it at one")
    if a["data_format"] != "channels_last":
        _refuse(model, f"data_format={a['data_format']!r}")
    rope = a["position_embedding"] == "rope"
    if a["mlp"] != "gelu" and not rope:
        _refuse(model, f"a gated MLP (mlp={a['mlp']!r}) without rotary positions (DINOv3's)")
    patch = a["patch_size"][0]
    size = tuple(a["input_shape"])
    common = dict(num_layers=a["num_layers"], num_heads=a["num_heads"], hidden_dim=a["hidden_dim"])
    siglip = a["pooling"] == "map" and not a["class_token"]
    if a["approximate_gelu"] and a["mlp"] == "gelu" and not siglip:
        _refuse(model, "tanh GELU (approximate_gelu=True) outside a SigLIP-shaped model")
    if a["pooling"] == "map" and not siglip:
        _refuse(model, "attention pooling (pooling='map') beside a class token")
    if siglip:
        if a["num_register_tokens"] or a["layer_scale_init"] is not None:
            _refuse(model, "registers or LayerScale in a SigLIP-shaped model")
        return "SigLIPVisionEncoder", dict(
            patch_size=patch,
            **common,
            intermediate_dim=a["mlp_dim"],
            intermediate_activation="gelu_approximate" if a["approximate_gelu"] else "gelu",
            layer_norm_epsilon=a["layer_norm_epsilon"],
            image_shape=size,
        )
    if not a["class_token"]:
        _refuse(model, "no class token, and no attention pooling (pooling='map')")
    dinov2_like = a["num_register_tokens"] or a["layer_scale_init"] is not None
    if rope or dinov2_like:
        if a["distillation_token"]:
            _refuse(model, "a distillation token beside registers or LayerScale")
        epsilon = a["layer_norm_epsilon"]
        if not rope and epsilon != 1e-6:
            _refuse(model, f"DINOv2's LayerNorm epsilon is 1e-6 (layer_norm_epsilon={epsilon!r})")
        config = dict(
            patch_size=patch,
            **common,
            intermediate_dim=a["mlp_dim"],
            layer_scale_init_value=1.0,
            num_register_tokens=a["num_register_tokens"],
            use_mask_token=True,
            image_shape=size,
            apply_layernorm=False,
        )
        if rope:
            gated = a["mlp"] == "swiglu"
            config.update(
                layer_norm_eps=a["layer_norm_epsilon"],
                rope_theta=a["rope_base"],
                use_gated_mlp=gated,
                hidden_activation="silu" if gated else "gelu",
            )
            return "DINOV3Backbone", config
        config.update(
            position_embedding_shape=size,
            antialias_in_interpolation=a["resample_method"] == "bicubic_antialias",
        )
        return "DINOV2Backbone", config
    if a["distillation_token"]:
        return "DeiTBackbone", dict(
            image_shape=size,
            patch_size=patch,
            **common,
            intermediate_dim=a["mlp_dim"],
            layer_norm_epsilon=a["layer_norm_epsilon"],
        )
    return "ViTBackbone", dict(
        image_shape=size,
        patch_size=a["patch_size"],
        **common,
        mlp_dim=a["mlp_dim"],
        layer_norm_epsilon=a["layer_norm_epsilon"],
    )


def _tensors(model, class_name, config):
    """`{h5 group: [variables]}` of the backbone, from the model's weights."""
    canonical = {w.path: keras.ops.convert_to_numpy(w) for w in model.weights}
    hidden = config["hidden_dim"]
    if class_name in ("DINOV2Backbone", "DINOV3Backbone"):
        for index in range(config["num_layers"]):  # LayerScale of ones: none
            for scale in ("attention_scale", "mlp_scale"):
                canonical.setdefault(
                    f"encoderblock_{index}/{scale}/gamma", np.ones(hidden, "float32")
                )
        canonical.setdefault(
            "register_tokens/tokens",
            np.zeros((1, config["num_register_tokens"], hidden), "float32"),
        )
    # Pre-training's mask token (unused by a backbone), and the table of
    # DINOv2's image size (its source table's own: one size).
    canonical[keras_hub.MASK_TOKEN] = np.zeros(
        (1, hidden) if class_name == "DINOV2Backbone" else (1, 1, hidden), "float32"
    )
    canonical[keras_hub.RESAMPLED_TABLE] = canonical.get("position_embedding/embeddings")
    groups = keras_hub.to_preset_tensors(canonical, class_name, config, config["num_layers"])
    return {group: values for group, values in groups.items() if values}


def _serialized(module, class_name, config, name):
    return {
        "module": f"keras_hub.src.models.{module}",
        "class_name": class_name,
        "config": {
            "name": name,
            "trainable": True,
            "dtype": {
                "module": "keras",
                "class_name": "DTypePolicy",
                "config": {"name": "float32"},
                "registered_name": None,
            },
            **config,
        },
        "registered_name": f"keras_hub>{class_name}",
    }


def save_to_preset(model, preset_dir):
    """Writes the model's encoder as a keras-hub backbone preset in `preset_dir`.

    `keras_hub.models.Backbone.from_preset(preset_dir)` builds the backbone
    that computes the model's encoder (a `ViTBackbone`, `DeiTBackbone`,
    `DINOV2Backbone`, `DINOV3Backbone` or `SigLIPVisionEncoder`, from the
    model's parts), with its weights; its `image_converter.json` holds the
    model's pixel normalisation (`keras_hub.layers.ImageConverter.from_preset`).
    `keras_vit.from_checkpoint(preset_dir)` reads it back. The classifier
    head is not part of a backbone and is not written.

    Args:
        model: a `VisionTransformer` (float, fixed image size, a patch
            embedding convolution; LoRA merged).
        preset_dir: a folder that does not exist yet or is empty.

    Returns:
        The backbone's class name (`"ViTBackbone"`, ...).

    Raises:
        ValueError: before anything is written, naming the model's part that
            no keras-hub backbone has (a convolutional stem, images of any
            size, a gated MLP, quantization), or a folder that holds files.

    Example:

    ```python
    model = keras_vit.ViTB16(weights="imagenet")
    model.save_to_preset("vit_b16_preset")
    backbone = keras_hub.models.Backbone.from_preset("vit_b16_preset")
    ```
    """
    preset_dir = os.fspath(preset_dir)
    if os.path.exists(preset_dir) and (not os.path.isdir(preset_dir) or os.listdir(preset_dir)):
        raise ValueError(
            f"preset_dir={preset_dir!r} exists and is not an empty folder: nothing in it is "
            "replaced. Choose a new folder."
        )
    class_name, config = backbone_of(model)
    groups = _tensors(model, class_name, config)
    module, converter_module, converter = _MODULES[class_name]
    os.makedirs(preset_dir, exist_ok=True)
    with h5py.File(os.path.join(preset_dir, "model.weights.h5"), "w") as weights:
        for group, values in groups.items():
            variables = weights.create_group(f"{group}/vars")
            for index, value in enumerate(values):
                variables.create_dataset(str(index), data=np.asarray(value))
    with open(os.path.join(preset_dir, "config.json"), "w") as f:
        json.dump(_serialized(module, class_name, config, _snake_case(class_name)), f, indent=4)
    rescaling = pixel_rescaling(model.parts["image"].normalization, config["image_shape"][-1])
    if not model.parts["image"].include_rescaling:
        rescaling = {"scale": None, "offset": None}  # the model takes normalised images
    converter_config = dict(
        image_size=list(config["image_shape"][:2]),
        scale=rescaling["scale"],
        offset=rescaling["offset"],
        interpolation="bilinear",
        antialias=False,
        crop_to_aspect_ratio=True,
        pad_to_aspect_ratio=False,
        bounding_box_format="yxyx",
    )
    with open(os.path.join(preset_dir, "image_converter.json"), "w") as f:
        json.dump(
            _serialized(
                converter_module,
                converter,
                converter_config,
                _snake_case(converter),
            ),
            f,
            indent=4,
        )
    metadata = {
        "keras_version": keras.version(),
        "parameter_count": int(sum(np.size(v) for values in groups.values() for v in values)),
        "date_saved": datetime.datetime.now().strftime("%Y-%m-%d@%H:%M:%S"),
        "tasks": [],
    }
    try:
        metadata["keras_hub_version"] = importlib.metadata.version("keras-hub")
    except importlib.metadata.PackageNotFoundError:
        pass  # (written without keras-hub: the format of 0.32)
    with open(os.path.join(preset_dir, "metadata.json"), "w") as f:
        json.dump(metadata, f, indent=4)
    return class_name
