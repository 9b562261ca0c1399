"""Latency of exported files side by side: one image, alternating rounds, medians.

    python benchmarks/file_latency.py A.tflite B.tflite model.onnx serving/vit \
        [--rounds 5] [--calls 10] [--threads 2]

Each file runs as `keras-vit predict` and `evaluate` run it
(`keras_vit.export.open_export`: LiteRT, ONNX Runtime, or TensorFlow for a
SavedModel folder), on one image (a grey one of the file's input shape).
The files take turns, round after round, so a machine whose speed drifts
moves every file alike; in each round a file gets 3 untimed calls, then
`--calls` timed ones, and its figure is the median of its rounds' medians.
One JSON line per file, after the day's GEMM rate.

`--quick` exports a tiny model as a float and an int8 LiteRT file and
times them for two short rounds (the test suite does, so the script cannot
rot); its numbers mean nothing.
"""

import argparse
import functools
import json
import os
import statistics
import tempfile

from harness import print_gemm_rate, timed


def measure(paths, rounds=5, calls=10, threads=2):
    """`[{path, kind, round_ms, latency_ms}]`: the files timed in alternating rounds."""
    import numpy as np

    from keras_vit.export import open_export

    exports = [open_export(path, num_threads=threads) for path in paths]
    images = [np.full((1, *export.image_shape), 128.0, "float32") for export in exports]
    round_ms = [[] for _ in exports]
    for _ in range(rounds):
        for index, export in enumerate(exports):
            seconds = timed(functools.partial(export, images[index]), calls, warmup=3)
            round_ms[index].append(round(1000 * seconds, 3))
    return [
        {
            "path": os.fspath(path),
            "kind": export.kind,
            "threads": threads,
            "round_ms": times,
            "latency_ms": round(statistics.median(times), 3),
        }
        for path, export, times in zip(paths, exports, round_ms)
    ]


def quick_files(folder):
    """A tiny model's float and int8 LiteRT files, written into `folder`."""
    import numpy as np

    import keras_vit

    model = keras_vit.ViT(
        patch_size=8,
        hidden_dim=32,
        num_layers=2,
        num_heads=2,
        mlp_dim=64,
        input_shape=(32, 32, 3),
        classes=10,
        classifier_activation=None,
        seed=0,
    )
    images = np.random.default_rng(0).uniform(0, 255, (8, 32, 32, 3)).astype("float32")
    paths = []
    for quantization in (None, "int8"):
        path = os.path.join(folder, f"tiny_{quantization or 'float'}.tflite")
        keras_vit.export.tflite(model, path, quantization=quantization, representative_data=images)
        paths.append(path)
    return paths


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("files", nargs="*", help=".tflite, .onnx files and SavedModel folders")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--calls", type=int, default=10, help="timed calls a round")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--quick", action="store_true")
    args = parser.parse_args(argv)
    if not args.quick and not args.files:
        parser.error("give the files to time (or --quick)")
    print_gemm_rate(size=1024 if args.quick else 4096)
    with tempfile.TemporaryDirectory() as folder:
        files = quick_files(folder) if args.quick else args.files
        rounds, calls = (2, 3) if args.quick else (args.rounds, args.calls)
        for row in measure(files, rounds, calls, args.threads):
            print(json.dumps(row), flush=True)


if __name__ == "__main__":
    main()
