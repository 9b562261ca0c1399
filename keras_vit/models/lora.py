"""LoRA (Hu et al., 2021) on a keras_vit model: low-rank adapters on its blocks' projections.

`enable_lora(model, rank)` freezes the encoder and adds trainable
low-rank updates `(alpha / rank) * A @ B` to the chosen projections of every
block and of an attention-pooling (MAP) head, SigLIP's (keras-hub's
defaults: the query and the value); the classifier stays trainable. The
query, key and value are slices of one fused kernel (the MAP head's key and
value), each adapted on its own (`layers.Projection`); the attention output
and the MLP's layers use Keras' own `enable_lora`. A saved `.keras` file holds the merged
model (Keras' LoRA saves merged kernels); `save_lora_weights` writes the
adapters and the head alone, a small file that `load_lora_weights` reads
into a model with the same LoRA.
"""

import json

import keras
import numpy as np

from keras_vit import _compat, _options
from keras_vit.layers.attention_pooling import AttentionPooling
from keras_vit.layers.transformer_block import TransformerBlock

# A target's layer in a block (its attention's `qkv` and `out`, its MLP's
# layers), and the slot of the fused q/k/v kernel.
TARGETS = {
    "query": ("attention/qkv", 0),
    "key": ("attention/qkv", 1),
    "value": ("attention/qkv", 2),
    "out": ("attention/out", None),
    "mlp_dense_1": ("mlp_dense_1", None),
    "mlp_dense_2": ("mlp_dense_2", None),
}
# The same targets in an attention-pooling (MAP) head: its probe's query,
# its key and value stacked in one kernel, its output and MLP.
POOLING_TARGETS = {
    "query": ("query", 0),  # (one projection: slot 0 of an unslotted kernel)
    "key": ("key_value", 0),
    "value": ("key_value", 1),
    "out": ("out", None),
    "mlp_dense_1": ("mlp_dense_1", None),
    "mlp_dense_2": ("mlp_dense_2", None),
}
DEFAULT_TARGETS = ("query", "value")
# Layers a LoRA fine-tune trains beside the adapters: the classifier.
TRAINED_LAYERS = ("head", "head_dist")
LORA_FILE_FORMAT = "keras_vit.lora/1"


def _blocks(model):
    return [layer for layer in _compat.all_layers(model) if isinstance(layer, TransformerBlock)]


def _adapted_parts(model):
    """The blocks, then any attention-pooling head: each part whose projections LoRA adapts."""
    heads = [layer for layer in _compat.all_layers(model) if isinstance(layer, AttentionPooling)]
    return _blocks(model) + heads


def _target(part, name):
    """`(layer, slot)`: the layer of `part` (a block or a MAP head) that target `name` adapts."""
    table = POOLING_TARGETS if isinstance(part, AttentionPooling) else TARGETS
    layer_path, slot = table[name]
    layer = part
    for attribute in layer_path.split("/"):
        layer = getattr(layer, attribute)
    return layer, slot


def _target_layer(block, name):
    return _target(block, name)[0]


def frozen_layer(layer):
    """Whether a LoRA fine-tune freezes `layer` (all but the head): what QLoRA quantizes.

    Example: `model.quantize("int8", filters=frozen_layer)`, then
    `model.enable_lora(8)`: the head stays float and trainable.
    """
    return layer.name not in TRAINED_LAYERS


def lora_settings(model):
    """`{"rank", "alpha", "target"}` of a LoRA-enabled model, as read from its layers; or `None`."""
    blocks = _blocks(model)
    if not blocks:
        return None
    target = [name for name in TARGETS if _has_lora(blocks[0], name)]
    if not target:
        return None
    layer = _target_layer(blocks[0], target[0])
    return {"rank": layer.lora_rank, "alpha": layer.lora_alpha, "target": target}


def _has_lora(block, name):
    layer, slot = _target(block, name)
    if slot is None:
        return bool(getattr(layer, "lora_enabled", False))
    return slot in (getattr(layer, "lora_slots", None) or ())


def check_rank(rank, argument="rank"):
    """A `ValueError` naming `argument` (as its caller spells it) unless `rank` is an int >= 1."""
    if isinstance(rank, bool) or not isinstance(rank, int) or rank < 1:
        raise ValueError(
            f"{_options.name(argument)} must be a positive int (the adapters' rank). "
            f"Received: {_options.given(argument, rank)}"
        )


def check_targets(target, argument="target"):
    """`target` as a tuple of names in `TARGETS`; a `ValueError` naming `argument` if not."""
    if isinstance(target, str):
        target = (target,)
    target = tuple(target)
    unknown = [name for name in target if name not in TARGETS]
    if unknown or not target:
        raise ValueError(
            f"{_options.name(argument)} must name projections among "
            f"{', '.join(TARGETS)}. Received: {_options.given(argument, target)}"
        )
    return target


