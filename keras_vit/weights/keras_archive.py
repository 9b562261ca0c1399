"""A keras_vit `.keras` file's weights, read from the archive: no model is built.

A `.keras` file is a zip archive whose `model.weights.h5` holds each layer's
variables by position (`layers/transformer_block_3/attention/vars/0`), the
layer's name in the group's `name` attribute (`encoderblock_3`, then
`attention`). The names of the variables themselves are not in the file: they
are the order in which each layer creates them, which this module keeps for
the layers of keras_vit's models (`tests/weights/test_keras_archive.py` reads
every kind of model back and compares it with the model's own `weight.path`s).
"""

import io
import json
import re
import zipfile

import numpy as np

# Each layer of a keras_vit model (by its name there) and its variables, in the
# order it creates them; a layer that creates fewer stops early (a Dense without
# bias). The first pattern that matches the whole name applies.
_VARIABLES = (
    # Attention's projections are its sublayers `qkv` and `out` (the MAP
    # head's `query`, `key_value`, `out`); files of the earlier layout held
    # their variables in the attention layer's (the head's) own.
    ("attention", ("qkv/kernel", "out/kernel", "qkv/bias", "out/bias")),
    (
        "map_head",
        (
            "probe",
            "query/kernel",
            "key_value/kernel",
            "out/kernel",
            "query/bias",
            "key_value/bias",
            "out/bias",
        ),
    ),
    ("(class|distillation)_token", ("token",)),
    ("register_tokens", ("tokens",)),
    ("(decoder_)?position_embedding", ("embeddings",)),
    ("patch_corruption|decoder_mask_tokens", ("mask_token",)),
    ("(attention|mlp)_scale", ("gamma",)),
    ("batch_norm_[0-9]+", ("gamma", "beta", "moving_mean", "moving_variance")),
    ("(.*_)?norm", ("gamma", "beta")),
    (".*", ("kernel", "bias")),  # Dense, Conv2D, PatchEmbedding
)


def _variable_names(layer_name, count, path, where):
    names = next(names for pattern, names in _VARIABLES if re.fullmatch(pattern, layer_name))
    if count > len(names):
        raise ValueError(
            f"{path!r}: layer {where!r} holds {count} variables where a keras_vit layer of "
            f"that name has {len(names)} ({', '.join(names)}): a model changed after it was "
            "built (quantized, LoRA) or not a keras_vit model. Load it with "
            "keras.saving.load_model instead."
        )
    return names[:count]


def _read_group(group, prefix, tensors, path):
    """Adds the variables of `group` (an h5 group of a layer, or a container) and below."""
    if "vars" in group:
        variables = group["vars"]
        name = variables.attrs.get("name")
        if name is None:
            raise ValueError(
                f"{path!r} was saved by a Keras older than 3.14, whose files do not name "
                "their layers: load it with keras.saving.load_model and save it again."
            )
        if "layers" not in group:  # a nested model's weights do not carry its name
            prefix = f"{prefix}{name}/"
        keys = sorted(variables, key=int)
        for key, variable in zip(keys, _variable_names(name, len(keys), path, prefix[:-1])):
            value = variables[key]
            if value.attrs.get("dtype") == "bfloat16":  # stored as raw 16-bit words
                import ml_dtypes

                tensors[prefix + variable] = np.array(value, dtype=ml_dtypes.bfloat16)
            else:
                tensors[prefix + variable] = np.asarray(value)
    for key in group:
        if key != "vars":
            _read_group(group[key], prefix, tensors, path)


def _objects(config):
    """Every dict in a saved configuration, at any depth."""
    if isinstance(config, dict):
        yield config
        config = list(config.values())
    if isinstance(config, list):
        for value in config:
            yield from _objects(value)


def _refuse_code(config, path):
    """A file whose configuration carries Python code (a `Lambda` layer's) is refused.

    Nothing here would run it, but such a file is not a keras_vit model, and
    Keras' safe mode refuses it where the file is loaded as a model.
    """
    if any(item.get("class_name") == "__lambda__" for item in _objects(config)):
        raise ValueError(
            f"{path!r} holds a `Lambda` layer's Python bytecode: not a keras_vit model "
            "file (Keras' safe mode refuses to run such code)"
        )


def _quantized_modes(config):
    """The Keras quantization modes a saved model's configuration names (its dtype policies)."""
    return {
        item["config"]["mode"]
        for item in _objects(config)
        if str(item.get("class_name", "")).endswith("DTypePolicy")
        and isinstance(item.get("config"), dict)
        and "mode" in item["config"]
    }


class QuantizedModelFile(ValueError):
    """A `.keras` file of a model quantized with Keras' `quantize`: not a checkpoint's weights."""


def _refuse_quantized(config, path):
    """A model quantized with Keras' `quantize` holds integer kernels: no checkpoint's weights."""
    modes = sorted(_quantized_modes(config))
    if modes:
        raise QuantizedModelFile(
            f"{path!r} holds a model quantized with Keras' `quantize` ({', '.join(modes)}): its "
            "kernels are integers, not weights to fine-tune or load into a float model. Start "
            "from the float model it was quantized from; `keras-vit evaluate` and `predict` "
            "run this one as it is."
        )


def check_keras_archive(path):
    """A clear `ValueError` unless `path` is a `.keras` archive: the one message for each case.

    Every place that reads a `.keras` file says the same of a truncated or
    foreign one (`from_checkpoint`, a fine-tune, a teacher, the commands).
    """
    if not zipfile.is_zipfile(path):
        raise ValueError(
            f"{path} is not a .keras model file: it is not a zip archive "
            "(a truncated download, or another kind of file)"
        )
    with zipfile.ZipFile(path) as archive:
        if "config.json" not in archive.namelist():
            raise ValueError(
                f"{path} is a zip archive without config.json: not a .keras model file"
            )


def read_keras_weights(path):
    """`{weight path: array}` of a keras_vit `.keras` file, as `model.weights` names them.

    Reads the archive's weights file only; the layers need not be registered
    and no model is built.

    Example:

    ```python
    tensors = read_keras_weights("run/model.keras")
    tensors["encoderblock_0/attention/qkv/kernel"].shape  # (width, 3, heads, head width)
    ```
    """
    import h5py

    with zipfile.ZipFile(path) as archive:
        config = json.loads(archive.read("config.json"))
        _refuse_code(config, path)
        _refuse_quantized(config, path)
        data = archive.read("model.weights.h5")
    tensors = {}
    with h5py.File(io.BytesIO(data), "r") as weights:
        if "layers" in weights:
            _read_group(weights["layers"], "", tensors, path)
    return tensors
