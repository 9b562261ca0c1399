"""keras-hub presets: a backbone's `model.weights.h5` (with its `config.json` beside it).

`Backbone.save_to_preset(DIR)` writes the backbone's configuration
(`config.json`: `{"class_name": "ViTBackbone", "config": {...}, "registered_name":
"keras_hub>ViTBackbone"}`), `metadata.json` and the weights as Keras saves
them: an HDF5 file of groups named after each layer's place in its parent
(`layers/vi_t_encoder/encoder_layers/vi_t_encoder_block_1/mha/query_dense/vars/0`,
list items by class name and a counter, attributes by attribute name), the
variables of a layer numbered in the order it creates them. The reader
(`keras_vit.weights.readers`) flattens the file to `{group path/index: array}`
(`.../mha/query_dense/0`); this module maps those names of each backbone that
keras_vit builds to its own, and `to_preset_tensors` maps them back
(`keras_vit.models.save_to_preset` writes the file).

The five backbones and where their parts sit are the `FAMILIES` table: one
row per backbone, each weight a pattern of the file's names and the keras_vit
weight it is.
"""

import dataclasses
import re

import numpy as np

from keras_vit.weights.converters.common import stack_qkv

PRESET_MARKER = "keras_hub>"


@dataclasses.dataclass(frozen=True)
class Family:
    """Where one keras-hub backbone keeps each weight.

    Attributes:
        embedding: the group of the patch embedding and the tokens (whose
            variables `token_slots` names).
        patch: the patch embedding's Conv2D under `embedding`.
        position_table: the position table's group (an `Embedding`), where
            it is not one of the embedding's own variables.
        block: the group of block `i` (`{suffix}`: "" for the first, "_1"...).
        block_names: `{name under the block: keras_vit weight under encoderblock_i}`.
        attention: the attention's group under the block.
        per_head: the q/k/v kernels have a head axis (`MultiHeadAttention`'s
            `(D, heads, head_dim)`); else `Dense` `(D, D)`.
        final_norm: the group of the encoder's last LayerNorm.
        head: the pooling head's group (SigLIP's attention pooling).
        gate: a gated MLP's gate projection under the block (DINOv3's
            `use_gated_mlp`), whose outputs come first in keras_vit's
            `SwiGLUDense` kernel.
    """

    embedding: str
    patch: str
    block: str
    block_names: dict
    attention: str
    final_norm: str
    per_head: bool = True
    position_table: str = ""
    head: str = ""
    gate: str = ""


_NORMS = {"0": "gamma", "1": "beta"}
_DENSE = {"0": "kernel", "1": "bias"}


def _block_names(attention_norm, mlp_norm, mlp_dense_1, mlp_dense_2, scales=()):
    names = {}
    for group, target in (
        (attention_norm, "attention_norm"),
        (mlp_norm, "mlp_norm"),
    ):
        names.update({f"{group}/{i}": f"{target}/{w}" for i, w in _NORMS.items()})
    for group, target in ((mlp_dense_1, "mlp_dense_1"), (mlp_dense_2, "mlp_dense_2")):
        names.update({f"{group}/{i}": f"{target}/{w}" for i, w in _DENSE.items()})
    for group, target in zip(scales, ("attention_scale", "mlp_scale")):
        names[f"{group}/0"] = f"{target}/gamma"
    return names


