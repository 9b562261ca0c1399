"""Fake quantization: the training graph of a model that LiteRT will run in int8.

Quantization-aware training (QAT) puts into the forward pass the rounding
that LiteRT's converter will apply, so that training learns weights that
survive it: per-output-channel symmetric int8 weights (`fake_quantized_kernel`)
and per-tensor asymmetric int8 activations at the points the converter
quantizes (`ActivationQuantizer`, one per point, its range tracked during
training; at zero point 0 for the right operands of batch matmuls, which
LiteRT's XNNPACK kernels read so). Gradients pass straight through the
rounding and are zero where a value is clipped.

The two modes are those of `keras_vit.export.tflite`:

- `"int8"`: the inputs and outputs of every convolution and Dense layer, and
  what LiteRT's converter quantizes beside them once their neighbours have
  ranges (GELU's output, the class token's concatenation, the attention's
  probabilities and context); LayerNorm, the residual stream and the rest
  stay float32 in the file;
- `"int8_full"`: every op's output (integer-only files): besides those, the
  steps of LayerNorm, the attention's scaled query, logits, probabilities and
  context, GELU's output, the residual additions and the token sequence.

An activation's rounding is Keras' `fake_quant_with_min_max_vars`: on
TensorFlow, TensorFlow's own `FakeQuantWithMinMaxVars` op, whose range the
LiteRT converter reads and uses as the tensor's quantization (how the
learned ranges reach the file); elsewhere the same arithmetic in `keras.ops`.

What a QAT layer does is decided by its own state, never by a variable read
while a function is traced: its mode (`qat`, in its configuration), and its
quantizers' `calibrating` flag, which `calibrate` sets only for its own eager
calls and after which it drops the model's traced functions (as Keras'
`quantize` does).
"""

import keras
from keras import ops

from keras_vit import _compat

QAT_MODES = ("int8", "int8_full")
# The kinds of quantization point that each mode quantizes: a Dense layer's
# inputs only where the op before it is float (the "int8" mode).
_KINDS = {
    "int8": {"dense_inputs", "dense_outputs", "activations"},
    "int8_full": {"dense_outputs", "activations", "steps"},
}
# A softmax's int8 output in LiteRT: scale 1/256, zero point -128; a
# LOGISTIC's (a sigmoid's) too.
SOFTMAX_RANGE = (0.0, 255.0 / 256.0)
_SOFTMAX_LIKE = ("probabilities", "gate_sigmoid")


def check_qat(qat, argument="qat"):
    """`qat` if it is `None` or a mode of `QAT_MODES`; a `ValueError` naming `argument` if not."""
    if qat is not None and qat not in QAT_MODES:
        raise ValueError(
            f"`{argument}` must be None or one of {', '.join(map(repr, QAT_MODES))} (the LiteRT "
            f"mode that training simulates). Received: {argument}={qat!r}"
        )
    return qat


def calibrate(model, images, batch_size=32):
    """Sets the range of each of `model`'s quantization points to what `images` give there.

    The images run through the model's float function (no rounding), each
    point recording the minimum and maximum of its inputs (the widest over
    all batches, zero inside): what `models.quantization_aware_copy` does to
    a new copy. On JAX they run as `predict` runs them, one compiled
    function for all batches (JAX's eager calls compile each op for each
    shape anew: twice as slow); elsewhere eagerly (tracing costs TensorFlow
    more than it saves). The model's traced functions are dropped before
    and after it.
    """
    quantizers = [
        layer for layer in _compat.all_layers(model) if isinstance(layer, ActivationQuantizer)
    ]
    _compat.forget_traced_functions(model)
    for quantizer in quantizers:
        quantizer.calibrating = True
    try:
        if keras.backend.backend() == "jax":
            model.predict(images, batch_size=batch_size, verbose=0)
        else:
            for start in range(0, len(images), batch_size):
                model(images[start : start + batch_size], training=False)
    finally:
        for quantizer in quantizers:
            quantizer.calibrating = False
        _compat.forget_traced_functions(model)


def rounds(quantizers):
    """Whether a layer with these quantizers rounds: it has some, and none is calibrating."""
    return bool(quantizers) and not any(q.calibrating for q in quantizers.values())


