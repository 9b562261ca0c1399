"""Checkpoints: reading them, and loading their weights into keras_vit models.

Keras files and foreign checkpoints (official `.npz`, Hugging Face, timm),
mapped to one layout of weight paths. This part sits below
`keras_vit.models` and builds no model: it reads files, maps their names
and assigns arrays; what a checkpoint says of its model's arguments is
`keras_vit.models.checkpoint_arguments`'.
"""

import os
import re

from keras_vit.layers.position_embedding import DEFAULT_RESAMPLE_METHOD
from keras_vit.weights import hub, readers, registry
from keras_vit.weights.converters import huggingface, to_canonical
from keras_vit.weights.readers import (
    CHECKPOINT_SUFFIXES,
    read_json_beside,
    read_tensors,
    reading_once,
)

KERAS_SUFFIXES = (".weights.h5", ".keras")
# Heads keep their zero initialisation when a checkpoint has none that fits.
HEAD_PREFIXES = ("head/", "head_dist/")
SUFFIXES = tuple(dict.fromkeys(KERAS_SUFFIXES + CHECKPOINT_SUFFIXES))


def encoder_blocks(model):
    """The `encoderblock_*` layers of a ViT, in order, or a clear error.

    The blocks of the layout that every checkpoint is mapped to
    (`encoderblock_3/attention/qkv/kernel`).
    """
    blocks = [layer for layer in model.layers if layer.name.startswith("encoderblock_")]
    if not blocks:
        raise ValueError(
            f"Model {model.name!r} has no 'encoderblock_*' layers; "
            "build it with keras_vit.VisionTransformer or a ViT* builder."
        )
    return blocks


def block_tokens(block):
    """The tokens that an encoder block of a model's graph takes (not a rotation beside them)."""
    taken = block.input
    return taken[0] if isinstance(taken, (list, tuple)) else taken


def registered(weights, variant=None):
    """The registry entry that `weights=` names, `None` for a local file.

    Checks `weights` without downloading anything: an existing file of a
    known format, or a name registered for `variant`.

    Args:
        weights: path of a weights file (`.weights.h5`, `.keras`, `.npz`,
            `.safetensors`, PyTorch `.bin`/`.pth`), or a name registered for
            `variant` (`"imagenet21k"`, `"augreg-imagenet21k+imagenet2012"`,
            ...; see `keras_vit.weights.registry`).
        variant: the model's variant (`"B/16"`), or `None` for an
            architecture outside the variant table.

    Returns:
        A `registry.Checkpoint`, or `None` for a local file.
    """
    if not isinstance(weights, (str, os.PathLike)):
        raise TypeError(
            "`weights` must be None, a registered checkpoint name or the path "
            f"of a weights file. Received: weights={weights!r}"
        )
    path = os.fspath(weights)
    if (variant, path) in registry.CHECKPOINTS and not os.path.exists(path):
        return registry.CHECKPOINTS[(variant, path)]
    if not os.path.isfile(path):
        known = registry.names(variant) if variant else []
        if path == registry.IMAGENET:
            raise ValueError(
                f"weights='imagenet' names a variant's ImageNet-1k classifier, and "
                f"{'ViT-' + variant if variant else 'this architecture'} has none "
                f"(registered: {', '.join(known) or 'none'}). Pass one of those or "
                "the path of a weights file."
            )
        raise ValueError(
            f"weights={path!r} is neither an existing file nor a checkpoint "
            f"registered for {'ViT-' + variant if variant else 'this architecture'} "
            f"(registered: {', '.join(known) or 'none'}). Pass None for random "
            f"initialisation, a registered name, or the path of a weights file "
            f"({', '.join(SUFFIXES)})."
        )
    if not path.endswith(SUFFIXES):
        raise ValueError(
            f"weights={path!r} has an unknown format; expected a file ending "
            f"in one of {', '.join(SUFFIXES)}."
        )
    return None


def checkpoint_file(weights):
    """The file that `weights=` names: a `hf-hub:` id's (downloaded once), a keras-hub
    preset folder's `model.weights.h5`; anything else as given."""
    return readers.preset_weights(hub.checkpoint_file(weights))


def resolve(weights, variant=None):
    """The local path of `weights=`: the file itself, or the downloaded one.

    Returns:
        `(path, checkpoint)`, `checkpoint` the registry entry or `None`.
    """
    checkpoint = registered(weights, variant)
    if checkpoint is None:
        return os.fspath(weights), None
    return registry.fetch(checkpoint), checkpoint


