"""Keras' BatchNormalization on keras_vit's closed-form backward pass."""

import keras
from keras import ops

from keras_vit.ops.batch_norm import batch_norm, closed_form_batch_norm_preferred


@keras.saving.register_keras_serializable(package="keras_vit")
class BatchNormalization(keras.layers.BatchNormalization):
    """`keras.layers.BatchNormalization` with a closed-form backward pass.

    A drop-in subclass: same arguments, weights (`gamma`, `beta`,
    `moving_mean`, `moving_variance`) and values. In a training step over
    the last axis, with `gamma` and `beta`, no mask, no renormalisation and
    unsynchronised statistics (`ConvStem`'s case), it runs
    `keras_vit.ops.batch_norm` where that is the faster kernel
    (`closed_form_batch_norm_preferred`: JAX), and updates the moving
    statistics as Keras' layer does. Otherwise it is Keras' own layer.

    Args:
        **kwargs: the arguments of `keras.layers.BatchNormalization`, e.g.
            `momentum`, `epsilon`, `name` and `dtype`.

    Example:
    >>> norm = BatchNormalization()
    >>> outputs = norm(keras.ops.reshape(keras.ops.arange(8.0), (4, 1, 1, 2)), training=True)
    >>> keras.ops.convert_to_numpy(norm.moving_mean).astype("float64").round(2).tolist()
    [0.03, 0.04]
    """

    def _runs_closed_form(self, inputs, training, mask):
        rank = len(inputs.shape)
        return (
            closed_form_batch_norm_preferred()
            and training
            and self.trainable
            and mask is None
            and self.axis % rank == rank - 1
            and self.center
            and self.scale
            and not self.renorm
            and not self.synchronized
        )

    def call(self, inputs, training=None, mask=None):
        if not self._runs_closed_form(inputs, training, mask):
            return super().call(inputs, training=training, mask=mask)
        dtype = keras.backend.result_type(inputs.dtype, "float32")
        outputs, mean, variance = batch_norm(
            inputs, ops.cast(self.gamma, dtype), ops.cast(self.beta, dtype), self.epsilon
        )
        for moving, batch in ((self.moving_mean, mean), (self.moving_variance, variance)):
            moving.assign(
                ops.cast(moving, dtype) * self.momentum
                + ops.stop_gradient(batch) * (1.0 - self.momentum)
            )
        return ops.cast(outputs, self.compute_dtype)
