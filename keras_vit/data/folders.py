"""Image folders: one sub-folder per class, listed, checked and decoded into a pipeline.

A folder's files are checked from their headers when it is listed (not an
image, above the size limits, truncated: skipped, counted in one warning);
the images that only decoding finds corrupt are dropped by the pipeline and
named in one warning when the pass that meets them ends. Also the layouts a
folder may have (`train/` and `test/`, or class folders at the top) and the
held-out split of a folder without test images.
"""

import logging
import os

import numpy as np

from keras_vit import _options
from keras_vit.data import image_limits
from keras_vit.data.pipeline import Dataset, file_decoder, limited, make_pipeline

IMAGE_SUFFIXES = (".jpg", ".jpeg", ".png", ".gif", ".bmp", ".webp")

logger = logging.getLogger("keras_vit")

# What a folder's warnings have said in this process: a command builds
# several pipelines over one folder (training, evaluation, statistics, each
# resume), and each thing is said once.
_said = set()


def _warn_once(message):
    if message not in _said:
        _said.add(message)
        logger.warning(message)


def _skip_reason(path, max_pixels, max_bytes):
    """Why an image folder's file is not used, or None."""
    try:
        image_limits.check_file(path, max_pixels, max_bytes)
    except image_limits.ImageTooLarge:
        return "image(s) above the size limits"
    except image_limits.TruncatedImage:
        return "truncated image(s)"
    except (OSError, ValueError):
        return "file(s) that are not JPEG/PNG/GIF/BMP/WebP images"
    return None


class _DecodeFailures:
    """Which of a folder's listed files its pipeline could not decode, each named once.

    Each file's index is recorded as tried before it is decoded and as
    decoded after, in two hash tables inside the pipeline's graph (not
    variables: a pipeline made inside a distribution strategy's scope would
    get mirrored ones; not Python calls: they cost a quarter of a small
    image's decoding). When a pass over the decoded examples ends (training
    reaches it at the end of its first epoch that meets a failure), the
    files tried and not decoded are logged in one warning; a file is named
    once per process, however many epochs and pipelines meet it.
    """

    def __init__(self, directory, paths):
        import tensorflow as tf

        self.directory, self.paths = directory, paths
        self.tried, self.decoded = (
            tf.lookup.experimental.MutableHashTable(tf.int64, tf.int64, default_value=0)
            for _ in range(2)
        )

    def decoding(self, decode_file):
        """`decode_file` of a path, as a function of `((index, path), label)`."""
        import tensorflow as tf

        def decode(example, label):
            index, path = example
            with tf.control_dependencies([self.tried.insert(index, index)]):
                image = decode_file(path)
            with tf.control_dependencies([self.decoded.insert(index, tf.size(image, tf.int64))]):
                return tf.identity(image), label

        return decode

    def report(self):
        tried, decoded = (set(table.export()[0].numpy()) for table in (self.tried, self.decoded))
        failed = sorted(tried - decoded)
        new = [self.paths[i] for i in failed if ("undecodable", self.paths[i]) not in _said]
        if not new:
            return
        _said.update(("undecodable", path) for path in new)
        names = [os.path.relpath(path, self.directory) for path in new]
        shown = ", ".join(names[:5]) + (f" and {len(names) - 5} more" if len(names) > 5 else "")
        _warn_once(
            f"{self.directory}: skipped {len(new)} image(s) that could not be decoded "
            f"(corrupt data): {shown}."
        )


def _describe_skipped(skipped):
    return " and ".join(f"{count} {reason}" for reason, count in sorted(skipped.items()))


