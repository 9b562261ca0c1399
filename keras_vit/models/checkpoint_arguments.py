"""What a checkpoint says of its model, as `VisionTransformer` arguments: the one place.

A checkpoint fixes an architecture (its shapes: patch size, width, depth,
heads, MLP width, input size, head) and computes one function (GELU form,
LayerNorm epsilon, pixel normalisation, class / distillation / register
tokens, LayerScale, pooling, `pre_logits`, how its position table moves to
another grid). This module reads both from a file (or a registered name's
entry), tells which of them the file records rather than its format's
convention, and resolves a builder's arguments against them: what the user
left unset is the checkpoint's, what the user set and contradicts it is an
error naming both. The builders and `from_checkpoint` resolve here first,
then construct a model that reads nothing, then load the weights
(`keras_vit.weights.load`).
"""

import os
import re

import numpy as np

from keras_vit import weights as checkpoints
from keras_vit.layers.patch_embedding import _pair
from keras_vit.layers.position_embedding import DEFAULT_RESAMPLE_METHOD
from keras_vit.models.image_input import (
    channels_last,
    in_data_format,
    resolve_data_format,
    same_normalization,
    validate_input_shape,
)
from keras_vit.models.parts import encoder_pooling
from keras_vit.models.variants import WIDTHS, variant_name
from keras_vit.weights.converters import huggingface, to_canonical
from keras_vit.weights.readers import CHECKPOINT_SUFFIXES, read_json_beside, read_tensors

ARCHITECTURE = ("patch_size", "hidden_dim", "num_layers", "num_heads", "mlp_dim")
# What the encoder computes: with `weights=`, the checkpoint's, and a set value
# that contradicts what the file records is an error.
ENCODER_FUNCTION = (
    "normalization",
    "class_token",
    "distillation_token",
    "num_register_tokens",
    "layer_scale_init",
    "approximate_gelu",
    "layer_norm_epsilon",
    "mlp",
    "position_embedding",
    "rope_base",
)
# The head's shape, its class count, and how (and for which image size) the
# position table moves to other grids: the checkpoint's unless set; a set one
# is the user's choice (another head, the table resampled).
HEAD_AND_TABLE = ("pooling", "representation_size", "classes", "resample_method", "base_image_size")
# What a builder given `weights=` takes from the checkpoint unless set.
FROM_CHECKPOINT = frozenset(ENCODER_FUNCTION + HEAD_AND_TABLE)

# The paper's head count of each width: for files that record no head count.
_HEADS_BY_WIDTH = {hidden_dim: heads for hidden_dim, _, heads, _ in WIDTHS.values()}
# Tensors of architectures that keras_vit does not build (yet): loading
# them into a plain ViT would silently change the model's outputs.
_UNSUPPORTED = {"reg_token": "timm register tokens (timm's own position-embedding rules)"}
# What a checkpoint's tensors themselves show (token layout, LayerScale, head).
_SHOWN_BY_TENSORS = (
    "class_token",
    "distillation_token",
    "num_register_tokens",
    "layer_scale_init",
    "mlp",
    "pooling",
    "representation_size",
)
# What a keras_vit `.keras` file's `VisionTransformer` configuration says that
# its tensors' shapes do not.
_KERAS_VIT_FUNCTION = (
    "approximate_gelu",
    "layer_norm_epsilon",
    "position_embedding",
    "resample_method",
    "rope_base",
    "pooling",
    "include_rescaling",
)
# The builder arguments that a checkpoint's shapes fix, and the weight that shows each.
_ARCHITECTURE_WEIGHTS = {
    "patch_size": "patch_embedding/kernel",
    "hidden_dim": "patch_embedding/kernel",
    "mlp_dim": "encoderblock_0/mlp_dense_1/kernel",
    "num_heads": "encoderblock_0/attention/qkv/kernel",
    "num_layers": "encoderblock_{last}",
}


def checked_path(path, argument):
    """The local path of a checkpoint file (a `hf-hub:` id downloaded once, a keras-hub
    preset folder's weights file), or a clear error."""
    path = os.fspath(checkpoints.checkpoint_file(path))
    preset = checkpoints.readers.is_keras_hub_preset(path)
    if not preset and (not os.path.isfile(path) or not path.endswith(CHECKPOINT_SUFFIXES)):
        raise ValueError(
            f"{argument}={path!r} is not an existing checkpoint file ending in one "
            f"of {', '.join(CHECKPOINT_SUFFIXES)}, nor a keras-hub preset folder."
        )
    return path


