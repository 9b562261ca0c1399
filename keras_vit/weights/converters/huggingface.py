"""Hugging Face state dicts as saved on the Hub.

`ViTModel` / `ViTForImageClassification` / DeiT (with teacher) /
`Dinov2Model` (with registers, classifiers) / `ViTMAEModel`
(`vit.encoder.layer.0.attention...`), SigLIP's vision tower
(`SiglipVisionModel`: no class token, a MAP head;
`vision_model.encoder.layers.0.self_attn...`), DINOv3 (`DINOv3ViTModel`:
no position table, rotary positions, no key bias; `layer.0.attention...`),
and the module names
transformers >= 5 writes with `torch.save(model.state_dict())`. Their GELU,
LayerNorm epsilon and pixel normalisation come from `config.json` and
`preprocessor_config.json` beside the file.
"""

import re

import numpy as np

from keras_vit.layers.position_embedding import DEFAULT_RESAMPLE_METHOD
from keras_vit.weights.converters.common import (
    attention_pool,
    dense,
    heads,
    linear,
    norm,
    out_projection,
    stack_qkv,
)
from keras_vit.weights.readers import read_json_beside

_BLOCK = {
    # ViT names, then DINOv2's for the same weights.
    "layernorm_before": "attention_norm",
    "norm1": "attention_norm",
    "layernorm_after": "mlp_norm",
    "norm2": "mlp_norm",
    "intermediate.dense": "mlp_dense_1",
    "mlp.fc1": "mlp_dense_1",
    "output.dense": "mlp_dense_2",
    "mlp.fc2": "mlp_dense_2",
    "mlp.up_proj": "mlp_dense_1",  # DINOv3's
    "mlp.down_proj": "mlp_dense_2",
}


# transformers >= 5 module names (what `torch.save(model.state_dict())`
# writes; `save_pretrained` converts back to the Hub names above).
_MODULE_NAMES = {
    r"^layers\.": "encoder.layer.",
    r"\.attention\.q_proj\.": ".attention.attention.query.",
    r"\.attention\.k_proj\.": ".attention.attention.key.",
    r"\.attention\.v_proj\.": ".attention.attention.value.",
    r"\.attention\.o_proj\.": ".attention.output.dense.",
}


# SigLIP's vision tower's module names, as ViT's on the Hub (its MAP head apart).
_SIGLIP_NAMES = {
    r"^embeddings\.patch_embedding\.": "embeddings.patch_embeddings.projection.",
    r"^encoder\.layers\.": "encoder.layer.",
    r"\.self_attn\.q_proj\.": ".attention.attention.query.",
    r"\.self_attn\.k_proj\.": ".attention.attention.key.",
    r"\.self_attn\.v_proj\.": ".attention.attention.value.",
    r"\.self_attn\.out_proj\.": ".attention.output.dense.",
    r"\.layer_norm1\.": ".layernorm_before.",
    r"\.layer_norm2\.": ".layernorm_after.",
    r"^post_layernorm\.": "layernorm.",
}


# DINOv3's module names, as ViT's on the Hub.
_DINOV3_NAMES = {
    r"^layer\.": "encoder.layer.",
    r"^embeddings\.patch_embeddings\.(weight|bias)$": r"embeddings.patch_embeddings.projection.\1",
    r"^norm\.": "layernorm.",
}


def _siglip_head(name, value, num_heads):
    """SigLIP's `SiglipMultiheadAttentionPoolingHead` (`head.*`) -> keras_vit's `map_head/*`.

    Its attention is PyTorch's `nn.MultiheadAttention`: the query, key and
    value projections stacked in `in_proj_*` (timm's `q` and `kv`).
    """
    if name.startswith("attention.in_proj_"):
        param = "weight" if name.endswith("weight") else "bias"
        width = value.shape[0] // 3
        return {
            **attention_pool("head.", f"q.{param}", value[:width], num_heads),
            **attention_pool("head.", f"kv.{param}", value[width:], num_heads),
        }
    for own, timm_name in (
        ("probe", "latent"),
        ("attention.out_proj.", "proj."),
        ("layernorm.", "norm."),
    ):
        if name.startswith(own):
            return attention_pool("head.", timm_name + name[len(own) :], value, num_heads)
    return attention_pool("head.", name, value, num_heads)  # mlp.fc1, mlp.fc2