def fake_quantize(x, low, high):
    """`x` rounded to 256 levels over `[low, high]` (nudged), gradients passed straight through.

    `low <= 0 < high`, as `ActivationQuantizer` keeps its range.
    Keras' `fake_quant_with_min_max_vars(x, low, high, num_bits=8)`
    (TensorFlow's op on TensorFlow): the gradient is 1 inside the range and
    0 outside. (Keras computes one for `low` and `high` too; a quantizer
    holds them non-trainable, so none is applied: they are tracked, not
    learned.)

    Example:

    >>> y = fake_quantize(keras.ops.convert_to_tensor([-1.0, 0.3, 5.0]), -1.0, 3.0)
    >>> [round(float(v), 4) for v in y]
    [-1.0039, 0.298, 2.9961]
    """
    return keras.quantizers.fake_quant_with_min_max_vars(x, low, high, num_bits=8)


def fake_quantized_kernel(kernel, input_axes):
    """`kernel` rounded as LiteRT stores int8 weights: symmetric, per output channel.

    Each output channel's scale is `max |w| / 127` over `input_axes` (the
    axes a matmul or convolution contracts), levels -127..127; the gradient
    passes straight through. Converting the rounded kernel again gives the
    same integers, so the file holds exactly the weights trained with.
    """
    magnitude = ops.max(ops.abs(kernel), axis=input_axes, keepdims=True)
    scale = ops.stop_gradient(ops.maximum(magnitude, 1e-12) / 127.0)
    return kernel + ops.stop_gradient(ops.round(kernel / scale) * scale - kernel)


@keras.saving.register_keras_serializable(package="keras_vit")
class ActivationQuantizer(keras.layers.Layer):
    """One quantization point: per-tensor asymmetric int8 rounding over a tracked range.

    Its range (`low`, `high`, not trained by gradients) is set by
    calibration (while `calibrating`, a call records its inputs' range and
    passes them unrounded; `calibrate` sets that for a whole model) and
    then follows each training batch's minimum and maximum as an
    exponential moving average (`momentum`), as TensorFlow Model
    Optimization's Keras 2 quantizers do. A
    `fixed_range` (the softmax's) never moves. A `symmetric` range is
    `[-128 s, 127 s]`: zero point 0, what LiteRT's int8 batch matmul
    assumes of its right operand (XNNPACK, its CPU runtime, reads that
    operand's levels without subtracting a zero point).

    Args:
        momentum: float in `[0, 1)`, the moving average's weight of the
            range so far at each training step.
        fixed_range: `None` or `(low, high)`, a range that never moves.
        symmetric: bool, whether the range is kept at zero point 0.
        **kwargs: base layer keyword arguments, e.g. `name`.

    Example:

    >>> quantizer = ActivationQuantizer()
    >>> quantizer.calibrating = True
    >>> _ = quantizer(keras.ops.convert_to_tensor([[-1.0, 3.0]]))
    >>> quantizer.calibrating = False
    >>> [round(float(v), 4) for v in quantizer(keras.ops.convert_to_tensor([[0.3, 9.0]]))[0]]
    [0.298, 2.9961]
    """

    # Set by `calibrate` for its calls only; not configuration, not saved.
    calibrating = False

    def __init__(self, momentum=0.99, fixed_range=None, symmetric=False, **kwargs):
        super().__init__(**kwargs)
        if isinstance(momentum, bool) or not 0 <= momentum < 1:
            raise ValueError(f"`momentum` must be in [0, 1). Received: momentum={momentum!r}")
        if fixed_range is not None:
            fixed_range = tuple(float(value) for value in fixed_range)
        self.momentum = momentum
        self.fixed_range = fixed_range
        self.symmetric = bool(symmetric)

    def build(self, input_shape=None):
        low, high = self.fixed_range or (0.0, 0.0)
        self.low = self.add_weight(
            name="low", shape=(), initializer=keras.initializers.Constant(low), trainable=False
        )
        self.high = self.add_weight(
            name="high", shape=(), initializer=keras.initializers.Constant(high), trainable=False
        )
        self.calibrated = self.add_weight(
            name="calibrated", shape=(), initializer="zeros", trainable=False
        )

    def call(self, inputs, training=None):
        if self.calibrating:
            self._calibrate(inputs)
            return inputs
        if training and self.fixed_range is None:
            self._track(inputs)
        return fake_quantize(inputs, self.low, self.high)

    def _calibrate(self, inputs):
        # (The range starts at [0, 0] and always holds zero: the widest
        # minimum and maximum over the calls.)
        if self.fixed_range is not None:
            return
        self._set_range(
            ops.minimum(self.low, ops.cast(ops.min(inputs), "float32")),
            ops.maximum(self.high, ops.cast(ops.max(inputs), "float32")),
        )
        self.calibrated.assign(1.0)

    def _track(self, inputs):
        values = ops.stop_gradient(ops.cast(inputs, "float32"))
        momentum = self.momentum
        self._set_range(
            momentum * self.low + (1 - momentum) * ops.min(values),
            momentum * self.high + (1 - momentum) * ops.max(values),
        )

    def _set_range(self, low, high):
        # Zero inside and a width above 0, as TensorFlow's op and the LiteRT
        # converter read a range (one of a positive minimum, TensorFlow's
        # op would shift to [0, max - min]).
        low = ops.minimum(low, 0.0)
        if self.symmetric:
            # Levels -128..127 at zero point 0: the wider side sets 127 s.
            high = ops.maximum(ops.maximum(-low * (127.0 / 128.0), high), 1e-6)
            low = -high * (128.0 / 127.0)
        self.low.assign(low)
        self.high.assign(ops.maximum(ops.maximum(high, 0.0), low + 1e-6))

    def load_own_variables(self, store):
        super().load_own_variables(store)
        if self.symmetric:
            # (A file of a layout that kept this point asymmetric.)
            self._set_range(self.low, self.high)

    def int8_parameters(self):
        """`(scale, zero_point)` of this point's int8 tensor in LiteRT: what its range becomes."""
        low = float(keras.ops.convert_to_numpy(self.low))
        high = float(keras.ops.convert_to_numpy(self.high))
        scale = (high - low) / 255.0
        return scale, int(min(max(round(-low / scale), 0), 255)) - 128

    def compute_output_shape(self, input_shape):
        return tuple(input_shape)

    def get_config(self):
        config = super().get_config()
        config.update(
            {
                "momentum": self.momentum,
                "fixed_range": self.fixed_range,
                "symmetric": self.symmetric,
            }
        )
        return config