# --- A file's architecture and function -------------------------------------------------


def _shapes(path, tensors):
    """What the tensors show: width, depth, patch, grid, tokens, LayerScale, head."""
    for name in tensors:
        for marker, what in _UNSUPPORTED.items():
            if marker in name:
                raise ValueError(
                    f"{path!r} is a ViT with {what} ({name!r}), which keras_vit does not build."
                )
    layout, shapes = to_canonical(tensors, num_heads=1, path=path)
    if "patch_embedding/kernel" not in shapes:
        raise ValueError(f"{path!r} has no patch embedding kernel.")
    distillation_token = "distillation_token/token" in shapes
    if distillation_token and "head/kernel" in shapes and "head_dist/kernel" not in shapes:
        raise ValueError(
            f"{path!r} is a DeiT with a distillation token but one head "
            "(DeiTForImageClassification); keras_vit builds distilled DeiTs "
            "with both heads (DeiTForImageClassificationWithTeacher). Use the "
            "checkpoint without its head (`keras_vit.weights.load` into a "
            "model with include_top=False)."
        )
    patch_h, patch_w, channels, hidden_dim = shapes["patch_embedding/kernel"].shape
    depth = 1 + max(
        (int(m[1]) for k in shapes if (m := re.match(r"encoderblock_(\d+)/", k))),
        default=-1,
    )
    if depth == 0 or not {
        "encoderblock_0/mlp_dense_1/kernel",
        "encoderblock_0/mlp_dense_2/kernel",
    } <= set(shapes):
        raise ValueError(f"{path!r} has no encoder blocks.")
    class_token = "class_token/token" in shapes
    mlp_dim = int(shapes["encoderblock_0/mlp_dense_2/kernel"].shape[0])
    # A gated MLP's first kernel holds the gate's and the up projection's outputs.
    gated = shapes["encoderblock_0/mlp_dense_1/kernel"].shape[1] == 2 * mlp_dim
    input_shape = None  # (a model of rotary positions: its config's)
    if "position_embedding/embeddings" in shapes:
        positions = (
            shapes["position_embedding/embeddings"].shape[1]
            - int(class_token)
            - int(distillation_token)
        )
        grid = int(round(positions**0.5))
        if grid * grid != positions and layout != "keras_vit":  # (its config has the shape)
            raise ValueError(f"{path!r}: {positions} position embeddings are not a square grid.")
        input_shape = (grid * patch_h, grid * patch_w, int(channels))
    arguments = {
        "patch_size": (patch_h, patch_w) if patch_h != patch_w else int(patch_h),
        "hidden_dim": int(hidden_dim),
        "num_layers": depth,
        "num_heads": None,
        "mlp_dim": mlp_dim,
        "mlp": "swiglu" if gated else "gelu",
        "input_shape": input_shape,
        "class_token": class_token,
        "distillation_token": distillation_token,
        "num_register_tokens": (
            int(shapes["register_tokens/tokens"].shape[1])
            if "register_tokens/tokens" in shapes
            else 0
        ),
        "pooling": "map" if "map_head/probe" in shapes else encoder_pooling(class_token),
        "include_top": "head/kernel" in shapes,
        "representation_size": (
            int(shapes["pre_logits/kernel"].shape[1]) if "pre_logits/kernel" in shapes else None
        ),
        "layer_scale_init": 1.0 if "encoderblock_0/attention_scale/gamma" in shapes else None,
    }
    if layout in ("official", "big_vision", "keras_vit"):  # kernels with a head axis
        arguments["num_heads"] = int(shapes["encoderblock_0/attention/qkv/kernel"].shape[2])
    if arguments["include_top"]:
        arguments["classes"] = int(shapes["head/kernel"].shape[1])
        if class_token and shapes["head/kernel"].shape[0] == 2 * hidden_dim:
            arguments["pooling"] = "token_gap"  # DINOv2's classifiers
    return layout, arguments


def _official_function(path, arguments):
    """The official code's: tanh GELU, LayerNorm epsilon 1e-6, pixels in [-1, 1]."""
    del path
    return arguments, set()


# Hugging Face's GELUs: the exact one, then the tanh approximations.
_GELUS = ("gelu", "gelu_new", "gelu_pytorch_tanh", "gelu_fast")


