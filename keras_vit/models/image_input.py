"""How a ViT takes images: their layout (`data_format`), shape and pixel normalisation.

What the model constructor and the checkpoint resolution both read, and
`preprocess_input` applies outside a model.
"""

import keras
import numpy as np

DEFAULT_INPUT_SHAPE = (224, 224, 3)
DATA_FORMATS = ("channels_last", "channels_first")


def resolve_data_format(data_format):
    """`data_format`, `None` as `keras.config.image_data_format()`, or a clear error."""
    resolved = data_format or keras.config.image_data_format()
    if resolved not in DATA_FORMATS:
        raise ValueError(
            f"`data_format` must be one of {DATA_FORMATS} or None. "
            f"Received: data_format={data_format!r}"
        )
    return resolved


def channels_last(shape, data_format):
    """An image shape in the layout of `data_format` as `(height, width, channels)`."""
    return (*shape[1:], shape[0]) if data_format == "channels_first" else tuple(shape)


def in_data_format(shape, data_format):
    """An image shape `(height, width, channels)` in the layout of `data_format`."""
    return (shape[-1], *shape[:-1]) if data_format == "channels_first" else tuple(shape)


# Pixel statistics (in [0, 1] units) that checkpoints were trained with.
NORMALIZATIONS = {
    "inception": ((0.5, 0.5, 0.5), (0.5, 0.5, 0.5)),  # [-1, 1], the paper's
    "imagenet": ((0.485, 0.456, 0.406), (0.229, 0.224, 0.225)),  # DeiT, DINO, MAE
}


def pixel_rescaling(normalization, channels):
    """`Rescaling` arguments mapping `[0, 255]` pixels to `(x/255 - mean) / std`."""
    if isinstance(normalization, str):
        if normalization not in NORMALIZATIONS:
            raise ValueError(
                f"`normalization` must be one of {tuple(NORMALIZATIONS)} or a "
                f"(mean, std) pair. Received: normalization={normalization!r}"
            )
        if normalization == "inception":  # one scalar scale for any channel count
            return {"scale": 1.0 / 127.5, "offset": -1.0}
        normalization = NORMALIZATIONS[normalization]
    try:
        mean, std = (np.asarray(v, dtype="float64").reshape(-1) for v in normalization)
    except (TypeError, ValueError):
        raise ValueError(
            "`normalization` must be a name or a (mean, std) pair of per-channel "
            f"values in [0, 1] units. Received: normalization={normalization!r}"
        ) from None
    if len(mean) != channels or len(std) != channels or np.any(std <= 0):
        raise ValueError(
            f"`normalization` needs {channels} means and {channels} positive "
            f"stds for {channels}-channel images. Received: "
            f"normalization={normalization!r}"
        )
    return {
        "scale": [float(v) for v in 1.0 / (255.0 * std)],
        "offset": [float(v) for v in -mean / std],
    }


def validate_input_shape(input_shape, input_tensor, data_format):
    """The input shape, in `data_format`'s layout, of the user's arguments, or a clear error."""
    if input_tensor is not None:
        if not keras.backend.is_keras_tensor(input_tensor):
            raise TypeError(
                "`input_tensor` must be a Keras tensor (from `keras.Input`). "
                f"Received: input_tensor={input_tensor!r}"
            )
        tensor_shape = tuple(input_tensor.shape[1:])
        if input_shape is not None and tuple(input_shape) != tensor_shape:
            raise ValueError(
                f"input_shape={tuple(input_shape)} does not match the shape "
                f"{tensor_shape} of input_tensor."
            )
        input_shape = tensor_shape
    if input_shape is None:
        return in_data_format(DEFAULT_INPUT_SHAPE, data_format)
    input_shape = tuple(input_shape) if isinstance(input_shape, (list, tuple)) else input_shape
    if (
        not isinstance(input_shape, tuple)
        or len(input_shape) != 3
        or not all(s is None or (isinstance(s, int) and s > 0) for s in input_shape)
        or channels_last(input_shape, data_format)[-1] is None
    ):
        layout = "(height, width, channels)"
        if data_format == "channels_first":
            layout = "(channels, height, width)"
        raise ValueError(
            f"`input_shape` must be {layout} ({data_format}) with positive "
            "ints, height and width `None` for images of any size. "
            f"Received: input_shape={input_shape!r}"
        )
    return input_shape


def same_normalization(first, second, channels):
    """Whether two `normalization` values give the same pixels (names and numbers alike)."""
    a, b = pixel_rescaling(first, channels), pixel_rescaling(second, channels)
    return all(np.allclose(a[key], b[key], rtol=1e-6, atol=1e-8) for key in a)
