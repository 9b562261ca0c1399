"""Exports side by side: size, latency and agreement with Keras.

For each model: Keras itself (`predict_on_batch`, one image), ONNX Runtime
(`keras_vit.export.onnx`, run by `check_onnx` in a process without Keras,
float32) and LiteRT in each quantisation mode (float32, float16,
dynamic-range int8, int8, int8_full; `keras_vit.export.tflite`, run by
`check_tflite`). One JSON line per row: file size, median latency of one
image (`--threads` threads), max abs error and top-1 agreement with the
Keras model on Fashion-MNIST test images (resized to the model's input,
grey repeated to RGB).

    KERAS_BACKEND=tensorflow python benchmarks/export_latency.py \
        --models Ti/16 S/16 keras_vit_run/model.keras [--modes keras onnx none]

`--quick` measures a tiny model for a few runs (the test suite does, so the
benchmark cannot rot); its numbers mean nothing.

Variants of the paper (`Ti/16`, `S/16`, ...) are built at 224 px with random
weights (no checkpoint can be downloaded here) and a random, non-zero head,
so their agreement numbers show quantisation noise against near-random
margins: a lower bound for a trained model. A `.keras` file (e.g. the main
job's model) is measured as trained.
"""

import argparse
import json
import os
import tempfile
import time

from harness import keras_latency_ms

MODES = ("keras", "onnx", "none", "float16", "dynamic", "int8", "int8_full")
TINY = dict(patch_size=8, hidden_dim=32, num_layers=2, num_heads=2, mlp_dim=64)


def build(name):
    import keras
    import numpy as np

    import keras_vit

    if name.endswith(".keras"):
        return keras.saving.load_model(name, compile=False)
    architecture = TINY if name == "tiny" else keras_vit.decode_variant(name)
    model = keras_vit.ViT(
        **architecture,
        input_shape=(32, 32, 3) if name == "tiny" else (224, 224, 3),
        classes=10,
        classifier_activation=None,
        seed=0,
        name=name.replace("/", "_"),
    )
    head = model.get_layer("head")
    head.kernel.assign(np.random.default_rng(0).normal(0, 0.05, head.kernel.shape))
    return model


def images_for(model, count):
    import numpy as np
    import tensorflow as tf

    from keras_vit.data.fashion_mnist import load_fashion_mnist

    height, width, channels = model.input_shape[1:]
    train, _ = load_fashion_mnist("train")
    test, _ = load_fashion_mnist("test")

    def prepare(images):
        images = tf.image.resize(images.astype("float32"), (height, width)).numpy()
        return np.repeat(images, channels, axis=-1) if channels == 3 else images

    return prepare(train[:128]), prepare(test[:count])


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", nargs="+", default=["Ti/16", "S/16"])
    parser.add_argument("--modes", nargs="+", default=list(MODES), choices=MODES)
    parser.add_argument("--images", type=int, default=200, help="test images to compare on")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--runs", type=int, default=50, help="timed invocations")
    parser.add_argument("--quick", action="store_true")
    args = parser.parse_args(argv)
    if args.quick:
        args.models, args.images, args.runs = ["tiny"], 16, 2
    import keras

    import keras_vit

    for name in args.models:
        model = build(name)
        calibration, test = images_for(model, args.images)
        with tempfile.TemporaryDirectory() as directory:
            for mode in args.modes:
                if mode == "keras":
                    print(
                        json.dumps(
                            {
                                "model": name,
                                "mode": "keras",
                                "latency_ms": round(
                                    keras_latency_ms(model, test[:1], args.runs), 2
                                ),
                                "backend": keras.backend.backend(),
                            }
                        ),
                        flush=True,
                    )
                    continue
                start = time.perf_counter()
                if mode == "onnx":
                    path = os.path.join(directory, "model.onnx")
                    keras_vit.export.onnx(model, path)
                    convert_seconds = time.perf_counter() - start
                    report = keras_vit.export.check_onnx(
                        path, model, test, num_threads=args.threads, latency_runs=args.runs
                    )
                else:
                    path = os.path.join(directory, f"{mode}.tflite")
                    keras_vit.export.tflite(
                        model, path, quantization=mode, representative_data=calibration
                    )
                    convert_seconds = time.perf_counter() - start
                    report = keras_vit.export.check_tflite(
                        path, model, test, num_threads=args.threads, latency_runs=args.runs
                    )
                print(
                    json.dumps(
                        {
                            "model": name,
                            "mode": mode,
                            "mb": round(report["bytes"] / 1e6, 2),
                            "latency_ms": round(report["latency_ms"], 2),
                            "max_abs_error": float(f"{report['max_abs_error']:.3g}"),
                            "top1_agreement": round(report["top1_agreement"], 4),
                            "xnnpack_partitions": report.get("xnnpack_partitions"),
                            "images": len(test),
                            "threads": args.threads,
                            "convert_s": round(convert_seconds, 1),
                        }
                    ),
                    flush=True,
                )


if __name__ == "__main__":
    main()
