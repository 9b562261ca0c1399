"""`tf.data` pipelines that feed `model.fit` on every backend.

Every source (in-memory arrays, an image folder, a TFDS dataset, the
Debian Fashion-MNIST files) ends in the same `make_pipeline`: images as
float32 `[0, 255]` pixels of the model's size and channels (the models
normalise pixels themselves), one-hot float labels (so label smoothing,
MixUp and CutMix apply), batched, optionally cached, prefetched, and
shuffled and augmented from `seed` (in the same order on every run with
`deterministic=True`), with tf.data's autotuning unless told otherwise.
"""

import dataclasses
import functools
import logging
import os

import numpy as np

from keras_vit.data import image_limits, orientation

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


def graph_function(function):
    """`function` for `tf.data.Dataset.map`, traced as written (no AutoGraph).

    The pipelines' functions branch with `tf.cond` and `tf.where` already;
    AutoGraph would re-parse the source of each one and of every function
    it calls on their first trace in a process (over a second of a short
    command's start-up), to change nothing.
    """
    import tensorflow as tf

    return tf.autograph.experimental.do_not_convert(function)


@functools.lru_cache(maxsize=None)
def file_decoder(max_pixels, max_bytes, channels):
    """A traced function: an image file's path to its float32 pixels upright, in `channels`.

    One per process and setting, whatever the number of pipelines: each
    pipeline of a folder (training, evaluation, statistics, every epoch's
    rebuild) calls it instead of tracing the decoding graph again.
    `max_pixels` and `max_bytes` are resolved limits (ints), so a later
    change of the module's defaults makes a new one.
    """
    import tensorflow as tf

    @tf.function(input_signature=[tf.TensorSpec((), tf.string)], autograph=False)
    def decode_file(path):
        # Native channels first, then the model's: a grey file stays exact
        # for a grey model (a round trip through RGB would scale it by 0.9999).
        # Its limits are checked again: a file may have changed since it was listed.
        image = decode_upright(tf.io.read_file(path), max_pixels, max_bytes)
        image = to_channels(tf.cast(image, tf.float32), channels)
        image.set_shape((None, None, channels))
        return image

    return decode_file


@dataclasses.dataclass
class Dataset:
    """A pipeline and what a model and its user need to know about it.

    Attributes:
        data: the `tf.data.Dataset` of `(images, one_hot_labels)` batches.
        class_names: tuple of class names, index = label.
        size: number of examples (before batching), or `None` if unknown.
    """

    data: object
    class_names: tuple
    size: int = None

    @property
    def num_classes(self):
        return len(self.class_names)


def _check_size(image_size):
    if isinstance(image_size, int):
        image_size = (image_size, image_size)
    if (
        not isinstance(image_size, (tuple, list))
        or len(image_size) != 2
        or not all(isinstance(s, int) and s > 0 for s in image_size)
    ):
        raise ValueError(
            "`image_size` must be a positive int or (height, width). "
            f"Received: image_size={image_size!r}"
        )
    return tuple(image_size)


def _random_crop_boxes(count, height, width, scale, ratio, seed):
    """`count` Inception-style crop boxes, normalised `[y1, x1, y2, x2]`.

    Each box covers a uniform fraction in `scale` of the image area with a
    log-uniform aspect ratio (width / height, in pixels) in `ratio`,
    clipped to the image, at a uniform position.
    """
    import tensorflow as tf

    seeds = tf.random.experimental.stateless_split(seed, 4)
    area = tf.random.stateless_uniform([count], seeds[0], *scale)
    log_ratio = tf.random.stateless_uniform(
        [count], seeds[1], float(np.log(ratio[0])), float(np.log(ratio[1]))
    )
    aspect = tf.cast(width, tf.float32) / tf.cast(height, tf.float32)
    box_height = tf.minimum(tf.sqrt(area * aspect / tf.exp(log_ratio)), 1.0)
    box_width = tf.minimum(tf.sqrt(area * tf.exp(log_ratio) / aspect), 1.0)
    top = tf.random.stateless_uniform([count], seeds[2]) * (1.0 - box_height)
    left = tf.random.stateless_uniform([count], seeds[3]) * (1.0 - box_width)
    return tf.stack([top, left, top + box_height, left + box_width], axis=1)


def _random_resized_crops(images, image_size, scale, ratio, seed):
    """A random-resized crop of every image of a `(B, H, W, C)` batch."""
    import tensorflow as tf

    shape = tf.shape(images)
    boxes = _random_crop_boxes(shape[0], shape[1], shape[2], scale, ratio, seed)
    return tf.image.crop_and_resize(
        images, boxes, tf.range(shape[0]), image_size, method="bilinear"
    )


