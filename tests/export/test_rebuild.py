"""The TensorFlow child that exports models of the other backends: one per process."""

import os
import signal
import stat

import pytest

import keras_vit
from keras_vit.export import tensorflow_worker
from tests.conftest import TINY

# The worker's life (one child, its errors, its replacement) is the same
# whichever backend asks: one suite runs it (each backend's exports through
# the child are tests/export/test_export.py's).
pytestmark = [pytest.mark.slow, pytest.mark.backend_independent]


def test_one_child_serves_every_export_of_a_process_and_outlives_their_errors(
    tmp_path, monkeypatch
):
    model = keras_vit.ViT(**TINY)
    monkeypatch.chdir(tmp_path)

    with pytest.raises(RuntimeError, match=r"(?s)for `tflite` failed.*must end in '\.tflite'"):
        tensorflow_worker.rebuild_on_tensorflow(model, "tflite", path="vit.bin")
    worker = tensorflow_worker.TensorFlowWorker.shared()

    # Relative paths are the caller's, and files get the caller's umask.
    old = os.umask(0o027)
    try:
        result = tensorflow_worker.rebuild_on_tensorflow(model, "tflite", path="vit.tflite")
    finally:
        os.umask(old)
    assert tensorflow_worker.TensorFlowWorker.shared() is worker  # the error left it serving
    assert result["path"] == "vit.tflite"
    assert stat.S_IMODE(os.stat(tmp_path / "vit.tflite").st_mode) == 0o640

    # A child that died answers its caller with how it ended, and is replaced.
    os.kill(worker.process.pid, signal.SIGKILL)
    with pytest.raises(RuntimeError, match="ended with status -9"):
        worker.run(str(tmp_path / "missing.keras"), "tflite", {"path": "x.tflite"})
    tensorflow_worker.rebuild_on_tensorflow(model, "onnx", path=str(tmp_path / "vit.onnx"))
    assert tensorflow_worker.TensorFlowWorker.shared() is not worker
    assert os.path.getsize(tmp_path / "vit.onnx") > 10_000