def list_image_folder(directory, max_pixels=None, max_bytes=None):
    """`(paths, labels, class_names, skipped)` of a one-folder-per-class tree.

    Files that are not JPEG/PNG/GIF/BMP/WebP images (by their first bytes, not
    their names), images whose header declares more than `max_pixels`
    pixels or whose file has more than `max_bytes` bytes, and images whose
    file ends before the image does (`keras_vit.data.image_limits`), are
    skipped and counted in `skipped` (a dict: reason -> count), never passed
    to the decoder.
    """
    max_pixels, max_bytes = image_limits.resolve_limits(max_pixels, max_bytes)
    if not isinstance(directory, (str, os.PathLike)) or not os.path.isdir(directory):
        raise ValueError(
            f"`directory` must be an existing folder with one sub-folder per "
            f"class. Received: directory={directory!r}"
        )
    class_names = sorted(
        d
        for d in os.listdir(directory)
        if os.path.isdir(os.path.join(directory, d)) and not d.startswith(".")
    )
    if not class_names:
        raise ValueError(
            f"{directory!r} has no class sub-folders; expected "
            f"{directory}/<class name>/<image files>."
        )
    paths, labels, skipped = [], [], {}
    for label, name in enumerate(class_names):
        folder = os.path.join(directory, name)
        for root, _, files in sorted(os.walk(folder)):
            for file in sorted(files):
                path = os.path.join(root, file)
                if file.startswith("."):
                    continue
                reason = _skip_reason(path, max_pixels, max_bytes)
                if reason is None:
                    paths.append(path)
                    labels.append(label)
                else:
                    skipped[reason] = skipped.get(reason, 0) + 1
    if not paths:
        raise ValueError(
            f"{directory!r} has {len(class_names)} class folders but no images to use "
            f"(JPEG, PNG, GIF or BMP within the size limits); skipped: "
            f"{_describe_skipped(skipped) or 'nothing'}."
        )
    return paths, np.asarray(labels, "int64"), tuple(class_names), skipped


def check_validation_split(validation_split):
    """Refuses a held-out share that is not a fraction between 0 and 1, naming it."""
    if (
        isinstance(validation_split, bool)
        or not isinstance(validation_split, (int, float))
        or not 0.0 < validation_split < 1.0
    ):
        raise ValueError(
            f"{_options.name('validation_split')} must be a fraction between 0 and 1. "
            f"Received: {_options.given('validation_split', validation_split)}"
        )


def held_out_split(labels, validation_split):
    """`(training, validation)` index arrays: a fixed share of each class held out.

    Deterministic (the same files for the same folder, whatever the training
    seed), stratified, at least one image of each class held out.
    """
    check_validation_split(validation_split)
    rng = np.random.default_rng(0)
    training, validation = [], []
    for label in np.unique(labels):
        members = np.flatnonzero(labels == label)
        members = members[rng.permutation(len(members))]
        count = min(max(1, round(len(members) * validation_split)), len(members) - 1)
        validation.extend(members[:count])
        training.extend(members[count:])
    return np.sort(np.asarray(training, "int64")), np.sort(np.asarray(validation, "int64"))


def from_folder(
    directory, max_pixels=None, max_bytes=None, validation_split=None, subset=None, **kwargs
):
    """A pipeline over an image folder: `directory/<class name>/<image>`.

    Class names are the sorted sub-folder names. Non-image files, images
    above the limits (`max_pixels`, `max_bytes`: see
    `keras_vit.data.image_limits`, checked from their headers) and
    truncated ones (`image_limits.check_complete`) are skipped with one
    warning that counts them; images that still fail to decode (corrupt
    data) are dropped by the pipeline instead of stopping an epoch, and
    named in a second warning when the first pass that meets them ends. A
    training pipeline keeps its length known (the images' count: Keras then
    knows an epoch's steps), the folder's first images standing in for any
    that failed; an evaluation pipeline gives
    exactly the images that decode.

    Args:
        directory: the folder.
        max_pixels, max_bytes: the image limits (default: the module's).
        validation_split: optional fraction of each class held out
            (`held_out_split`); then `subset` picks `"training"` (the rest)
            or `"validation"` (the held-out images).
        subset: `"training"` or `"validation"`, with `validation_split`.
        **kwargs: `make_pipeline` arguments.

    Returns:
        A `Dataset`.
    """
    import tensorflow as tf

    max_pixels, max_bytes = image_limits.resolve_limits(max_pixels, max_bytes)
    paths, labels, class_names, skipped = list_image_folder(directory, max_pixels, max_bytes)
    if (validation_split is None) != (subset is None) or subset not in (
        None,
        "training",
        "validation",
    ):
        raise ValueError(
            "`validation_split` and `subset` ('training' or 'validation') go together. "
            f"Received: validation_split={validation_split!r}, subset={subset!r}"
        )
    if validation_split is not None:
        chosen = held_out_split(labels, validation_split)[subset == "validation"]
        paths, labels = [paths[i] for i in chosen], labels[chosen]
    if skipped:
        _warn_once(
            f"{directory}: skipped {_describe_skipped(skipped)} "
            f"(limits: {max_pixels:,} pixels, {max_bytes:,} bytes)."
        )

    failures = _DecodeFailures(directory, paths)
    decode = failures.decoding(file_decoder(max_pixels, max_bytes, kwargs.get("channels", 3)))
    # Decoded after the shuffle: its buffer holds the file names, not the images.
    dataset = tf.data.Dataset.from_tensor_slices(((np.arange(len(paths)), paths), labels))
    data = make_pipeline(
        dataset,
        len(class_names),
        shuffle_buffer=len(paths),
        decode=decode,
        after_decoding=failures.report,
        **kwargs,
    )
    return Dataset(data, class_names, limited(len(paths), kwargs.get("limit")))


