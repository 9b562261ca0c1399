"""This package's own `.keras` files (a trained model to fine-tune at another
resolution or on other classes): already in keras_vit's layout; what the
shapes do not say comes from the file's configuration: a `VisionTransformer`'s
arguments, or the layer configs of a functional graph (a pre-training model,
or a file of an earlier keras_vit, whose models were plain functional ones).
"""

import numpy as np

from keras_vit.models.vision_transformer import DEFAULT_INPUT_SHAPE
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


def function_arguments(path, arguments):
    """What a keras_vit `.keras` file's configuration adds to its shapes."""
    saved = keras_model_config(path)
    model = saved["config"]
    if "layers" not in model:  # a VisionTransformer: its arguments, as built
        built = {name: _listed(value) for name, value in model.items()}
        arguments["input_shape"] = built["input_shape"]
        arguments.update({name: built[name] for name in _FUNCTION})
        if built["input_shape"][0] is None:  # a model of run-time resolution: its table's size
            arguments["base_image_size"] = built["base_image_size"] or DEFAULT_INPUT_SHAPE[:2]
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
    positions = configs.get("position_embedding", {})
    if "resample_method" in positions:
        arguments["resample_method"] = positions["resample_method"]
    if arguments["input_shape"][0] is None and "grid_size" in positions:
        # A model of run-time resolution: its table's image size.
        stride = int(
            np.prod(
                configs.get("stem", {}).get("strides")
                or [2] * len(configs.get("stem", {}).get("filters", ()))
            )
        )
        patch = configs.get("patch_embedding", {}).get("patch_size", (1, 1))
        arguments["base_image_size"] = tuple(
            int(g) * int(p) * stride for g, p in zip(positions["grid_size"], patch)
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