def _huggingface_function(path, arguments):
    """The GELU form, LayerNorm epsilon and pixel normalisation of the file's configs."""
    config = huggingface.vision_config(path)
    recorded = set()
    activation = config.get("hidden_act", "gelu")
    expected = ("silu", "swish") if arguments["mlp"] == "swiglu" else _GELUS
    if activation not in expected:
        raise ValueError(
            f"{path!r}: its config's hidden_act={activation!r} is not what keras_vit builds for "
            f"its MLP (mlp={arguments['mlp']!r}: one of {expected})."
        )
    arguments["approximate_gelu"] = activation in _GELUS[1:]
    arguments["layer_norm_epsilon"] = float(config.get("layer_norm_eps", 1e-12))
    recorded.update(
        name
        for name, key in (
            ("approximate_gelu", "hidden_act"),
            ("layer_norm_epsilon", "layer_norm_eps"),
        )
        if key in config
    )
    if config.get("model_type") in huggingface.ROTARY_MODEL_TYPES:
        size = config.get("image_size", 224)
        size = tuple(size) if isinstance(size, (list, tuple)) else (size, size)
        arguments["input_shape"] = (*size, int(config.get("num_channels", 3)))
        arguments["position_embedding"] = "rope"
        arguments["rope_base"] = float(config.get("rope_theta", 100.0))
        recorded.update(("position_embedding", "rope_base"))
    preprocessor = read_json_beside(path, "preprocessor_config.json")
    if "image_mean" in preprocessor:
        arguments["normalization"] = (preprocessor["image_mean"], preprocessor["image_std"])
        recorded.add("normalization")
    elif config.get("model_type") in huggingface.IMAGENET_MODEL_TYPES:
        arguments["normalization"] = "imagenet"
        recorded.add("normalization")
    return arguments, recorded


def _timm_function(path, arguments):
    """Exact GELU, and the pixel mean/std of the `config.json` beside the file."""
    arguments["approximate_gelu"] = False
    pretrained = read_json_beside(path, "config.json").get("pretrained_cfg", {})
    if "mean" in pretrained:
        arguments["normalization"] = (pretrained["mean"], pretrained["std"])
        return arguments, {"normalization"}
    return arguments, set()


def _listed(value):
    """JSON's lists back to the tuples the builder was given."""
    return tuple(_listed(v) for v in value) if isinstance(value, list) else value


def _table_image_size(grid_size, patch_size, stem_filters, stem_strides):
    """The image size that a position table of `grid_size` was laid out for."""
    stride = int(np.prod(stem_strides or [2] * len(stem_filters or ())))
    return tuple(int(g) * int(p) * stride for g, p in zip(grid_size, patch_size))


def _built_model_function(built, arguments):
    """A `VisionTransformer`'s configuration (its arguments, as built) over its shapes."""
    built = {name: _listed(value) for name, value in built.items()}
    # The shapes' input size: the position table's grid of patches (None: no table).
    table_pixels = arguments["input_shape"] and arguments["input_shape"][:2]
    arguments["input_shape"] = built["input_shape"]
    if built.get("data_format") == "channels_first":  # the images' shape, channels last
        channels, *size = built["input_shape"]
        arguments["input_shape"] = (*size, channels)
    # (A file of a version before an argument: its default.)
    arguments.update({name: built[name] for name in _KERAS_VIT_FUNCTION if name in built})
    # (A file of a version before the option pads nothing.)
    arguments["pad_to_patches"] = built.get("pad_to_patches", False)
    if built["input_shape"][0] is None:  # a model of run-time resolution: its table's size
        arguments["base_image_size"] = built["base_image_size"]
        if table_pixels and not arguments["base_image_size"]:
            arguments["base_image_size"] = _table_image_size(
                table_pixels, (1, 1), built["stem_filters"], built["stem_strides"]
            )
    if built["stem_filters"] is not None:
        for name in ("stem_filters", "stem_strides", "stem_downsampling"):
            arguments[name] = built[name]
    if built["include_rescaling"]:
        arguments["normalization"] = built["normalization"]
    return arguments


