"""What an export writes: the artefact and its metadata file, whole or not at all.

Every export is written aside under a temporary name and renamed in (a
failure never leaves half a file), readable as a plain `open` would make it
under the process's umask, with a JSON file beside it (`metadata`: one
layout for every format) that says what the artefact takes and gives.
"""

import json
import os
import tempfile

import keras


def process_umask():
    """The process's umask (reading it means setting it: set back at once)."""
    umask = os.umask(0)
    os.umask(umask)
    return umask


def apply_umask(path):
    """Gives `path` the permissions a plain `open`/`mkdir` would under the process's umask.

    `tempfile` creates files 0600 and folders 0700 whatever the umask; an
    export written aside under a temporary name and renamed in would keep
    them, and a server running as another user (TF Serving's container)
    could not read it.
    """
    os.chmod(path, (0o777 if os.path.isdir(path) else 0o666) & ~process_umask())
    return path


# Where a SavedModel version folder holds its metadata (TF Serving ignores it).
SAVED_MODEL_METADATA = os.path.join("assets.extra", "keras_vit.json")


def metadata_path(path):
    """The JSON file that describes an export: its own (`model.tflite.json`).

    Each artefact has its own, so a `.tflite` and an `.onnx` of one model can
    sit in one folder; a SavedModel version folder holds it inside
    (`SAVED_MODEL_METADATA`).
    """
    if os.path.isdir(path):
        return os.path.join(path, SAVED_MODEL_METADATA)
    return os.fspath(path) + ".json"


def read_metadata(path, export_format):
    """The metadata of the export at `path`, or `{}`.

    Files of earlier versions wrote `model.json` for `model.tflite` (and for
    `model.onnx`): read where it describes this format.
    """
    for candidate in (metadata_path(path), os.path.splitext(os.fspath(path))[0] + ".json"):
        if os.path.isfile(candidate):
            with open(candidate) as f:
                described = json.load(f)
            if described.get("format") == f"keras_vit.{export_format}/1":
                return described
    return {}


def refuse_to_replace(path, overwrite):
    """A `ValueError` unless `overwrite`, when the export or its metadata file exists already."""
    from keras_vit import _options

    if overwrite:
        return
    for existing in (path, metadata_path(path)):
        if os.path.exists(existing):
            raise ValueError(
                f"{existing!r} exists; pass {_options.code('overwrite', True)} to replace it."
            )


def metadata(model, export_format, image_size, class_names=None, **fields):
    """What a client needs to feed an export and read its outputs, as a dict.

    The fields every format shares (`format`, `model_name`, `image_size`,
    `channels`, `classes`, `class_names`, `exported_from_backend`), then the
    format's own `fields`.
    """
    return {
        "format": f"keras_vit.{export_format}/1",
        "model_name": model.name,
        "image_size": list(image_size),
        "channels": model.inputs[0].shape[-1],
        "classes": model.outputs[0].shape[-1],
        "class_names": class_names,
        "exported_from_backend": keras.backend.backend(),
        **fields,
    }


def write_aside(files):
    """Writes `{path: bytes or str}`, each aside then renamed in, with the umask's permissions."""
    for target, data in files.items():
        directory = os.path.dirname(os.path.abspath(target))
        os.makedirs(directory, exist_ok=True)
        mode = "wb" if isinstance(data, bytes) else "w"
        with tempfile.NamedTemporaryFile(mode, dir=directory, delete=False, suffix=".partial") as f:
            f.write(data)
        apply_umask(f.name)
        os.replace(f.name, target)


def check_class_names(class_names, classes):
    """`class_names` as a list of one str per class (or None); a clear error if not."""
    if class_names is None:
        return None
    if isinstance(class_names, str) or not all(isinstance(n, str) for n in class_names):
        raise TypeError(
            f"`class_names` must be a sequence of str. Received: class_names={class_names!r}"
        )
    if len(class_names) != classes:
        raise ValueError(
            f"`class_names` has {len(class_names)} names for a model with {classes} "
            f"classes. Received: class_names={list(class_names)!r}"
        )
    return list(class_names)
