"""Gradient checkpointing: the peak memory and time of a ViT-B/16 training step, with and without.

For each backend, in a fresh process per case: `keras_vit.ViTB16(remat=...)` at 224 px,
compiled with SGD, then the peak resident memory (VmHWM, reset just before) above the
resident memory before: of the first `train_on_batch` of `--batch-size` images (which
also traces and compiles; TensorFlow's allocator keeps what it took there), and of
`--steps` more steps (the activations, gradients and temporaries of a step, where the
allocator hands them back). TensorFlow runs with and without XLA (`jit_compile`). The
step's time is the median. One JSON line per case, then the day's fp32 GEMM rate.

    python benchmarks/remat_memory.py [--backends tensorflow jax torch] [--batch-size 16]
        [--steps 2]
"""

import argparse
import json
import textwrap

from harness import fresh_process, gemm_gflops, python_code

CASE = textwrap.dedent(
    """
    import ctypes, json, statistics, sys, time
    import numpy as np

    def status(field):
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith(field + ":"):
                    return int(line.split()[1]) / 1024

    import keras, keras_vit

    remat = sys.argv[1] == "1"
    jit_compile = {"auto": "auto", "1": True, "0": False}[sys.argv[2]]
    batch_size, steps = int(sys.argv[3]), int(sys.argv[4])
    model = keras_vit.ViTB16(classes=10, classifier_activation=None, remat=remat)
    model.compile(
        keras.optimizers.SGD(1e-3),
        keras.losses.SparseCategoricalCrossentropy(from_logits=True),
        jit_compile=jit_compile,
    )
    rng = np.random.default_rng(0)
    x = rng.uniform(0, 255, (batch_size, 224, 224, 3)).astype("float32")
    y = rng.integers(0, 10, batch_size)
    def reset_peak():
        # What earlier work freed goes back to the system, and VmHWM starts
        # again from the current resident size.
        ctypes.CDLL("libc.so.6").malloc_trim(0)
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
        return status("VmRSS")

    first = reset_peak()
    model.train_on_batch(x, y)  # traces and compiles, then steps
    first_peak = status("VmHWM") - first
    before = reset_peak()
    times = []
    for _ in range(steps):
        start = time.perf_counter()
        model.train_on_batch(x, y)
        times.append(time.perf_counter() - start)
    print(json.dumps({
        "backend": keras.backend.backend(), "remat": remat, "jit_compile": jit_compile,
        "batch_size": batch_size, "first_step_peak_above_mb": round(first_peak),
        "step_peak_above_mb": round(status("VmHWM") - before),
        "step_s": round(statistics.median(times), 2),
    }), flush=True)
    """
)


def run(code, *arguments, backend="tensorflow"):
    """The last line that `code` prints in a fresh interpreter of `backend`."""
    return fresh_process(python_code(code, *arguments), backend).stdout.strip().splitlines()[-1]


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--backends", nargs="+", default=["tensorflow", "jax", "torch"])
    parser.add_argument("--batch-size", type=int, default=16)
    parser.add_argument("--steps", type=int, default=2)
    args = parser.parse_args(argv)
    for backend in args.backends:
        for jit_compile in ("1", "0") if backend == "tensorflow" else ("auto",):
            for remat in ("0", "1"):
                print(
                    run(CASE, remat, jit_compile, args.batch_size, args.steps, backend=backend),
                    flush=True,
                )
    print(json.dumps({"fp32_gemm_gflops": int(gemm_gflops(1024))}))


if __name__ == "__main__":
    main()
