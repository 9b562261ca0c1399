"""Top-1 agreement of `mixed_bfloat16` with float32 on a trained classifier.

Issue 8 asks for >= 99% top-1 agreement with float32 on a trained head.
This trains the main job (`keras-vit train` with its defaults, on
TensorFlow) unless `--run DIR` names a finished run, then predicts the
10,000 Fashion-MNIST test images with the run's `model.keras` in float32
and rebuilt under `mixed_bfloat16` with the same weights
(`keras_vit.from_checkpoint`), on each backend in a fresh process.
It prints one JSON line per backend: agreement, both accuracies, the
largest difference of the outputs and images/s of each precision.

    python benchmarks/mixed_precision_agreement.py [--run DIR]
        [--backends tensorflow jax torch] [-- extra train args]
"""

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time


def test_images(limit=None, batch_size=500):
    """The Fashion-MNIST test split as the main job feeds it: images, labels."""
    import numpy as np

    from keras_vit import data as vit_data

    test = vit_data.load("fashion_mnist", "test", image_size=28, channels=1, batch_size=batch_size)
    images, labels = [], []
    for x, y in test.data.as_numpy_iterator():
        images.append(x)
        labels.append(y)
    images, labels = np.concatenate(images), np.concatenate(labels).argmax(-1)  # one-hot
    if limit is not None:
        images, labels = images[:limit], labels[:limit]
    return images, labels


def agreement(model_path, limit=None, batch_size=500):
    """Predicts the test images in float32 and `mixed_bfloat16`; compares."""
    import keras
    import numpy as np

    from keras_vit.models import from_checkpoint

    images, labels = test_images(limit, batch_size)
    outputs, speed = {}, {}
    policy = keras.config.dtype_policy()
    try:
        for precision in ("float32", "mixed_bfloat16"):
            keras.config.set_dtype_policy(precision)
            model = from_checkpoint(model_path)
            model.predict(images[:batch_size], batch_size=batch_size, verbose=0)  # compile
            start = time.perf_counter()
            outputs[precision] = np.asarray(
                model.predict(images, batch_size=batch_size, verbose=0), dtype="float64"
            )
            speed[precision] = len(images) / (time.perf_counter() - start)
    finally:
        keras.config.set_dtype_policy(policy)
    fp32, bf16 = outputs["float32"].argmax(-1), outputs["mixed_bfloat16"].argmax(-1)
    return {
        "images": int(len(images)),
        "top1_agreement": float(np.mean(fp32 == bf16)),
        "accuracy_float32": float(np.mean(fp32 == labels)),
        "accuracy_mixed_bfloat16": float(np.mean(bf16 == labels)),
        "max_abs_output_difference": float(
            np.max(np.abs(outputs["float32"] - outputs["mixed_bfloat16"]))
        ),
        "images_per_second_float32": speed["float32"],
        "images_per_second_mixed_bfloat16": speed["mixed_bfloat16"],
    }


def train_main_job(output_dir, extra):
    subprocess.run(
        [sys.executable, "-m", "keras_vit.cli", "train", "--output-dir", output_dir, *extra],
        env=dict(os.environ, KERAS_BACKEND="tensorflow", TF_CPP_MIN_LOG_LEVEL="3"),
        check=True,
    )


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--run", default=None, help="a finished `keras-vit train` output directory")
    parser.add_argument("--backends", nargs="+", default=["tensorflow", "jax", "torch"])
    parser.add_argument("--worker", default=None, help=argparse.SUPPRESS)
    args, extra = parser.parse_known_args(argv)
    if args.worker:
        print(json.dumps(agreement(args.worker)))
        return
    extra = [a for a in extra if a != "--"]
    run_dir = args.run or tempfile.mkdtemp(prefix="vit_agreement_")
    try:
        model_path = os.path.join(run_dir, "model.keras")
        if args.run is None:
            train_main_job(run_dir, extra)
        elif not os.path.isfile(model_path):
            parser.error(f"--run {args.run!r} has no model.keras")
        with open(os.path.join(run_dir, "metrics.json")) as f:
            print(json.dumps({"run": run_dir, **json.load(f)}), flush=True)
        for backend in args.backends:
            done = subprocess.run(
                [sys.executable, __file__, "--worker", model_path],
                env=dict(os.environ, KERAS_BACKEND=backend, TF_CPP_MIN_LOG_LEVEL="3"),
                capture_output=True,
                text=True,
            )
            if done.returncode:
                result = {"error": (done.stderr.strip().splitlines() or ["failed"])[-1]}
            else:
                result = json.loads(done.stdout.strip().splitlines()[-1])
            print(json.dumps({"backend": backend, **result}), flush=True)
    finally:
        if args.run is None:
            shutil.rmtree(run_dir, ignore_errors=True)


if __name__ == "__main__":
    main()