FAMILIES = {
    "ViTBackbone": Family(
        embedding="layers/vi_t_patching_and_embedding",
        patch="patch_embedding",
        position_table="position_embedding",
        block="layers/vi_t_encoder/encoder_layers/vi_t_encoder_block{suffix}",
        block_names=_block_names("layer_norm_1", "layer_norm_2", "mlp/dense_1", "mlp/dense_2"),
        attention="mha",
        final_norm="layers/vi_t_encoder/layer_norm",
    ),
    "DeiTBackbone": Family(
        embedding="layers/dei_t_embeddings",
        patch="patch_embedding",
        block="layers/dei_t_encoder/encoder_layers/dei_t_encoder_block{suffix}",
        block_names=_block_names("layer_norm_1", "layer_norm_2", "mlp/dense", "output_layer/dense"),
        attention="mha",
        final_norm="layers/dei_t_encoder/layer_norm",
    ),
    "DINOV2Backbone": Family(
        embedding="layers/dinov2_embedding",
        patch="patch_embeddings/projection",
        block="layers/dinov2_encoder/layers/dinov2_layer{suffix}",
        block_names=_block_names(
            "norm1", "norm2", "mlp/fc1", "mlp/fc2", scales=("layer_scale1", "layer_scale2")
        ),
        attention="attention/attention",
        final_norm="layers/layer_normalization",
    ),
    "DINOV3Backbone": Family(
        embedding="layers/dinov3_embedding",
        patch="patch_embeddings/projection",
        block="layers/dinov3_encoder/layers/dinov3_layer{suffix}",
        block_names=_block_names(
            "norm1",
            "norm2",
            "mlp/up_proj",
            "mlp/down_proj",
            scales=("layer_scale1", "layer_scale2"),
        ),
        attention="attention",
        per_head=False,
        final_norm="layers/layer_normalization",
        gate="mlp/gate_proj",
    ),
    "SigLIPVisionEncoder": Family(
        embedding="layers/sig_lip_vision_embedding",
        patch="patch_embedding",
        position_table="position_embedding",
        block="layers/sig_lip_encoder_layer{suffix}",
        block_names=_block_names("layer_norm1", "layer_norm2", "mlp/fc1", "mlp/fc2"),
        attention="self_attn",
        final_norm="layers/layer_normalization",
        head="layers/sig_lip_multi_head_attention_pooling",
    ),
}


# The embedding's variables that keras_vit has no weight for: DINOv2's and
# DINOv3's mask token (pre-training's), and the position table that DINOv2
# resamples for its image size (made again from the source table on loading).
MASK_TOKEN = "keras_hub:mask_token"
RESAMPLED_TABLE = "keras_hub:resampled_position_embeddings"


def token_slots(class_name, config):
    """The embedding layer's own variables, in order: keras_vit weights, or a keras-hub one's name.

    A layer numbers its variables in the order it creates them, and which it
    creates follows its configuration (DINOv2's mask token, registers).
    DINOv2 keeps its position table at `position_embedding_shape` (not
    trained: last) beside the one its image size uses, which its
    `from_preset` resamples from it again (with Keras' bicubic resize): the
    source table is read, and the model resamples it as its own code does.
    """
    if class_name == "ViTBackbone":
        return ["class_token/token"] if config.get("use_class_token", True) else []
    if class_name == "DeiTBackbone":
        return ["class_token/token", "distillation_token/token", "position_embedding/embeddings"]
    if class_name in ("DINOV2Backbone", "DINOV3Backbone"):
        slots = ["class_token/token"]
        if config.get("use_mask_token", True):
            slots.append(MASK_TOKEN)
        if config.get("num_register_tokens", 0 if class_name == "DINOV2Backbone" else 4):
            slots.append("register_tokens/tokens")
        if class_name == "DINOV2Backbone":
            slots += [RESAMPLED_TABLE, "position_embedding/embeddings"]
        return slots
    return []


def _suffix_index(suffix):
    return int(suffix[1:]) if suffix else 0


def _heads_kernel(value, num_heads, per_head):
    return value if per_head else value.reshape(value.shape[0], num_heads, -1)