def to_canonical(tensors, num_heads):
    out, qkv, gates = {}, {}, {}
    for name, value in tensors.items():
        name = re.sub(r"^(vit|deit|dinov2_with_registers|dinov2|model|vision_model)\.", "", name)
        for pattern, hub_name in _MODULE_NAMES.items():
            name = re.sub(pattern, hub_name, name)
        for pattern, hub_name in (*_SIGLIP_NAMES.items(), *_DINOV3_NAMES.items()):
            name = re.sub(pattern, hub_name, name)
        if name == "embeddings.position_embedding.weight":  # SigLIP's: an nn.Embedding
            out["position_embedding/embeddings"] = value[None]
        elif name.startswith("head."):  # SigLIP's MAP head
            out.update(_siglip_head(name[len("head.") :], value, num_heads))
        elif name == "embeddings.cls_token":
            out["class_token/token"] = value
        elif name == "embeddings.distillation_token":
            out["distillation_token/token"] = value
        elif name == "embeddings.register_tokens":
            out["register_tokens/tokens"] = value
        elif name == "embeddings.position_embeddings":
            out["position_embedding/embeddings"] = value
        elif name.startswith("embeddings.patch_embeddings.projection."):
            if name.endswith("weight"):
                out["patch_embedding/kernel"] = value.transpose(2, 3, 1, 0)
            else:
                out["patch_embedding/bias"] = value
        elif name.startswith("layernorm."):
            out.update(norm("encoder_norm", name.rsplit(".", 1)[1], value))
        elif name.startswith("pooler.dense."):
            out.update(dense("pre_logits", name.rsplit(".", 1)[1], value))
        elif name.startswith(("classifier.", "cls_classifier.")):
            out.update(dense("head", name.rsplit(".", 1)[1], value))
        elif name.startswith("distillation_classifier."):
            out.update(dense("head_dist", name.rsplit(".", 1)[1], value))
        match = re.fullmatch(r"encoder\.layer\.(\d+)\.(.+)\.(weight|bias|lambda1)", name)
        if not match:
            continue
        index, module, param = int(match[1]), match[2], match[3]
        prefix = f"encoderblock_{index}/"
        projection = re.fullmatch(r"attention\.attention\.(query|key|value)", module)
        if projection:
            kind = "kernel" if param == "weight" else "bias"
            value = (
                heads(linear(value), num_heads)
                if kind == "kernel"
                else value.reshape(num_heads, -1)
            )
            qkv[(index, kind, projection[1])] = value
        elif module == "attention.output.dense":
            out.update(out_projection(prefix, param, value, num_heads))
        elif module == "mlp.gate_proj":  # DINOv3's gated MLP: before `up_proj` in one kernel
            gates[(index, param)] = linear(value) if param == "weight" else value
        elif module in ("layer_scale1", "layer_scale2"):
            out[
                prefix + ("attention_scale" if module.endswith("1") else "mlp_scale") + "/gamma"
            ] = value
        elif module in _BLOCK:
            target = _BLOCK[module]
            convert = norm if target.endswith("norm") else dense
            out.update(convert(prefix + target, param, value))
    for (index, param), gate in gates.items():  # (SwiGLUDense: the gate's outputs first)
        target = f"encoderblock_{index}/mlp_dense_1/" + ("kernel" if param == "weight" else "bias")
        out[target] = np.concatenate([gate, out[target]], axis=-1)
    for index, kind, _ in list(qkv):
        if kind == "bias" and (index, "bias", "key") not in qkv:
            # DINOv3's key has no bias (`key_bias=False`): a zero one is the same.
            qkv[(index, "bias", "key")] = np.zeros_like(qkv[(index, "bias", "query")])
    return stack_qkv(out, qkv)


def vision_config(path):
    """The vision model's settings in the `config.json` beside a file.

    A two-tower model's file (SigLIP's `SiglipModel`, which the Hub's SigLIP
    repositories hold) nests them as `vision_config`; a vision model's file
    has them at the top.
    """
    config = read_json_beside(path, "config.json")
    return config.get("vision_config") or config


# Hugging Face model types that resample their position grid with
# `antialias=True` (the others: plain bicubic, as PyTorch's default).
ANTIALIASED_MODEL_TYPES = ("dinov2_with_registers",)


# Hugging Face model types trained on ImageNet mean/std pixels.
IMAGENET_MODEL_TYPES = ("deit", "dinov2", "vit_mae", "dino", "dinov3_vit")

# Hugging Face model types whose attentions rotate queries and keys by
# their patches' places (2-D RoPE) instead of adding a position table.
ROTARY_MODEL_TYPES = ("dinov3_vit",)


def resample_method(path):
    """How the file's own code resamples its position grid.

    `"bicubic_antialias"` for the models that interpolate with
    `antialias=True` (read from `config.json` beside the file), else
    `"bicubic"` (PyTorch's bicubic, as timm and Hugging Face ViT/DeiT/DINOv2).
    """
    model_type = vision_config(path).get("model_type")
    return "bicubic_antialias" if model_type in ANTIALIASED_MODEL_TYPES else DEFAULT_RESAMPLE_METHOD