def _graph_function(configs, arguments):
    """A functional graph's layer configs (a pre-training model, an earlier version's file)."""
    # The image input (a pre-training model has mask inputs too).
    batch_shape = configs.get("images", {}).get("batch_shape") or next(
        (c["batch_shape"] for c in configs.values() if "batch_shape" in c), None
    )
    if batch_shape:
        arguments["input_shape"] = tuple(batch_shape[1:])
        if "channels_last" in configs:  # a channels-first model's graph
            channels, *size = arguments["input_shape"]
            arguments["input_shape"] = (*size, channels)
    positions = configs.get("position_embedding", {})
    if "resample_method" in positions:
        arguments["resample_method"] = positions["resample_method"]
    if arguments["input_shape"][0] is None and "grid_size" in positions:
        # A model of run-time resolution: its table's image size.
        stem = configs.get("stem", {})
        arguments["base_image_size"] = _table_image_size(
            positions["grid_size"],
            configs.get("patch_embedding", {}).get("patch_size", (1, 1)),
            stem.get("filters"),
            stem.get("strides"),
        )
    block = configs.get("encoderblock_0", {})
    arguments["approximate_gelu"] = block.get("approximate_gelu", True)
    arguments["layer_norm_epsilon"] = block.get("layer_norm_epsilon", 1e-6)
    arguments["position_embedding"] = positions.get("kind", "learned")
    if "rotary_embedding" in configs:
        arguments["position_embedding"] = "rope"
        arguments["rope_base"] = configs["rotary_embedding"]["base"]
    if "stem" in configs:
        arguments["stem_filters"] = tuple(configs["stem"]["filters"])
        arguments["stem_strides"] = tuple(configs["stem"].get("strides") or ()) or None
        arguments["stem_downsampling"] = configs["stem"].get("downsampling", "convolution")
    pooling = configs.get("pooling")
    arguments["pooling"] = "map" if "map_head" in configs else pooling["mode"] if pooling else None
    rescaling = configs.get("rescaling")
    arguments["include_rescaling"] = rescaling is not None
    if rescaling is not None:
        arguments["normalization"] = _mean_and_std(
            rescaling["scale"], rescaling["offset"], arguments["input_shape"][-1]
        )
    return arguments


def _mean_and_std(scale, offset, channels):
    """The `(mean, std)` of `[0, 255]` pixels rescaled as `x * scale + offset`."""
    scale = np.broadcast_to(np.asarray(scale, "float64"), (channels,))
    offset = np.broadcast_to(np.asarray(offset, "float64"), (channels,))
    std = 1.0 / (255.0 * scale)
    return tuple(-offset * std), tuple(std)


def _keras_vit_function(path, arguments):
    """A keras_vit `.keras` file: its configuration records the whole function."""
    saved = checkpoints.readers.keras_model_config(path)
    if "layers" not in saved["config"]:  # a VisionTransformer: its arguments, as built
        arguments = _built_model_function(saved["config"], arguments)
    else:
        configs = checkpoints.readers.keras_layer_configs(saved, path)
        arguments = _graph_function(configs, arguments)
    recorded = {"approximate_gelu", "layer_norm_epsilon", "normalization"}
    if arguments.get("position_embedding") == "rope":  # (a table's kind is a choice)
        recorded.update(("position_embedding", "rope_base"))
    return arguments, recorded


# keras-hub backbones: their settings' names for the epsilon, the pixels their
# presets are converted for (no image converter beside the backbone), and the
# settings of theirs that keras_vit does not build, with the value it builds.
_KERAS_HUB_EPSILON = {"DINOV3Backbone": "layer_norm_eps", "DINOV2Backbone": None}
_KERAS_HUB_PIXELS = {"ViTBackbone": "inception", "SigLIPVisionEncoder": "inception"}
_KERAS_HUB_UNBUILT = {
    "use_mha_bias": True,
    "use_mlp_bias": True,
    "use_patch_bias": True,
    "use_swiglu_ffn": False,
    "use_query_bias": True,
    "use_value_bias": True,
    "use_proj_bias": True,
    "data_format": "channels_last",
}