def to_canonical(tensors, num_heads, class_name, config):
    """A preset's flattened weights -> `{keras_vit weight path: array}`."""
    family = FAMILIES[class_name]
    out, qkv, gates = {}, {}, {}
    embedding = family.embedding + "/"
    for index, target in enumerate(token_slots(class_name, config)):
        name = f"{embedding}{index}"
        if name in tensors and not target.startswith("keras_hub:"):
            out[target] = tensors[name]
    for i, weight in _DENSE.items():
        name = f"{embedding}{family.patch}/{i}"
        if name in tensors:
            out[f"patch_embedding/{weight}"] = tensors[name]
    if family.position_table:
        out["position_embedding/embeddings"] = tensors[f"{embedding}{family.position_table}/0"][
            None
        ]
    for i, weight in _NORMS.items():
        if f"{family.final_norm}/{i}" in tensors:
            out[f"encoder_norm/{weight}"] = tensors[f"{family.final_norm}/{i}"]
    block = re.compile(re.escape(family.block).replace(r"\{suffix\}", r"(_\d+)?") + "/(.+)")
    projection = re.compile(re.escape(family.attention) + r"/(query|key|value|output)_dense/([01])")
    for name, value in tensors.items():
        match = block.fullmatch(name)
        if not match:
            continue
        index, rest = _suffix_index(match[1] or ""), match[2]
        prefix = f"encoderblock_{index}/"
        if rest in family.block_names:
            out[prefix + family.block_names[rest]] = value
            continue
        if family.gate and rest.startswith(family.gate + "/"):
            gates[(index, _DENSE[rest[-1]])] = value
            continue
        found = projection.fullmatch(rest)
        if not found:
            continue
        kind = _DENSE[found[2]]
        if found[1] == "output":
            if kind == "kernel" and not family.per_head:
                value = value.reshape(num_heads, -1, value.shape[-1])
            out[prefix + f"attention/out/{kind}"] = value
        elif kind == "kernel":
            qkv[(index, kind, found[1])] = _heads_kernel(value, num_heads, family.per_head)
        else:
            qkv[(index, kind, found[1])] = value.reshape(num_heads, -1)
    for index, kind, _ in list(qkv):
        if kind == "bias" and (index, "bias", "key") not in qkv:
            # A key without bias (DINOv3's `use_key_bias=False`): a zero one is the same.
            qkv[(index, "bias", "key")] = np.zeros_like(qkv[(index, "bias", "query")])
    for (index, kind), gate in gates.items():  # (SwiGLUDense: the gate's outputs first)
        target = f"encoderblock_{index}/mlp_dense_1/{kind}"
        out[target] = np.concatenate([gate, out[target]], axis=-1)
    if family.head:
        out.update(_pooling_head(tensors, family.head))
    return stack_qkv(out, qkv)


# SigLIP's `SigLIPMultiHeadAttentionPooling`: `{name under its group: keras_vit
# weight}`, both ways; its key and value are one stacked kernel in keras_vit's
# (`_KEY_VALUE`).
_HEAD_NAMES = {
    "0": "map_head/probe",
    **{f"attention/query_dense/{i}": f"map_head/query/{w}" for i, w in _DENSE.items()},
    **{f"attention/output_dense/{i}": f"map_head/out/{w}" for i, w in _DENSE.items()},
    **{f"layer_norm/{i}": f"map_head/norm/{w}" for i, w in _NORMS.items()},
    **{f"mlp/fc{d}/{i}": f"map_head/mlp_dense_{d}/{w}" for d in "12" for i, w in _DENSE.items()},
}
_KEY_VALUE = ("attention/key_dense", "attention/value_dense")


def _pooling_head(tensors, group):
    """SigLIP's pooling head -> keras_vit's `map_head/*`."""
    out = {target: tensors[f"{group}/{name}"] for name, target in _HEAD_NAMES.items()}
    for i, kind in _DENSE.items():  # (D, 2, heads, head_dim) and (2, heads, head_dim)
        out[f"map_head/key_value/{kind}"] = np.stack(
            [tensors[f"{group}/{part}/{i}"] for part in _KEY_VALUE], axis=-3
        )
    return out


def _group_of(family, target):
    """The group under a block that holds keras_vit's `target` weight."""
    return next(n.rsplit("/", 1)[0] for n, t in family.block_names.items() if t == target)


