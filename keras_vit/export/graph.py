"""The Keras model as a TensorFlow function, whatever the backend.

Everything that writes TensorFlow artefacts starts here: on the TensorFlow
backend the model is traced directly; on JAX it goes through `jax2tf`
(Keras' `ExportArchive`), so the model's own JAX computation is what gets
served. The torch backend has no TensorFlow path in Keras; its models are
rebuilt on TensorFlow from a `.keras` file (see `rebuild_on_tensorflow`).
"""

import atexit
import json
import os
import subprocess
import sys
import tempfile
import threading

import keras

from keras_vit import _options


def cpu_threads(num_threads=None):
    """`num_threads`, or for `None` the CPUs this process may run on."""
    if num_threads is not None:
        return num_threads
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # (not on every platform)
        return os.cpu_count() or 1


def channels_last_input(model):
    """`model`, or for a channels-first ViT a model of it that takes channels-last images.

    Every export serves `(batch, height, width, channels)` images, as its
    signature says: TF Serving's decoders, LiteRT's and ONNX's image tools
    make them. The wrapper moves the channels first again (layer
    `channels_first`) before the model, which moves them last (its
    `channels_last` layer): converters fold the two transposes.
    """
    from keras_vit.models import image_shape, takes_channels_first

    if len(getattr(model, "inputs", None) or ()) != 1 or not takes_channels_first(model):
        return model
    images = keras.Input(image_shape(model), name="images")
    outputs = model(keras.layers.Permute((3, 1, 2), name="channels_first")(images))
    return keras.Model(images, outputs, name=model.name)


def input_spec(model, batch_size=None, image_size=None, any_size=False):
    """`(shape, dtype)` of the model's image input, with the given batch.

    A model of run-time resolution (`input_shape=(None, None, C)`) keeps
    height and width unknown with `any_size=True` (a SavedModel serves
    every size), and is otherwise exported at `image_size`, which it then
    needs. A fixed-size model takes only its own size.
    """
    if len(model.inputs) != 1:
        raise ValueError(
            f"`model` must have one image input; {model.name!r} has {len(model.inputs)}."
        )
    shape = tuple(model.inputs[0].shape[1:])
    if len(shape) != 3 or shape[-1] is None:
        raise ValueError(
            "`model` must take images of shape `(height, width, channels)`. "
            f"Received input shape {model.inputs[0].shape}."
        )
    if image_size is not None:
        size = (image_size, image_size) if isinstance(image_size, int) else tuple(image_size)
        if len(size) != 2 or not all(isinstance(s, int) and s > 0 for s in size):
            raise ValueError(
                f"{_options.name('image_size')} must be a positive int or (height, width). "
                f"Received: {_options.given('image_size', image_size)}"
            )
        if None not in shape[:2] and size != shape[:2]:
            raise ValueError(
                f"The model takes {shape[0]}x{shape[1]} images only. Received: "
                f"{_options.given('image_size', image_size)} (a model built with "
                f"input_shape=(None, None, {shape[-1]}) takes any size)."
            )
        shape = (*size, shape[-1])
    if None in shape[:2] and not any_size:
        raise ValueError(
            f"The model takes images of any size (input shape {model.inputs[0].shape}); "
            "this export needs static shapes: name the size to export it at, e.g. "
            f"{_options.code('image_size', (224, 224), typed=224)}."
        )
    return (batch_size, *shape), "float32"


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


def outputs_probabilities(model):
    """Whether the model ends in a softmax (else it returns logits)."""
    last = model.layers[-1]
    activation = getattr(last, "activation", None)
    return activation is not None and getattr(activation, "__name__", "") == "softmax"


def as_probabilities(scores, already_probabilities):
    """Model outputs as float64 probabilities (a softmax over logits)."""
    import numpy as np

    scores = np.asarray(scores, "float64")
    if already_probabilities:
        return scores
    scores = np.exp(scores - scores.max(-1, keepdims=True))
    return scores / scores.sum(-1, keepdims=True)


# Below this share of images whose top-1 class an export keeps, `keras-vit
# export` warns: a quantized file that loses points (or collapses) must not
# pass unnoticed.
AGREEMENT_WARNING_BELOW = 0.99


def agreement_warning(top1_agreement, count, what):
    """One line saying that `what` agrees too rarely with its Keras model; `None` if it does not.

    Example:

    >>> print(agreement_warning(0.916, 500, "model_int8.tflite"))  # doctest: +NORMALIZE_WHITESPACE
    model_int8.tflite gives the Keras model's top-1 class for 91.60% of 500 images,
    below 99%: measure its accuracy before shipping it
    >>> agreement_warning(0.998, 500, "model.onnx") is None
    True
    """
    if top1_agreement >= AGREEMENT_WARNING_BELOW:
        return None
    return (
        f"{what} gives the Keras model's top-1 class for {top1_agreement:.2%} of {count} "
        f"images, below {AGREEMENT_WARNING_BELOW:.0%}: measure its accuracy before "
        "shipping it"
    )


def agreement(served, model, images, verbose=0):
    """`max_abs_error` and `top1_agreement` of an export's outputs against `model` on `images`.

    With `top1_classes`, the export's own top-1 class of each image (to score
    it against labels).
    """
    import numpy as np

    expected = np.asarray(model.predict(images, verbose=verbose), "float32")
    return {
        "max_abs_error": float(np.max(np.abs(served - expected))),
        "top1_agreement": float(np.mean(served.argmax(-1) == expected.argmax(-1))),
        "top1_classes": served.argmax(-1).tolist(),
    }