def _keras_hub_function(path, arguments):
    """A keras-hub preset: its backbone's config, and its image converter's pixels if saved."""
    saved = read_json_beside(path, "config.json")
    class_name, config = saved["class_name"], saved["config"]
    for name, built in _KERAS_HUB_UNBUILT.items():
        if config.get(name, built) not in (built, None):
            raise ValueError(
                f"{path!r}: a {class_name} with {name}={config[name]!r}, which keras_vit does "
                f"not build (only {name}={built!r})."
            )
    arguments["num_heads"] = int(config["num_heads"])
    arguments["input_shape"] = tuple(config["image_shape"])
    epsilon = _KERAS_HUB_EPSILON.get(class_name, "layer_norm_epsilon")
    arguments["layer_norm_epsilon"] = float(config[epsilon]) if epsilon else 1e-6
    activation = config.get("intermediate_activation", config.get("hidden_activation", "gelu"))
    expected = ("silu", "swish") if arguments["mlp"] == "swiglu" else ("gelu", "gelu_approximate")
    if activation not in expected:
        raise ValueError(
            f"{path!r}: its {class_name}'s MLP activation {activation!r} is not one that "
            f"keras_vit builds for its MLP (mlp={arguments['mlp']!r}: one of {expected})."
        )
    arguments["approximate_gelu"] = activation == "gelu_approximate"
    if class_name == "DINOV2Backbone":  # its table's size; resampled to its images' size
        arguments["base_image_size"] = tuple(config["position_embedding_shape"][:2])
        arguments["resample_method"] = (
            "bicubic_antialias" if config.get("antialias_in_interpolation") else "bicubic"
        )
    if class_name == "DINOV3Backbone":
        arguments["position_embedding"] = "rope"
        arguments["rope_base"] = float(config.get("rope_theta", 100.0))
    converter = read_json_beside(path, "image_converter.json").get("config", {})
    recorded = {"approximate_gelu", "layer_norm_epsilon", "position_embedding", "rope_base"}
    if converter.get("scale") is not None:
        arguments["normalization"] = _mean_and_std(
            converter["scale"], converter.get("offset") or 0.0, arguments["input_shape"][-1]
        )
        recorded.add("normalization")
    else:
        arguments["normalization"] = _KERAS_HUB_PIXELS.get(class_name, "imagenet")
    return arguments, recorded


_FUNCTION_OF_LAYOUT = {
    "official": _official_function,
    "big_vision": _official_function,  # Flax's: tanh GELU, epsilon 1e-6, pixels in [-1, 1]
    "huggingface": _huggingface_function,
    "timm": _timm_function,
    "keras_vit": _keras_vit_function,
    "keras_hub": _keras_hub_function,
}


def source_resample_method(path):
    """How the checkpoint's own code resamples its position grid (see `weights.load`)."""
    return huggingface.resample_method(path)


def file_arguments(path, num_heads=None):
    """What a checkpoint file's model is: `(layout, arguments, recorded)`.

    `arguments` are the `VisionTransformer` arguments that reproduce it (its
    shapes; its function: the file's configs, else its format's convention;
    the image size of its position table and how its own code resamples
    it); `recorded` the names of the function that the file records (its
    tensors, its `config.json` / `preprocessor_config.json`, a Keras model's
    configuration) rather than its format's convention: an official `.npz`
    was trained with tanh GELU and epsilon 1e-6, a timm file without config
    with exact GELU, which a builder's explicit argument may override. The
    head count is the file's, else `num_heads` (else `None`).
    """
    layout, arguments = _shapes(path, read_tensors(path))
    if arguments["num_heads"] is None:  # what the file records comes first
        config = huggingface.vision_config(path)
        arguments["num_heads"] = config.get("num_attention_heads") or num_heads
    arguments.update(approximate_gelu=True, layer_norm_epsilon=1e-6, normalization="inception")
    arguments, recorded = _FUNCTION_OF_LAYOUT[layout](path, arguments)
    if arguments["input_shape"] is None:
        raise ValueError(
            f"{path!r} has no position table, and its configs name no rotary position "
            "scheme (a config.json of a DINOv3 model beside it) that keras_vit builds."
        )
    recorded = recorded | set(_SHOWN_BY_TENSORS)
    arguments.setdefault("base_image_size", None)
    if arguments["base_image_size"] is None and None not in arguments["input_shape"][:2]:
        arguments["base_image_size"] = arguments["input_shape"][:2]
    arguments.setdefault("resample_method", source_resample_method(path))
    return layout, arguments, recorded


