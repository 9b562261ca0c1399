"""ONNX: the model as an ONNX graph, checked in ONNX Runtime.

The graph is written by `tf2onnx` from the model's TensorFlow function (as
Keras' `model.export(format="onnx")` does on TensorFlow); models of the JAX
and torch backends are rebuilt on TensorFlow from their `.keras` file first,
as for LiteRT (Keras' JAX path needs `jax2onnx`, and `torch.onnx` fails on
the ViT's gather).
"""

import json
import logging
import os
import tempfile
import warnings

import keras
import numpy as np

from keras_vit._native_output import native_stderr_captured
from keras_vit.export import artefacts, checks, graph
from keras_vit.export.tensorflow_worker import rebuild_on_tensorflow

metadata_path = artefacts.metadata_path  # (the `.json` beside an `.onnx` file)


def onnx(model, path, *, image_size=None, class_names=None, overwrite=False, opset=None):
    """Exports `model` as an ONNX file with a dynamic batch axis.

    Args:
        model: a Keras image classifier with one image input. A model of
            any size (`input_shape=(None, None, C)`) is exported at
            `image_size`, which it needs: ONNX Runtime would not run the
            graph's size check, and a size that is not a multiple of the
            patch would be cropped silently.
        path: the `.onnx` file to write (and its metadata beside it,
            `<path>.json`).
        image_size: int or `(height, width)` for a model of any size; a
            fixed-size model's own.
        class_names: optional class names for the metadata file.
        overwrite: bool, replace an existing file.
        opset: int, the ONNX opset; `None`: tf2onnx's default.

    Returns:
        dict: `path`, `metadata_path`, `bytes`, `opset`.

    Example:

    ```python
    keras_vit.export.onnx(model, "vit.onnx")
    report = keras_vit.export.check_onnx("vit.onnx", model, images)
    ```
    """
    model = graph.exported_model(model)
    path = os.fspath(path)
    if not path.endswith(".onnx"):
        raise ValueError(f"`path` must end in '.onnx'. Received: path={path!r}")
    artefacts.refuse_to_replace(path, overwrite)
    if opset is not None and (not isinstance(opset, int) or isinstance(opset, bool) or opset < 13):
        raise ValueError(f"`opset` must be an int >= 13 or None. Received: opset={opset!r}")
    (_, height, width, channels), _ = graph.input_spec(model, image_size=image_size)
    classes = model.outputs[0].shape[-1]
    if class_names is not None:
        class_names = artefacts.check_class_names(class_names, classes)
    if keras.backend.backend() != "tensorflow":
        return rebuild_on_tensorflow(
            model,
            "onnx",
            path=path,
            image_size=[height, width],
            class_names=class_names,
            overwrite=overwrite,
            opset=opset,
        )

    import onnx as onnx_format

    directory = os.path.dirname(os.path.abspath(path))
    os.makedirs(directory, exist_ok=True)
    spec = keras.InputSpec(shape=(None, height, width, channels), dtype="float32", name="images")
    # Written aside and renamed in: a failure never leaves half a file.
    with tempfile.TemporaryDirectory(prefix=".keras_vit_onnx_", dir=directory) as staging:
        staged = os.path.join(staging, "model.onnx")
        tf2onnx_logger = logging.getLogger("tf2onnx")
        level = tf2onnx_logger.level
        tf2onnx_logger.setLevel(logging.ERROR)
        try:
            with native_stderr_captured(), warnings.catch_warnings():
                warnings.simplefilter("ignore", FutureWarning)  # tf2onnx on NumPy 2
                model.export(
                    staged,
                    format="onnx",
                    verbose=False,
                    input_signature=[spec],
                    opset_version=opset,
                )
        finally:
            tf2onnx_logger.setLevel(level)
        written = onnx_format.load(staged, load_external_data=False)
        if replace_erfc(written.graph):
            onnx_format.save(written, staged)
        metadata = artefacts.metadata(
            model,
            "onnx",
            (height, width),
            class_names,
            output="probabilities" if checks.outputs_probabilities(model) else "logits",
            input=f"float32 (batch, {height}, {width}, {channels}), pixels in [0, 255]",
            opset=max(o.version for o in written.opset_import if o.domain in ("", "ai.onnx")),
        )
        with open(os.path.join(staging, "model.json"), "w") as f:
            json.dump(metadata, f, indent=2)
        for name, target in (("model.onnx", path), ("model.json", metadata_path(path))):
            artefacts.apply_umask(os.path.join(staging, name))
            os.replace(os.path.join(staging, name), target)
    return {
        "path": path,
        "metadata_path": metadata_path(path),
        "bytes": os.path.getsize(path),
        "opset": metadata["opset"],
    }


def replace_erfc(graph_proto):
    """Rewrites each `Erfc(x)` node of an ONNX graph as `1 - Erf(x)`; how many there were.

    TensorFlow's exact GELU is `0.5 * x * erfc(-x / sqrt(2))`, and tf2onnx
    writes its `Erfc` as an ONNX op of that name, which ONNX does not have:
    ONNX Runtime refuses the whole file. `1 - erf` is the same function
    (its absolute error, 1e-7 near erfc's zeros, is what GELU's `x *` keeps).

    Example:
    >>> from onnx import helper
    >>> graph = helper.make_graph([helper.make_node("Erfc", ["x"], ["y"])], "g", [], [])
    >>> replace_erfc(graph), [node.op_type for node in graph.node]
    (1, ['Erf', 'Sub'])
    """
    from onnx import helper, numpy_helper

    one = "keras_vit/one"
    rewritten, replaced = [], 0
    for node in graph_proto.node:
        if node.op_type != "Erfc" or node.domain not in ("", "ai.onnx"):
            rewritten.append(node)
            continue
        replaced += 1
        erf = node.output[0] + "/erf"
        rewritten += [
            helper.make_node("Erf", [node.input[0]], [erf], name=node.name + "/Erf"),
            helper.make_node("Sub", [one, erf], [node.output[0]], name=node.name),
        ]
    if replaced:
        graph_proto.initializer.append(numpy_helper.from_array(np.array(1.0, "float32"), one))
        del graph_proto.node[:]
        graph_proto.node.extend(rewritten)
    return replaced