def largest_ranks(hidden_dim, mlp_dim):
    """`{target: the largest useful rank of its update}`: each projection's smaller side.

    A slot of the fused q/k/v kernel is a `(D, heads * head_dim)` = `(D, D)`
    matrix, the attention's output `(D, D)`, the MLP's `(D, mlp_dim)` and
    `(mlp_dim, D)`.
    """
    mlp = min(hidden_dim, mlp_dim)
    return {
        "query": hidden_dim,
        "key": hidden_dim,
        "value": hidden_dim,
        "out": hidden_dim,
        "mlp_dense_1": mlp,
        "mlp_dense_2": mlp,
    }


def check_rank_fits(rank, target, hidden_dim, mlp_dim, argument="rank"):
    """A `ValueError` naming `argument` if `rank` exceeds a `target` projection's smaller side.

    The one rule of the bound, which `enable_lora` asks of a model and the
    training job of an architecture before building it.
    """
    bounds = largest_ranks(hidden_dim, mlp_dim)
    for name in target:
        if rank > bounds[name]:
            raise ValueError(
                f"{_options.name(argument)} must be at most the {name} projection's smaller "
                f"side, {bounds[name]}. Received: {_options.given(argument, rank)}"
            )


def _check(model, rank, target, alpha):
    check_rank(rank)
    target = check_targets(target)
    if alpha is not None and (isinstance(alpha, bool) or not isinstance(alpha, (int, float))):
        raise TypeError(f"`alpha` must be a number or None. Received: alpha={alpha!r}")
    blocks = _blocks(model)
    if not blocks:
        raise ValueError(f"Model {model.name!r} has no keras_vit Transformer blocks to adapt.")
    settings = lora_settings(model)
    if settings is not None:
        raise ValueError(
            f"Model {model.name!r} has LoRA already (rank {settings['rank']}): "
            "enable it once, on the model as built or loaded."
        )
    modes = {layer.path: layer.quantization_mode for layer in _compat.all_layers(model)}
    other = [(path, mode) for path, mode in modes.items() if mode not in (None, "int8")]
    if other:
        raise ValueError(
            f"Model {model.name!r} is quantized in {other[0][1]!r} ({other[0][0]}, ...): LoRA "
            "trains on a float model or one quantized by Keras in 'int8' (QLoRA)."
        )
    hidden_dim, mlp_dim = blocks[0].mlp_dense_1.kernel.shape
    check_rank_fits(rank, target, hidden_dim, mlp_dim)
    return target, blocks


def enable_lora(model, rank, target=DEFAULT_TARGETS, alpha=None):
    """Adds LoRA adapters of `rank` to `target` projections of every block; freezes the rest.

    A model with an attention-pooling head (`pooling="map"`, SigLIP's)
    gets the same adapters on the head's projections: its query, its key
    and value (slots of one kernel), its output and MLP.

    Args:
        model: a keras_vit model (a `VisionTransformer`, or a model holding
            its blocks).
        rank: int, the adapters' rank.
        target: names among `"query"`, `"key"`, `"value"` (slices of the
            fused q/k/v projection), `"out"` (attention's output
            projection), `"mlp_dense_1"`, `"mlp_dense_2"`. Defaults to the
            query and the value, as keras-hub and the LoRA paper.
        alpha: the update's scale numerator, `alpha / rank`; defaults to
            `rank` (a scale of 1), as Keras.

    Returns:
        `model`, whose trainable weights are now the adapters, the target
        layers' biases and the head.

    Raises:
        ValueError: a rank below 1 or above a target's width, an unknown
            target, a model with LoRA already, a model quantized in another
            mode than Keras' `"int8"`; before any weight is touched.

    Example:

    ```python
    model = keras_vit.ViTB16(weights="augreg-imagenet21k", classes=10)
    model.enable_lora(8)  # query and value of every block
    model.fit(...)
    model.save_lora_weights("vit.lora.h5")
    ```

    On a model quantized by Keras (`model.quantize("int8")` first), the
    adapters train beside the int8 kernels (Keras' QLoRA); a saved `.keras`
    file holds each adapted kernel merged and requantized, as Keras saves its
    own int8 LoRA layers, and `merge_lora` returns that int8 model.
    """
    target, _ = _check(model, rank, target, alpha)
    for layer in model.layers:
        if layer.name not in TRAINED_LAYERS:
            layer.trainable = False
    for part in _adapted_parts(model):
        # Each adapted layer once, with the slots of its fused kernel (None: whole).
        slots = {}
        for name in target:
            layer, slot = _target(part, name)
            entry = slots.setdefault(layer.name, (layer, []))
            if slot is not None:
                entry[1].append(slot)
        for layer, layer_slots in slots.values():
            layer.trainable = True
            layer.enable_lora(
                rank, lora_alpha=alpha, **({"slots": sorted(layer_slots)} if layer_slots else {})
            )
    _compat.forget_traced_functions(model)
    return model


