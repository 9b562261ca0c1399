"""A LiteRT (`.tflite`) file read and run: its graph's ops, its delegation, the interpreter.

What `keras-vit predict` runs a `.tflite` file with, and what the checks
(`export.verification`) and the writer's metadata read of it.
"""

import os
import time

import numpy as np

from keras_vit._compat import litert_ops
from keras_vit._native_output import native_stderr_captured
from keras_vit.export import artefacts, checks


def graph_ops(path_or_content):
    """The ops of a `.tflite` model's graph (before delegation), in order.

    Each is `{"op_name": ..., "inputs": [...], "outputs": [...]}`, its
    tensors as the interpreter details them (`name`, `dtype`, `shape`,
    `quantization_parameters`, ...), None for an absent optional input.
    """
    from ai_edge_litert.interpreter import Interpreter

    content = _read(path_or_content)
    interpreter = Interpreter(model_content=content, experimental_op_resolver_type=_no_delegate())
    tensors = {tensor["index"]: tensor for tensor in interpreter.get_tensor_details()}
    return [
        {
            "op_name": op["op_name"],
            "inputs": [tensors.get(index) for index in op["inputs"]],
            "outputs": [tensors.get(index) for index in op["outputs"]],
        }
        for op in litert_ops(interpreter)
    ]


def op_counts(path_or_content):
    """`{op name: count}` of a `.tflite` model's graph (before delegation)."""
    counts = {}
    for op in graph_ops(path_or_content):
        counts[op["op_name"]] = counts.get(op["op_name"], 0) + 1
    return dict(sorted(counts.items()))


def delegate_partitions(path_or_content, num_threads=None):
    """How many pieces the default CPU delegate (XNNPACK) runs the graph in.

    1 means XNNPACK runs the whole graph; each op it cannot take splits the
    graph, and the ops between pieces run in TFLite's own slower kernels.
    """
    from ai_edge_litert.interpreter import Interpreter

    interpreter = Interpreter(
        model_content=_read(path_or_content), num_threads=checks.cpu_threads(num_threads)
    )
    interpreter.allocate_tensors()
    return sum(op["op_name"] == "DELEGATE" for op in litert_ops(interpreter))


def _no_delegate():
    from ai_edge_litert.interpreter import OpResolverType

    return OpResolverType.BUILTIN_WITHOUT_DEFAULT_DELEGATES


def _read(path_or_content):
    if isinstance(path_or_content, bytes):
        return path_or_content
    with open(path_or_content, "rb") as f:
        return f.read()


class TFLiteModel:
    """A `.tflite` file in the LiteRT interpreter, called like a model.

    Args:
        path: the `.tflite` file (its `.json` metadata is read when present).
        num_threads: int, CPU threads (XNNPACK); `None`: the CPUs this
            process may run on.

    Example:

    ```python
    runner = keras_vit.export.TFLiteModel("vit.tflite", num_threads=2)
    scores = runner(images)          # (N, classes), one image at a time
    ```
    """

    def __init__(self, path, num_threads=None):
        from ai_edge_litert.interpreter import Interpreter

        if not os.path.isfile(path):
            raise ValueError(f"no such TFLite file: {path!r}")
        self.path = os.fspath(path)
        self.metadata = artefacts.read_metadata(path, "tflite")
        try:
            # LiteRT announces its CPU delegate on standard error ("INFO: Created
            # TensorFlow Lite XNNPACK delegate"), past Python's logging settings.
            with native_stderr_captured():
                self.interpreter = Interpreter(
                    model_path=self.path, num_threads=checks.cpu_threads(num_threads)
                )
                self.interpreter.allocate_tensors()
        except ValueError as error:
            raise ValueError(
                f"{path!r} is not a TFLite model the runtime can load: {error}"
            ) from None
        self._input = self.interpreter.get_input_details()[0]
        self._output = self.interpreter.get_output_details()[0]
        self.input_shape = tuple(int(d) for d in self._input["shape"])
        self.output_shape = tuple(int(d) for d in self._output["shape"])

    def predict_one(self, image):
        """The output row for one image `(H, W, C)` (or `(1, H, W, C)`)."""
        image = np.asarray(image, "float32").reshape(self.input_shape)
        self.interpreter.set_tensor(self._input["index"], image)
        self.interpreter.invoke()
        return self.interpreter.get_tensor(self._output["index"])[0].copy()

    def __call__(self, images):
        return np.stack([self.predict_one(image) for image in np.asarray(images)])

    def latency_ms(self, image, runs=50, warmup=5):
        """Median wall time of one `invoke` on one image, in milliseconds."""
        image = np.asarray(image, "float32").reshape(self.input_shape)
        times = []
        for index in range(warmup + runs):
            self.interpreter.set_tensor(self._input["index"], image)
            start = time.perf_counter()
            self.interpreter.invoke()
            if index >= warmup:
                times.append((time.perf_counter() - start) * 1000)
        return float(np.median(times))
