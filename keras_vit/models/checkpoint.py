"""Models built from checkpoints: resolve the arguments, construct, load the weights."""

from keras_vit import weights as checkpoints
from keras_vit.models.checkpoint_arguments import (
    FROM_CHECKPOINT,
    checked_path,
    checkpoint_architecture,
    resolve,
)
from keras_vit.models.image_input import in_data_format, resolve_data_format
from keras_vit.models.vision_transformer import VisionTransformer, default_arguments


def build(weights, given, model_class=VisionTransformer):
    """A model built with `weights=`: resolve its arguments, construct it, load the weights.

    The builders' three steps,
    as timm's `build_model_with_cfg` and keras-hub's `from_preset` take
    them: what the user left unset in `given` is the checkpoint's
    (`checkpoint_arguments.resolve`, which reads no weight and downloads
    nothing, and refuses a contradiction before anything is built); a
    registered name is downloaded once; the model is constructed from its
    parts; the weights are loaded. A file is read once for all of it.

    Args:
        weights: a registered name, a `hf-hub:` id, or a checkpoint file.
        given: `{argument: value}` of the flat arguments the user set
            (`VisionTransformer.from_arguments`'s).
        model_class: `VisionTransformer` or a subclass.

    Returns:
        The model, with the checkpoint's weights.
    """
    weights = checkpoints.checkpoint_file(weights)  # a Hub id, a preset folder: its file
    with checkpoints.reading_once():
        arguments, variant = resolve(weights, given, default_arguments())
        path, _ = checkpoints.resolve(weights, variant)
        model = model_class.from_arguments(**arguments)
        checkpoints.load(model, path, arguments["resample_method"])
    return model


def from_checkpoint(path, num_heads=None, resample_method=None, **overrides):
    """Builds the ViT that a checkpoint file describes, with its weights.

    The architecture, GELU form, LayerNorm epsilon and pixel normalisation
    are read from the checkpoint (see `checkpoint_architecture`); `overrides`
    change any of the model's flat arguments, e.g. `input_shape=(384, 384,
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
            `keras_vit.models.checkpoint_arguments.source_resample_method`).
        **overrides: flat arguments (`VisionTransformer.from_arguments`'s).

    Returns:
        A `VisionTransformer`.

    Example:

    ```python
    model = keras_vit.from_checkpoint("ViT-B_16.npz", input_shape=(384, 384, 3), classes=10)
    ```
    """
    path = checked_path(path, "path")
    if "weights" in overrides:
        raise TypeError(
            f"from_checkpoint loads path={path!r}; it takes no `weights`. Received: "
            f"weights={overrides['weights']!r}"
        )
    unknown = set(overrides) - set(default_arguments())
    if unknown:
        raise TypeError(
            f"Unknown VisionTransformer arguments {sorted(unknown)} for from_checkpoint."
        )
    with checkpoints.reading_once():  # for its shapes here, then its weights: one read
        arguments = checkpoint_architecture(path, num_heads)
        # The architecture from here; `build` takes the function (GELU form,
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
        return build(path, {**architecture, **overrides})
