"""Where a run's images come from: arrays, Fashion-MNIST, an image folder or TFDS, by name.

`load` reads any of them by name, and `check_source` refuses, before any
data is read, a source that cannot give a run its data: the one check that
`load` and the training jobs share.
"""

import os

import numpy as np

from keras_vit import _options
from keras_vit.data.folders import (
    check_classes,
    check_validation_split,
    folder_layout,
    folder_layout_error,
    from_folder,
)
from keras_vit.data.pipeline import Dataset, limited, make_pipeline


def from_arrays(images, labels, class_names=None, **kwargs):
    """A pipeline over in-memory arrays.

    Args:
        images: array `(N, H, W)` or `(N, H, W, C)` of `[0, 255]` pixels.
        labels: int array `(N,)`.
        class_names: sequence of names; defaults to `"0"`, `"1"`, ...
        **kwargs: `make_pipeline` arguments (`image_size`, `training`, ...).

    Returns:
        A `Dataset`.

    Example:

    >>> import numpy as np
    >>> ds = from_arrays(np.zeros((10, 28, 28), "uint8"), np.arange(10) % 2,
    ...                  image_size=32, batch_size=4)
    >>> images, labels = next(iter(ds.data))
    >>> tuple(images.shape), tuple(labels.shape)
    ((4, 32, 32, 3), (4, 2))
    """
    import tensorflow as tf

    images, labels = np.asarray(images), np.asarray(labels)
    if images.ndim not in (3, 4) or len(images) != len(labels) or len(images) == 0:
        raise ValueError(
            "`images` must be a non-empty (N, H, W[, C]) array with one label "
            f"per image. Received: images of shape {images.shape}, labels of "
            f"shape {labels.shape}"
        )
    if not np.issubdtype(labels.dtype, np.integer) or labels.min() < 0:
        raise ValueError("`labels` must be non-negative integers.")
    num_classes = int(labels.max()) + 1
    if class_names is None:
        class_names = tuple(str(i) for i in range(num_classes))
    if len(class_names) < num_classes:
        raise ValueError(f"{len(class_names)} class names for labels up to {num_classes - 1}.")
    dataset = tf.data.Dataset.from_tensor_slices((images, labels))
    data = make_pipeline(dataset, len(class_names), shuffle_buffer=len(images), **kwargs)
    return Dataset(data, tuple(class_names), limited(len(images), kwargs.get("limit")))


def fashion_mnist(split="train", **kwargs):
    """Fashion-MNIST (Debian's files, else a download) as a pipeline.

    Example:

    ```python
    train = keras_vit.data.fashion_mnist("train", image_size=28, channels=1,
                                         training=True)
    model.fit(train.data, epochs=10)
    ```
    """
    from keras_vit.data.fashion_mnist import CLASS_NAMES, load_fashion_mnist

    images, labels = load_fashion_mnist(split)
    return from_arrays(images, labels, CLASS_NAMES, **kwargs)


def check_source(source, validation_split=None):
    """Refuses at once, before any data is read, a source that cannot give images.

    `"fashion_mnist"`, an existing folder, or a name TFDS knows (checked
    without network); `validation_split` (a fraction) holds out images of a
    folder only. Each refusal is a `ValueError` naming the source.
    """
    if not isinstance(source, (str, os.PathLike)):
        raise TypeError(
            f"{_options.name('dataset')} must be a str. "
            f"Received: {_options.given('dataset', source)}"
        )
    source = os.fspath(source)
    folder = os.path.isdir(source)
    if validation_split is not None:
        check_validation_split(validation_split)
        if not folder:
            raise ValueError(
                f"{_options.name('validation_split')} holds out images of an image folder; "
                f"{source!r} is not one (its own test split is used). "
                f"Received: {_options.given('validation_split', validation_split)}"
            )
    if source == "fashion_mnist" or folder:
        return
    if os.sep in source or source.startswith("."):
        raise ValueError(f"Dataset folder {source!r} does not exist.")
    from keras_vit.data.tfds import check_tfds_name

    check_tfds_name(source)


def check_training_layout(source, validation_split=None):
    """Refuses, before any training, a folder a training run cannot train and test on.

    A run tests on the folder's `test/` images, or with `validation_split` on
    images held out of its training images: a folder without `test/` needs
    `validation_split`, and one with `test/` refuses it (either choice would
    leave some of the user's images out silently). Its classes must train a
    classifier (`folders.check_classes`).
    """
    check_source(source, validation_split)
    if not os.path.isdir(os.fspath(source)):
        return
    layout = folder_layout(source)
    if validation_split is not None and layout["test"] is not None:
        raise ValueError(
            f"{source!r} has a test/ folder, its own test images; "
            f"{_options.name('validation_split')} is for a folder without one. Leave out "
            f"{_options.name('validation_split')} to test on test/. "
            f"Received: {_options.given('validation_split', validation_split)}"
        )
    if validation_split is None and (
        layout["test"] is None or layout["train"] is None and not layout["flat"]
    ):
        raise ValueError(folder_layout_error(source, layout))
    check_classes(source, validation_split)


def load(source, split="train", **kwargs):
    """A pipeline from a source name: `"fashion_mnist"`, a folder, or TFDS.

    A path to an existing folder is read with `from_folder`: `split` picks
    `source/<split>` (a missing `test/` is an error that says what was
    found, never the parent folder read as a split); a flat folder (class
    folders at the top) gives all its images as `"train"`. With
    `validation_split=F`, a share F of each class of the training images
    is held out as `"test"` (the rest is `"train"`). `"fashion_mnist"`
    reads Debian's files; any other name goes to `from_tfds`.
    """
    validation_split = kwargs.pop("validation_split", None)
    check_source(source, validation_split)
    source = os.fspath(source)
    # TFDS's own options: where its data is, whether it may download.
    tfds_options = {k: kwargs.pop(k) for k in ("data_dir", "download") if k in kwargs}
    if source == "fashion_mnist":
        return fashion_mnist(split, **kwargs)
    if os.path.isdir(source):
        layout = folder_layout(source)
        if validation_split is not None:
            # Held out of the training images: train/ when there is one, else the folder.
            return from_folder(
                layout["train"] or source,
                validation_split=validation_split,
                subset="validation" if split == "test" else "training",
                **kwargs,
            )
        if split in ("train", "test") and layout[split] is None:
            if split == "train" and layout["flat"]:
                return from_folder(source, **kwargs)  # a flat folder: all of it to train on
            raise ValueError(folder_layout_error(source, layout, split))
        split_folder = os.path.join(source, split)
        if not os.path.isdir(split_folder):
            raise ValueError(folder_layout_error(source, layout, split))
        return from_folder(split_folder, **kwargs)
    from keras_vit.data.tfds import from_tfds

    return from_tfds(source, split, **tfds_options, **kwargs)
