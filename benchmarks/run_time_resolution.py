"""What a model of run-time resolution costs against a fixed-size model.

A ViT built with `input_shape=(None, None, 3)` resamples its position
table inside the graph for every batch; a fixed-size model has it resampled
once, at load time. This measures ViT-B/16 inference (random weights) both
ways at 224 and 384 px, on each backend asked, each backend in a fresh
process: per round, each size, the fixed model and the dynamic one, taking
turns to go first (`predict_on_batch` after warm-up, so both run their
compiled function),
medians over rounds. It also checks that both give the same numbers, and
prints the backend's fp32 GEMM rate of the day beside the times.

    python benchmarks/run_time_resolution.py [--backends tensorflow jax]
        [--rounds 5] [--batch 4] [--json out.json] [--quick]

`--quick` runs a tiny model for a few steps (the test suite does, so the
benchmark cannot rot); its numbers mean nothing.
"""

import argparse
import json
import os
import statistics
import subprocess
import sys
import time

from harness import gemm_rate

FULL = dict(variant="B/16", sizes=(224, 384), base=224, gemm=2048)
QUICK = dict(variant="tiny", sizes=(16, 24), base=16, gemm=128)
TINY = dict(patch_size=4, hidden_dim=32, num_layers=2, num_heads=2, mlp_dim=64)


def measure(config, rounds, batch):
    """Runs in the child process of one backend."""
    import keras
    import numpy as np

    import keras_vit

    def build(input_shape):
        arguments = dict(input_shape=input_shape, classes=1000, classifier_activation=None)
        if None in input_shape:
            arguments["base_image_size"] = config["base"]
        if config["variant"] == "tiny":
            return keras_vit.ViT(**TINY, **arguments)
        return keras_vit.models.BUILDERS[config["variant"]](**arguments)

    keras.utils.set_random_seed(0)
    dynamic = build((None, None, 3))
    rng = np.random.default_rng(0)
    head = dynamic.get_layer("head").kernel  # zero-initialised: logits would all agree
    head.assign(rng.normal(0, 0.02, head.shape).astype("float32"))
    fixed, images, agreement = {}, {}, {}
    for size in config["sizes"]:
        model = build((size, size, 3))
        # The same weights, the table resampled once as a checkpoint load does.
        keras_vit.weights.assign_canonical(
            model, {w.path: keras.ops.convert_to_numpy(w) for w in dynamic.weights}
        )
        fixed[size] = model
        images[size] = rng.uniform(0, 255, (batch, size, size, 3)).astype("float32")
        a = np.asarray(dynamic.predict_on_batch(images[size]))
        b = np.asarray(model.predict_on_batch(images[size]))  # also the warm-ups
        agreement[size] = float(np.abs(a - b).max())
    times = {size: {"fixed": [], "dynamic": []} for size in config["sizes"]}
    for round_ in range(rounds):
        for size in config["sizes"]:
            order = (("fixed", fixed[size]), ("dynamic", dynamic))
            for kind, model in order[:: 1 if round_ % 2 == 0 else -1]:  # who goes first alternates
                start = time.perf_counter()
                np.asarray(model.predict_on_batch(images[size]))
                times[size][kind].append(time.perf_counter() - start)
    rows = []
    for size in config["sizes"]:
        fixed_ms = 1e3 * statistics.median(times[size]["fixed"])
        dynamic_ms = 1e3 * statistics.median(times[size]["dynamic"])
        rows.append(
            {
                "size": size,
                "batch": batch,
                "fixed_ms": round(fixed_ms, 2),
                "dynamic_ms": round(dynamic_ms, 2),
                "overhead_percent": round(100 * (dynamic_ms / fixed_ms - 1), 2),
                "max_abs_difference": agreement[size],
            }
        )
    return {
        "backend": keras.backend.backend(),
        "gemm_gflops": round(
            gemm_rate(config["gemm"], backend=keras.backend.backend())["gflops"], 1
        ),
        "rows": rows,
    }


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--backends", nargs="+", default=["tensorflow", "jax"])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--batch", type=int, default=4)
    parser.add_argument("--json")
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--child", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    config = QUICK if args.quick else FULL
    if args.child:
        print(json.dumps(measure(config, args.rounds, args.batch)))
        return 0
    results = []
    for backend in args.backends:
        command = [
            sys.executable,
            os.path.abspath(__file__),
            "--child",
            backend,
            "--rounds",
            str(args.rounds),
            "--batch",
            str(args.batch),
        ]
        if args.quick:
            command.append("--quick")
        done = subprocess.run(
            command, capture_output=True, text=True, env={**os.environ, "KERAS_BACKEND": backend}
        )
        if done.returncode:
            sys.stderr.write(done.stdout + done.stderr)
            raise SystemExit(f"the {backend} child failed (exit {done.returncode})")
        results.append(json.loads(done.stdout.strip().splitlines()[-1]))
    print(
        f"ViT-{config['variant']} inference, fixed size vs run-time resolution "
        f"(table at {config['base']} px), batch {args.batch}, median of {args.rounds}"
    )
    print(
        f"{'backend':<11} {'GEMM GFLOP/s':>12} {'size':>5} {'fixed ms':>9} "
        f"{'any-size ms':>11} {'overhead':>9} {'max |diff|':>10}"
    )
    for result in results:
        for row in result["rows"]:
            print(
                f"{result['backend']:<11} {result['gemm_gflops']:>12} {row['size']:>5} "
                f"{row['fixed_ms']:>9.1f} {row['dynamic_ms']:>11.1f} "
                f"{row['overhead_percent']:>8.1f}% {row['max_abs_difference']:>10.1e}"
            )
    if args.json:
        with open(args.json, "w") as f:
            json.dump(results, f, indent=2)
    return 0


if __name__ == "__main__":
    sys.exit(main())
