"""A built ViT's anatomy: what its images are and where its parts sit.

Read from a built model (its layers and input), for those who take it apart
or feed it: the commands, the exporters and the inspection tools.
"""

import keras

from keras_vit.models.image_input import channels_last
from keras_vit.weights import encoder_blocks


def takes_channels_first(model):
    """Whether a ViT takes `(batch, channels, height, width)` images (layer `channels_last`)."""
    return any(layer.name == "channels_last" for layer in getattr(model, "layers", ()))


def image_shape(model):
    """`(height, width, channels)` of a ViT's images, whichever its `data_format`."""
    shape = tuple(model.input_shape[1:])
    return channels_last(shape, "channels_first") if takes_channels_first(model) else shape


def default_image_size(model):
    """`(height, width)` of the images a ViT takes unless told otherwise.

    A fixed-size model's input size; for a model of run-time resolution
    (`input_shape=(None, None, C)`), the size its position table is laid
    out for (`base_image_size`), where it computes without resampling.
    """
    size = image_shape(model)[:2]
    if None not in size:
        return size
    if not any(layer.name == "position_embedding" for layer in model.layers):
        positions = getattr(model, "parts", {}).get("positions")
        if positions is None:  # (a graph's rotary model: no table, no size of its own)
            raise ValueError(
                f"Model {model.name!r} takes images of any size and has no position table "
                "to tell a default one (rotary positions): pass the image size."
            )
        return positions.table_size(model.parts["image"])
    grid = model.get_layer("position_embedding").grid_size
    return tuple(g * p for g, p in zip(grid, patch_pixels(model)))


def patch_pixels(model):
    """`(height, width)` in input pixels of one patch of a ViT (a stem's stride included).

    Example:

    >>> from keras_vit import ViT
    >>> model = ViT(patch_size=1, hidden_dim=8, num_layers=1, num_heads=2,
    ...                           mlp_dim=16, input_shape=(16, 16, 1), classes=2,
    ...                           stem_filters=(4, 8), stem_strides=(2, 2))
    >>> patch_pixels(model)
    (4, 4)
    """
    stride = (
        model.get_layer("stem").stride if any(layer.name == "stem" for layer in model.layers) else 1
    )
    return tuple(side * stride for side in model.get_layer("patch_embedding").patch_size)


def feature_extractor(model, blocks=None):
    """A model that returns the outputs of a ViT's encoder blocks.

    For users who take the model apart (linear probes, dense prediction,
    inspection): the returned model shares the layers and weights of
    `model`, takes the same images, and returns a dict of the token
    sequences after each chosen block (`"encoderblock_{i}"`) and after the
    final LayerNorm (`"encoder_norm"`).

    Args:
        model: a model built by `VisionTransformer` or a `ViT*` builder.
        blocks: iterable of block indices (negative ones count from the
            end), or `None` for every block.

    Returns:
        A `keras.Model` mapping images to
        `{"encoderblock_{i}": (batch, tokens, dim), ..., "encoder_norm": ...}`.

    Example:

    >>> from keras_vit import ViT
    >>> vit = ViT(
    ...     patch_size=4, hidden_dim=32, num_layers=3, num_heads=2,
    ...     mlp_dim=64, input_shape=(16, 16, 3), classes=10,
    ... )
    >>> features = feature_extractor(vit, blocks=[0, -1])
    >>> sorted(features(keras.ops.zeros((1, 16, 16, 3))))
    ['encoder_norm', 'encoderblock_0', 'encoderblock_2']
    """
    block_layers = encoder_blocks(model)
    indices = range(len(block_layers)) if blocks is None else list(blocks)
    outputs = {}
    for index in indices:
        if not -len(block_layers) <= index < len(block_layers):
            raise ValueError(
                f"Block index {index} is out of range for a model with {len(block_layers)} blocks."
            )
        layer = block_layers[index]
        outputs[layer.name] = layer.output
    outputs["encoder_norm"] = model.get_layer("encoder_norm").output
    return keras.Model(model.input, outputs, name=f"{model.name}_features")


def inference_image_shape(model, image_size=None):
    """`(height, width, channels)` of the images to feed `model` at inference.

    A fixed-size model's own; for a model of run-time resolution, `image_size`
    (an int: square images) or else the size its position table is laid out
    for (`default_image_size`).
    """
    height, width, channels = image_shape(model)
    if None in (height, width):
        height, width = (image_size, image_size) if image_size else default_image_size(model)
    return (height, width, channels)
