"""Training-mode BatchNorm whose backward pass is written out.

Autodiff through Keras' BatchNorm (`ops.moments`, then
`ops.batch_normalization`) differentiates the mean, the variance and the
normalisation op by op. The closed form

    dx = gamma / sigma * (g - mean(g) - x_hat * mean(g * x_hat))

needs two per-channel sums and one element-wise pass, from the input and
the per-channel mean and `1 / sigma` (`x_hat` is recomputed). On JAX
(XLA:CPU) that makes the main job's training step 5–6% cheaper; under
TensorFlow's XLA the step costs the same either way, so TensorFlow keeps
Keras' layer (`closed_form_batch_norm_preferred`). PyTorch's batch norm is
one kernel with its own backward. The measurements are in
docs/performance.md.
"""

import keras
from keras import ops

from keras_vit.ops.switch import fast_kernels_enabled
from keras_vit.ops.xla import compiled_on_tensorflow


def closed_form_batch_norm_preferred():
    """Whether `keras_vit.layers.BatchNormalization` trains on `batch_norm`.

    True on JAX with the fast kernels on (`enable_fast_kernels`): there the
    closed-form backward pass beats autodiff through Keras' layer. On
    TensorFlow, XLA already fuses Keras' BatchNorm as well (the same step
    time), and PyTorch has its own kernel.

    Example:
    >>> closed_form_batch_norm_preferred() == (keras.backend.backend() == "jax")
    True
    """
    return fast_kernels_enabled() and keras.backend.backend() == "jax"


def batch_norm(x, gamma, beta, epsilon):
    """BatchNorm of a training step over all axes but the last; closed-form backward.

    The batch statistics are the biased mean and variance, as in
    `keras.layers.BatchNormalization(training=True)`, and so are the
    normalised values (to rounding). It runs autodiff through those
    `keras.ops` with the fast kernels switched off (`disable_fast_kernels`)
    and on PyTorch. Gradients flow to `x`, `gamma` and
    `beta` through the normalised values only: the returned statistics
    are for the moving averages and count as constants.

    Args:
        x: float tensor `(..., channels)`; computed in at least float32.
        gamma: tensor `(channels,)`, the scale.
        beta: tensor `(channels,)`, the offset.
        epsilon: float, added to the variance.

    Returns:
        `(outputs, mean, variance)`: the normalised, scaled and shifted `x`
        in the dtype of `x`, and the batch's per-channel mean and variance
        in at least float32.

    Example:
    >>> x = keras.ops.convert_to_tensor([[1.0], [3.0]])
    >>> outputs, mean, variance = batch_norm(x, keras.ops.ones(1), keras.ops.zeros(1), 0.0)
    >>> keras.ops.convert_to_numpy(outputs).ravel().tolist(), float(mean[0]), float(variance[0])
    ([-1.0, 1.0], 2.0, 1.0)
    """
    dtype = keras.backend.result_type(x.dtype, "float32")
    axes = tuple(range(len(x.shape) - 1))
    if not fast_kernels_enabled() or keras.backend.backend() == "torch":
        wide = ops.cast(x, dtype)
        mean, variance = ops.moments(wide, axes)
        outputs = ops.batch_normalization(
            wide,
            mean,
            variance,
            axis=-1,
            offset=ops.cast(beta, dtype),
            scale=ops.cast(gamma, dtype),
            epsilon=epsilon,
        )
        return ops.cast(outputs, x.dtype), ops.stop_gradient(mean), ops.stop_gradient(variance)

    @ops.custom_gradient
    def forward(x, gamma, beta):
        wide = ops.cast(x, dtype)
        mean = ops.mean(wide, axis=axes)
        centered = wide - mean
        variance = ops.mean(ops.square(centered), axis=axes)
        inverse_std = ops.rsqrt(variance + epsilon)
        outputs = centered * (inverse_std * ops.cast(gamma, dtype)) + ops.cast(beta, dtype)

        def backward(*upstream, **unused):
            # TensorFlow passes one upstream gradient per output, JAX a
            # tuple of them; only the outputs' one is used.
            while isinstance(upstream, (list, tuple)):
                upstream = upstream[0]
            # As rows of a matrix: one compiled signature for every rank.
            channels = x.shape[-1]
            x_gradient, gamma_gradient, beta_gradient = _batch_norm_gradients(
                ops.reshape(upstream, (-1, channels)),
                ops.reshape(x, (-1, channels)),
                mean,
                inverse_std,
                gamma,
                keras.backend.standardize_dtype(beta.dtype),
            )
            return ops.reshape(x_gradient, ops.shape(x)), gamma_gradient, beta_gradient

        return (ops.cast(outputs, x.dtype), mean, variance), backward

    return forward(x, gamma, beta)


@compiled_on_tensorflow
def _batch_norm_gradients(upstream, x, mean, inverse_std, gamma, beta_dtype):
    """Gradients of `batch_norm` with respect to `x`, `gamma` and `beta`, for 2-D `x`."""
    dtype = mean.dtype
    upstream = ops.cast(upstream, dtype)
    normalized = (ops.cast(x, dtype) - mean) * inverse_std
    beta_gradient = ops.sum(upstream, axis=0)
    gamma_gradient = ops.sum(upstream * normalized, axis=0)
    count = ops.cast(ops.shape(x)[0], dtype)
    x_gradient = (ops.cast(gamma, dtype) * inverse_std) * (
        upstream - (beta_gradient + normalized * gamma_gradient) / count
    )
    return (
        ops.cast(x_gradient, x.dtype),
        ops.cast(gamma_gradient, gamma.dtype),
        ops.cast(beta_gradient, beta_dtype),
    )
