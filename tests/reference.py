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
    q, k, v = (np.einsum("btd,dhk->bthk", x, qkv_kernel[:, i]) + qkv_bias[i] for i in range(3))
    probs = softmax(np.einsum("bqhk,bshk->bhqs", q, k) / np.sqrt(head_dim))
    context = np.einsum("bhqs,bshk->bqhk", probs, v)
    return np.einsum("bqhk,hkd->bqd", context, out_kernel) + out_bias, probs


def transformer_block(x, w, approximate=True, eps=1e-6):
    """Pre-norm block; `w` maps the block's weight paths to arrays."""
    h = layer_norm(x, w["attention_norm/gamma"], w["attention_norm/beta"], eps)
    h, _ = self_attention(
        h,
        w["attention/qkv/kernel"],
        w["attention/qkv/bias"],
        w["attention/out/kernel"],
        w["attention/out/bias"],
    )
    x = x + h
    h = layer_norm(x, w["mlp_norm/gamma"], w["mlp_norm/beta"], eps)
    h = gelu(h @ w["mlp_dense_1/kernel"] + w["mlp_dense_1/bias"], approximate)
    return x + h @ w["mlp_dense_2/kernel"] + w["mlp_dense_2/bias"]


def weights_by_path(layer):
    """`{"sublayer/weight": array}` of a layer's weights (paths relative to it)."""
    from keras import ops

    prefix = layer.path + "/"
    return {w.path[len(prefix) :]: ops.convert_to_numpy(w).astype("float64") for w in layer.weights}


def _timm_linear(x, tensors, name):
    return x @ tensors[name + ".weight"].T + tensors[name + ".bias"]


def timm_attention(query_tokens, tokens, q, kv, proj, heads):
    """timm's attention with separate `q`/`kv` Linear layers (`(fn, name)` pairs)."""
    batch, queries, dim = query_tokens.shape
    head_dim = dim // heads
    q = q(query_tokens).reshape(batch, queries, heads, head_dim).transpose(0, 2, 1, 3)
    kv = kv(tokens).reshape(batch, tokens.shape[1], 2, heads, head_dim).transpose(2, 0, 3, 1, 4)
    probs = softmax(q @ kv[0].swapaxes(-1, -2) * head_dim**-0.5)
    return proj((probs @ kv[1]).transpose(0, 2, 1, 3).reshape(batch, queries, dim))


def timm_attention_pool(tokens, t, heads, prefix="attn_pool.", eps=1e-6):
    """timm's `AttentionPoolLatent.forward` (latent_len 1, pool "token"), from its tensors."""
    latent = np.broadcast_to(t[prefix + "latent"], (len(tokens),) + t[prefix + "latent"].shape[1:])
    x = timm_attention(
        latent,
        tokens,
        q=lambda h: _timm_linear(h, t, prefix + "q"),
        kv=lambda h: _timm_linear(h, t, prefix + "kv"),
        proj=lambda h: _timm_linear(h, t, prefix + "proj"),
        heads=heads,
    )
    h = layer_norm(x, t[prefix + "norm.weight"], t[prefix + "norm.bias"], eps)
    h = _timm_linear(
        gelu(_timm_linear(h, t, prefix + "mlp.fc1"), approximate=False), t, prefix + "mlp.fc2"
    )
    return (x + h)[:, 0]


def timm_vit_map(images, t, heads, patch, eps=1e-6):
    """timm's `VisionTransformer(class_token=False, global_pool="map")` forward, from its tensors.

    `images` are `(batch, H, W, C)` floats as the network sees them.
    """
    batch, height, width, channels = images.shape
    kernel = t["patch_embed.proj.weight"]  # (D, C, p, p)
    grid = images.reshape(batch, height // patch, patch, width // patch, patch, channels)
    x = np.einsum("bipjqc,dcpq->bijd", grid, kernel).reshape(batch, -1, kernel.shape[0])
    x = x + t["patch_embed.proj.bias"] + t["pos_embed"]
    depth = 1 + max(int(n.split(".")[1]) for n in t if n.startswith("blocks."))
    for i in range(depth):
        p = f"blocks.{i}."
        h = layer_norm(x, t[p + "norm1.weight"], t[p + "norm1.bias"], eps)
        qkv = _timm_linear(h, t, p + "attn.qkv").reshape(batch, x.shape[1], 3, heads, -1)
        q, k, v = qkv.transpose(2, 0, 3, 1, 4)
        probs = softmax(q @ k.swapaxes(-1, -2) * q.shape[-1] ** -0.5)
        o = (probs @ v).transpose(0, 2, 1, 3).reshape(x.shape)
        x = x + _timm_linear(o, t, p + "attn.proj")
        h = layer_norm(x, t[p + "norm2.weight"], t[p + "norm2.bias"], eps)
        x = x + _timm_linear(
            gelu(_timm_linear(h, t, p + "mlp.fc1"), approximate=False), t, p + "mlp.fc2"
        )
    x = layer_norm(x, t["norm.weight"], t["norm.bias"], eps)
    return _timm_linear(timm_attention_pool(x, t, heads), t, "head")
