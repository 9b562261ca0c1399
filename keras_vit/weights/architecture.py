"""The `VisionTransformer` arguments that reproduce a checkpoint's model."""

import re

from keras_vit.weights.converters import SOURCES, huggingface, to_canonical
from keras_vit.weights.readers import read_json_beside

# Tensors of architectures that keras_vit does not build (yet): loading
# them into a plain ViT would silently change the model's outputs.
_UNSUPPORTED = {
    "reg_token": "timm register tokens (timm's own position-embedding rules)",
}


def source_resample_method(path):
    """How the checkpoint's own code resamples its position grid.

    `"bicubic_antialias"` for the Hugging Face models that interpolate with
    `antialias=True` (read from `config.json` beside the file), else
    `"bicubic"` (PyTorch's bicubic, as timm and Hugging Face ViT/DeiT/DINOv2).
    """
    model_type = read_json_beside(path, "config.json").get("model_type")
    return "bicubic_antialias" if model_type in huggingface.ANTIALIASED_MODEL_TYPES else "bicubic"


def infer_architecture(path, tensors, num_heads=None):
    """The `VisionTransformer` arguments that reproduce a checkpoint's model.

    Shapes give the width, depth, patch size, MLP width, position grid,
    class token, `pre_logits` and head; the head count comes from the
    official kernels, `config.json` beside the file or `num_heads` (`None`
    where none of them says it: `keras_vit.models.checkpoint_architecture`
    takes it from the paper's variant table). The GELU form, LayerNorm epsilon and pixel
    normalisation follow the checkpoint's source: the official code uses
    tanh GELU and eps 1e-6 on `[-1, 1]` pixels; Hugging Face its config
    (`hidden_act`, `layer_norm_eps`) and `preprocessor_config.json`; timm
    exact GELU, eps 1e-6 and the mean/std in its `config.json`.

    Returns:
        `(layout, arguments)`.
    """
    for name in tensors:
        for marker, what in _UNSUPPORTED.items():
            if marker in name:
                raise ValueError(
                    f"{path!r} is a ViT with {what} ({name!r}), which keras_vit does not build."
                )
    layout, shapes = to_canonical(tensors, num_heads=1)
    if "patch_embedding/kernel" not in shapes:
        raise ValueError(f"{path!r} has no patch embedding kernel.")
    distillation_token = "distillation_token/token" in shapes
    if distillation_token and "head/kernel" in shapes and "head_dist/kernel" not in shapes:
        raise ValueError(
            f"{path!r} is a DeiT with a distillation token but one head "
            "(DeiTForImageClassification); keras_vit builds distilled DeiTs "
            "with both heads (DeiTForImageClassificationWithTeacher). Use the "
            "checkpoint without its head (`keras_vit.weights.load` into a "
            "model with include_top=False)."
        )
    patch_h, patch_w, channels, hidden_dim = shapes["patch_embedding/kernel"].shape
    depth = 1 + max(
        (int(m[1]) for k in shapes if (m := re.match(r"encoderblock_(\d+)/", k))),
        default=-1,
    )
    if depth == 0 or "encoderblock_0/mlp_dense_1/kernel" not in shapes:
        raise ValueError(f"{path!r} has no encoder blocks.")
    config = read_json_beside(path, "config.json")
    if layout in ("official", "keras_vit"):  # kernels with a head axis
        num_heads = shapes["encoderblock_0/attention/qkv_kernel"].shape[2]
    else:  # what the file records comes first: a builder checks its own against it
        num_heads = config.get("num_attention_heads") or num_heads
    class_token = "class_token/token" in shapes
    positions = (
        shapes["position_embedding/embeddings"].shape[1]
        - int(class_token)
        - int(distillation_token)
    )
    grid = int(round(positions**0.5))
    if grid * grid != positions and layout != "keras_vit":  # (its config has the shape)
        raise ValueError(f"{path!r}: {positions} position embeddings are not a square grid.")
    arguments = {
        "patch_size": (patch_h, patch_w) if patch_h != patch_w else int(patch_h),
        "hidden_dim": int(hidden_dim),
        "num_layers": depth,
        "num_heads": None if num_heads is None else int(num_heads),
        "mlp_dim": int(shapes["encoderblock_0/mlp_dense_1/kernel"].shape[1]),
        "input_shape": (grid * patch_h, grid * patch_w, int(channels)),
        "class_token": class_token,
        "distillation_token": distillation_token,
        "num_register_tokens": (
            int(shapes["register_tokens/tokens"].shape[1])
            if "register_tokens/tokens" in shapes
            else 0
        ),
        "pooling": "map" if "map_head/probe" in shapes else "token" if class_token else "gap",
        "include_top": "head/kernel" in shapes,
        "representation_size": (
            int(shapes["pre_logits/kernel"].shape[1]) if "pre_logits/kernel" in shapes else None
        ),
        "layer_scale_init": 1.0 if "encoderblock_0/attention_scale/gamma" in shapes else None,
        "approximate_gelu": True,
        "layer_norm_epsilon": 1e-6,
        "normalization": "inception",
    }
    if arguments["include_top"]:
        arguments["classes"] = int(shapes["head/kernel"].shape[1])
        if class_token and shapes["head/kernel"].shape[0] == 2 * hidden_dim:
            arguments["pooling"] = "token_gap"  # DINOv2's classifiers
    arguments = SOURCES[layout].function_arguments(path, arguments)
    return layout, arguments