def to_preset_tensors(canonical, class_name, config, num_layers):
    """keras_vit's weights -> `{h5 group path: [variables in order]}` of a keras-hub backbone.

    The inverse of `to_canonical` for the backbones that `save_to_preset`
    writes (every weight of the backbone: a missing one is a `KeyError`;
    `canonical` also holds the `token_slots` of keras-hub's own).
    """
    family = FAMILIES[class_name]
    groups = {}
    slots = token_slots(class_name, config)
    if slots:  # (keras-hub's own variables: the caller's `canonical` holds them by name)
        groups[family.embedding] = [canonical[name] for name in slots]
    groups[f"{family.embedding}/{family.patch}"] = [
        canonical["patch_embedding/kernel"],
        canonical["patch_embedding/bias"],
    ]
    if family.position_table:
        groups[f"{family.embedding}/{family.position_table}"] = [
            canonical["position_embedding/embeddings"][0]
        ]
    groups[family.final_norm] = [canonical["encoder_norm/gamma"], canonical["encoder_norm/beta"]]
    for index in range(num_layers):
        block = family.block.format(suffix=f"_{index}" if index else "")
        prefix = f"encoderblock_{index}/"
        for name, target in family.block_names.items():
            group, position = name.rsplit("/", 1)
            groups.setdefault(f"{block}/{group}", {})[int(position)] = canonical[prefix + target]
        if config.get("use_gated_mlp"):  # one SwiGLUDense kernel: the gate's half, then up's
            up = groups[f"{block}/{_group_of(family, 'mlp_dense_1/kernel')}"]
            (gate_kernel, up[0]), (gate_bias, up[1]) = (
                np.split(v, 2, axis=-1) for v in up.values()
            )
            groups[f"{block}/{family.gate}"] = {0: gate_kernel, 1: gate_bias}
        kernel = canonical[prefix + "attention/qkv/kernel"]
        bias = canonical[prefix + "attention/qkv/bias"]
        for i, projection in enumerate(("query", "key", "value")):
            groups[f"{block}/{family.attention}/{projection}_dense"] = [
                kernel[:, i],
                bias[i],
            ]
        groups[f"{block}/{family.attention}/output_dense"] = [
            canonical[prefix + "attention/out/kernel"],
            canonical[prefix + "attention/out/bias"],
        ]
    groups = {
        group: [values[i] for i in sorted(values)] if isinstance(values, dict) else values
        for group, values in groups.items()
    }
    if family.head:
        groups.update(_pooling_head_groups(canonical, family))
    if not family.per_head:  # DINOv3's projections are Dense (D, D) layers
        for index in range(num_layers):
            block = family.block.format(suffix=f"_{index}" if index else "")
            for projection in ("query", "key", "value", "output"):
                group = groups[f"{block}/{family.attention}/{projection}_dense"]
                kernel, bias = group
                if projection == "output":
                    group[0] = kernel.reshape(-1, kernel.shape[-1])
                else:
                    group[0], group[1] = kernel.reshape(kernel.shape[0], -1), bias.reshape(-1)
    return groups


def _pooling_head_groups(canonical, family):
    """keras_vit's `map_head/*` -> SigLIP's pooling head (`_pooling_head` read backwards)."""
    tokens = canonical["position_embedding/embeddings"].shape[1]
    groups = {family.embedding: {0: np.arange(tokens, dtype="int64")[None]}}  # position ids
    for name, target in _HEAD_NAMES.items():
        group, _, index = f"{family.head}/{name}".rpartition("/")
        groups.setdefault(group, {})[int(index)] = canonical[target]
    for i, kind in _DENSE.items():
        stacked = canonical[f"map_head/key_value/{kind}"]
        for position, part in enumerate(_KEY_VALUE):
            value = stacked[:, position] if kind == "kernel" else stacked[position]
            groups.setdefault(f"{family.head}/{part}", {})[int(i)] = value
    return {group: [values[i] for i in sorted(values)] for group, values in groups.items()}
