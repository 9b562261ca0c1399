"""The main job against a small CNN: `keras-vit train` with its defaults beside a Keras CNN.

Both run on the same Fashion-MNIST files, each in a fresh process, in
alternating order, for `--rounds` rounds on each backend asked. For every
run: test accuracy, wall-clock seconds from process start to exit, and the
seconds of each epoch; then, per round and as medians over the rounds, the
ViT's accuracy minus the CNN's (points) and the ViT's time over the CNN's; with
TensorFlow and another backend, the ViT's second epoch (the first compiles) on
that backend over TensorFlow's.
Round r (from 0) trains both models with seed `--seed` + r, so that the
medians sample the spread between seeds as well as the machine's (one seed's
accuracy moves by a few tenths of a point between seeds; `--fixed-seed`
keeps `--seed` for every round, to time the same runs again).
The day's fp32 GEMM rate (4096^3, TensorFlow) is measured first, since these
machines' speed moves about 2x between days. Prints a table and, with
`--json PATH`, writes everything.

    python benchmarks/main_job_vs_cnn.py --rounds 3                 # about 35 minutes here
    python benchmarks/main_job_vs_cnn.py --backends tensorflow jax --rounds 1
    python benchmarks/main_job_vs_cnn.py --backends tensorflow jax --cnn-backends tensorflow
    python benchmarks/main_job_vs_cnn.py --quick                    # does it run? (the suite)

The CNN is the one the main job has to beat, defined here and not in the
package: 3 x [Conv2D 3x3 (no bias) - BatchNormalization - ReLU - MaxPooling
2x2] with 32 / 64 / 128 filters, Flatten, Dropout 0.3, Dense 128 ReLU,
Dense 10 (logits); 242,218 parameters; AdamW 2e-3, weight decay 1e-4, cosine
decay over 9 epochs, batch 128; random horizontal flip and 2-pixel
pad-and-random-crop; pixels / 255; tf.data with autotune off and prefetch(2).
`--quick` runs both for one epoch on 1,024 training and 512 test images.
"""

import argparse
import json
import os
import re
import shutil
import statistics
import sys
import tempfile
import time

from harness import fresh_process, gemm_gflops

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CNN_EPOCHS = 9


def build_cnn():
    import keras

    inputs = keras.Input((28, 28, 1), name="images")
    x = keras.layers.Rescaling(1 / 255)(inputs)
    for filters in (32, 64, 128):
        x = keras.layers.Conv2D(filters, 3, padding="same", use_bias=False)(x)
        x = keras.layers.BatchNormalization()(x)
        x = keras.layers.ReLU()(x)
        x = keras.layers.MaxPooling2D(2)(x)
    x = keras.layers.Flatten()(x)
    x = keras.layers.Dropout(0.3)(x)
    x = keras.layers.Dense(128, activation="relu")(x)
    outputs = keras.layers.Dense(10, name="logits")(x)
    return keras.Model(inputs, outputs, name="small_cnn")


def fashion_mnist(quick):
    from keras_vit.data import load_fashion_mnist

    train, test = load_fashion_mnist("train"), load_fashion_mnist("test")
    if quick:
        train, test = (train[0][:1024], train[1][:1024]), (test[0][:512], test[1][:512])
    return train, test


