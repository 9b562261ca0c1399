"""A TensorFlow-backend child process that runs `keras_vit.export` functions on request.

For backends without a direct TensorFlow path (LiteRT from JAX, anything
from torch) the model travels to it as a `.keras` file, which loads on every
backend.
"""

import atexit
import json
import os
import subprocess
import sys
import tempfile
import threading

from keras_vit.export.artefacts import process_umask


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
