"""GELU activations whose backward pass keeps only the pre-activation.

Autodiff through `keras.ops.gelu` on TensorFlow and JAX keeps every
intermediate of the composite (the tanh or erf, `1 + tanh`, `0.5 * x`) for
the backward pass: three more tensors of the MLP's width (`4 * hidden_dim`)
per block. On ViT-B/16 at batch 32 that was 2.7 GB of a training step's
peak memory on TensorFlow and 0.85 GB on JAX (XLA keeps fewer). Here the
derivative is written out and recomputed from the input in the backward
pass, as PyTorch's own GELU kernel does (so PyTorch keeps its native op).
The forward pass is the same
`keras.ops.gelu`, so TensorFlow's oneDNN remapper still fuses it into the
preceding matmul at inference.
"""

import math

import keras
from keras import ops

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


def gelu(x, approximate=True):
    """`keras.ops.gelu` with a backward pass that keeps only `x`.

    Same values and gradients as `keras.ops.gelu` (to rounding).

    Args:
        x: tensor.
        approximate: bool, the tanh approximation (`True`, the original ViT
            checkpoints) or the exact erf form (`False`).

    Example:
    >>> float(gelu(keras.ops.convert_to_tensor(1.0), approximate=False))
    0.841344...
    """
    x = ops.convert_to_tensor(x)
    if keras.backend.backend() == "torch":
        return ops.gelu(x, approximate=approximate)

    @ops.custom_gradient
    def forward(x):
        def backward(upstream):
            return upstream * gelu_derivative(x, approximate)

        return ops.gelu(x, approximate=approximate), backward

    return forward(x)


@keras.saving.register_keras_serializable(package="keras_vit")
def gelu_approximate(x):
    """GELU in its tanh approximation (original ViT checkpoints)."""
    return gelu(x, approximate=True)


@keras.saving.register_keras_serializable(package="keras_vit")
def gelu_exact(x):
    """GELU with the exact erf (Hugging Face ViT, DINOv2)."""
    return gelu(x, approximate=False)