def center_crop(images, image_size, crop_fraction=1.0):
    """Resizes so the crop is `crop_fraction` of the shorter side, then crops.

    Works on one image `(H, W, C)` or a batch `(B, H, W, C)`.
    """
    import tensorflow as tf

    if crop_fraction >= 1.0:
        if tuple(images.shape[-3:-1]) == tuple(image_size):
            return images
        return tf.image.resize(images, image_size, method="bilinear")
    height, width = image_size
    resize_to = (
        int(round(height / crop_fraction)),
        int(round(width / crop_fraction)),
    )
    images = tf.image.resize(images, resize_to, method="bilinear")
    top, left = (resize_to[0] - height) // 2, (resize_to[1] - width) // 2
    return images[..., top : top + height, left : left + width, :]


def to_channels(images, channels):
    """Grey, grey+alpha, RGB or RGBA pixels as `channels` (1 or 3) channels.

    Grey becomes RGB by repetition, RGB grey by `tf.image.rgb_to_grayscale`,
    alpha is dropped. Works when the channel count is only known at run
    time (decoded image bytes).
    """
    import tensorflow as tf

    def grey(images):
        return images[..., :1]

    def colour(images):
        return images[..., :3]

    if channels == 3:
        as_grey, as_colour = (
            lambda: tf.image.grayscale_to_rgb(grey(images)),
            lambda: colour(images),
        )
    else:
        as_grey, as_colour = (
            lambda: grey(images),
            lambda: tf.image.rgb_to_grayscale(colour(images)),
        )
    have = images.shape[-1]
    if have is not None:
        return as_grey() if have < 3 else as_colour()
    return tf.cond(tf.shape(images)[-1] < 3, as_grey, as_colour)


def decode_upright(encoded, max_pixels=None, max_bytes=None):
    """Encoded image bytes decoded the right way up, their size checked before decoding.

    Refuses bytes above the limits from their header
    (`image_limits.assert_within_limits`), decodes JPEG/PNG/GIF/BMP/WebP (a
    GIF's first frame) and turns a photo as its EXIF orientation says
    (`orientation.upright`). Every place that decodes encoded images (image
    folders, `decode_for_eval`: `keras-vit predict`, `inspect` and the
    `serving_bytes` signature) goes through it.

    Returns:
        A `(height, width, channels)` uint8 tensor in the file's own channels.
    """
    import tensorflow as tf

    with tf.control_dependencies(
        [image_limits.assert_within_limits(encoded, max_pixels, max_bytes)]
    ):
        image = tf.io.decode_image(encoded, expand_animations=False)
    return orientation.upright(image, orientation.exif_orientation(encoded))


def decode_for_eval(
    encoded, image_size, channels=3, crop_fraction=1.0, max_pixels=None, max_bytes=None
):
    """Encoded image bytes as the evaluation pipeline's view of them.

    Decodes JPEG/PNG/GIF/BMP/WebP bytes (`decode_upright`: the first frame
    of a GIF, a photo turned by its EXIF orientation), converts the
    channels, then resizes and centre-crops exactly as the evaluation
    batches of `from_folder` do: float32 `(height, width, channels)` in
    `[0, 255]`. Undecodable bytes, and bytes whose header declares more
    than `max_pixels` pixels (or that are longer than `max_bytes`; defaults
    in `keras_vit.data.image_limits`), raise `tf.errors.InvalidArgumentError`
    when run; oversized images are refused before any decoding. The
    exported serving signatures and `keras-vit predict` use this, so served
    images see what evaluation saw.

    Example:

    >>> import tensorflow as tf
    >>> png = tf.io.encode_png(tf.zeros((10, 20, 1), tf.uint8))
    >>> decode_for_eval(png, (8, 8), channels=3).shape
    TensorShape([8, 8, 3])
    """
    import tensorflow as tf

    image_size = _check_size(image_size)
    image = to_channels(
        tf.cast(decode_upright(encoded, max_pixels, max_bytes), tf.float32), channels
    )
    image = center_crop(image, image_size, crop_fraction)
    image.set_shape((*image_size, channels))
    return image


def check_limit(limit):
    """Refuses a `limit` that is not `None` or a positive int (a `ValueError` naming it)."""
    if limit is not None and (not isinstance(limit, int) or isinstance(limit, bool) or limit < 1):
        raise ValueError(f"`limit` must be None or a positive int. Received: limit={limit!r}")


def limited(size, limit):
    """The examples a pipeline of `size` examples (or `None`: unknown) keeps under `limit`."""
    if limit is None or size is None:
        return size
    return min(size, limit)