def train_cnn(quick, seed=0, save=None):
    """The CNN's run, inside its own process; returns accuracy and epoch times.

    With `save`, the trained CNN is written there (a `.keras` file).
    """
    import keras
    import tensorflow as tf

    keras.utils.set_random_seed(seed)
    (train_images, train_labels), (test_images, test_labels) = fashion_mnist(quick)
    epochs = 1 if quick else CNN_EPOCHS
    batch = 128
    steps = epochs * (len(train_images) // batch)
    options = tf.data.Options()
    options.autotune.enabled = False

    def augment(images, labels):
        images = tf.image.random_flip_left_right(images, seed=seed)
        padded = tf.pad(images, [[0, 0], [2, 2], [2, 2], [0, 0]])
        return tf.image.random_crop(padded, tf.shape(images), seed=seed), labels

    train = (
        tf.data.Dataset.from_tensor_slices((train_images.astype("float32"), train_labels))
        .shuffle(len(train_images), seed=seed)
        .batch(batch, drop_remainder=True)
        .map(augment)
        .with_options(options)
        .prefetch(2)
    )
    test = (
        tf.data.Dataset.from_tensor_slices((test_images.astype("float32"), test_labels))
        .batch(512)
        .with_options(options)
        .prefetch(2)
    )
    model = build_cnn()
    model.compile(
        optimizer=keras.optimizers.AdamW(
            keras.optimizers.schedules.CosineDecay(2e-3, steps), weight_decay=1e-4
        ),
        loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
        metrics=["accuracy"],
    )
    times = []

    class EpochTimes(keras.callbacks.Callback):
        def on_epoch_begin(self, epoch, logs=None):
            self.start = time.perf_counter()

        def on_epoch_end(self, epoch, logs=None):
            times.append(round(time.perf_counter() - self.start, 2))

    model.fit(train, epochs=epochs, callbacks=[EpochTimes()], verbose=2)
    _, accuracy = model.evaluate(test, verbose=0)
    if save:
        model.save(save)
    return {
        "test_accuracy": float(accuracy),
        "epoch_seconds": times,
        "parameters": model.count_params(),
        "seed": seed,
    }


def write_folder(root, quick):
    """The quick mode's data as an image folder, so `keras-vit train` reads the same images."""
    import numpy as np
    from PIL import Image

    (train_images, train_labels), (test_images, test_labels) = fashion_mnist(quick)
    for split, images, labels in (
        ("train", train_images, train_labels),
        ("test", test_images, test_labels),
    ):
        for index, (image, label) in enumerate(zip(images, labels)):
            folder = os.path.join(root, split, f"class_{int(label)}")
            os.makedirs(folder, exist_ok=True)
            Image.fromarray(np.asarray(image)[..., 0]).save(os.path.join(folder, f"{index}.png"))
    return root


def run_cnn(backend, quick, seed, save=None):
    command = [sys.executable, os.path.abspath(__file__), "--child-cnn", "--seed", str(seed)]
    command += ["--save", save] if save else []
    stdout, wall = fresh_process(command + (["--quick"] if quick else []), backend)
    return {
        "model": "cnn",
        "backend": backend,
        "wall_seconds": wall,
        **json.loads(stdout.strip().splitlines()[-1]),
    }


def run_vit(backend, quick, folder, seed):
    output = tempfile.mkdtemp(prefix="keras_vit_main_job_")
    try:
        command = [
            sys.executable,
            "-m",
            "keras_vit_launcher",
            "train",
            "--output-dir",
            output,
            "--seed",
            str(seed),
        ]
        if quick:
            command += ["--dataset", folder, "--epochs", "1", "--image-size", "28"]
        stdout, wall = fresh_process(command, backend)
        with open(os.path.join(output, "metrics.json")) as f:
            metrics = json.load(f)
        with open(os.path.join(output, "run.json")) as f:
            settings = json.load(f)  # the run's own record of its settings
    finally:
        shutil.rmtree(output, ignore_errors=True)
    epochs = [int(s) for s in re.findall(r"^\d+/\d+ - (\d+)s - ", stdout, re.MULTILINE)]
    return {
        "model": "vit",
        "backend": backend,
        "seed": settings["seed"],
        "wall_seconds": wall,
        "test_accuracy": metrics["test_accuracy"],
        "epoch_seconds": epochs,
        "parameters": metrics["parameters"],
    }


def summarise(rounds):
    """Per backend: each round's ratios and their medians.

    A round without a CNN run (a backend left out of `--cnn-backends`) counts
    for the ViT's own medians and the comparison with TensorFlow only.
    """

    def median_of(runs, model, key):
        return statistics.median(r[model][key] for r in runs)

    summary = {}
    for backend in sorted({r["vit"]["backend"] for r in rounds}):
        own = [r for r in rounds if r["vit"]["backend"] == backend]
        paired = [r for r in own if "cnn" in r]
        points = [100 * (r["vit"]["test_accuracy"] - r["cnn"]["test_accuracy"]) for r in paired]
        ratios = [r["vit"]["wall_seconds"] / r["cnn"]["wall_seconds"] for r in paired]
        summary[backend] = {
            "median_vit_accuracy": median_of(own, "vit", "test_accuracy"),
            "median_vit_seconds": round(median_of(own, "vit", "wall_seconds"), 1),
            "median_vit_second_epoch_seconds": median_second_epoch(own),
        }
        if paired:
            summary[backend].update(
                {
                    "accuracy_points_vit_minus_cnn": [round(p, 2) for p in points],
                    "time_ratio_vit_over_cnn": [round(t, 3) for t in ratios],
                    "median_accuracy_points": round(statistics.median(points), 2),
                    "median_time_ratio": round(statistics.median(ratios), 3),
                    "median_cnn_accuracy": median_of(paired, "cnn", "test_accuracy"),
                    "median_cnn_seconds": round(median_of(paired, "cnn", "wall_seconds"), 1),
                }
            )
    tensorflow = summary.get("tensorflow", {})
    for backend, row in summary.items():
        epoch = row["median_vit_second_epoch_seconds"]
        if backend == "tensorflow" or not tensorflow:
            continue
        row["vit_accuracy_points_minus_tensorflow"] = round(
            100 * (row["median_vit_accuracy"] - tensorflow["median_vit_accuracy"]), 2
        )
        if epoch and tensorflow["median_vit_second_epoch_seconds"]:
            row["vit_second_epoch_over_tensorflow"] = round(
                epoch / tensorflow["median_vit_second_epoch_seconds"], 3
            )
    return summary


def median_second_epoch(runs):
    """The median of the rounds' ViT second epochs (the first compiles), or `None`."""
    seconds = [r["vit"]["epoch_seconds"][1] for r in runs if len(r["vit"]["epoch_seconds"]) > 1]
    return statistics.median(seconds) if seconds else None


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--backends", nargs="+", default=["tensorflow"], choices=("tensorflow", "jax", "torch")
    )
    parser.add_argument(
        "--cnn-backends",
        nargs="*",
        default=None,
        choices=("tensorflow", "jax", "torch"),
        help="the backends the CNN runs on too (default: all of --backends); "
        "e.g. the ViT on JAX against TensorFlow's without JAX's slow CNN",
    )
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--quick", action="store_true", help="1 epoch on 1,024 images")
    parser.add_argument("--json", default=None, help="write the results here")
    parser.add_argument(
        "--seed",
        type=int,
        default=0,
        help="round r trains both models with seed SEED + r (default: 0)",
    )
    parser.add_argument(
        "--fixed-seed",
        action="store_true",
        help="every round with seed SEED: the same runs timed again",
    )
    parser.add_argument("--child-cnn", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--save", default=None, help=argparse.SUPPRESS)
    args = parser.parse_args()
    cnn_backends = args.backends if args.cnn_backends is None else args.cnn_backends
    if not set(cnn_backends) <= set(args.backends):
        parser.error(
            f"--cnn-backends must be among --backends {args.backends}. Received: {cnn_backends}"
        )
    if args.child_cnn:
        print(json.dumps(train_cnn(args.quick, args.seed, args.save)))
        return

    with tempfile.TemporaryDirectory(prefix="keras_vit_main_job_data_") as directory:
        folder = write_folder(directory, True) if args.quick else None
        # --quick checks that the benchmark runs: a GEMM of seconds on both
        # cores would only slow what runs beside it.
        gemm_size = 1024 if args.quick else 4096
        results = {"gemm_fp32_gflops": gemm_gflops(gemm_size), "quick": args.quick, "rounds": []}
        print(
            f"GEMM {gemm_size}^3 fp32 (TensorFlow): {results['gemm_fp32_gflops']} GFLOP/s",
            flush=True,
        )
        for index in range(args.rounds):
            seed = args.seed if args.fixed_seed else args.seed + index
            for backend in args.backends:
                # Alternate which goes first, so neither always meets a warmer machine.
                order = ("cnn", "vit") if index % 2 == 0 else ("vit", "cnn")
                if backend not in cnn_backends:
                    order = ("vit",)
                runs = {}
                for model in order:
                    runs[model] = (
                        run_cnn(backend, args.quick, seed)
                        if model == "cnn"
                        else run_vit(backend, args.quick, folder, seed)
                    )
                    run = runs[model]
                    print(
                        f"round {index + 1} {backend} {model} seed {seed}: accuracy "
                        f"{run['test_accuracy']:.4f}, {run['wall_seconds']} s, epochs "
                        f"{run['epoch_seconds']}",
                        flush=True,
                    )
                results["rounds"].append(runs)
    results["summary"] = summarise(results["rounds"])
    print(
        "\n| backend | ViT accuracy | CNN accuracy | ViT - CNN (points) | ViT s | CNN s "
        "| ViT / CNN time |"
    )
    print("|---|---|---|---|---|---|---|")
    for backend, row in results["summary"].items():
        if "median_cnn_accuracy" in row:
            cnn = (
                f"{row['median_cnn_accuracy']:.2%} | {row['median_accuracy_points']:+.2f} | "
                f"{row['median_vit_seconds']} | {row['median_cnn_seconds']} | "
                f"{row['median_time_ratio']:.2f}x"
            )
        else:
            cnn = f"- | - | {row['median_vit_seconds']} | - | -"
        print(f"| {backend} | {row['median_vit_accuracy']:.2%} | {cnn} |")
    for backend, row in results["summary"].items():
        if "vit_accuracy_points_minus_tensorflow" in row:
            epochs = (
                f"second epoch {row['vit_second_epoch_over_tensorflow']:.2f}x, "
                if "vit_second_epoch_over_tensorflow" in row
                else ""
            )
            print(
                f"ViT on {backend} against tensorflow: {epochs}accuracy "
                f"{row['vit_accuracy_points_minus_tensorflow']:+.2f} points"
            )
    print(f"(medians of {args.rounds} round(s); GEMM {results['gemm_fp32_gflops']} GFLOP/s)")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(results, f, indent=2)


if __name__ == "__main__":
    main()
