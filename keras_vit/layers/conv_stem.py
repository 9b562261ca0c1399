"""A small convolutional stem: the paper's hybrid input, kept light."""

import math

import keras
import numpy as np

from keras_vit.layers.batch_normalization import BatchNormalization

DOWNSAMPLINGS = ("convolution", "max_pool")


def replicated_tensorflow():
    """Whether a `tf.distribute` strategy with several replicas is in scope."""
    if keras.backend.backend() != "tensorflow":
        return False
    import tensorflow as tf

    return tf.distribute.has_strategy() and tf.distribute.get_strategy().num_replicas_in_sync > 1


@keras.saving.register_keras_serializable(package="keras_vit")
class ConvStem(keras.layers.Layer):
    """3×3 convolutions (BatchNorm, ReLU) before the patch embedding.

    The paper's hybrid ViT (section 3.1) forms the token sequence from a
    CNN's feature map instead of raw pixels; Xiao et al. 2021 ("Early
    Convolutions Help Transformers See Better") show that a few stride-2
    convolutions in place of the patchify layer make ViTs train faster
    and more stably. Each entry of `filters` adds one Conv(3×3, same
    padding) + BatchNorm + ReLU, of stride 2 unless `strides` says
    otherwise, so the feature map is `stride` (the product of the strides)
    times smaller than the image; the patch embedding then cuts that map
    into patches (often 1×1). Built under a `tf.distribute` strategy
    with several replicas, the BatchNorms compute their statistics over
    the global batch (`synchronized=True`), as one device and JAX's
    `keras.distribution` do; otherwise the replicas' moving statistics
    would drift apart.

    Args:
        filters: sequence of ints, the channels of each convolution.
        strides: sequence of 1s and 2s, one per convolution, or `None` for
            all 2.
        downsampling: how each stride-2 stage halves the map:
            `"convolution"` (a stride-2 convolution) or `"max_pool"` (a
            stride-1 convolution, then 2×2 max pooling); one for every
            stage, or a sequence with one per convolution.
        **kwargs: base layer keyword arguments, e.g. `name` and `dtype`.

    Call arguments:
        inputs: images `(batch, height, width, channels)`.
        training: bool, BatchNorm's mode.

    Returns:
        Feature maps `(batch, ⌈height / stride⌉, ⌈width / stride⌉, filters[-1])`
        (each halving rounded up).

    Example:

    >>> stem = ConvStem(filters=(16, 32))
    >>> tuple(stem(keras.ops.zeros((2, 28, 28, 1))).shape)
    (2, 7, 7, 32)
    >>> stem = ConvStem(filters=(16, 32, 64), downsampling="max_pool")
    >>> tuple(stem(keras.ops.zeros((2, 28, 28, 1))).shape)
    (2, 4, 4, 64)
    """

    def __init__(self, filters=(32, 64), strides=None, downsampling="convolution", **kwargs):
        super().__init__(**kwargs)
        filters = tuple(filters) if isinstance(filters, (list, tuple)) else filters
        if (
            not isinstance(filters, tuple)
            or not filters
            or not all(isinstance(f, int) and f > 0 for f in filters)
        ):
            raise ValueError(
                "`filters` must be a non-empty sequence of positive ints. "
                f"Received: filters={filters!r}"
            )
        strides = (2,) * len(filters) if strides is None else tuple(strides)
        if len(strides) != len(filters) or not all(s in (1, 2) for s in strides):
            raise ValueError(
                f"`strides` must hold a 1 or 2 for each of the {len(filters)} "
                f"convolutions. Received: strides={strides!r}"
            )
        stages = (downsampling,) * len(filters) if isinstance(downsampling, str) else downsampling
        if (
            not isinstance(stages, (list, tuple))
            or len(stages) != len(filters)
            or not all(stage in DOWNSAMPLINGS for stage in stages)
        ):
            raise ValueError(
                f"`downsampling` must be one of {DOWNSAMPLINGS}, or one of them for each of "
                f"the {len(filters)} convolutions. Received: downsampling={downsampling!r}"
            )
        self.filters = filters
        self.strides = strides
        self.downsampling = downsampling if isinstance(downsampling, str) else tuple(stages)
        self.stage_downsampling = tuple(stages)
        self.convolutions, self.norms = [], []
        synchronized = replicated_tensorflow()
        for index, (width, stride, stage) in enumerate(zip(filters, strides, stages)):
            self.convolutions.append(
                keras.layers.Conv2D(
                    width,
                    3,
                    strides=stride if stage == "convolution" else 1,
                    padding="same",
                    data_format="channels_last",  # whatever the global image format
                    use_bias=False,
                    dtype=self.dtype_policy,
                    name=f"conv_{index}",
                )
            )
            self.norms.append(
                BatchNormalization(
                    synchronized=synchronized,
                    dtype=self.dtype_policy,
                    name=f"batch_norm_{index}",
                )
            )

    @property
    def stride(self):
        """How many times smaller the output map is than the image."""
        return int(np.prod(self.strides))

    def output_size(self, size):
        """`(height, width)` of the feature map for an image of `size` (ints or None)."""
        return tuple(stem_output_side(side, self.strides) for side in size)

    def build(self, input_shape):
        shape = tuple(input_shape)
        for convolution, norm, stride, stage in zip(
            self.convolutions, self.norms, self.strides, self.stage_downsampling
        ):
            convolution.build(shape)
            shape = convolution.compute_output_shape(shape)
            norm.build(shape)
            if stage == "max_pool":
                shape = (
                    shape[0],
                    *(stem_output_side(side, (stride,)) for side in shape[1:3]),
                    shape[3],
                )

    def call(self, inputs, training=None):
        x = inputs
        for convolution, norm, stride, stage in zip(
            self.convolutions, self.norms, self.strides, self.stage_downsampling
        ):
            x = keras.ops.relu(norm(convolution(x), training=training))
            if stage == "max_pool" and stride == 2:
                x = max_pool_2x2(x)
        return x

    def compute_output_shape(self, input_shape):
        shape = tuple(input_shape)
        return (shape[0],) + self.output_size(shape[1:3]) + (self.filters[-1],)

    def get_config(self):
        config = super().get_config()
        downsampling = self.downsampling
        config.update(
            {
                "filters": list(self.filters),
                "strides": list(self.strides),
                "downsampling": downsampling
                if isinstance(downsampling, str)
                else list(downsampling),
            }
        )
        return config


def stem_output_side(side, strides):
    """The side of a stem's feature map for an image side (`None` stays `None`).

    Each stride-2 stage halves it, rounding up (Conv2D's and pooling's
    "same" padding).
    """
    if side is None:
        return None
    for stride in strides:
        side = math.ceil(side / stride)
    return side


def max_pool_2x2(x):
    """2×2 max pooling of stride 2 over `(batch, height, width, channels)`, "same" padding.

    The same values as `keras.ops.max_pool(x, 2, 2, padding="same")`: an
    odd side gets a row or column of -inf at its end. As a reshape and a
    max, its gradient is element-wise work under XLA (the pooling op's
    is a select-and-scatter, slow on XLA:CPU).
    """
    shape = keras.ops.shape(x)
    height, width = shape[1], shape[2]
    x = keras.ops.pad(
        x, [[0, 0], [0, height % 2], [0, width % 2], [0, 0]], constant_values=float("-inf")
    )
    x = keras.ops.reshape(x, (-1, (height + 1) // 2, 2, (width + 1) // 2, 2, shape[3]))
    return keras.ops.max(x, axis=(2, 4))
