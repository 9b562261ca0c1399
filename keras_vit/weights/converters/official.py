"""google-research/vision_transformer `.npz` files (original i21k / i21k+i1k, AugReg).

Flax names such as `embedding/kernel` and
`Transformer/encoderblock_0/MultiHeadDotProductAttention_1/query/kernel`;
the kernels carry the head axis. `to_official` writes the layout back with
the same tables.
"""

import re

from keras_vit.weights.converters.common import stack_qkv

# The official (Flax) checkpoints' tensor names -> keras_vit weight paths,
# outside and inside `Transformer/encoderblock_{i}/`. `to_official` writes
# with the same tables, read backwards. The q/k/v projections, stacked into
# one kernel here, are `QKV_NAME`.
NAMES = {
    "embedding/kernel": "patch_embedding/kernel",
    "embedding/bias": "patch_embedding/bias",
    "cls": "class_token/token",
    "Transformer/posembed_input/pos_embedding": "position_embedding/embeddings",
    "Transformer/encoder_norm/scale": "encoder_norm/gamma",
    "Transformer/encoder_norm/bias": "encoder_norm/beta",
    "pre_logits/kernel": "pre_logits/kernel",
    "pre_logits/bias": "pre_logits/bias",
    "head/kernel": "head/kernel",
    "head/bias": "head/bias",
}


BLOCK_NAMES = {
    "LayerNorm_0/scale": "attention_norm/gamma",
    "LayerNorm_0/bias": "attention_norm/beta",
    "LayerNorm_2/scale": "mlp_norm/gamma",
    "LayerNorm_2/bias": "mlp_norm/beta",
    "MlpBlock_3/Dense_0/kernel": "mlp_dense_1/kernel",
    "MlpBlock_3/Dense_0/bias": "mlp_dense_1/bias",
    "MlpBlock_3/Dense_1/kernel": "mlp_dense_2/kernel",
    "MlpBlock_3/Dense_1/bias": "mlp_dense_2/bias",
    "MultiHeadDotProductAttention_1/out/kernel": "attention/out/kernel",
    "MultiHeadDotProductAttention_1/out/bias": "attention/out/bias",
}


QKV_NAME = "MultiHeadDotProductAttention_1/{projection}/{kind}"


def to_canonical(tensors, num_heads, names=NAMES, block_names=BLOCK_NAMES, qkv_name=QKV_NAME):
    """The official names -> keras_vit's (another Flax layout's: its own tables)."""
    del num_heads  # the Flax kernels carry the head axis
    out = {}
    qkv = {}
    for name, value in tensors.items():
        if name in names:
            out[names[name]] = value
            continue
        match = re.fullmatch(r"Transformer/encoderblock_(\d+)/(.+)", name)
        if not match:
            continue
        index, rest = int(match[1]), match[2]
        if rest in block_names:
            out[f"encoderblock_{index}/{block_names[rest]}"] = value
        projection = re.fullmatch(
            qkv_name.format(projection="(query|key|value)", kind="(kernel|bias)"), rest
        )
        if projection:
            qkv[(index, projection[2], projection[1])] = value
    return stack_qkv(out, qkv)


def to_official(model):
    """A model's weights as `{name: array}` in the official `.npz` layout.

    The inverse of the `official` reader, for writing checkpoints that the
    original JAX code (and this package) read.
    """
    from keras import ops

    inverse = {path: name for name, path in NAMES.items()}
    block = {path: name for name, path in BLOCK_NAMES.items()}
    out = {}
    for weight in model.weights:
        value = ops.convert_to_numpy(weight).astype("float32")
        if weight.path in inverse:
            out[inverse[weight.path]] = value
            continue
        match = re.fullmatch(r"encoderblock_(\d+)/(.+)", weight.path)
        if not match:
            raise ValueError(f"{weight.path!r} has no place in the official layout.")
        prefix, rest = f"Transformer/encoderblock_{match[1]}/", match[2]
        if rest in block:
            out[prefix + block[rest]] = value
        elif rest in ("attention/qkv/kernel", "attention/qkv/bias"):
            kind = "kernel" if rest.endswith("kernel") else "bias"
            for i, projection in enumerate(("query", "key", "value")):
                part = value[:, i] if kind == "kernel" else value[i]
                out[prefix + QKV_NAME.format(projection=projection, kind=kind)] = part
        else:
            raise ValueError(f"{weight.path!r} has no place in the official layout.")
    return out
