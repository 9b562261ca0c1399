"""Exports read back and run: what `keras-vit evaluate` and `predict` call an exported file with.

`open_export(path)` gives each file `keras_vit.export` writes (a LiteRT
`.tflite`, an `.onnx`, a SavedModel folder) the same face, so a command
measures the file it will ship the way it measures the `.keras` it came from:

```python
exported = keras_vit.export.open_export("run/model_int8.tflite")
exported.image_shape         # (28, 28, 1): what its input takes
exported.classes, exported.class_names
scores = exported(images)    # (N, classes): logits or probabilities
exported.outputs_probabilities
```

Each reads the metadata file its writer put beside it (class names, output
kind); without one, the file's own shapes are read and its outputs taken
as logits (the exports' default).
"""

import os

import numpy as np

from keras_vit import _options
from keras_vit.export import artefacts, checks


def exported_kind(path):
    """What kind of export `path` is ("a TFLite model", ...), or `None` for anything else."""
    if os.path.isdir(path):
        if os.path.isfile(os.path.join(path, "saved_model.pb")) or _latest_version(path):
            return "an exported SavedModel folder"
        return None
    if os.fspath(path).endswith(".onnx"):
        return "an ONNX model"
    try:
        with open(path, "rb") as f:
            head = f.read(8)
    except OSError:
        return None
    return "a TFLite model" if head[4:8] == b"TFL3" else None  # its FlatBuffer's identifier


def _latest_version(model_dir):
    """The highest numbered version folder of a served model's folder, as TF Serving picks it."""
    versions = [
        int(name)
        for name in os.listdir(model_dir)
        if name.isdigit() and os.path.isfile(os.path.join(model_dir, name, "saved_model.pb"))
    ]
    return os.path.join(model_dir, str(max(versions))) if versions else None


def open_export(path, num_threads=None):
    """The export at `path`, ready to run; a `ValueError` if it is none.

    Args:
        path: a `.tflite` file, an `.onnx` file, or a SavedModel folder: a
            version folder (`serving/vit/1`) or the model's folder above its
            versions (the highest is read, as TF Serving does).
        num_threads: int, the CPU threads of LiteRT and ONNX Runtime; `None`:
            the CPUs this process may run on. (A SavedModel runs on
            TensorFlow's threads, set for the whole process.)

    Returns:
        A callable from float32 images `(N, H, W, C)` in `[0, 255]` to their
        scores `(N, classes)`, with `path`, `kind`, `image_shape`, `classes`,
        `class_names` and `outputs_probabilities`.
    """
    kind = exported_kind(path)
    if kind is None:
        raise ValueError(
            f"path={os.fspath(path)!r} is not a file that keras-vit export writes (a .tflite, "
            "an .onnx, or a SavedModel folder)"
        )
    return {
        "a TFLite model": _LiteRT,
        "an ONNX model": _ONNXRuntime,
        "an exported SavedModel folder": _SavedModel,
    }[kind](path, kind, checks.cpu_threads(num_threads))


class _Export:
    """The face every export shares; each runtime fills in `_run` and the shapes."""

    def __init__(self, path, kind, metadata):
        self.path = os.fspath(path)
        self.kind = kind
        self.metadata = metadata
        self.class_names = metadata.get("class_names")
        self.outputs_probabilities = metadata.get("output", "logits") == "probabilities"

    def __call__(self, images):
        return np.asarray(self._run(np.asarray(images, "float32")))

    def __repr__(self):
        return f"<{self.kind} {self.path!r}: {self.image_shape} -> {self.classes} classes>"


class _LiteRT(_Export):
    def __init__(self, path, kind, num_threads):
        from keras_vit.export.litert_runtime import TFLiteModel

        self._model = TFLiteModel(path, num_threads=num_threads)
        super().__init__(path, kind, self._model.metadata)
        self.image_shape = self._model.input_shape[1:]
        self.classes = self._model.output_shape[-1]
        self._run = self._model


class _ONNXRuntime(_Export):
    def __init__(self, path, kind, num_threads):
        import onnxruntime

        options = onnxruntime.SessionOptions()
        options.intra_op_num_threads = num_threads
        options.inter_op_num_threads = 1
        try:
            self._session = onnxruntime.InferenceSession(
                os.fspath(path), options, providers=["CPUExecutionProvider"]
            )
        except Exception as error:  # onnxruntime's own exception types
            raise ValueError(
                f"{path!r} is not an ONNX model ONNX Runtime can load: {_options.first_line(error)}"
            ) from None
        super().__init__(path, kind, artefacts.read_metadata(path, "onnx"))
        (feed,) = self._session.get_inputs()
        self._feed = feed.name
        self.image_shape = tuple(int(d) for d in feed.shape[1:])
        self.classes = int(self._session.get_outputs()[0].shape[-1])

    def _run(self, images):
        return self._session.run(None, {self._feed: images})[0]


class _SavedModel(_Export):
    """`serving_default` of the SavedModel: it returns probabilities (and the top k)."""

    def __init__(self, path, kind, num_threads):
        import tensorflow as tf

        version = path if os.path.isfile(os.path.join(path, "saved_model.pb")) else None
        version = version or _latest_version(path)
        try:
            self._loaded = tf.saved_model.load(version)
        except Exception as error:  # TensorFlow's and protobuf's own exception types
            raise ValueError(
                f"{version!r} is not a SavedModel TensorFlow can load: {_options.first_line(error)}"
            ) from None
        if "serving_default" not in self._loaded.signatures:
            raise ValueError(
                f"{version!r} has no serving_default signature: not a SavedModel of keras-vit "
                f"export (its signatures: {sorted(self._loaded.signatures)})"
            )
        metadata = artefacts.read_metadata(version, "saved_model")
        super().__init__(version, kind, {**metadata, "output": "probabilities"})
        self._function = self._loaded.signatures["serving_default"]
        ((name, spec),) = self._function.structured_input_signature[1].items()
        self._feed = name
        height, width, channels = spec.shape[1:]
        if height is None:  # a model of any size: the size its metadata names
            height, width = metadata["image_size"]
        self.image_shape = (int(height), int(width), int(channels))
        self.classes = int(self._function.structured_outputs["probabilities"].shape[-1])

    def _run(self, images):
        return self._function(**{self._feed: images})["probabilities"].numpy()