def folder_layout(directory):
    """What an image folder holds: `{"train", "test", "flat", "classes"}`.

    `train` / `test`: the paths of its `train/` and `test/` sub-folders, or
    None; `flat`: class folders at the top and neither of those;
    `classes`: the names of the top-level sub-folders.
    """
    directory = os.fspath(directory)
    folders = sorted(
        d
        for d in os.listdir(directory)
        if os.path.isdir(os.path.join(directory, d)) and not d.startswith(".")
    )
    found = {
        split: os.path.join(directory, split) if split in folders else None
        for split in ("train", "test")
    }
    return {**found, "flat": not any(found.values()) and bool(folders), "classes": folders}


def folder_layout_error(directory, layout, split="test"):
    """The message for a folder without the split a job needs: what was found, what is expected."""
    if layout["train"] and not layout["test"]:
        found = f"{directory!r} has train/ but no test/"
    elif layout["test"] and not layout["train"]:
        found = f"{directory!r} has test/ but no train/"
    elif layout["flat"]:
        found = (
            f"{directory!r} has class folders at the top "
            f"({', '.join(layout['classes'][:4])}{', ...' if len(layout['classes']) > 4 else ''}) "
            "and no train/ and test/"
        )
    else:
        found = f"{directory!r} has no sub-folders"
    return (
        f"{found}, so it has no {split} images. Expected {directory}/train/<class>/<images> "
        f"and {directory}/test/<class>/<images>; or pass "
        f"{_options.given('validation_split', 0.1)} to hold out 10% of the training images "
        "of each class for testing."
    )


def check_classes(source, validation_split=None):
    """Refuses, before any training, a folder whose images cannot train a classifier.

    Its training images (`train/`, or the class folders at the top) must be of
    two classes or more, with no class folder empty; with `validation_split`
    each class needs two images or more (one to test on, one to train on);
    a `test/` folder must hold images of the training classes, in folders of
    the same names (its labels are its folders' sorted names). Each refusal
    names the images of each class.
    """
    layout = folder_layout(source)
    train_dir = layout["train"] or os.fspath(source)
    _, labels, names, _ = list_image_folder(train_dir)
    counts = np.bincount(labels, minlength=len(names))
    described = ", ".join(f"{name}: {count}" for name, count in zip(names, counts))
    empty = [name for name, count in zip(names, counts) if count == 0]
    if len(names) - len(empty) < 2:
        raise ValueError(
            f"{train_dir!r} has images of {len(names) - len(empty)} class(es) (images per "
            f"class: {described}): a classifier needs two classes or more."
        )
    if empty:
        raise ValueError(
            f"{train_dir!r}: the class folder(s) {empty} hold no image (images per class: "
            f"{described}); add images or remove the folder(s)."
        )
    if validation_split is not None:
        alone = [name for name, count in zip(names, counts) if count < 2]
        if alone:
            raise ValueError(
                f"{train_dir!r}: holding out "
                f"{_options.given('validation_split', validation_split)} of each class leaves "
                f"class(es) {alone} without a test or a training image: "
                f"each class needs two images or more (images per class: {described})."
            )
    elif layout["test"] is not None:
        _, test_labels, test_names, _ = list_image_folder(layout["test"])
        if tuple(test_names) != tuple(names):
            raise ValueError(
                f"{layout['test']!r} has the classes {list(test_names)} and {train_dir!r} "
                f"{list(names)}: the test images must be of the training classes, in folders "
                "of the same names."
            )
