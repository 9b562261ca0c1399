"""Pieces the converters share: PyTorch's `(out, in)` layouts to Keras', q/k/v stacking."""

import numpy as np


def linear(weight):
    """PyTorch `(out, in)` Linear weight -> Keras `(in, out)` kernel."""
    return np.ascontiguousarray(weight.T)


def norm(target, param, value):
    """A PyTorch LayerNorm `weight`/`bias` -> `{target/gamma|beta: value}`."""
    return {f"{target}/{'gamma' if param == 'weight' else 'beta'}": value}


def dense(target, param, value):
    """A PyTorch Linear `weight`/`bias` -> `{target/kernel|bias: value}`."""
    if param == "weight":
        return {f"{target}/kernel": linear(value)}
    return {f"{target}/bias": value}


def out_projection(prefix, param, value, num_heads):
    """The attention output Linear -> `(H, hd, D)` kernel / `(D,)` bias."""
    if param == "weight":
        kernel = linear(value).reshape(num_heads, -1, value.shape[0])
        return {prefix + "attention/out/kernel": kernel}
    return {prefix + "attention/out/bias": value}


def heads(kernel, num_heads):
    """`(D, H * hd)` -> `(D, H, hd)`."""
    return kernel.reshape(kernel.shape[0], num_heads, -1)


def stack_qkv(out, qkv):
    """Stacks per-projection `(D, H, hd)` kernels / `(H, hd)` biases on axis 1 / 0."""
    for index, kind in sorted({(i, k) for i, k, _ in qkv}):
        parts = [qkv.get((index, kind, p)) for p in ("query", "key", "value")]
        if any(part is None for part in parts):
            continue  # reported as a missing weight
        if kind == "kernel":
            out[f"encoderblock_{index}/attention/qkv/kernel"] = np.stack(parts, axis=1)
        else:
            out[f"encoderblock_{index}/attention/qkv/bias"] = np.stack(parts, axis=0)
    return out


def attention_pool(prefix, name, value, num_heads):
    """A MAP head's tensor in timm's names (`AttentionPoolLatent`) -> keras_vit's `map_head/*`.

    `name` is relative to the pool (whose own is `prefix`, for errors):
    `latent`, `q.weight`, `kv.bias` (key and value stacked), `proj.*`,
    `norm.*`, `mlp.fc1.*`, `mlp.fc2.*`.
    """
    if name == "latent":
        return {"map_head/probe": value}
    module, param = name.rsplit(".", 1)
    if module in ("q", "kv", "proj"):
        target = {"q": "query", "kv": "key_value", "proj": "out"}[module]
        if module == "proj":
            shape = (num_heads, -1, value.shape[0]) if param == "weight" else (-1,)
        else:
            parts = () if module == "q" else (2,)
            shape = ((value.shape[-1],) if param == "weight" else ()) + parts + (num_heads, -1)
        value = linear(value) if param == "weight" else value
        return {
            f"map_head/{target}/{'kernel' if param == 'weight' else 'bias'}": value.reshape(shape)
        }
    if module == "norm":
        return norm("map_head/norm", param, value)
    if module in ("mlp.fc1", "mlp.fc2"):
        return dense("map_head/mlp_dense_" + module[-1], param, value)
    raise ValueError(
        f"attention pool tensor {prefix + name!r} has no place "
        "in keras_vit's MAP head (e.g. a latent length above 1 or q/k norms)."
    )
