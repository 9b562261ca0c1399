"""The model that a checkpoint file describes, built with its weights."""

import inspect
import os

from keras_vit.models.variants import WIDTHS
from keras_vit.models.vision_transformer import (
    FROM_CHECKPOINT,
    VisionTransformer,
    in_data_format,
    resolve_data_format,
)
from keras_vit.weights import hub
from keras_vit.weights.architecture import infer_architecture
from keras_vit.weights.readers import CHECKPOINT_SUFFIXES, read_tensors, reading_once

# The paper's head count of each width: for files that record no head count.
_HEADS_BY_WIDTH = {hidden_dim: heads for hidden_dim, _, heads, _ in WIDTHS.values()}


def _checked_path(path, argument):
    path = os.fspath(hub.checkpoint_file(path))
    if not os.path.isfile(path) or not path.endswith(CHECKPOINT_SUFFIXES):
        raise ValueError(
            f"{argument}={path!r} is not an existing checkpoint file ending in one "
            f"of {', '.join(CHECKPOINT_SUFFIXES)}."
        )
    return path


def checkpoint_architecture(path, num_heads=None, argument="path"):
    """The `VisionTransformer` arguments that reproduce a checkpoint file's model.

    What the file shows and records (see
    `keras_vit.weights.architecture.infer_architecture`); the head count of
    a file that records none (PyTorch layouts without `config.json`) is
    `num_heads`, else the paper's for the file's width.

    Args:
        path: a checkpoint file (official `.npz`, Hugging Face or timm
            `.safetensors`, `.bin` / `.pth` with torch, a keras_vit `.keras`).
        num_heads: the head count, where the file records none.
        argument: the name under which the caller took `path`, for errors.

    Returns:
        dict of `VisionTransformer` arguments.

    Example:

    ```python
    keras_vit.models.checkpoint_architecture("ViT-B_16.npz")["hidden_dim"]  # 768
    ```
    """
    path = _checked_path(path, argument)
    _, arguments = infer_architecture(path, read_tensors(path), num_heads)
    if num_heads is not None and num_heads != arguments["num_heads"]:
        raise ValueError(
            f"num_heads={num_heads!r} contradicts the checkpoint {argument}={path!r}, whose "
            f"model has num_heads={arguments['num_heads']!r}. Leave num_heads unset."
        )
    if arguments["num_heads"] is None:
        width = arguments["hidden_dim"]
        if width not in _HEADS_BY_WIDTH:
            raise ValueError(
                f"{path!r}: the head count of a width-{width} ViT is not in the "
                "checkpoint, a config.json or the variant table; pass num_heads."
            )
        arguments["num_heads"] = _HEADS_BY_WIDTH[width]
    return arguments


def from_checkpoint(path, num_heads=None, resample_method=None, **overrides):
    """Builds the ViT that a checkpoint file describes, with its weights.

    The architecture, GELU form, LayerNorm epsilon and pixel normalisation
    are read from the checkpoint (see `checkpoint_architecture`); `overrides`
    change any `VisionTransformer` argument, e.g. `input_shape=(384, 384,
    3)` to fine-tune at a higher resolution (position embeddings
    resampled), `classes=10` for a new zero-initialised head (on a file
    without a head too),
    `include_top=False` for features, or `representation_size=None` to drop
    an ImageNet-21k `pre_logits` layer. As for a builder given the file as
    `weights=`, an override that contradicts what the file records of its
    encoder (`approximate_gelu=True` for an exact-GELU checkpoint) is a
    `ValueError` naming both.

    Args:
        path: an official `.npz`, Hugging Face or timm `.safetensors` (or
            `.bin`/`.pth` with torch) file, or a keras_vit `.keras` file; a
            `config.json` (and `preprocessor_config.json`) beside it is
            read when present.
        num_heads: the head count, for PyTorch-layout files that have no
            `config.json` and a width outside the paper's table.
        resample_method: `"bicubic"`, `"bicubic_antialias"` or `"bilinear"`
            position resampling; `None`: the checkpoint's own (see
            `keras_vit.weights.source_resample_method`).
        **overrides: `VisionTransformer` arguments.

    Returns:
        A `VisionTransformer`.

    Example:

    ```python
    model = keras_vit.from_checkpoint("ViT-B_16.npz", input_shape=(384, 384, 3), classes=10)
    ```
    """
    path = _checked_path(path, "path")
    unknown = set(overrides) - set(inspect.signature(VisionTransformer).parameters)
    if unknown:
        raise TypeError(
            f"Unknown VisionTransformer arguments {sorted(unknown)} for from_checkpoint."
        )
    if "weights" in overrides:
        raise TypeError(
            f"from_checkpoint loads path={path!r}; it takes no `weights`. Received: "
            f"weights={overrides['weights']!r}"
        )
    with reading_once():  # for its shapes here, then by the builder: one read
        arguments = checkpoint_architecture(path, num_heads)
        # The architecture from here; the builder takes the function (GELU form,
        # tokens, normalisation, head, resampling) from the file as it does for
        # any `weights=`, and refuses an override that contradicts it.
        architecture = {k: v for k, v in arguments.items() if k not in FROM_CHECKPOINT}
        # The file's images are channels-last; the model's in its own layout.
        data_format = resolve_data_format(overrides.get("data_format"))
        architecture["input_shape"] = in_data_format(architecture["input_shape"], data_format)
        if "classes" in overrides and "include_top" not in overrides:
            architecture["include_top"] = True  # a head asked for, the file with one or not
        elif arguments["pooling"] is None and not arguments["include_top"]:
            architecture["pooling"] = None  # an encoder's file: its tokens
        if resample_method is not None:
            architecture["resample_method"] = resample_method
        return VisionTransformer(**{**architecture, **overrides}, weights=path)
