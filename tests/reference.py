"""NumPy reference computations of ViT's pieces, written from the paper."""

import math

import numpy as np


def random_tokens(shape=(2, 5, 16), seed=0):
    return np.random.default_rng(seed).normal(size=shape).astype("float32")


def layer_norm(x, gamma, beta, eps=1e-6):
    mean = x.mean(-1, keepdims=True)
    var = x.var(-1, keepdims=True)
    return (x - mean) / np.sqrt(var + eps) * gamma + beta


def gelu(x, approximate=True):
    if approximate:
        return 0.5 * x * (1 + np.tanh(np.sqrt(2 / np.pi) * (x + 0.044715 * x**3)))
    erf = np.vectorize(math.erf)
    return 0.5 * x * (1 + erf(x / np.sqrt(2)))


def softmax(x):
    e = np.exp(x - x.max(-1, keepdims=True))
    return e / e.sum(-1, keepdims=True)


def self_attention(x, qkv_kernel, qkv_bias, out_kernel, out_bias):
    """Returns (outputs, probabilities) of multi-head self-attention."""
    dim, _, heads, head_dim = qkv_kernel.shape
    q, k, v = (
        np.einsum("btd,dhk->bthk", x, qkv_kernel[:, i]) + qkv_bias[i] for i in range(3)
    )
    probs = softmax(np.einsum("bqhk,bshk->bhqs", q, k) / np.sqrt(head_dim))
    context = np.einsum("bhqs,bshk->bqhk", probs, v)
    return np.einsum("bqhk,hkd->bqd", context, out_kernel) + out_bias, probs


def transformer_block(x, w, approximate=True, eps=1e-6):
    """Pre-norm block; `w` maps the block's weight paths to arrays."""
    h = layer_norm(x, w["attention_norm/gamma"], w["attention_norm/beta"], eps)
    h, _ = self_attention(
        h, w["attention/qkv_kernel"], w["attention/qkv_bias"],
        w["attention/out_kernel"], w["attention/out_bias"],
    )
    x = x + h
    h = layer_norm(x, w["mlp_norm/gamma"], w["mlp_norm/beta"], eps)
    h = gelu(h @ w["mlp_dense_1/kernel"] + w["mlp_dense_1/bias"], approximate)
    return x + h @ w["mlp_dense_2/kernel"] + w["mlp_dense_2/bias"]


def weights_by_path(layer):
    """`{"sublayer/weight": array}` of a layer's weights (paths relative to it)."""
    from keras import ops

    prefix = layer.path + "/"
    return {
        w.path[len(prefix):]: ops.convert_to_numpy(w).astype("float64")
        for w in layer.weights
    }
