"""A small convolutional stem: the paper's hybrid input, kept light."""

import keras
import numpy as np


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
        **kwargs: base layer keyword arguments, e.g. `name` and `dtype`.

    Call arguments:
        inputs: images `(batch, height, width, channels)`.
        training: bool, BatchNorm's mode.

    Returns:
        Feature maps `(batch, height / 2**n, width / 2**n, filters[-1])`.

    Example:

    >>> stem = ConvStem(filters=(16, 32))
    >>> tuple(stem(keras.ops.zeros((2, 28, 28, 1))).shape)
    (2, 7, 7, 32)
    """

    def __init__(self, filters=(32, 64), strides=None, **kwargs):
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
        self.filters = filters
        self.strides = strides
        self.convolutions, self.norms = [], []
        synchronized = replicated_tensorflow()
        for index, (width, stride) in enumerate(zip(filters, strides)):
            self.convolutions.append(keras.layers.Conv2D(
                width, 3, strides=stride, padding="same", use_bias=False,
                dtype=self.dtype_policy, name=f"conv_{index}",
            ))
            self.norms.append(keras.layers.BatchNormalization(
                synchronized=synchronized, dtype=self.dtype_policy,
                name=f"batch_norm_{index}",
            ))

    @property
    def stride(self):
        """How many times smaller the output map is than the image."""
        return int(np.prod(self.strides))

    def build(self, input_shape):
        shape = tuple(input_shape)
        for convolution, norm in zip(self.convolutions, self.norms):
            convolution.build(shape)
            shape = convolution.compute_output_shape(shape)
            norm.build(shape)

    def call(self, inputs, training=None):
        x = inputs
        for convolution, norm in zip(self.convolutions, self.norms):
            x = keras.ops.relu(norm(convolution(x), training=training))
        return x

    def compute_output_shape(self, input_shape):
        shape = tuple(input_shape)
        for convolution in self.convolutions:
            shape = convolution.compute_output_shape(shape)
        return shape

    def get_config(self):
        config = super().get_config()
        config.update({"filters": list(self.filters), "strides": list(self.strides)})
        return config