def checkpoint_architecture(path, num_heads=None, argument="path"):
    """The `VisionTransformer` arguments that reproduce a checkpoint file's model.

    What the file shows and records (see `file_arguments`); the head count of
    a file that records none (PyTorch layouts without `config.json`) is
    `num_heads`, else the paper's for the file's width.

    Args:
        path: a checkpoint file (official `.npz`, Hugging Face or timm
            `.safetensors`, `.bin` / `.pth` with torch, a keras_vit `.keras`).
        num_heads: the head count, where the file records none.
        argument: the name under which the caller took `path`, for errors.

    Returns:
        dict of `VisionTransformer` arguments.

    Example:

    ```python
    keras_vit.models.checkpoint_architecture("ViT-B_16.npz")["hidden_dim"]  # 768
    ```
    """
    path = checked_path(path, argument)
    _, arguments, _ = file_arguments(path, num_heads)
    if num_heads is not None and num_heads != arguments["num_heads"]:
        raise ValueError(
            f"num_heads={num_heads!r} contradicts the checkpoint {argument}={path!r}, whose "
            f"model has num_heads={arguments['num_heads']!r}. Leave num_heads unset."
        )
    if arguments["num_heads"] is None:
        width = arguments["hidden_dim"]
        if width not in _HEADS_BY_WIDTH:
            raise ValueError(
                f"{path!r}: the head count of a width-{width} ViT is not in the "
                "checkpoint, a config.json or the variant table; pass num_heads."
            )
        arguments["num_heads"] = _HEADS_BY_WIDTH[width]
    return arguments


def _registered_arguments(checkpoint):
    """What a registered checkpoint's entry says: the paper's function, its head, its size."""
    arguments = {
        "approximate_gelu": True,
        "layer_norm_epsilon": 1e-6,
        "normalization": checkpoint.normalization,
        "class_token": True,
        "distillation_token": False,
        "num_register_tokens": 0,
        "layer_scale_init": None,
        "representation_size": checkpoint.representation_size,
    }
    recorded = set(arguments)
    arguments.update(base_image_size=checkpoint.image_size, resample_method=DEFAULT_RESAMPLE_METHOD)
    return arguments, recorded


# --- A builder's arguments against a checkpoint ----------------------------------------