def make_pipeline(
    dataset,
    num_classes,
    *,
    image_size,
    channels=3,
    training=False,
    batch_size=128,
    seed=0,
    shuffle_buffer=None,
    crop_scale=(0.08, 1.0),
    crop_fraction=1.0,
    flip=True,
    augmentation=None,
    cache=False,
    drop_remainder=None,
    shard=None,
    limit=None,
    decode=None,
    after_decoding=None,
    deterministic=False,
    autotune=True,
):
    """Turns `(image, label)` examples into model-ready batches.

    Training batches: shuffled, random-resized crop (Inception style:
    `crop_scale` of the area, aspect 3/4 to 4/3) and horizontal flip, then
    batch-level `augmentation` (see `keras_vit.data.augmentation`).
    Evaluation batches: resized (and centre-cropped to `crop_fraction` of
    the image), in order. Grayscale images become RGB when `channels=3`.

    Images of one static size (arrays, Fashion-MNIST, most TFDS datasets)
    are batched first and processed a batch at a time, in a few vectorised
    ops; images of varying sizes (folders) are cropped or resized one by
    one before batching. Both give the same kind of batches.

    Args:
        dataset: `tf.data.Dataset` of `(image, integer label)`, images
            uint8 or float `(H, W, C)` in `[0, 255]`.
        num_classes: int, for the one-hot labels.
        image_size: int or `(height, width)` of the model's input.
        channels: 1 or 3, the model's input channels.
        training: bool, whether to shuffle and augment.
        batch_size: int.
        seed: int; the same seed gives the same batches.
        shuffle_buffer: int or `None` (the whole dataset, if small enough).
        crop_scale: `(min, max)` area fraction of the random crop, or
            `None` for no crop (resize only).
        crop_fraction: float in `(0, 1]`, the evaluation centre crop.
        flip: bool, random horizontal flips in training.
        augmentation: `None` or a callable on `(images, labels)` batches.
        cache: bool, cache the decoded examples in memory.
        drop_remainder: bool; defaults to `training`.
        shard: `None` or `(num_shards, index)`: keep only every
            `num_shards`-th example from `index` on (one worker's share in
            multi-worker training), every shard cut to the same length
            when the size is known, so that all workers run as many steps.
        limit: `None` or an int: only the first `limit` examples (a quick
            trial run; the sources' `Dataset.size` counts them the same).
        decode: `None`, or a function of `(example, label)` to `(image,
            label)` for examples that are not images yet (a folder's file
            names): it runs after the shuffle, so the shuffle buffer holds
            names rather than images (unless `cache`, which keeps the
            decoded images); examples it fails on are dropped (with
            tf.data's warning, unless `after_decoding`).
        after_decoding: `None`, or a function of no arguments, called (in
            Python) each time a pass over the decoded examples ends, e.g. to
            report the examples that `decode` failed on.
        deterministic: bool, whether training batches come in the same
            order on every run of a `seed` (`keras-vit train --deterministic`:
            runs and resumes bit for bit); otherwise parallel steps may hand
            over out of order, which keeps many cores busy. Each batch's
            examples and augmentations follow `seed` either way, and
            evaluation batches always keep the data's order.
        autotune: bool, whether tf.data tunes its parallelism and buffers
            to the machine while it runs (tf.data's default), or keeps them
            fixed.

    Returns:
        `tf.data.Dataset` of `(float32 images (B, H, W, channels),
        float32 one-hot labels (B, num_classes))`.
    """
    import tensorflow as tf

    image_size = _check_size(image_size)
    if channels not in (1, 3):
        raise ValueError(f"`channels` must be 1 or 3. Received: channels={channels!r}")
    if not isinstance(batch_size, int) or batch_size < 1:
        raise ValueError(
            f"`batch_size` must be a positive int. Received: batch_size={batch_size!r}"
        )
    if not 0.0 < crop_fraction <= 1.0:
        raise ValueError(
            f"`crop_fraction` must be in (0, 1]. Received: crop_fraction={crop_fraction!r}"
        )
    check_limit(limit)
    if shard is not None:
        if (
            not isinstance(shard, (tuple, list))
            or len(shard) != 2
            or not all(isinstance(s, int) for s in shard)
            or not 0 <= shard[1] < shard[0]
        ):
            raise ValueError(
                f"`shard` must be (num_shards, index) with 0 <= index < num_shards. "
                f"Received: shard={shard!r}"
            )
    deterministic = deterministic or not training  # predictions line up with their files
    parallel = dict(num_parallel_calls=tf.data.AUTOTUNE, deterministic=deterministic)

    def decoded(data, in_order):
        if decode is None:
            return data
        count = int(in_order.cardinality())
        decode_one = graph_function(decode)
        examples = data.map(decode_one, **parallel).ignore_errors(
            log_warning=after_decoding is None
        )
        if after_decoding is not None:
            examples = examples.concatenate(_calling(after_decoding, examples.element_spec))
        if not training or count < 0:
            return examples  # evaluation: exactly the examples that decode
        # Dropping examples leaves the length unknown, which Keras reports at
        # every training epoch's end as running out of data: the length stays
        # the examples' count, the first examples in order standing in for any
        # that failed. (Behind `concatenate`, which opens its first input when
        # it is opened: each epoch's iterator draws its shuffle at once, as
        # a resumed run's replay of the finished epochs expects.)
        stand_ins = in_order.map(decode_one, **parallel).ignore_errors().repeat()
        return (
            examples.concatenate(stand_ins)
            .take(count)
            .apply(tf.data.experimental.assert_cardinality(count))
        )

    data = dataset if limit is None else dataset.take(limit)
    if shard is not None:
        size = int(data.cardinality())
        data = data.shard(*shard)
        if size >= 0:
            data = data.take(size // shard[0])
    in_order = data
    if cache:
        data = decoded(data, in_order).cache()
    if training:
        buffer = shuffle_buffer or 60_000
        data = data.shuffle(buffer, seed=seed, reshuffle_each_iteration=True)
    if not cache:
        data = decoded(data, in_order)
    # The images as decoded (a folder's examples are names until `decode`).
    image_spec = data.element_spec[0]
    if image_spec.shape.rank not in (2, 3) or (
        image_spec.shape.rank == 3 and image_spec.shape[-1] not in (1, 3, 4)
    ):
        raise ValueError(
            "Images must be (H, W) or (H, W, C) with 1, 3 or 4 channels (static). "
            f"Received shape {image_spec.shape}."
        )
    ratio = (3 / 4, 4 / 3)
    per_batch = image_spec.shape.is_fully_defined()
    random_crop = training and crop_scale is not None
    fraction = 1.0 if training else crop_fraction  # the evaluation view

    channel_axis_missing = image_spec.shape.rank == 2

    def as_float(image, label):  # one image or a batch
        image = tf.cast(image, tf.float32)
        return (image[..., None] if channel_axis_missing else image), label

    def crop_one(index, example):
        # Each example's crop seed comes from its position in the epoch
        # stream, so a given seed replays the same augmented batches.
        image, label = as_float(*example)
        crop_seed = tf.stack([tf.cast(seed, tf.int64), index])
        return _random_resized_crops(image[None], image_size, crop_scale, ratio, crop_seed)[
            0
        ], label

    def view_one(image, label):
        return center_crop(as_float(image, label)[0], image_size, fraction), label

    def finish_batch(index, batch):
        images, labels = as_float(*batch) if per_batch else batch
        batch_seed = tf.stack([tf.cast(seed, tf.int64), index])
        if per_batch and random_crop:
            images = _random_resized_crops(images, image_size, crop_scale, ratio, batch_seed)
        elif per_batch:
            images = center_crop(images, image_size, fraction)
        images = to_channels(images, channels)
        if training and flip:
            # One flip decision per image, seeded by the batch index.
            flip_seed = tf.random.experimental.stateless_fold_in(batch_seed, 1)
            flips = tf.random.stateless_uniform([tf.shape(images)[0], 1, 1, 1], flip_seed) < 0.5
            images = tf.where(flips, tf.reverse(images, axis=[2]), images)
        return images, tf.one_hot(tf.cast(labels, tf.int32), num_classes)

    def counted(data):
        return tf.data.Dataset.zip(tf.data.Dataset.counter(), data)

    if not per_batch:  # varying sizes: one size per example before batching
        if random_crop:
            data = counted(data).map(graph_function(crop_one), **parallel)
        else:
            data = data.map(graph_function(view_one), **parallel)
    data = data.batch(
        batch_size, drop_remainder=training if drop_remainder is None else drop_remainder
    )
    data = counted(data).map(graph_function(finish_batch), **parallel)
    if training and augmentation is not None:
        data = data.map(graph_function(augmentation), **parallel)
    options = tf.data.Options()
    options.deterministic = deterministic
    options.autotune.enabled = autotune
    return data.with_options(options).prefetch(tf.data.AUTOTUNE)


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


def _calling(function, element_spec):
    """A dataset of no elements (of `element_spec`) that calls `function` when reached.

    A `py_function` rather than a generator: tf.data serialises a pipeline
    to optimise it, which a generator would prevent for the whole pipeline.
    """
    import tensorflow as tf

    def call(_):
        return tf.py_function(lambda: function() or False, [], tf.bool)

    def nothing(_):  # the structure only: no element gets here
        return tf.nest.map_structure(
            lambda spec: tf.zeros([size or 0 for size in spec.shape], spec.dtype), element_spec
        )

    return tf.data.Dataset.from_tensors(0).map(call).filter(lambda kept: kept).map(nothing)


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


def held_out_split(labels, validation_split):
    """`(training, validation)` index arrays: a fixed share of each class held out.

    Deterministic (the same files for the same folder, whatever the training
    seed), stratified, at least one image of each class held out.
    """
    if (
        isinstance(validation_split, bool)
        or not isinstance(validation_split, (int, float))
        or not 0.0 < validation_split < 1.0
    ):
        raise ValueError(
            "`validation_split` must be a fraction between 0 and 1. "
            f"Received: validation_split={validation_split!r}"
        )
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


def _first_line(text, limit=300):
    """The first line of a message, shortened at a word boundary."""
    line = str(text).strip().splitlines()[0] if str(text).strip() else ""
    if len(line) <= limit:
        return line
    return line[:limit].rsplit(" ", 1)[0] + " ..."


def check_tfds_name(name):
    """Fails at once, without network, for a name TFDS does not know."""
    import tensorflow_datasets as tfds

    if name not in tfds.list_builders():
        raise ValueError(
            f"Unknown TFDS dataset {name!r}; see `tfds.list_builders()` (or "
            "pass an image folder or 'fashion_mnist')."
        )


def from_tfds(name, split="train", data_dir=None, download=False, **kwargs):
    """A pipeline over a TensorFlow Datasets dataset, by name.

    Args:
        name: TFDS name, e.g. `"cifar10"`, `"oxford_flowers102"`.
        split: TFDS split, e.g. `"train"`, `"test[:10%]"`.
        data_dir: where TFDS keeps its data (default `~/tensorflow_datasets`).
        download: whether TFDS may download and prepare the data; without
            it a dataset that is not prepared fails at once.
        **kwargs: `make_pipeline` arguments.

    Raises:
        ValueError: unknown dataset name.
        RuntimeError: the data is not prepared (and may not, or could not,
            be downloaded), saying how to prepare it.
    """
    import tensorflow_datasets as tfds

    check_tfds_name(name)
    try:
        # Without download, TFDS reads what is prepared in data_dir or fails at once.
        dataset, info = tfds.load(
            name,
            split=split,
            data_dir=data_dir,
            download=download,
            as_supervised=True,
            with_info=True,
        )
    except Exception as error:
        if not download:
            raise RuntimeError(
                f"TFDS dataset {name!r} ({split}) is not prepared in "
                f"{data_dir or '~/tensorflow_datasets'}. Pass "
                "`download=True` to download and prepare it there (needs internet), or "
                f"prepare it on a machine with internet access (`tfds build {name} "
                "--data_dir DIR`), copy DIR here and pass it as `data_dir`."
            ) from error
        raise RuntimeError(
            f"TFDS dataset {name!r} ({split}) could not be read from "
            f"{data_dir or '~/tensorflow_datasets'}"
            + (" or downloaded" if download else "")
            + f" ({type(error).__name__}: {_first_line(error)}). Prepare it on a "
            f"machine with internet access (`tfds build {name}`) and copy the "
            "data directory here, then pass it as `data_dir`."
        ) from error
    class_names = tuple(info.features["label"].names)
    size = info.splits[split].num_examples if split in info.splits else None
    data = make_pipeline(dataset, len(class_names), shuffle_buffer=10_000, **kwargs)
    return Dataset(data, class_names, limited(size, kwargs.get("limit")))


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
        f"and {directory}/test/<class>/<images>; or pass validation_split=0.1 to hold out "
        "10% of the training images of each class for testing."
    )


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
    if not isinstance(source, (str, os.PathLike)):
        raise TypeError(f"`source` must be a str. Received: source={source!r}")
    source = os.fspath(source)
    validation_split = kwargs.pop("validation_split", None)
    # TFDS's own options: where its data is, whether it may download.
    tfds_options = {k: kwargs.pop(k) for k in ("data_dir", "download") if k in kwargs}
    if validation_split is not None and not os.path.isdir(source):
        raise ValueError(
            "`validation_split` holds out images of an image folder; "
            f"{source!r} is not one (its own test split is used). "
            f"Received: validation_split={validation_split!r}"
        )
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
    if os.sep in source or source.startswith("."):
        raise ValueError(f"Dataset folder {source!r} does not exist.")
    return from_tfds(source, split, **tfds_options, **kwargs)
