"""This package's own `.keras` files (a trained model to fine-tune at another
resolution or on other classes): already in keras_vit's layout; what the
shapes do not say comes from the file's configuration: a `VisionTransformer`'s
arguments, or the layer configs of a functional graph (a pre-training model,
or a file of an earlier keras_vit, whose models were plain functional ones).
"""

import numpy as np

from keras_vit.weights.readers import keras_layer_configs, keras_model_config

# What a `VisionTransformer` configuration says that the tensors' shapes do not.
_FUNCTION = (
    "approximate_gelu",
    "layer_norm_epsilon",
    "position_embedding",
    "resample_method",
    "pooling",
    "include_rescaling",
)


def to_canonical(tensors, num_heads):
    del num_heads  # already in keras_vit's layout
    return dict(tensors)


def _listed(value):
    """JSON's lists back to the tuples the builder was given."""
    return tuple(_listed(v) for v in value) if isinstance(value, list) else value


def _table_image_size(grid_size, patch_size, stem_filters, stem_strides):
    """The image size that a position table of `grid_size` was laid out for."""
    stride = int(np.prod(stem_strides or [2] * len(stem_filters or ())))
    return tuple(int(g) * int(p) * stride for g, p in zip(grid_size, patch_size))


def function_arguments(path, arguments):
    """What a keras_vit `.keras` file's configuration adds to its shapes."""
    saved = keras_model_config(path)
    model = saved["config"]
    if "layers" not in model:  # a VisionTransformer: its arguments, as built
        built = {name: _listed(value) for name, value in model.items()}
        # The shapes' input size: the position table's grid of patches.
        grid_pixels = arguments["input_shape"][:2]
        arguments["input_shape"] = built["input_shape"]
        if built.get("data_format") == "channels_first":  # the images' shape, channels last
            channels, *size = built["input_shape"]
            arguments["input_shape"] = (*size, channels)
        arguments.update({name: built[name] for name in _FUNCTION})
        # (A file of a version before the option pads nothing.)
        arguments["pad_to_patches"] = built.get("pad_to_patches", False)
        if built["input_shape"][0] is None:  # a model of run-time resolution: its table's size
            arguments["base_image_size"] = built["base_image_size"] or _table_image_size(
                grid_pixels, (1, 1), built["stem_filters"], built["stem_strides"]
            )
        if built["stem_filters"] is not None:
            for name in ("stem_filters", "stem_strides", "stem_downsampling"):
                arguments[name] = built[name]
        if built["include_rescaling"]:
            arguments["normalization"] = built["normalization"]
        return arguments
    configs = keras_layer_configs(saved, path)
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
    arguments["position_embedding"] = configs.get("position_embedding", {}).get("kind", "learned")
    if "stem" in configs:
        arguments["stem_filters"] = tuple(configs["stem"]["filters"])
        arguments["stem_strides"] = tuple(configs["stem"].get("strides") or ()) or None
        arguments["stem_downsampling"] = configs["stem"].get("downsampling", "convolution")
    pooling = configs.get("pooling")
    arguments["pooling"] = "map" if "map_head" in configs else pooling["mode"] if pooling else None
    rescaling = configs.get("rescaling")
    arguments["include_rescaling"] = rescaling is not None
    if rescaling is not None:
        channels = arguments["input_shape"][-1]
        scale = np.broadcast_to(np.asarray(rescaling["scale"], "float64"), (channels,))
        offset = np.broadcast_to(np.asarray(rescaling["offset"], "float64"), (channels,))
        std = 1.0 / (255.0 * scale)
        arguments["normalization"] = (tuple(-offset * std), tuple(std))
    return arguments
