"""big_vision's SigLIP `.npz` checkpoints (the two towers: `params/img/...`, `params/txt/...`).

The image tower is a Flax ViT as the official code's, without a class token,
with a MAP head (`MAPHead_0`), its own module numbering inside a block
(`LayerNorm_0`, `MultiHeadDotProductAttention_0`, `LayerNorm_1`,
`MlpBlock_0`) and the position table at `pos_embedding`; the kernels carry
the head axis. The text tower, the temperature `t` and the bias `b` are not
read. These are the official converter's tables for this layout.
"""

import numpy as np

from keras_vit.weights.converters import official

PREFIX = "params/img/"
_MAP = "MAPHead_0/"
_MAP_ATTENTION = _MAP + "MultiHeadDotProductAttention_0/"

NAMES = {
    "embedding/kernel": "patch_embedding/kernel",
    "embedding/bias": "patch_embedding/bias",
    "pos_embedding": "position_embedding/embeddings",
    "Transformer/encoder_norm/scale": "encoder_norm/gamma",
    "Transformer/encoder_norm/bias": "encoder_norm/beta",
    _MAP + "probe": "map_head/probe",
    _MAP + "LayerNorm_0/scale": "map_head/norm/gamma",
    _MAP + "LayerNorm_0/bias": "map_head/norm/beta",
    _MAP + "MlpBlock_0/Dense_0/kernel": "map_head/mlp_dense_1/kernel",
    _MAP + "MlpBlock_0/Dense_0/bias": "map_head/mlp_dense_1/bias",
    _MAP + "MlpBlock_0/Dense_1/kernel": "map_head/mlp_dense_2/kernel",
    _MAP + "MlpBlock_0/Dense_1/bias": "map_head/mlp_dense_2/bias",
    _MAP_ATTENTION + "query/kernel": "map_head/query/kernel",
    _MAP_ATTENTION + "query/bias": "map_head/query/bias",
    _MAP_ATTENTION + "out/kernel": "map_head/out/kernel",
    _MAP_ATTENTION + "out/bias": "map_head/out/bias",
}

BLOCK_NAMES = {
    "LayerNorm_0/scale": "attention_norm/gamma",
    "LayerNorm_0/bias": "attention_norm/beta",
    "LayerNorm_1/scale": "mlp_norm/gamma",
    "LayerNorm_1/bias": "mlp_norm/beta",
    "MlpBlock_0/Dense_0/kernel": "mlp_dense_1/kernel",
    "MlpBlock_0/Dense_0/bias": "mlp_dense_1/bias",
    "MlpBlock_0/Dense_1/kernel": "mlp_dense_2/kernel",
    "MlpBlock_0/Dense_1/bias": "mlp_dense_2/bias",
    "MultiHeadDotProductAttention_0/out/kernel": "attention/out/kernel",
    "MultiHeadDotProductAttention_0/out/bias": "attention/out/bias",
}

QKV_NAME = "MultiHeadDotProductAttention_0/{projection}/{kind}"


def to_canonical(tensors, num_heads):
    image = {k[len(PREFIX) :]: v for k, v in tensors.items() if k.startswith(PREFIX)}
    out = official.to_canonical(image, num_heads, NAMES, BLOCK_NAMES, QKV_NAME)
    for kind in ("kernel", "bias"):  # the MAP head's key and value: one stacked kernel
        key, value = (image.get(f"{_MAP_ATTENTION}{p}/{kind}") for p in ("key", "value"))
        if key is not None and value is not None:
            out[f"map_head/key_value/{kind}"] = np.stack([key, value], axis=-3)
    return out
