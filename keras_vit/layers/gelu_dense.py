"""GELU as a serializable activation, the MLP's Dense + GELU layer, and the gated MLP's.

GELU and GeluDense compute through `keras_vit.ops.gelu` (a backward pass that keeps only
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


@keras.saving.register_keras_serializable(package="keras_vit")
class SwiGLUDense(QuantizationAwareDense):
    """The gated MLP's first layer: `silu(x W_gate + b_gate) * (x W_up + b_up)`.

    SwiGLU (Shazeer 2020), DINOv3's larger models' MLP (`DINOv3ViTGatedMLP`:
    `down_proj(silu(gate_proj(x)) * up_proj(x))`). The gate and up
    projections are one kernel of `2 * units` outputs, the gate's first
    (one matrix product), so `model.quantize` and LoRA reach it as any
    Keras `Dense`; the layer's output has `units` channels.

    Args:
        units: int, the width of the gated hidden layer (the MLP's `mlp_dim`).
        qat: `None`, `"int8"` or `"int8_full"`: as `QuantizationAwareDense`
            (the product of both projections), and the gated outputs rounded
            per tensor; with `"int8_full"` also the gate's sigmoid (at
            LiteRT's fixed int8 range of a LOGISTIC) and `silu` (the gate
            times its sigmoid), as LiteRT computes them.
        **kwargs: the other arguments of `keras.layers.Dense` (not
            `activation`), e.g. `kernel_initializer` and `name`.

    Example:
    >>> layer = SwiGLUDense(8)
    >>> tuple(layer(keras.ops.ones((2, 4))).shape), tuple(layer.kernel.shape)
    ((2, 8), (4, 16))
    """

    def __init__(self, units, qat=None, **kwargs):
        if "activation" in kwargs:
            raise TypeError(
                "SwiGLUDense gates itself and takes no `activation`. "
                f"Received: activation={kwargs['activation']!r}"
            )
        if isinstance(units, bool) or not isinstance(units, int) or units < 1:
            raise ValueError(f"`units` must be a positive int. Received: units={units!r}")
        super().__init__(2 * units, qat=qat, **kwargs)
        self.gated_units = units

    points = {
        **QuantizationAwareDense.points,
        "gate_sigmoid": "activations",  # (its LOGISTIC reads the int8 gate in "int8" too)
        "gate_silu": "steps",
        "activations": "activations",
    }

    def _gated(self, outputs, training=None):
        gate, up = ops.split(outputs, 2, axis=-1)
        if self.qat is None:
            return ops.silu(gate) * up

        def point(name, x):
            return fake_quantization.at_point(self.quantizers, name, x, training)

        # silu as LiteRT runs it: a LOGISTIC, then the gate times it.
        silu = point("gate_silu", gate * point("gate_sigmoid", ops.sigmoid(gate)))
        return point("activations", silu * up)

    def call(self, inputs, training=None):
        return self._gated(super().call(inputs, training=training), training)

    def quantized_call(self, inputs, training=None):
        # After `quantize()` Keras calls this instead of `call`.
        return self._gated(super().quantized_call(inputs, training=training))

    def compute_output_shape(self, input_shape):
        return (*input_shape[:-1], self.gated_units)

    def get_config(self):
        config = super().get_config()
        del config["activation"]
        config["units"] = self.gated_units
        return config
