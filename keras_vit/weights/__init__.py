"""Loading weights into keras_vit models."""

import os

import keras

# Keras' own weight files; checkpoint converters extend this.
KERAS_SUFFIXES = (".weights.h5", ".keras")


def resolve(weights):
    """The local file that `weights=` names, or a clear error.

    Args:
        weights: path of a weights file.

    Returns:
        The path, checked to exist and to have a known format.
    """
    if not isinstance(weights, (str, os.PathLike)):
        raise TypeError(
            "`weights` must be None or the path of a weights file. "
            f"Received: weights={weights!r}"
        )
    path = os.fspath(weights)
    if not os.path.isfile(path):
        raise ValueError(
            f"weights={path!r} is not an existing file. Pass None for random "
            f"initialisation or the path of a {' or '.join(KERAS_SUFFIXES)} file."
        )
    if not path.endswith(KERAS_SUFFIXES):
        raise ValueError(
            f"weights={path!r} has an unknown format; expected a file ending "
            f"in {' or '.join(KERAS_SUFFIXES)}."
        )
    return path


def load(model, path):
    """Loads the weights file at `path` into `model`."""
    model.load_weights(path)
    return model
