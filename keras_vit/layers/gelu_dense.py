"""GELU as a serializable activation, and the MLP's Dense + GELU layer.

Both compute through `keras_vit.ops.gelu` (a backward pass that keeps only
the pre-activation; `keras.ops.gelu` with the fast kernels switched off).
"""

import keras
from keras import ops

from keras_vit.layers import fake_quantization
from keras_vit.ops.gelu import gelu


@keras.saving.register_keras_serializable(package="keras_vit")
def gelu_approximate(x):
    """GELU in its tanh approximation (original ViT checkpoints)."""
    return gelu(x, approximate=True)


@keras.saving.register_keras_serializable(package="keras_vit")
def gelu_exact(x):
    """GELU with the exact erf (Hugging Face ViT, DINOv2)."""
    return gelu(x, approximate=False)


@keras.saving.register_keras_serializable(package="keras_vit")
class QuantizationAwareDense(keras.layers.Dense):
    """`keras.layers.Dense` that can simulate LiteRT's int8 rounding (`qat`).

    Without `qat` it is Keras' `Dense`. With it, the kernel is rounded per
    output channel and the outputs (before the activation; in `"int8"` the
    inputs too) per tensor, as `layers.fake_quantization` describes: the
    MLP's second layer and the head of a quantization-aware ViT.

    Args:
        units: int, the output width.
        qat: `None`, `"int8"` or `"int8_full"`.
        round_inputs: bool, whether `"int8"` rounds the inputs (`False`
            where the layer before rounds its outputs already: one rounding,
            as in the file).
        **kwargs: the other arguments of `keras.layers.Dense`.

    Example:
    >>> layer = QuantizationAwareDense(4, qat="int8")
    >>> tuple(layer(keras.ops.ones((2, 3))).shape)
    (2, 4)
    """

    def __init__(self, units, qat=None, round_inputs=True, **kwargs):
        super().__init__(units, **kwargs)
        self.qat = fake_quantization.check_qat(qat)
        self.round_inputs = round_inputs

    # The layer's quantization points and their kinds (`fake_quantization`).
    points = {"inputs": "dense_inputs", "outputs": "dense_outputs"}

    def build(self, input_shape):
        super().build(input_shape)
        points = {k: v for k, v in self.points.items() if self.round_inputs or k != "inputs"}
        self.quantizers = fake_quantization.quantizers(self.qat, points)
        if self.qat is not None:
            self.output_scale = fake_quantization.add_output_scale(self)

    def call(self, inputs, training=None):
        if self.qat is None:
            return super().call(inputs, training=training)
        inputs = fake_quantization.at_point(self.quantizers, "inputs", inputs, training)
        kernel, bias = fake_quantization.scaled(self, self.kernel, self.bias)
        outputs = ops.matmul(inputs, ops.cast(kernel, self.compute_dtype))
        if bias is not None:
            outputs = outputs + ops.cast(bias, self.compute_dtype)
        outputs = fake_quantization.at_point(self.quantizers, "outputs", outputs, training)
        return outputs if self.activation is None else self.activation(outputs)

    def quantize(self, mode=None, type_check=True, config=None):
        fake_quantization.refuse_keras_quantize(self)
        # Keras' Dense refuses to quantize subclasses, whose `call` it cannot
        # vouch for; unsimulated, this one is Dense's.
        super().quantize(mode, type_check=False, config=config)

    @property
    def variable_serialization_spec(self):
        return fake_quantization.serialization_spec(self, super().variable_serialization_spec)

    def get_config(self):
        return {**super().get_config(), "qat": self.qat, "round_inputs": self.round_inputs}


@keras.saving.register_keras_serializable(package="keras_vit")
class GeluDense(QuantizationAwareDense):
    """`keras.layers.Dense` followed by `gelu`, which is told `training`.

    The MLP's first layer. GELU runs inside this layer's `call` rather than
    after it: TensorFlow's oneDNN remapper fuses the matmul, bias and GELU
    into one kernel at inference only when they sit in one layer (a GELU
    applied to the output of a nested `Dense` stayed eight element-wise
    passes), and `training` picks GELU's kernels (see `gelu`).

    Args:
        units: int, the output width.
        approximate: bool, the tanh approximation of GELU (`True`) or the
            exact erf form (`False`).
        qat: `None`, `"int8"` or `"int8_full"`: as `QuantizationAwareDense`,
            and GELU's outputs rounded per tensor.
        **kwargs: the other arguments of `keras.layers.Dense` (not
            `activation`), e.g. `kernel_initializer` and `name`.

    Example:
    >>> layer = GeluDense(8, approximate=False)
    >>> tuple(layer(keras.ops.ones((2, 4))).shape)
    (2, 8)
    """

    def __init__(self, units, approximate=True, qat=None, **kwargs):
        if "activation" in kwargs:
            raise TypeError(
                "GeluDense applies GELU itself and takes no `activation`. "
                f"Received: activation={kwargs['activation']!r}"
            )
        super().__init__(units, qat=qat, **kwargs)
        self.approximate = approximate

    points = {**QuantizationAwareDense.points, "activations": "activations"}

    def call(self, inputs, training=None):
        outputs = gelu(super().call(inputs, training=training), self.approximate, bool(training))
        return fake_quantization.at_point(self.quantizers, "activations", outputs, training)

    def quantized_call(self, inputs, training=None):
        # After `quantize()` Keras calls this instead of `call`.
        outputs = super().quantized_call(inputs, training=training)
        return gelu(outputs, self.approximate, training=bool(training))

    def get_config(self):
        config = super().get_config()
        del config["activation"]
        config["approximate"] = self.approximate
        return config
