"""BatchNorm statistics that match the trained weights, whatever the run's length.

A BatchNorm layer normalises a training batch by the batch's own mean and
variance, and at inference by its moving averages of them (momentum 0.99
in Keras). After a short run those averages still remember their start
(mean 0, variance 1) and lag the weights, which changed fastest early: the
main job's model after one epoch on 2,048 images scores 24% with them, and
several times that with the statistics of its inputs. So a run recomputes
them after its last epoch (and before any validation): the population mean
and variance of each layer's inputs at inference, over a bounded sample of
the training images (timm and detectron call this "precise BN").
"""

import math

import keras
import numpy as np

from keras_vit._compat import all_layers

MAX_IMAGES = 2048  # per layer; plenty for the per-channel statistics of a stem's map


class _Recorded(Exception):
    """Ends a forward pass once the layer of interest has seen its inputs."""


def batch_norm_layers(model):
    """The model's trainable `keras.layers.BatchNormalization` layers, nested ones included.

    A frozen one (`trainable=False`: a distillation teacher's, a frozen
    stem's) runs in inference mode in training and keeps its statistics.
    """
    return [
        layer
        for layer in all_layers(model)
        if isinstance(layer, keras.layers.BatchNormalization) and layer.trainable
    ]


def recompute_batch_norm_statistics(model, batches, max_images=MAX_IMAGES):
    """Sets every BatchNorm layer's moving statistics to those of its inputs at inference.

    The layers are done in the order the model calls them, each over
    `max_images` images run through the model in inference mode with the
    layers before it already done: each layer then normalises what it
    receives at inference to zero mean and unit variance (before its
    `gamma` and `beta`), as its training batches were. Each pass stops at
    the layer it measures, so layers after the last BatchNorm (a ViT's
    Transformer blocks after its stem) cost nothing. A model without
    BatchNorm is left as it is.

    Args:
        model: a built Keras model.
        batches: a function of no arguments that returns an iterable of
            batches (images, or `(images, labels, ...)` tuples, as NumPy
            arrays or tensors), e.g. a `tf.data.Dataset` of the training
            images without augmentation; called once per layer, it should
            give the same images each time.
        max_images: positive int, the images per layer (fewer if the data
            has fewer).

    Returns:
        int, the images each layer's statistics were computed over (0 for
        a model without BatchNorm).

    Example:

    >>> import numpy as np
    >>> inputs = keras.Input((4, 4, 2))
    >>> model = keras.Model(inputs, keras.layers.BatchNormalization()(inputs))
    >>> images = np.random.default_rng(0).normal(3.0, 2.0, (64, 4, 4, 2))
    >>> recompute_batch_norm_statistics(model, lambda: np.split(images, 4))
    64
    >>> norm = model.layers[1]
    >>> bool(np.allclose(norm.moving_mean, images.mean(axis=(0, 1, 2)), atol=1e-6))
    True
    >>> bool(np.allclose(norm.moving_variance, images.var(axis=(0, 1, 2)), atol=1e-5))
    True
    """
    if not isinstance(max_images, int) or isinstance(max_images, bool) or max_images < 1:
        raise ValueError(
            f"`max_images` must be a positive int. Received: max_images={max_images!r}"
        )
    pending = batch_norm_layers(model)
    images = 0
    while pending:
        moments = _InputMoments()
        seen = _pass(model, pending, moments.record, batches(), max_images)
        if moments.layer is None:
            break  # the rest are never called
        mean = moments.sum / moments.count
        variance = np.maximum(moments.sum_of_squares / moments.count - np.square(mean), 0.0)
        layer = moments.layer
        layer.moving_mean.assign(mean.astype(layer.moving_mean.dtype))
        layer.moving_variance.assign(variance.astype(layer.moving_variance.dtype))
        pending.remove(layer)
        images = seen if not images else min(images, seen)
    return images


class _InputMoments:
    """Per-channel sums of the inputs of the first layer that records, in float64."""

    def __init__(self):
        self.layer, self.count, self.sum, self.sum_of_squares = None, 0, 0.0, 0.0

    def record(self, layer, inputs):
        x = np.asarray(keras.ops.convert_to_numpy(inputs), dtype=np.float64)
        axes = tuple(i for i in range(x.ndim) if i != layer.axis % x.ndim)
        self.layer = layer
        self.count += math.prod(x.shape[i] for i in axes)
        self.sum = self.sum + x.sum(axis=axes)
        self.sum_of_squares = self.sum_of_squares + np.square(x).sum(axis=axes)
        raise _Recorded


def _pass(model, layers, record, batches, max_images):
    """Runs `batches` through `model` until `max_images`, with `record` on `layers`' inputs."""
    for layer in layers:
        # An instance attribute: Keras' `__call__` calls `self.call`.
        layer.call = lambda inputs, *args, _layer=layer, **kwargs: record(_layer, inputs)
    seen = 0
    try:
        for batch in batches:
            if seen >= max_images:
                break
            images = batch[0] if isinstance(batch, (tuple, list)) else batch
            images = np.asarray(images)[: max_images - seen]
            try:
                model(images, training=False)
            except _Recorded:
                pass
            seen += len(images)
    finally:
        for layer in layers:
            del layer.call
    return seen


class PreciseBatchNorm(keras.callbacks.Callback):
    """Recomputes the BatchNorm statistics before each validation in `fit`.

    Keras runs a `fit`'s validation after the epoch's last training step
    and before `on_epoch_end`, through the fit's callbacks: the statistics
    are recomputed there (`on_test_begin`), so every validation (and the
    checkpoint written at the epoch's end) sees them. Training steps use
    their batches' statistics, so the run's course does not change. After
    `fit`, `finish()` recomputes them unless the last epoch's validation did.

    Args:
        batches: as `recompute_batch_norm_statistics`.
        max_images: as `recompute_batch_norm_statistics`.
        log: `None` or a function that prints a line (once, after the
            first recomputation).
    """

    def __init__(self, batches, max_images=MAX_IMAGES, log=None):
        super().__init__()
        self.batches = batches
        self.max_images = max_images
        self.log = log
        self.current = False  # the statistics are those of the weights as they are

    def on_epoch_begin(self, epoch, logs=None):
        self.current = False  # the epoch's steps will move the weights

    def on_test_begin(self, logs=None):
        if not self.current:
            self.recompute()

    def finish(self):
        """Recomputes the statistics unless they are the final weights' already."""
        if not self.current:
            self.recompute()

    def recompute(self):
        images = recompute_batch_norm_statistics(self.model, self.batches, self.max_images)
        self.current = True
        if images and self.log is not None:
            self.log(f"BatchNorm statistics recomputed on {images:,} training images")
            self.log = None
