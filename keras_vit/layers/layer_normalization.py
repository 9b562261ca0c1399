"""Keras' LayerNormalization on keras_vit's closed-form backward pass."""

import contextlib

import keras
from keras import ops

from keras_vit.layers import fake_quantization
from keras_vit.ops.layer_norm import layer_norm
from keras_vit.ops.switch import fast_kernels_enabled

# Non-empty while `variance_from_second_moment()` is active.
_SECOND_MOMENT = []


@contextlib.contextmanager
def variance_from_second_moment():
    """Inside it, `LayerNormalization` computes its variance as `mean(x * x) - mean ** 2`.

    For graphs traced for LiteRT's 16x8 quantisation (int16 activations):
    the converter turns the usual `mean((x - mean) ** 2)` into
    `SQUARED_DIFFERENCE`, which has no int16 kernel. The same values to
    float32 rounding where a row's mean is small against its spread, as in
    a ViT's blocks; exports use it, training does not.

    Example:
    >>> norm = LayerNormalization(epsilon=1e-6)
    >>> x = keras.ops.convert_to_tensor([[1.0, 2.0, 6.0]])
    >>> with variance_from_second_moment():
    ...     second = keras.ops.convert_to_numpy(norm(x))
    >>> bool(abs(second - keras.ops.convert_to_numpy(norm(x))).max() < 1e-6)
    True
    """
    _SECOND_MOMENT.append(True)
    try:
        yield
    finally:
        _SECOND_MOMENT.pop()


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
        qat: `None`, `"int8"` or `"int8_full"`: the LiteRT mode that training
            simulates (`layers.fake_quantization`). The layer then
            normalises only, without `gamma` and `beta` (a
            quantization-aware ViT has them folded into the layers that read
            its output, as the converter would fold them), and with
            `"int8_full"` it rounds each step as LiteRT computes it: the
            mean, the centred values, their squares, the variance, the
            variance plus epsilon, its inverse square root, the output.
        **kwargs: the arguments of `keras.layers.LayerNormalization`, e.g.
            `epsilon`, `name` and `dtype`.

    Example:
    >>> norm = LayerNormalization(epsilon=1e-6)
    >>> tuple(norm(keras.ops.ones((2, 5, 16))).shape)
    (2, 5, 16)
    """

    # The steps that "int8_full" rounds, in the order they are computed.
    points = {
        name: "steps"
        for name in (
            "mean",
            "centered",
            "squared",
            "variance",
            "shifted_variance",
            "inverse_std",
            "normalized",
        )
    }

    def __init__(self, qat=None, **kwargs):
        qat = fake_quantization.check_qat(qat)
        if qat is not None:
            kwargs.update(center=False, scale=False)
        super().__init__(**kwargs)
        self.qat = qat

    # Where this layer's inputs are int8 in the file, the rounding to their
    # levels (a function, set by the layer that rounds them; not
    # configuration): LiteRT's MEAN of int8 values keeps its input's scale,
    # so where the mode has no point of its own for the mean, the mean is
    # rounded to those levels.
    round_to_input_levels = None

    def build(self, input_shape):
        super().build(input_shape)
        self.quantizers = fake_quantization.quantizers(self.qat, self.points)

    def _quantization_aware_call(self, inputs, training):
        def point(name, x):
            return fake_quantization.at_point(self.quantizers, name, x, training)

        x = ops.cast(inputs, "float32")
        mean = ops.mean(x, axis=-1, keepdims=True)
        if "mean" not in self.quantizers and self.round_to_input_levels is not None:
            mean = self.round_to_input_levels(mean)
        mean = point("mean", mean)
        centered = point("centered", x - mean)
        variance = point("variance", ops.mean(point("squared", centered * centered), -1, True))
        shifted = point("shifted_variance", variance + self.epsilon)
        inverse_std = point("inverse_std", self._inverse_std(shifted, training))
        outputs = point("normalized", centered * inverse_std)
        return ops.cast(outputs, self.compute_dtype)

    def _inverse_std(self, shifted, training):
        """`1 / sqrt(shifted)`; in training, at level 0, the inverse std's top level.

        A row whose variance plus epsilon rounds to 0 (a fresh model's zero
        class token, at a range set by spread-out rows) has no inverse square
        root: LiteRT's int8 RSQRT, and the quantization point after it at
        inference, give the range's largest value there. Training takes that
        value too, where `rsqrt(0)` would be infinite: its gradient NaN, and
        the tracked range infinite. (Inference keeps the one RSQRT op that
        the converter maps.)
        """
        quantizer = self.quantizers.get("inverse_std")
        if not training or quantizer is None or not fake_quantization.rounds(self.quantizers):
            return ops.rsqrt(shifted)
        positive = ops.greater(shifted, 0.0)
        inverse_std = ops.rsqrt(ops.where(positive, shifted, 1.0))
        return ops.where(positive, inverse_std, ops.cast(quantizer.high, inverse_std.dtype))

    def _normalises_last_axis(self, inputs):
        rank = len(inputs.shape)
        # build() has made `axis` a sorted list, possibly of negative axes.
        last_axis_only = [axis % rank for axis in self.axis] == [rank - 1]
        return last_axis_only and self.center and self.scale and not self.rms_scaling

    def _runs_closed_form(self, inputs):
        return fast_kernels_enabled() and self._normalises_last_axis(inputs)

    def _second_moment_call(self, inputs):
        dtype = keras.backend.result_type(inputs.dtype, "float32")
        x = ops.cast(inputs, dtype)
        mean = ops.mean(x, axis=-1, keepdims=True)
        # Rounding can leave a constant row a tiny negative variance.
        variance = ops.maximum(ops.mean(x * x, axis=-1, keepdims=True) - mean * mean, 0.0)
        outputs = (x - mean) * ops.rsqrt(variance + self.epsilon)
        outputs = outputs * ops.cast(self.gamma, dtype) + ops.cast(self.beta, dtype)
        return ops.cast(outputs, self.compute_dtype)

    def call(self, inputs, training=None):
        if self.qat is not None:
            return self._quantization_aware_call(inputs, training)
        if _SECOND_MOMENT and self._normalises_last_axis(inputs):
            return self._second_moment_call(inputs)
        if not self._runs_closed_form(inputs):
            return super().call(inputs)
        # In at least float32, without a float32 copy of bf16 inputs kept
        # for the backward pass (`layer_norm` widens them itself).
        dtype = keras.backend.result_type(inputs.dtype, "float32")
        outputs = layer_norm(
            inputs, ops.cast(self.gamma, dtype), ops.cast(self.beta, dtype), self.epsilon
        )
        return ops.cast(outputs, self.compute_dtype)

    def get_config(self):
        return {**super().get_config(), "qat": self.qat}
