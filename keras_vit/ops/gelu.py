"""GELU whose backward pass keeps only the pre-activation.

Autodiff through `keras.ops.gelu` on TensorFlow and JAX keeps every
intermediate of the composite (the tanh or erf, `1 + tanh`, `0.5 * x`) for
the backward pass: three more tensors of the MLP's width (`4 * hidden_dim`)
per block. Here the derivative is written out and recomputed from the
input in the backward pass, as PyTorch's own GELU kernel does (so PyTorch
keeps its native op). At inference the forward pass is the same
`keras.ops.gelu`, so TensorFlow's oneDNN remapper still fuses it into the
preceding matmul. On TensorFlow the backward pass, and in training the
forward pass, are XLA-compiled (`ops/xla.py`): one loop each instead of 8
and 15 element-wise ops. The memory and time this saves are in
docs/performance.md.
"""

import math

import keras
from keras import ops

from keras_vit.ops.switch import fast_kernels_enabled
from keras_vit.ops.xla import compiled_on_tensorflow

_TANH_COEFFICIENT = 0.044715
_SQRT_2_OVER_PI = math.sqrt(2.0 / math.pi)
_INVERSE_SQRT_2 = 1.0 / math.sqrt(2.0)
_INVERSE_SQRT_2_PI = 1.0 / math.sqrt(2.0 * math.pi)


def gelu_derivative(x, approximate):
    """d GELU(x) / dx, in the dtype of `x`.

    Args:
        x: tensor, the pre-activation.
        approximate: bool, the tanh approximation (`True`) or the exact
            erf form (`False`).
    """
    if approximate:
        # GELU = x/2 (1 + t), t = tanh(u), u = sqrt(2/pi) (x + 0.044715 x^3):
        # d/dx = (1 + t)/2 (1 + x (1 - t) u'), as 1 - t^2 = (1 - t)(1 + t).
        # Written for few passes: without XLA each op is one over the tensor.
        c, a = _SQRT_2_OVER_PI, _TANH_COEFFICIENT
        square = x * x
        tanh = ops.tanh(x * (c + (c * a) * square))
        du_dx = c + (3.0 * c * a) * square
        return (0.5 + 0.5 * tanh) * (1.0 + (x - x * tanh) * du_dx)
    # GELU = x Phi(x): Phi(x) + x phi(x)
    cdf = 0.5 * (1.0 + ops.erf(x * _INVERSE_SQRT_2))
    return cdf + x * ops.exp(-0.5 * x * x) * _INVERSE_SQRT_2_PI


@compiled_on_tensorflow
def _gelu_gradient(upstream, x, approximate):
    return upstream * gelu_derivative(x, approximate)


def gelu(x, approximate=True, training=False):
    """`keras.ops.gelu` with a backward pass that keeps only `x`.

    Same values and gradients as `keras.ops.gelu` (to rounding), which it
    is with the fast kernels switched off (`disable_fast_kernels`) and on
    PyTorch. On TensorFlow the backward pass is XLA-compiled (`ops/xla.py`),
    and with `training=True` the forward pass too: a training graph keeps
    `x` for the backward pass, so TensorFlow cannot fuse GELU into the
    matmul that produces `x` anyway. At inference it stays TensorFlow's own
    GELU ops, which its oneDNN remapper fuses into that matmul.

    Args:
        x: tensor.
        approximate: bool, the tanh approximation (`True`, the original ViT
            checkpoints) or the exact erf form (`False`).
        training: bool, whether this is a training step (only which kernels
            run depends on it, not the values).

    Example:
    >>> float(gelu(keras.ops.convert_to_tensor(1.0), approximate=False))
    0.841344...
    """
    x = ops.convert_to_tensor(x)
    if not fast_kernels_enabled() or keras.backend.backend() == "torch":
        return ops.gelu(x, approximate=approximate)

    @ops.custom_gradient
    def forward(x):
        def backward(upstream):
            return _gelu_gradient(upstream, x, approximate)

        if training:
            return _compiled_gelu(x, approximate), backward
        return ops.gelu(x, approximate=approximate), backward

    return forward(x)


@compiled_on_tensorflow
def _compiled_gelu(x, approximate):
    return ops.gelu(x, approximate=approximate)
