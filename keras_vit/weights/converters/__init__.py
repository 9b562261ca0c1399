"""Checkpoints of other origins in keras_vit's weight layout, one converter per source.

Every source is converted to one canonical form: a dict from a keras_vit
weight path (`"encoderblock_3/attention/qkv/kernel"`, as `weight.path` names
it) to a NumPy array of that weight's shape. Each source's module has
`to_canonical(tensors, num_heads)`; what its files say of the model's
function beyond shapes is read by `keras_vit.models.checkpoint_arguments`:

- `official`: google-research/vision_transformer `.npz` files;
- `big_vision`: big_vision's SigLIP `.npz` files (the image tower);
- `huggingface`: Hugging Face ViT / DeiT / DINOv2 / DINOv3 / ViTMAE / SigLIP vision state dicts;
- `timm`: timm VisionTransformer state dicts;
- `keras_vit`: this package's own `.keras` files;
- `keras_hub`: keras-hub backbone presets (their `model.weights.h5`), whose
  `config.json` names the backbone (`to_canonical` takes the file's path).
"""

import numpy as np

from keras_vit.weights.converters import (
    big_vision,
    huggingface,
    keras_hub,
    keras_vit,
    official,
    timm,
)
from keras_vit.weights.readers import read_json_beside

SOURCES = {
    "official": official,
    "big_vision": big_vision,
    "huggingface": huggingface,
    "timm": timm,
    "keras_vit": keras_vit,
}


def detect_layout(tensors):
    """`"official"`, `"huggingface"` or `"timm"`, from the tensor names."""
    names = set(tensors)
    if any(
        n.startswith(family.embedding + "/" + family.patch + "/")
        for family in keras_hub.FAMILIES.values()
        for n in names
    ):
        return "keras_hub"
    if "patch_embedding/kernel" in names:
        return "keras_vit"
    if "embedding/kernel" in names:
        return "official"
    if big_vision.PREFIX + "embedding/kernel" in names:
        return "big_vision"
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
        "Not a ViT checkpoint of a known layout (official or big_vision .npz, Hugging "
        f"Face, timm, keras-hub preset): none of its {len(names)} tensors is a patch "
        f"embedding. First names: {sorted(names)[:5]}"
    )


def to_canonical(tensors, num_heads, path=None):
    """Converts a checkpoint's tensors to `{keras_vit weight path: array}`.

    Args:
        tensors: `{name: array}` as read from the file.
        num_heads: the attention heads of the target model (PyTorch layouts
            store projections as `(D, D)` matrices without a head axis).
        path: the file they were read from (a keras-hub preset's
            `config.json` beside it names its backbone).

    Returns:
        `(layout, canonical)`.
    """
    layout = detect_layout(tensors)
    if layout == "keras_hub":
        saved = read_json_beside(path, "config.json") if path else {}
        class_name = saved.get("class_name")
        if class_name not in keras_hub.FAMILIES:
            raise ValueError(
                f"{path!r} holds keras-hub weights, but its config.json names the backbone "
                f"{class_name!r}, not one keras_vit builds ({', '.join(keras_hub.FAMILIES)})."
            )
        canonical = keras_hub.to_canonical(tensors, num_heads, class_name, saved["config"])
    else:
        canonical = SOURCES[layout].to_canonical(tensors, num_heads)
    return layout, {k: np.asarray(v, dtype="float32") for k, v in canonical.items()}