def add_output_scale(layer):
    """A quantization-aware layer's `output_scale`: a fixed factor of its kernel and bias.

    A quantization-aware copy folds LayerScale's gains (down to 1e-5 in real
    checkpoints) into the layers that write the residual stream; Adam moves
    every weight by about its learning rate, so a folded kernel stored as is
    would change a hundred times faster, relative to its size, than in the
    float model. Stored divided by this factor, it trains at the float
    model's pace; the product (and the file) is the same: per-channel int8
    rounding commutes with a scalar factor.
    """
    return layer.add_weight(
        name="output_scale", shape=(), initializer="ones", trainable=False, dtype="float32"
    )


def refuse_keras_quantize(layer):
    """A `ValueError` if `layer` simulates a LiteRT mode: Keras' `quantize` is not its way."""
    if layer.qat is not None:
        raise ValueError(
            f"Layer {layer.name!r} simulates LiteRT's {layer.qat!r} quantization (qat): "
            "export it to LiteRT rather than quantizing it in Keras."
        )


def serialization_spec(layer, spec):
    """Keras' `variable_serialization_spec` of a projection, its `output_scale` saved after its own.

    (Keras' Dense and EinsumDense save only the variables that spec names.)
    """
    spec = dict(spec)
    if layer.qat is not None:
        spec[None] = [*spec[None], "output_scale"]
    return spec


def scaled(layer, kernel, bias):
    """`(kernel, bias)` times the layer's `output_scale`, the kernel rounded unless calibrating."""
    scale = ops.cast(layer.output_scale, kernel.dtype)
    kernel = kernel * scale
    if rounds(layer.quantizers):
        kernel = fake_quantized_kernel(kernel, tuple(range(len(kernel.shape) - 1)))
    return kernel, None if bias is None else bias * ops.cast(scale, bias.dtype)


def quantizers(qat, points, shape=None, symmetric=()):
    """`{point: ActivationQuantizer}` of the points (`{name: kind}`) that mode `qat` quantizes.

    The points named in `symmetric` keep zero point 0 (`ActivationQuantizer`).
    """
    if qat is None:
        return {}
    made = {}
    for name, kind in points.items():
        if kind in _KINDS[qat]:
            fixed = SOFTMAX_RANGE if name in _SOFTMAX_LIKE else None
            made[name] = ActivationQuantizer(
                fixed_range=fixed, symmetric=name in symmetric, name=f"{name}_quantizer"
            )
            made[name].build(shape)
    return made


def at_point(made, name, x, training=None):
    """`x` through the quantizer of point `name`, if its layer's mode has one."""
    quantizer = made.get(name)
    return x if quantizer is None else quantizer(x, training=training)
