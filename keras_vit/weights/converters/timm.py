"""timm VisionTransformer state dicts (`blocks.0.attn.qkv.weight`).

Distilled DeiT (`dist_token`, `head_dist`) and the attention-pooling head
(`attn_pool.*`) included. timm's ViTs use exact GELU and LayerNorm epsilon
1e-6; their pixel mean/std is in the `config.json` beside the file.
"""

import re

from keras_vit.weights.converters.common import (
    attention_pool,
    dense,
    linear,
    norm,
    out_projection,
)


def to_canonical(tensors, num_heads):
    out = {}
    simple = {
        "cls_token": "class_token/token",
        "dist_token": "distillation_token/token",
        "pos_embed": "position_embedding/embeddings",
        "patch_embed.proj.bias": "patch_embedding/bias",
        "norm.weight": "encoder_norm/gamma",
        "norm.bias": "encoder_norm/beta",
        "head.bias": "head/bias",
        "head_dist.bias": "head_dist/bias",
        "pre_logits.fc.bias": "pre_logits/bias",
    }
    for name, value in tensors.items():
        if name in simple:
            out[simple[name]] = value
        elif name == "patch_embed.proj.weight":
            out["patch_embedding/kernel"] = value.transpose(2, 3, 1, 0)
        elif name in ("head.weight", "head_dist.weight"):
            out[name.split(".")[0] + "/kernel"] = linear(value)
        elif name == "pre_logits.fc.weight":
            out["pre_logits/kernel"] = linear(value)
        elif name.startswith("attn_pool."):
            out.update(attention_pool("attn_pool.", name[len("attn_pool.") :], value, num_heads))
        match = re.fullmatch(r"blocks\.(\d+)\.(.+)\.(weight|bias|gamma)", name)
        if not match:
            continue
        prefix, module, param = f"encoderblock_{match[1]}/", match[2], match[3]
        if module == "attn.qkv":
            if param == "weight":
                dim = value.shape[1]
                out[prefix + "attention/qkv/kernel"] = linear(value).reshape(dim, 3, num_heads, -1)
            else:
                out[prefix + "attention/qkv/bias"] = value.reshape(3, num_heads, -1)
        elif module == "attn.proj":
            out.update(out_projection(prefix, param, value, num_heads))
        elif module in ("ls1", "ls2"):
            out[prefix + ("attention_scale" if module == "ls1" else "mlp_scale") + "/gamma"] = value
        elif module in ("norm1", "norm2"):
            target = "attention_norm" if module == "norm1" else "mlp_norm"
            out.update(norm(prefix + target, param, value))
        elif module in ("mlp.fc1", "mlp.fc2"):
            target = "mlp_dense_1" if module.endswith("1") else "mlp_dense_2"
            out.update(dense(prefix + target, param, value))
    return out