def model_function(model, batch_size=None, image_size=None, any_size=False):
    """A TensorFlow-callable `images -> model outputs` (inference mode).

    Args:
        model: a built single-input Keras model.
        batch_size: `None` for a dynamic batch, or a fixed int.
        image_size, any_size: see `input_spec`.

    Returns:
        A restored SavedModel function (see `write_archive`) taking float32 images
        `(batch, H, W, C)`; its `restored_module` holds the variables.
    """
    import tensorflow as tf

    with tempfile.TemporaryDirectory(prefix="keras_vit_export_") as directory:
        write_archive(model, directory, batch_size, image_size, any_size)
        restored = tf.saved_model.load(directory)
    serve = restored.serve
    serve.restored_module = restored  # keeps the variables alive
    return serve


def write_archive(model, directory, batch_size=None, image_size=None, any_size=False):
    """Writes the model's inference call as a SavedModel with one `serve` endpoint.

    One path for both backends: Keras' `ExportArchive` (through `jax2tf` on
    JAX), so what is exported is exactly what a SavedModel of the model
    computes. (`image_size`, `any_size`: see `input_spec`.)
    """
    shape, dtype = input_spec(model, batch_size, image_size, any_size)
    backend = keras.backend.backend()
    if backend not in ("tensorflow", "jax"):
        raise ValueError(
            f"A TensorFlow graph of the model needs the tensorflow or jax backend, "
            f"not {backend!r}; `rebuild_on_tensorflow` moves the model there."
        )
    archive = keras.export.ExportArchive()
    archive.track(model)
    archive.add_endpoint(
        "serve",
        lambda images: model(images, training=False),
        input_signature=[keras.InputSpec(shape=shape, dtype=dtype)],
    )
    archive.write_out(directory, verbose=False)


def rebuild_on_tensorflow(model, command, **arguments):
    """Runs `keras_vit.export.<command>` on the TensorFlow backend in a child process.

    For backends without a direct TensorFlow path (LiteRT from JAX, anything
    from torch): the model travels as a `.keras` file, which loads on every
    backend, and the child calls the same export function there. The child
    (`TensorFlowWorker`) stays up for the next export of this process, so a
    model exported to several formats pays for TensorFlow's start once.

    Args:
        model: the Keras model.
        command: the name of a function in `keras_vit.export`.
        **arguments: JSON-serialisable keyword arguments for it.

    Returns:
        The function's JSON-serialisable result.
    """
    with tempfile.TemporaryDirectory(prefix="keras_vit_rebuild_") as directory:
        model_path = os.path.join(directory, "model.keras")
        model.save(model_path)
        return TensorFlowWorker.shared().run(model_path, command, arguments)


# Runs in the child: one request a line on stdin, one answer a line on the
# file descriptor that was stdout (fd 1 then points at stderr, so whatever
# TensorFlow or a converter prints cannot break the answers).
_WORKER = """
import json, os, sys, traceback
answers = os.fdopen(os.dup(1), "w")
os.dup2(2, 1)
import keras, keras_vit.export as export
for line in sys.stdin:
    request = json.loads(line)
    os.chdir(request["cwd"])
    os.umask(request["umask"])
    try:
        model = keras.saving.load_model(request["model"])
        answer = {"result": getattr(export, request["command"])(model, **request["arguments"])}
    except BaseException:
        answer = {"error": traceback.format_exc()}
    finally:
        model = None
        keras.backend.clear_session()
    answers.write(json.dumps(answer) + "\\n")
    answers.flush()
"""


class TensorFlowWorker:
    """A TensorFlow-backend interpreter that runs `keras_vit.export` functions on request.

    One is kept per process (`shared`), with the environment the process had
    when it started; it ends with its process (its stdin closes), or when
    `close` is called.
    """

    _shared = None
    _lock = threading.Lock()

    def __init__(self):
        self.log = tempfile.TemporaryFile()  # the child's stderr, read on failure
        self.process = subprocess.Popen(
            [sys.executable, "-c", _WORKER],
            env={**os.environ, "KERAS_BACKEND": "tensorflow"},
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=self.log,
            text=True,
        )

    @classmethod
    def shared(cls):
        """This process's worker, started on first use and again if it ended."""
        with cls._lock:
            worker = cls._shared
            if worker is None or worker.process.poll() is not None:
                worker = cls._shared = cls()
                atexit.register(worker.close)
            return worker

    def run(self, model_path, command, arguments):
        """`keras_vit.export.<command>(the model at model_path, **arguments)` in the child."""
        request = {
            "model": model_path,
            "command": command,
            "arguments": arguments,
            "cwd": os.getcwd(),
            "umask": process_umask(),
        }
        with self._lock:
            start = self.log.seek(0, os.SEEK_END)
            try:
                self.process.stdin.write(json.dumps(request) + "\n")
                self.process.stdin.flush()
                line = self.process.stdout.readline()
            except BrokenPipeError:
                line = ""
            answer = json.loads(line) if line else {"error": self._log_since(start)}
        if "error" in answer:
            if not line:
                self.close()  # it died: the next export starts another
            raise RuntimeError(
                f"Rebuilding the model on TensorFlow for `{command}` failed:\n"
                + answer["error"][-3000:]
            )
        return answer["result"]

    def _log_since(self, start):
        self.process.wait()
        self.log.seek(start)
        return (
            self.log.read().decode(errors="replace")
            + f"\n(the TensorFlow process ended with status {self.process.returncode})"
        )

    def close(self):
        """Ends the child: it reads the end of its stdin and exits."""
        if self.process.poll() is None:
            self.process.stdin.close()
            try:
                self.process.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.process.kill()
        self.log.close()


def takes_any_size(model):
    """Whether the model was built for images of any size (`(None, None, C)`)."""
    return None in tuple(model.inputs[0].shape[1:3])
