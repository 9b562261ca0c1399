"""Benchmark of the main job: `keras-vit train` with its defaults.

Runs the command in a fresh process per backend (start-up included), and
prints wall-clock seconds and test accuracy as JSON lines. The target of
issue 4: >= 91% test accuracy in <= 5 minutes on a 2-core CPU.

    python benchmarks/train_fashion_mnist.py [--backends tensorflow jax] [-- extra train args]
"""

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time


def run(backend, extra):
    out = tempfile.mkdtemp(prefix=f"vit_bench_{backend}_")
    try:
        start = time.perf_counter()
        subprocess.run(
            [sys.executable, "-m", "keras_vit.cli", "train", "--output-dir", out, *extra],
            env=dict(os.environ, KERAS_BACKEND=backend, TF_CPP_MIN_LOG_LEVEL="3"),
            check=True,
        )
        wall = time.perf_counter() - start
        with open(os.path.join(out, "metrics.json")) as f:
            metrics = json.load(f)
        return {"backend": backend, "wall_seconds": round(wall, 1), **metrics}
    finally:
        shutil.rmtree(out, ignore_errors=True)


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--backends", nargs="+", default=["tensorflow", "jax"])
    args, extra = parser.parse_known_args()
    extra = [a for a in extra if a != "--"]
    for backend in args.backends:
        print(json.dumps(run(backend, extra)), flush=True)


if __name__ == "__main__":
    main()
