"""Checkpoints of other origins in keras_vit's weight layout, one converter per source.

Every source is converted to one canonical form: a dict from a keras_vit
weight path (`"encoderblock_3/attention/qkv/kernel"`, as `weight.path` names
it) to a NumPy array of that weight's shape. Each source's module has
`to_canonical(tensors, num_heads)`; what its files say of the model's
function beyond shapes is read by `keras_vit.models.checkpoint_arguments`:

- `official`: google-research/vision_transformer `.npz` files;
- `huggingface`: Hugging Face ViT / DeiT / DINOv2 / DINOv3 / ViTMAE / SigLIP vision state dicts;
- `timm`: timm VisionTransformer state dicts;
- `keras_vit`: this package's own `.keras` files.
"""

import numpy as np

from keras_vit.weights.converters import huggingface, keras_vit, official, timm

SOURCES = {"official": official, "huggingface": huggingface, "timm": timm, "keras_vit": keras_vit}


def detect_layout(tensors):
    """`"official"`, `"huggingface"` or `"timm"`, from the tensor names."""
    names = set(tensors)
    if "patch_embedding/kernel" in names:
        return "keras_vit"
    if "embedding/kernel" in names:
        return "official"
    if "patch_embed.proj.weight" in names:
        return "timm"
    if any(
        n.endswith(
            (
                "embeddings.patch_embeddings.projection.weight",
                "embeddings.patch_embedding.weight",  # SigLIP's
                "embeddings.patch_embeddings.weight",  # DINOv3's
            )
        )
        for n in names
    ):
        return "huggingface"
    raise ValueError(
        "Not a ViT checkpoint of a known layout (official .npz, Hugging Face, "
        f"timm): none of its {len(names)} tensors is a patch embedding. "
        f"First names: {sorted(names)[:5]}"
    )


def to_canonical(tensors, num_heads):
    """Converts a checkpoint's tensors to `{keras_vit weight path: array}`.

    Args:
        tensors: `{name: array}` as read from the file.
        num_heads: the attention heads of the target model (PyTorch layouts
            store projections as `(D, D)` matrices without a head axis).

    Returns:
        `(layout, canonical)`.
    """
    layout = detect_layout(tensors)
    canonical = SOURCES[layout].to_canonical(tensors, num_heads)
    return layout, {k: np.asarray(v, dtype="float32") for k, v in canonical.items()}
