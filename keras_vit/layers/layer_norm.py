"""Keras' LayerNormalization on keras_vit's closed-form backward pass."""

import keras
from keras import ops

from keras_vit.ops.layer_norm import layer_norm
from keras_vit.ops.switch import fast_kernels_enabled


@keras.saving.register_keras_serializable(package="keras_vit")
class LayerNormalization(keras.layers.LayerNormalization):
    """`keras.layers.LayerNormalization` with a closed-form backward pass.

    A drop-in subclass: same arguments, weights (`gamma`, `beta`) and values.
    When it normalises over the last axis with both `gamma` and `beta`
    (ViT's case), it runs `keras_vit.ops.layer_norm`, whose backward pass
    on TensorFlow and JAX keeps only the input and the per-row mean and
    `1 / sigma`. Otherwise, and with the fast kernels switched off
    (`disable_fast_kernels`), it is Keras' own layer.
    Computes in at least float32, as Keras' layer does.

    Args:
        **kwargs: the arguments of `keras.layers.LayerNormalization`, e.g.
            `epsilon`, `name` and `dtype`.

    Example:
    >>> norm = LayerNormalization(epsilon=1e-6)
    >>> tuple(norm(keras.ops.ones((2, 5, 16))).shape)
    (2, 5, 16)
    """

    def _runs_closed_form(self, inputs):
        rank = len(inputs.shape)
        # build() has made `axis` a sorted list, possibly of negative axes.
        last_axis_only = [axis % rank for axis in self.axis] == [rank - 1]
        return (
            fast_kernels_enabled()
            and last_axis_only
            and self.center
            and self.scale
            and not self.rms_scaling
        )

    def call(self, inputs):
        if not self._runs_closed_form(inputs):
            return super().call(inputs)
        # In at least float32, without a float32 copy of bf16 inputs kept
        # for the backward pass (`layer_norm` widens them itself).
        dtype = keras.backend.result_type(inputs.dtype, "float32")
        outputs = layer_norm(
            inputs, ops.cast(self.gamma, dtype), ops.cast(self.beta, dtype), self.epsilon
        )
        return ops.cast(outputs, self.compute_dtype)