def class_names(weights, variant=None, classes=None):
    """The names of the classes of a checkpoint's head, or `None` where nothing names them.

    A registered name's label set (see `keras_vit.labels`); for a file, the
    `id2label` of the Hugging Face `config.json` beside it, else the label
    set of its class count (`classes`: 1,000 ImageNet-1k, 21,843
    ImageNet-21k, the counts of the published heads).

    Example:

    >>> class_names("imagenet21k+imagenet2012", "B/16")[386]
    'African_elephant'
    """
    from keras_vit.labels import label_set, label_set_for

    weights = checkpoint_file(weights)
    checkpoint = registered(weights, variant)
    if checkpoint is not None:
        chosen = checkpoint.label_set
    else:
        id2label = read_json_beside(os.fspath(weights), "config.json").get("id2label") or {}
        if classes is not None and len(id2label) == classes:
            return [id2label.get(str(index), str(index)) for index in range(classes)]
        chosen = label_set_for(classes)
    return [name for _, name in label_set(chosen)] if chosen else None


def assign_canonical(model, tensors, source="checkpoint", resample_method=DEFAULT_RESAMPLE_METHOD):
    """Assigns `{weight path: array}` to `model`, after checking all of it.

    Every weight of the model must be in `tensors` with the model's shape,
    except: the position embeddings, which are resampled to the model's
    grid (class slot kept) when the checkpoint's grid differs; and the
    head, which keeps its zero initialisation when the checkpoint has none
    or one of another class count. Checkpoint weights the model has no
    place for (`pre_logits`, `head` of a model without them) are dropped;
    blocks beyond the model's depth are an error. Nothing is assigned
    unless everything checks out, so a failed load leaves the model as it was.

    Returns:
        dict with the lists `"loaded"`, `"kept"` (model weights left as
        initialised) and `"dropped"` (checkpoint weights not used).
    """
    from keras_vit.layers import resample_position_embeddings

    weights = {w.path: w for w in model.weights}
    depth = len(encoder_blocks(model))
    deeper = sorted(
        {int(m[1]) for k in tensors if (m := re.match(r"encoderblock_(\d+)/", k))}
        - set(range(depth))
    )
    if deeper:
        raise ValueError(
            f"{source} has {max(deeper) + 1} encoder blocks but the model has "
            f"{depth}: build the model with num_layers={max(deeper) + 1}."
        )
    plan, kept = [], []
    for path, weight in weights.items():
        model_shape = tuple(weight.shape)
        if path not in tensors:
            if path.startswith(HEAD_PREFIXES):
                kept.append(path)
                continue
            raise ValueError(f"{source} has no weight for {path!r} (model shape {model_shape}).")
        value = tensors[path]
        if path == "position_embedding/embeddings" and value.shape != model_shape:
            layer = model.get_layer("position_embedding")
            prefix = layer.num_prefix_tokens
            if value.shape[-1] != model_shape[-1]:
                raise ValueError(
                    f"{path!r}: {source} has shape {value.shape}, the model "
                    f"{model_shape} (another width)."
                )
            value = resample_position_embeddings(
                value, layer.grid_size, num_prefix_tokens=prefix, method=resample_method
            )
        if path.startswith(HEAD_PREFIXES) and value.shape != model_shape:
            kept.append(path)  # a new head for another class count
            continue
        if value.shape != model_shape:
            raise ValueError(
                f"{path!r}: {source} has shape {tuple(value.shape)} but the model "
                f"has {model_shape}."
            )
        plan.append((weight, value))
    for weight, value in plan:
        weight.assign(value.astype(weight.dtype))
    return {
        "loaded": [w.path for w, _ in plan],
        "kept": kept,
        "dropped": sorted(set(tensors) - set(weights)),
    }


def load(model, path, resample_method=None):
    """Loads a weights file or checkpoint at `path` into `model`.

    `.weights.h5` files load as Keras saves them (same architecture); `.keras`
    models (any keras_vit model: a classifier of another resolution or class
    count, a pre-training model's encoder), official `.npz`, Hugging Face
    and timm checkpoints are matched by weight path and checked first (see
    `assign_canonical`). `resample_method` (`None`: the one the
    checkpoint's own code uses, see `converters.huggingface.resample_method`)
    moves the position grid to the model's.

    Returns:
        `model`.
    """
    if path.endswith(".weights.h5") and not readers.is_keras_hub_preset(path):
        model.load_weights(path)
        return model
    tensors = read_tensors(path)
    layout, canonical = to_canonical(tensors, encoder_blocks(model)[0].num_heads, path)
    assign_canonical(
        model,
        canonical,
        source=f"{layout} checkpoint {path!r}",
        resample_method=resample_method or huggingface.resample_method(path),
    )
    return model