def merged_weights(model):
    """`{weight path: array}` of `model` with every adapter merged into its kernel."""
    weights = {
        variable.path: keras.ops.convert_to_numpy(variable)
        for variable in model.weights
        if "lora_kernel" not in variable.path
    }
    for layer in _compat.all_layers(model):
        if not getattr(layer, "lora_enabled", False):
            continue
        if layer.quantization_mode is None:
            weights[f"{layer.path}/kernel"] = keras.ops.convert_to_numpy(layer.kernel)
        else:  # Keras' QLoRA: the merge requantized, with its new scales
            kernel, scale = _compat.merged_quantized_kernel(layer)
            weights[f"{layer.path}/kernel"] = keras.ops.convert_to_numpy(kernel)
            weights[f"{layer.path}/kernel_scale"] = keras.ops.convert_to_numpy(scale)
    return weights


def unmerged_variables(model):
    """The variables of a LoRA model that its saved weights do not hold as they are.

    Keras saves a LoRA layer's merged kernel and no adapters, and loading
    zeroes the adapters: a training checkpoint that resumes a LoRA fine-tune
    keeps these besides (`keras_vit.training.backup`): each adapted layer's
    frozen kernel and its two factors.
    """
    found = []
    for layer in _compat.all_layers(model):
        if getattr(layer, "lora_enabled", False):
            found += [_compat.lora_frozen_kernel(layer), layer.lora_kernel_a, layer.lora_kernel_b]
    return found


def merge_lora(model):
    """A plain copy of a LoRA model, its adapters merged into the kernels (for export).

    Example:

    ```python
    keras_vit.export.tflite(keras_vit.models.merge_lora(model), "vit.tflite")
    ```
    """
    merged = model.__class__.from_config(model.get_config())
    weights = merged_weights(model)
    for variable in merged.weights:
        variable.assign(weights[variable.path])
    return merged


def _trained(model):
    return {variable.path: variable for variable in model.trainable_weights}


def base_fingerprint(model):
    """A digest of the frozen kernels that `model`'s adapters update: the base they fit.

    An adapter file records it, and `load_lora_weights` refuses a file
    trained on another base (the same architecture with other weights).
    """
    import hashlib

    digest = hashlib.sha256()
    for layer in _compat.all_layers(model):
        if getattr(layer, "lora_enabled", False):
            digest.update(layer.path.encode())
            digest.update(
                np.ascontiguousarray(
                    keras.ops.convert_to_numpy(_compat.lora_frozen_kernel(layer))
                ).tobytes()
            )
    return digest.hexdigest()[:16]


def save_lora_weights(model, path):
    """Writes the adapters, the adapted layers' biases and the head: a small `.lora.h5` file.

    The file records the fingerprint of the frozen base (`base_fingerprint`).
    """
    import h5py

    settings = lora_settings(model)
    if settings is None:
        raise ValueError(f"Model {model.name!r} has no LoRA: call enable_lora first.")
    path = str(path)
    if not path.endswith(".lora.h5"):
        raise ValueError(f"`path` must end with '.lora.h5'. Received: path={path!r}")
    with h5py.File(path, "w") as f:
        f.attrs["format"] = LORA_FILE_FORMAT
        f.attrs["settings"] = json.dumps(settings)
        f.attrs["base"] = base_fingerprint(model)
        for weight_path, variable in _trained(model).items():
            f[weight_path] = keras.ops.convert_to_numpy(variable)


def load_lora_weights(model, path):
    """Reads a `save_lora_weights` file into a model with the same LoRA and the same base.

    Refused before any weight moves: another LoRA (rank, target, shapes), or
    adapters trained on other frozen weights (`base_fingerprint`).
    """
    import h5py

    settings = lora_settings(model)
    if settings is None:
        raise ValueError(f"Model {model.name!r} has no LoRA: call enable_lora first.")
    trained = _trained(model)
    with h5py.File(str(path), "r") as f:
        if f.attrs.get("format") != LORA_FILE_FORMAT:
            raise ValueError(f"{path} is not a keras_vit LoRA file (no {LORA_FILE_FORMAT!r}).")
        saved = json.loads(f.attrs["settings"])
        if saved != settings:
            raise ValueError(f"{path} holds LoRA {saved}; the model has LoRA {settings}.")
        base = f.attrs.get("base")  # (files of earlier versions have none)
        values = {}

        def collect(name, item):
            if isinstance(item, h5py.Dataset):
                values[name] = np.asarray(item)

        f.visititems(collect)
    different = sorted(set(values) ^ set(trained)) or [
        p for p in sorted(trained) if values[p].shape != tuple(trained[p].shape)
    ]
    if different:
        raise ValueError(
            f"{path} holds the LoRA weights of another architecture: {different[0]} differs "
            "(missing, extra, or another shape)."
        )
    own = base_fingerprint(model)
    if base is not None and base != own:
        raise ValueError(
            f"{path} holds adapters trained on another base model (frozen weights "
            f"{base}; this model's {own}): load them into the model "
            "they were trained on (the same checkpoint, quantized the same way)."
        )
    for weight_path, variable in trained.items():
        variable.assign(values[weight_path])
