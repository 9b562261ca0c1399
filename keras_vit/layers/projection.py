"""A Keras `EinsumDense` whose float call is one 2-D matmul: attention's projections."""

import math
import re

import keras
from keras import ops

# `a<contracted>,<contracted><kept>-><a><kept>`: every non-batch axis of the
# inputs is contracted, and the outputs keep the kernel's other axes.
_FLAT_EQUATION = re.compile(r"a([b-z]+),\1([b-z]+)->a\2")


@keras.saving.register_keras_serializable(package="keras_vit")
class Projection(keras.layers.EinsumDense):
    """`keras.layers.EinsumDense` that contracts all of its inputs' axes in one matmul.

    Attention keeps its kernels in head-major layouts, `(D, 3, heads,
    head_dim)` for the fused query-key-value projection and `(heads,
    head_dim, D)` for the output projection, so that they shard by heads.
    As an `EinsumDense` they are what Keras' `quantize` (int8, int4,
    float8, GPTQ), `enable_lora` and `DTypePolicyMap` know. Unquantized, the
    call flattens the inputs and the kernel to 2-D matrices: TensorFlow then
    runs one oneDNN inner product with the bias fused in, as for a `Dense`,
    and a LiteRT file gets one `FULLY_CONNECTED` (an einsum with a 4-D
    kernel stays a matmul, a reshape and a separate add). Quantized, Keras'
    own `EinsumDense` calls run.

    Args:
        equation: `"a<in>,<in><out>->a<out>"`: every non-batch input axis
            contracted (`"ab,bcde->acde"`, `"abc,bcd->ad"`).
        output_shape: the shape of the kept axes (`(3, heads, head_dim)`).
        bias_axes: `None`, or all of the kept axes (`"cde"`).
        **kwargs: the other arguments of `keras.layers.EinsumDense`.

    Example:

    >>> layer = Projection("ab,bcd->acd", output_shape=(2, 4), bias_axes="cd")
    >>> tuple(layer(keras.ops.ones((3, 8))).shape)
    (3, 2, 4)
    """

    def __init__(self, equation, output_shape, bias_axes=None, **kwargs):
        match = _FLAT_EQUATION.fullmatch(equation)
        if match is None or bias_axes not in (None, match.group(2)):
            raise ValueError(
                "`equation` must contract every non-batch input axis, as "
                "'a<in>,<in><out>->a<out>', with `bias_axes` None or <out>. "
                f"Received: equation={equation!r}, bias_axes={bias_axes!r}"
            )
        super().__init__(equation, output_shape, bias_axes=bias_axes, **kwargs)

    def call(self, inputs, training=None):
        width = math.prod(inputs.shape[1:])
        outputs = ops.matmul(
            ops.reshape(inputs, (-1, width)), ops.reshape(self.kernel, (width, -1))
        )
        if self.bias is not None:
            outputs = outputs + ops.reshape(self.bias, (-1,))
        return ops.reshape(outputs, (-1, *self.partial_output_shape))

    def quantize(self, mode=None, type_check=True, config=None):
        # Keras' EinsumDense refuses to quantize subclasses, whose `call` it
        # cannot vouch for; quantized, this one runs EinsumDense's own calls.
        super().quantize(mode, type_check=False, config=config)

    def assign_loaded(self, kernel, bias=None):
        """Sets the variables from a file that held them in the parent layer's own.

        The parent's (`MultiHeadSelfAttention`'s) variables load before its
        sublayers', so the file's empty entry for this layer that follows
        is then skipped.
        """
        self._kernel.assign(kernel)
        if bias is not None:
            self.bias.assign(bias)
        self._assigned_by_parent = True

    def load_own_variables(self, store):
        if self._assigned_by_parent and not len(store.keys()):
            self._assigned_by_parent = False
            return
        super().load_own_variables(store)

    _assigned_by_parent = False
