"""LayerNorm whose backward pass is written out (fewer passes, less memory).

Autodiff through `keras.ops.layer_normalization` on TensorFlow and JAX
differentiates the composite op by op: a dozen and more element-wise passes
over the tokens, and several of their tensors kept for the backward pass.
Here the gradient is the closed form

    dx = (g*gamma - mean(g*gamma) - x_hat * mean(g*gamma * x_hat)) / sigma

from the input `x` (in its own dtype) and the per-row mean and `1 / sigma`,
the only tensors kept (`x_hat` is recomputed from them). On TensorFlow the
backward pass runs XLA-compiled (`ops/xla.py`): one loop instead of ten
separate element-wise ops. The time and memory this saves are in
docs/performance.md. PyTorch's `layer_norm` is already one kernel with its
own backward, so PyTorch keeps it.
"""

import keras
from keras import ops

from keras_vit.ops.switch import fast_kernels_enabled
from keras_vit.ops.xla import compiled_on_tensorflow


def layer_norm(x, gamma, beta, epsilon):
    """LayerNorm over the last axis, with a closed-form backward pass.

    Same values and gradients as `keras.ops.layer_normalization` (to
    rounding), which it runs with the fast kernels switched off
    (`disable_fast_kernels`) and on PyTorch. Computes in at least float32 and
    returns the dtype of `x`.
    The backward pass keeps `x` as it came (bf16 under mixed precision:
    half the bytes of a float32 `x_hat`) and the per-row mean and `1 / sigma`,
    and recomputes `x_hat` from them.

    Args:
        x: tensor of shape `(..., width)`.
        gamma: tensor of shape `(width,)`, the scale.
        beta: tensor of shape `(width,)`, the offset.
        epsilon: float, added to the variance.

    Returns:
        The normalised, scaled and shifted `x`, in the dtype of `x`.

    Example:
    >>> x = keras.ops.convert_to_tensor([[1.0, 2.0, 3.0]])
    >>> y = layer_norm(x, keras.ops.ones(3), keras.ops.zeros(3), 0.0)
    >>> keras.ops.convert_to_numpy(y).round(6)  # (the last bit of rsqrt is the CPU's)
    array([[-1.224745,  0.      ,  1.224745]], dtype=float32)
    """
    dtype = keras.backend.result_type(x.dtype, "float32")
    if not fast_kernels_enabled() or keras.backend.backend() == "torch":
        outputs = ops.layer_normalization(
            ops.cast(x, dtype), ops.cast(gamma, dtype), ops.cast(beta, dtype), epsilon=epsilon
        )
        return ops.cast(outputs, x.dtype)

    @ops.custom_gradient
    def forward(x, gamma, beta):
        wide = ops.cast(x, dtype)
        mean = ops.mean(wide, axis=-1, keepdims=True)
        centered = wide - mean
        variance = ops.mean(ops.square(centered), axis=-1, keepdims=True)
        inverse_std = ops.rsqrt(variance + epsilon)
        outputs = centered * inverse_std * ops.cast(gamma, dtype) + ops.cast(beta, dtype)

        def backward(upstream):
            # As rows of a matrix: one compiled signature for every rank.
            width = x.shape[-1]
            x_gradient, gamma_gradient, beta_gradient = _layer_norm_gradients(
                ops.reshape(upstream, (-1, width)),
                ops.reshape(x, (-1, width)),
                ops.reshape(mean, (-1, 1)),
                ops.reshape(inverse_std, (-1, 1)),
                gamma,
                keras.backend.standardize_dtype(beta.dtype),
            )
            return ops.reshape(x_gradient, ops.shape(x)), gamma_gradient, beta_gradient

        return ops.cast(outputs, x.dtype), backward

    return forward(x, gamma, beta)


@compiled_on_tensorflow
def _layer_norm_gradients(upstream, x, mean, inverse_std, gamma, beta_dtype):
    """Gradients of `layer_norm` with respect to `x`, `gamma` and `beta`, for 2-D `x`."""
    dtype = mean.dtype
    upstream = ops.cast(upstream, dtype)
    normalized = (ops.cast(x, dtype) - mean) * inverse_std
    scaled = upstream * ops.cast(gamma, dtype)
    mean_scaled = ops.mean(scaled, axis=-1, keepdims=True)
    mean_projection = ops.mean(scaled * normalized, axis=-1, keepdims=True)
    x_gradient = (scaled - mean_scaled - normalized * mean_projection) * inverse_std
    gamma_gradient = ops.sum(upstream * normalized, axis=0)
    beta_gradient = ops.sum(upstream, axis=0)
    return (
        ops.cast(x_gradient, x.dtype),
        ops.cast(gamma_gradient, gamma.dtype),
        ops.cast(beta_gradient, beta_dtype),
    )
