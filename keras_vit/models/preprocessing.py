"""`preprocess_input` in `keras.applications`' shape."""

import keras
import numpy as np

from keras_vit.models.image_input import pixel_rescaling, resolve_data_format


def preprocess_input(x, data_format=None, normalization=None):
    """Prepares `[0, 255]` pixels for a keras_vit model.

    The builders' models normalise pixels themselves (`include_rescaling=True`,
    the default, with the checkpoint's statistics), so by default this
    returns `x` unchanged, as `keras.applications.efficientnet`'s does. For a
    model built with `include_rescaling=False`, pass the `normalization` it
    expects.

    Args:
        x: images in `[0, 255]`, a NumPy array or a tensor, `(..., height,
            width, channels)` or `(..., channels, height, width)` by
            `data_format`.
        data_format: `"channels_last"`, `"channels_first"` or `None`
            (`keras.config.image_data_format()`): where the channel axis is.
        normalization: `None` (unchanged), `"inception"` (to `[-1, 1]`, the
            paper's), `"imagenet"` (ImageNet mean / std), or a `(mean, std)`
            pair of per-channel values in `[0, 1]` units.

    Returns:
        Float32 images of the same shape (a NumPy array for a NumPy input).

    Example:

    >>> import numpy as np
    >>> preprocess_input(np.array([[[0.0, 127.5, 255.0]]]), normalization="inception").tolist()
    [[[-1.0, 0.0, 1.0]]]
    """
    data_format = resolve_data_format(data_format)
    numpy = isinstance(x, (np.ndarray, list, tuple, int, float))
    ops = np if numpy else keras.ops
    x = np.asarray(x, "float32") if numpy else keras.ops.cast(x, "float32")
    if normalization is None:
        return x
    axis = -3 if data_format == "channels_first" else -1
    rescaling = pixel_rescaling(normalization, x.shape[axis])
    shape = (-1, 1, 1) if data_format == "channels_first" else (-1,)
    scale = np.reshape(np.asarray(rescaling["scale"], "float32"), shape)
    offset = np.reshape(np.asarray(rescaling["offset"], "float32"), shape)
    return ops.add(ops.multiply(x, scale), offset)
