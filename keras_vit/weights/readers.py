"""Checkpoint files to `{name: array}`, never unpickling anything.

`.npz` with `allow_pickle=False`, `.safetensors` with `safetensors`,
PyTorch `.bin`/`.pth`/`.pt` with `torch.load(weights_only=True)`, and this
package's own `.keras` files from their archive's weights (`keras_archive`,
no model built), a keras-hub preset's `model.weights.h5` (its HDF5 groups;
nothing in the preset runs); also the JSON files that sit beside a
checkpoint and the layer configs of a `.keras` file.
"""

import contextlib
import json
import os
import threading
import zipfile

import numpy as np

CHECKPOINT_SUFFIXES = (".npz", ".safetensors", ".bin", ".pth", ".pt", ".keras")
# A keras-hub preset (a folder) is read through its weights file.
PRESET_WEIGHTS = "model.weights.h5"


def _read_npz(path):
    with np.load(path, allow_pickle=False) as archive:  # object arrays need pickle: refused
        return {key: archive[key] for key in archive.files}


def _read_safetensors(path):
    from safetensors.numpy import load_file

    return load_file(path)


def _read_keras(path):
    from keras_vit.weights.keras_archive import read_keras_weights

    return read_keras_weights(path)  # no model built: nothing in the file runs


def _read_keras_hub(path):
    """`{group path/variable index: array}` of a Keras weights file (`.../mha/query_dense/0`)."""
    import h5py

    tensors = {}

    def add(name, item):
        if isinstance(item, h5py.Dataset):
            group, _, index = name.rpartition("/vars/")
            if item.attrs.get("dtype") == "bfloat16":  # stored as raw 16-bit words
                import ml_dtypes

                tensors[f"{group}/{index}"] = np.array(item, dtype=ml_dtypes.bfloat16)
            else:
                tensors[f"{group}/{index}"] = np.asarray(item)

    with h5py.File(path, "r") as weights:
        weights.visititems(add)
    return tensors


def is_keras_hub_preset(path):
    """Whether `path` is a keras-hub preset folder or its weights file (its config.json says so)."""
    path = os.fspath(path)
    if os.path.isdir(path):
        path = os.path.join(path, PRESET_WEIGHTS)
    if not (path.endswith(PRESET_WEIGHTS) and os.path.isfile(path)):
        return False
    try:
        registered = read_json_beside(path, "config.json").get("registered_name")
    except (ValueError, AttributeError):
        return False
    return isinstance(registered, str) and registered.startswith("keras_hub>")


def preset_weights(path):
    """A keras-hub preset folder's weights file; any other path as given."""
    if isinstance(path, (str, os.PathLike)) and os.path.isdir(path) and is_keras_hub_preset(path):
        return os.path.join(os.fspath(path), PRESET_WEIGHTS)
    return path


def _read_torch(path):
    try:
        import torch
    except ImportError:
        raise ImportError(
            f"Reading the PyTorch file {path!r} needs torch "
            "(`pip install keras-vit[torch]`); .safetensors files do not."
        ) from None
    state = torch.load(path, map_location="cpu", weights_only=True)
    if not isinstance(state, dict):
        raise ValueError(f"it holds a {type(state).__name__}, not a state dict")
    state = state.get("model", state.get("state_dict", state))
    return {k: v.float().numpy() for k, v in state.items() if hasattr(v, "numpy")}


_READERS = {
    ".npz": ("NumPy .npz", _read_npz),
    ".safetensors": ("safetensors", _read_safetensors),
    ".keras": ("Keras .keras", _read_keras),
    ".bin": ("PyTorch", _read_torch),
    ".pth": ("PyTorch", _read_torch),
    ".pt": ("PyTorch", _read_torch),
    PRESET_WEIGHTS: ("keras-hub preset", _read_keras_hub),
}


# What `reading_once` blocks of this thread have read: {(path, mtime, size): tensors}.
_read_in_block = threading.local()


@contextlib.contextmanager
def reading_once():
    """Within the block, `read_tensors` reads each file once.

    Building a model from a checkpoint reads it for its shapes (the
    architecture, the checks) and then for its weights; a ViT-B/16 file is
    330 MB. Blocks nest; the arrays are released when the outermost ends.
    """
    outermost = getattr(_read_in_block, "files", None) is None
    if outermost:
        _read_in_block.files = {}
    try:
        yield
    finally:
        if outermost:
            _read_in_block.files = None


def read_tensors(path):
    """`{name: array}` of a checkpoint file, never unpickling anything.

    A damaged, truncated or crafted file ends in a `ValueError` that names
    the file and what the parser found, whatever the parser raised. Inside
    a `reading_once` block a file (unchanged since) is read once.
    """
    files = getattr(_read_in_block, "files", None)
    if files is None or not os.path.isfile(path):
        return _read_tensors(path)
    status = os.stat(path)
    key = (os.path.realpath(path), status.st_mtime_ns, status.st_size)
    if key not in files:
        files[key] = _read_tensors(path)
    return dict(files[key])  # callers may add or drop names, never the arrays


def _read_tensors(path):
    suffix = next((s for s in _READERS if str(path).endswith(s)), None)
    if suffix is None:
        raise ValueError(
            f"{path!r} is not a checkpoint file; expected one ending in "
            f"{' or '.join(CHECKPOINT_SUFFIXES)}."
        )
    if not os.path.isfile(path):
        raise ValueError(f"No such checkpoint file: {path!r}")
    kind, read = _READERS[suffix]
    from keras_vit.weights.keras_archive import QuantizedModelFile, check_keras_archive

    if suffix == ".keras":
        check_keras_archive(path)  # a truncated file: the same words everywhere
    try:
        return read(path)
    except (ImportError, QuantizedModelFile):
        raise  # (a quantized model's file: its own words, what it is and what to do)
    except Exception as error:  # noqa: BLE001  (parsers raise anything on bad bytes)
        raise ValueError(
            f"{path!r} is not a readable {kind} checkpoint "
            f"({type(error).__name__}: {str(error)[:500]})"
        ) from None


def read_json_beside(path, name):
    """A JSON file (`config.json`, ...) in the checkpoint's folder, or `{}`."""
    json_path = os.path.join(os.path.dirname(os.path.abspath(path)), name)
    if not os.path.isfile(json_path):
        return {}
    with open(json_path) as f:
        return json.load(f)


def keras_model_config(path):
    """A `.keras` file's model: `{"class_name": ..., "config": {...}}`, from its `config.json`.

    Read without building anything.
    """
    try:
        with zipfile.ZipFile(path) as archive:
            config = json.loads(archive.read("config.json"))
        if not isinstance(config["config"], dict):
            raise TypeError("its model has no configuration")
        return config
    except (zipfile.BadZipFile, KeyError, TypeError, ValueError) as error:
        raise ValueError(f"{path!r} is not a Keras model file: {error}") from None


def keras_layer_configs(model_config, path):
    """`{layer name: config}` of a functional graph (`model_config`: `keras_model_config(path)`)."""
    try:
        return {layer["name"]: layer["config"] for layer in model_config["config"]["layers"]}
    except (KeyError, TypeError) as error:
        raise ValueError(f"{path!r} is not a Keras functional model file: {error}") from None
