"""`tf.data` pipelines that feed `model.fit` on every backend: examples to batches.

Every source (`keras_vit.data.sources`: in-memory arrays, an image folder,
a TFDS dataset, the Debian Fashion-MNIST files) ends in the same
`make_pipeline`: images as float32 `[0, 255]` pixels of the model's size
and channels (the models normalise pixels themselves), one-hot float labels
(so label smoothing, MixUp and CutMix apply), batched, optionally cached,
prefetched, and shuffled and augmented from `seed` (in the same order on
every run with `deterministic=True`), with tf.data's autotuning unless told
otherwise. Also the one decoding of encoded images (`decode_upright`,
`decode_for_eval`) that folders, serving and the commands share.
"""

import dataclasses
import functools

import numpy as np

from keras_vit import _options
from keras_vit.data import image_limits, orientation


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
            f"{_options.name('image_size')} must be a positive int or (height, width). "
            f"Received: {_options.given('image_size', image_size)}"
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
        raise ValueError(
            f"{_options.name('limit')} must be None or a positive int. "
            f"Received: {_options.given('limit', limit)}"
        )


def limited(size, limit):
    """The examples a pipeline of `size` examples (or `None`: unknown) keeps under `limit`."""
    if limit is None or size is None:
        return size
    return min(size, limit)


@dataclasses.dataclass(frozen=True)
class PipelineOptions:
    """How `make_pipeline` turns examples into batches: its keywords, as one value.

    See `make_pipeline` for each field. `image_size` has no default.
    """

    image_size: object = None
    channels: int = 3
    training: bool = False
    batch_size: int = 128
    seed: int = 0
    shuffle_buffer: int = None
    crop_scale: tuple = (0.08, 1.0)
    crop_fraction: float = 1.0
    flip: bool = True
    augmentation: object = None
    cache: bool = False
    drop_remainder: bool = None
    shard: tuple = None
    limit: int = None
    deterministic: bool = False
    autotune: bool = True

    def checked(self):
        """The options with `image_size` as `(height, width)`, or a `ValueError` naming one."""
        if self.image_size is None:
            raise TypeError("make_pipeline() needs `image_size`, the model's input size.")
        image_size = _check_size(self.image_size)
        if self.channels not in (1, 3):
            raise ValueError(f"`channels` must be 1 or 3. Received: channels={self.channels!r}")
        batch_size = self.batch_size
        if not isinstance(batch_size, int) or batch_size < 1:
            raise ValueError(
                f"{_options.name('batch_size')} must be a positive int. "
                f"Received: {_options.given('batch_size', batch_size)}"
            )
        if not 0.0 < self.crop_fraction <= 1.0:
            raise ValueError(
                f"`crop_fraction` must be in (0, 1]. Received: crop_fraction={self.crop_fraction!r}"
            )
        check_limit(self.limit)
        shard = self.shard
        if shard is not None and (
            not isinstance(shard, (tuple, list))
            or len(shard) != 2
            or not all(isinstance(s, int) for s in shard)
            or not 0 <= shard[1] < shard[0]
        ):
            raise ValueError(
                f"`shard` must be (num_shards, index) with 0 <= index < num_shards. "
                f"Received: shard={shard!r}"
            )
        return dataclasses.replace(self, image_size=image_size)


def make_pipeline(
    dataset, num_classes, options=None, *, decode=None, after_decoding=None, **keywords
):
    import tensorflow as tf

    options = dataclasses.replace(options or PipelineOptions(), **keywords).checked()
    # Evaluation batches keep the data's order: predictions line up with their files.
    deterministic = options.deterministic or not options.training
    parallel = dict(num_parallel_calls=tf.data.AUTOTUNE, deterministic=deterministic)
    data = _examples(dataset, options, decode, after_decoding, parallel)
    # The images as decoded (a folder's examples are names until `decode`).
    image_spec = data.element_spec[0]
    if image_spec.shape.rank not in (2, 3) or (
        image_spec.shape.rank == 3 and image_spec.shape[-1] not in (1, 3, 4)
    ):
        raise ValueError(
            "Images must be (H, W) or (H, W, C) with 1, 3 or 4 channels (static). "
            f"Received shape {image_spec.shape}."
        )
    data = _batches(data, num_classes, options, image_spec, parallel)
    if options.training and options.augmentation is not None:
        data = data.map(graph_function(options.augmentation), **parallel)
    pipeline_options = tf.data.Options()
    pipeline_options.deterministic = deterministic
    pipeline_options.autotune.enabled = options.autotune
    return data.with_options(pipeline_options).prefetch(tf.data.AUTOTUNE)


def _examples(dataset, options, decode, after_decoding, parallel):
    """The examples an epoch sees: limited, sharded, cached, shuffled, decoded."""
    data = dataset if options.limit is None else dataset.take(options.limit)
    if options.shard is not None:
        size = int(data.cardinality())
        data = data.shard(*options.shard)
        if size >= 0:
            data = data.take(size // options.shard[0])
    in_order = data
    if options.cache:
        data = _decoded(data, in_order, decode, after_decoding, options.training, parallel)
        data = data.cache()
    if options.training:
        buffer = options.shuffle_buffer or 60_000
        data = data.shuffle(buffer, seed=options.seed, reshuffle_each_iteration=True)
    if not options.cache:
        data = _decoded(data, in_order, decode, after_decoding, options.training, parallel)
    return data


def _decoded(data, in_order, decode, after_decoding, training, parallel):
    """`data`'s examples through `decode` (a folder's names to images), failures dropped."""
    import tensorflow as tf

    if decode is None:
        return data
    count = int(in_order.cardinality())
    decode_one = graph_function(decode)
    examples = data.map(decode_one, **parallel).ignore_errors(log_warning=after_decoding is None)
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


def _batches(data, num_classes, options, image_spec, parallel):
    """Examples to batches: cropped (or viewed), flipped, channels and one-hot labels."""
    import tensorflow as tf

    image_size, seed, training = options.image_size, options.seed, options.training
    ratio = (3 / 4, 4 / 3)
    per_batch = image_spec.shape.is_fully_defined()
    random_crop = training and options.crop_scale is not None
    fraction = 1.0 if training else options.crop_fraction  # the evaluation view
    channel_axis_missing = image_spec.shape.rank == 2

    def as_float(image, label):  # one image or a batch
        image = tf.cast(image, tf.float32)
        return (image[..., None] if channel_axis_missing else image), label

    def crop_one(index, example):
        # Each example's crop seed comes from its position in the epoch
        # stream, so a given seed replays the same augmented batches.
        image, label = as_float(*example)
        crop_seed = tf.stack([tf.cast(seed, tf.int64), index])
        crops = _random_resized_crops(image[None], image_size, options.crop_scale, ratio, crop_seed)
        return crops[0], label

    def view_one(image, label):
        return center_crop(as_float(image, label)[0], image_size, fraction), label

    def finish_batch(index, batch):
        images, labels = as_float(*batch) if per_batch else batch
        batch_seed = tf.stack([tf.cast(seed, tf.int64), index])
        if per_batch and random_crop:
            images = _random_resized_crops(
                images, image_size, options.crop_scale, ratio, batch_seed
            )
        elif per_batch:
            images = center_crop(images, image_size, fraction)
        images = to_channels(images, options.channels)
        if training and options.flip:
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
    drop_remainder = training if options.drop_remainder is None else options.drop_remainder
    data = data.batch(options.batch_size, drop_remainder=drop_remainder)
    return counted(data).map(graph_function(finish_batch), **parallel)


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