def _weight_shape(name, arguments):
    """The shape that the builder `arguments` give the weight that shows `name`."""
    patch_height, patch_width = _pair(arguments["patch_size"], "patch_size")
    width = arguments["hidden_dim"]
    if name in ("patch_size", "hidden_dim"):
        return (patch_height, patch_width, arguments["input_shape"][-1], width)
    if name == "mlp_dim":
        return (width, arguments["mlp_dim"])
    if name == "num_heads":
        return (width, 3, arguments["num_heads"], width // arguments["num_heads"])
    return None


def _check_architecture(source, weights, asked):
    """A checkpoint file whose shapes are not the model's: a `ValueError` naming both.

    `source` holds the file's architecture (its shapes); `asked` the
    builder's. Every difference is named, with the weight that shows it.
    """
    differences, ours = [], {**source, **asked}
    for name, value in asked.items():
        if name not in source:
            continue  # a registered name, or a Keras weights file: loading checks them
        theirs = source[name]
        if name == "patch_size":
            theirs, value = _pair(theirs, name), _pair(value, name)
        if theirs == value:
            continue
        weight = _ARCHITECTURE_WEIGHTS[name]
        if name == "num_layers":
            shown = (
                f"its last block is {weight.format(last=theirs - 1)!r}, the model's "
                f"{weight.format(last=value - 1)!r}"
            )
        else:
            shown = (
                f"its {weight!r} has shape {_weight_shape(name, source)}, the model's "
                f"{_weight_shape(name, ours)}"
            )
        differences.append((name, theirs, value, shown))
    if differences:
        raise ValueError(
            f"weights={os.fspath(weights)!r} holds a ViT of "
            + ", ".join(f"{name}={theirs!r}" for name, theirs, _, _ in differences)
            + ", not the "
            + ", ".join(f"{name}={value!r}" for name, _, value, _ in differences)
            + " of the model asked for: "
            + "; ".join(dict.fromkeys(shown for *_, shown in differences))  # each weight once
            + ". Build the model with "
            + ", ".join(f"{name}={theirs!r}" for name, theirs, _, _ in differences)
            + ", or let keras_vit.from_checkpoint read the whole architecture "
            "from the file."
        )


def _recorded_arguments(weights, variant, num_heads):
    """`(arguments, recorded)` of `weights=`: a registered name's entry, or a file's."""
    checkpoint = checkpoints.registered(weights, variant)
    if checkpoint is not None:
        return _registered_arguments(checkpoint)
    path = os.fspath(weights)
    if not path.endswith(CHECKPOINT_SUFFIXES) and not checkpoints.readers.is_keras_hub_preset(path):
        return {}, set()  # a Keras weights file: loading checks it
    _, arguments, recorded = file_arguments(path, num_heads)
    return arguments, recorded


def _function(given, source, recorded, weights, defaults, channels):
    """The function arguments of a model built with `weights=`.

    Arguments the user left unset take the checkpoint's values (`source`),
    else the constructor's `defaults`. A set one that contradicts what the
    checkpoint records of its encoder is a `ValueError` naming both; one
    that only departs from its format's convention (an official `.npz`
    records no GELU form) is the user's.
    """
    chosen = {}
    for name in FROM_CHECKPOINT - {"classes", "base_image_size"}:
        value = given.get(name)
        if name not in given or (name == "normalization" and value is None):
            chosen[name] = source.get(name, defaults[name])
            if chosen[name] is None and name in ("pooling", "normalization"):
                # A pre-training model's file pools nothing: a classifier's default.
                chosen[name] = defaults[name]
            continue
        chosen[name] = value
        if name not in ENCODER_FUNCTION or name not in recorded:
            continue  # another head, or departing from a format's convention: the user's
        theirs = source[name]
        if name == "layer_scale_init":
            agree = (value is None) == (theirs is None)  # its values come from the file
        elif name == "normalization":
            agree = same_normalization(value, theirs, channels)
        else:
            agree = value == theirs
        if not agree:
            raise ValueError(
                f"{name}={value!r} contradicts the checkpoint weights={os.fspath(weights)!r}, "
                f"whose model has {name}={theirs!r}. Leave {name} unset to build the "
                "checkpoint's function, or use another checkpoint."
            )
    return chosen


def resolve(weights, given, defaults):
    """The constructor arguments of a model built with `weights=`, checked against it.

    Reads what the checkpoint records (a registered name's entry, a file's
    shapes and configs): no download, no weight. A file whose shapes are
    not the architecture asked for is a `ValueError` naming the weights that
    show it.

    Args:
        weights: a local checkpoint file or a registered name.
        given: the constructor arguments the user set (by name).
        defaults: the constructor's defaults, for what neither sets.

    Returns:
        `(arguments, variant)`: the user's arguments with the checkpoint's
        values in place of those left unset, and the variant's name (for the
        registry; `None` outside the variant table).
    """
    arguments = dict(given)
    architecture = {name: given.get(name, defaults[name]) for name in ARCHITECTURE}
    patch_size = _pair(architecture["patch_size"], "patch_size")
    data_format = resolve_data_format(given.get("data_format"))
    variant = None
    if patch_size[0] == patch_size[1]:
        variant = variant_name(patch_size[0], *(architecture[n] for n in ARCHITECTURE[1:]))
    source, recorded = _recorded_arguments(weights, variant, architecture["num_heads"])
    asked = {name: architecture[name] for name in ("hidden_dim", "num_layers", "mlp_dim")}
    _check_architecture(
        source, weights, {"patch_size": patch_size, **asked, "num_heads": architecture["num_heads"]}
    )
    input_tensor = given.get("input_tensor")
    if given.get("input_shape") is None and input_tensor is None:
        checkpoint = checkpoints.registered(weights, variant)
        if checkpoint is not None:
            arguments["input_shape"] = (checkpoint.image_size, checkpoint.image_size, 3)
        elif "input_shape" in source:
            arguments["input_shape"] = source["input_shape"]
        if arguments.get("input_shape") is not None:  # a checkpoint's images are channels-last
            arguments["input_shape"] = in_data_format(arguments["input_shape"], data_format)
    input_shape = channels_last(
        validate_input_shape(arguments.get("input_shape"), input_tensor, data_format),
        data_format,
    )
    if "classes" not in given:
        arguments["classes"] = source.get("classes", defaults["classes"])
    arguments.update(_function(given, source, recorded, weights, defaults, input_shape[-1]))
    if None in input_shape[:2] and "base_image_size" not in given:
        arguments["base_image_size"] = source.get("base_image_size", defaults["base_image_size"])
    return arguments, variant
