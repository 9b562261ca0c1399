"""Softmax attention on a fused kernel, where the backend has one.

`keras.ops.dot_product_attention` is a fused kernel on PyTorch (SDPA, on
CPUs too) and on JAX with a GPU (cuDNN, whose tokens are padded here to
the multiple it trains on). Elsewhere it is two einsums over token-major
tensors, which the explicit head-major matmuls of
`keras_vit.layers.MultiHeadSelfAttention` beat on CPUs
(docs/performance.md).
"""

import keras
from keras import ops


def fused_attention_kernel_available():
    """Whether `keras.ops.dot_product_attention` runs a fused kernel here.

    It does on PyTorch (SDPA, on CPUs too; its backward keeps less memory)
    and on JAX with a GPU (cuDNN). Elsewhere it is two einsums over
    token-major tensors, and the explicit head-major matmuls beat it on
    CPUs (docs/performance.md has the measurements).
    """
    backend = keras.backend.backend()
    if backend == "torch":
        return True
    if backend == "jax":
        import jax

        return jax.default_backend() != "cpu"
    return False


# cuDNN's fused attention (JAX on a GPU) trains only on even token counts
# (JAX 0.11: "Unsupported sequence length Q 197, KV 197"), and ViT's
# 1 + (size / patch)^2 tokens are odd for every variant of the paper. The
# tokens are padded to a multiple of this and the padding masked out.
CUDNN_TOKEN_MULTIPLE = 8


def fused_attention(query, key, value):
    """Softmax attention of `(batch, tokens, heads, head_dim)` tensors on a fused kernel.

    `keras.ops.dot_product_attention`, except on JAX with a GPU in bf16 or
    fp16, where it runs cuDNN's flash attention directly, the token axis
    padded to a multiple of `CUDNN_TOKEN_MULTIPLE` (see
    `padded_dot_product_attention`).
    """
    if keras.backend.backend() == "jax" and _jax_on_cuda():
        head_dim = query.shape[-1]
        dtype = keras.backend.standardize_dtype(query.dtype)
        if dtype in ("bfloat16", "float16") and head_dim % 8 == 0 and head_dim <= 128:
            return padded_dot_product_attention(
                query, key, value, CUDNN_TOKEN_MULTIPLE, implementation="cudnn"
            )
    return ops.dot_product_attention(query, key, value)


def _jax_on_cuda():
    import jax

    device = jax.devices()[0]
    return device.platform == "gpu" and "cuda" in device.client.platform_version.lower()


def padded_dot_product_attention(query, key, value, multiple, implementation=None):
    """JAX's `dot_product_attention` over tokens padded to a multiple of `multiple`.

    The padded keys are masked out through the kernel's sequence lengths
    (no bias tensor) and the padded queries' rows dropped, so the result
    and its gradients are those of unpadded attention.

    Args:
        query, key, value: JAX arrays of shape `(batch, tokens, heads, head_dim)`.
        multiple: int, the token count is padded up to a multiple of it.
        implementation: `"cudnn"`, `"xla"` or `None`, as in
            `jax.nn.dot_product_attention`.

    Returns:
        The attention output, of the shape of `query`.
    """
    import jax
    import jax.numpy as jnp

    batch, num_tokens = query.shape[0], query.shape[1]
    padded = -(-num_tokens // multiple) * multiple
    if padded == num_tokens:
        return jax.nn.dot_product_attention(query, key, value, implementation=implementation)
    widths = [(0, 0), (0, padded - num_tokens), (0, 0), (0, 0)]
    query, key, value = (jnp.pad(t, widths) for t in (query, key, value))
    lengths = jnp.full((batch,), num_tokens, dtype="int32")
    outputs = jax.nn.dot_product_attention(
        query,
        key,
        value,
        query_seq_lengths=lengths,
        key_value_seq_lengths=lengths,
        implementation=implementation,
    )
    return outputs[:, :num_tokens]
