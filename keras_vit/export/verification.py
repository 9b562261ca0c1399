"""An exported file checked against its Keras model: served outputs, top-1 agreement, latency.

Each check runs the file as a deployment would: a SavedModel in a process
that imports TensorFlow alone (`tf_only.py`), an ONNX file in ONNX Runtime
in a process without Keras (`onnx_only.py`), a `.tflite` file in the LiteRT
interpreter (`litert_runtime.TFLiteModel`). Writing a file is the writers'
(`saved_model`, `onnx_file`, `litert`); running one, the runtimes'.
"""

import base64
import json
import os
import subprocess
import sys
import tempfile

import numpy as np

from keras_vit.export import artefacts, checks, graph
from keras_vit.export.litert_runtime import TFLiteModel, delegate_partitions


def _keras_probabilities(model, images, verbose=0):
    import numpy as np

    scores = model.predict(np.asarray(images, "float32"), verbose=verbose)
    return checks.as_probabilities(scores, checks.outputs_probabilities(model))


def check_saved_model(version_dir, model, images, encoded_images=(), crop_fraction=1.0, verbose=0):
    """Serves an export from a TensorFlow-only process and compares it with Keras.

    A fresh interpreter that imports only TensorFlow (`tf_only.py`) loads
    `version_dir`, sends each signature a `PredictRequest` (float `images`
    to `serving_default`, `encoded_images` to `serving_bytes`) and returns
    the responses; the same inputs go through `model` here (encoded images
    decoded by `decode_for_eval`, as the graph does).

    Args:
        version_dir: the exported version directory.
        model: the Keras model that was exported.
        images: float array `(N, H, W, C)` of `[0, 255]` pixels.
        encoded_images: sequence of JPEG/PNG bytes.
        crop_fraction: the crop the export was made with.
        verbose: Keras' progress verbosity for the Keras model's pass.

    Returns:
        dict: `signatures` (the table), per signature
        `{"max_abs_error", "top1_agreement", "top_k_classes"}`, `errors`
        (the requests the server refused, with its message) and
        `keras_vit_imported` (False: the server needs only TensorFlow).
    """
    model = graph.exported_model(model)
    import subprocess
    import sys

    import numpy as np

    from keras_vit.export import tf_only

    images = np.asarray(images, "float32")
    expected = {"serving_default": _keras_probabilities(model, images, verbose)}
    requests = {}
    with tempfile.TemporaryDirectory(prefix="keras_vit_check_") as directory:
        np.save(os.path.join(directory, "images.npy"), images)
        requests["serving_default"] = {"images": {"npy": os.path.join(directory, "images.npy")}}
        if len(encoded_images):
            import tensorflow as tf

            from keras_vit.data.pipeline import decode_for_eval

            # What serving_bytes resizes to.
            height, width = artefacts.read_metadata(version_dir, "saved_model")["image_size"]
            channels = model.inputs[0].shape[-1]
            try:
                decoded = np.stack(
                    [
                        decode_for_eval(tf.constant(e), (height, width), channels, crop_fraction)
                        for e in encoded_images
                    ]
                )
                expected["serving_bytes"] = _keras_probabilities(model, decoded)
            except tf.errors.InvalidArgumentError:
                pass  # undecodable: the server must refuse the request too
            requests["serving_bytes"] = {
                "image_bytes": {"base64": [base64.b64encode(e).decode() for e in encoded_images]}
            }
        requests_path = os.path.join(directory, "requests.json")
        outputs_path = os.path.join(directory, "outputs.npz")
        with open(requests_path, "w") as f:
            json.dump(requests, f)
        script = (
            "import runpy, sys; sys.argv = sys.argv[1:]; "
            "runpy.run_path(sys.argv[0], run_name='__main__')"
        )
        done = subprocess.run(
            [
                sys.executable,
                "-I",
                "-c",
                script,
                tf_only.__file__,
                version_dir,
                requests_path,
                outputs_path,
            ],
            capture_output=True,
            text=True,
        )
        if done.returncode != 0:
            raise RuntimeError(
                f"The TensorFlow-only serving process failed:\n{done.stderr[-3000:]}"
            )
        report = json.loads(done.stdout.strip().splitlines()[-1])
        served = dict(np.load(outputs_path))
    for signature, reference in expected.items():
        if signature in report["errors"]:
            continue
        probabilities = served[f"{signature}/probabilities"]
        report[signature] = {
            "max_abs_error": float(np.max(np.abs(probabilities - reference))),
            "top1_agreement": float(np.mean(probabilities.argmax(-1) == reference.argmax(-1))),
            "top_k_classes": served[f"{signature}/top_k_classes"].tolist(),
        }
    return report


def check_onnx(path, model, images, num_threads=None, latency_runs=50, verbose=0):
    """Runs an `.onnx` file in ONNX Runtime in a fresh process and compares it with Keras.

    The process (`onnx_only.py`) imports neither Keras nor keras_vit, as a
    deployment would not.

    Returns:
        dict: `max_abs_error` and `top1_agreement` against `model` on
        `images`, `top1_classes` (the export's top-1 class of each
        image), `bytes`, `latency_ms` (median, one image, `num_threads`
        threads), `input` (name and shape as ONNX Runtime sees them) and
        `keras_imported` (False).
    """
    model = graph.exported_model(model)
    images = np.asarray(images, "float32")
    script = os.path.join(os.path.dirname(os.path.abspath(__file__)), "onnx_only.py")
    with tempfile.TemporaryDirectory(prefix="keras_vit_onnx_check_") as directory:
        images_path = os.path.join(directory, "images.npy")
        outputs_path = os.path.join(directory, "outputs.npy")
        np.save(images_path, images)
        done = subprocess.run(
            [
                sys.executable,
                script,
                os.fspath(path),
                images_path,
                outputs_path,
                str(checks.cpu_threads(num_threads)),
                str(latency_runs),
            ],
            capture_output=True,
            text=True,
        )
        if done.returncode:
            raise RuntimeError(
                f"ONNX Runtime failed on {os.fspath(path)!r}: {done.stderr.strip()[-2000:]}"
            )
        report = json.loads(done.stdout.strip().splitlines()[-1])
        served = np.load(outputs_path)
    return {
        **checks.agreement(served, model, images, verbose),
        "bytes": os.path.getsize(path),
        **report,
    }


def check_tflite(path, model, images, num_threads=None, latency_runs=50, verbose=0):
    """Runs a `.tflite` file in LiteRT and compares it with the Keras model.

    `verbose` is Keras' progress verbosity (0 silent, 1 a live bar, 2 one
    line when done), for the Keras model's pass and the interpreter's.

    Returns:
        dict: `max_abs_error` and `top1_agreement` against `model` on
        `images`, `top1_classes` (the export's top-1 class of each
        image), `bytes` (file size), `latency_ms` (median, one image,
        `num_threads` threads) and `xnnpack_partitions`
        (`delegate_partitions`).
    """
    model = graph.exported_model(model)
    import keras

    images = np.asarray(images, "float32")
    runner = TFLiteModel(path, num_threads=num_threads)
    progress = keras.utils.Progbar(len(images), verbose=verbose, unit_name="image")
    served = []
    for image in images:
        served.append(runner.predict_one(image))
        progress.add(1)
    served = np.stack(served)
    return {
        **checks.agreement(served, model, images, verbose),
        "bytes": os.path.getsize(path),
        "latency_ms": runner.latency_ms(images[0], runs=latency_runs),
        "xnnpack_partitions": delegate_partitions(path, num_threads),
    }
