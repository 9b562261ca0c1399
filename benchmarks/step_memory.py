"""A ViT-B/16 training step's peak memory and time: plain, with gradient checkpointing, with LoRA.

For each backend and case, in a fresh process: `keras_vit.ViTB16` at 224 px (`plain`;
`remat`: `remat=True`; `lora`: `enable_lora(--rank)` on the query and value, the encoder
frozen; `lora+remat`: both; `int8+lora`: QLoRA, the encoder quantized by Keras in int8
first), compiled with `--optimizer` (SGD, or AdamW as `keras-vit
finetune`), then the peak resident memory (VmHWM, reset just before) above the resident
memory before: of the first `train_on_batch` of `--batch-size` images (which also traces
and compiles and makes the optimizer's slots; TensorFlow's allocator keeps what it took
there), and of `--steps` more steps (the activations, gradients and temporaries of a
step, where the allocator hands them back); and the process's whole peak (weights,
optimizer state and step together). TensorFlow runs with and without XLA (`jit_compile`)
unless `--xla-only`. The step's time is the median. One JSON line per case, then the
day's fp32 GEMM rate.

    python benchmarks/step_memory.py [--backends tensorflow jax torch] [--batch-size 16]
        [--steps 2] [--cases plain remat] [--optimizer sgd] [--rank 8]
    python benchmarks/step_memory.py --cases plain lora --optimizer adamw --batch-size 32 \
        --backends tensorflow jax --xla-only
    python benchmarks/step_memory.py --cases lora int8+lora --optimizer adamw \
        --batch-size 32 --backends tensorflow jax --xla-only
"""

import argparse
import json
import textwrap

from harness import fresh_process, gemm_gflops, python_code

CASES = ("plain", "remat", "lora", "lora+remat", "int8+lora")

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

    case = sys.argv[1]
    jit_compile = {"auto": "auto", "1": True, "0": False}[sys.argv[2]]
    batch_size, steps = int(sys.argv[3]), int(sys.argv[4])
    optimizer, rank = sys.argv[5], int(sys.argv[6])
    parts = case.split("+")
    model = keras_vit.ViTB16(classes=10, classifier_activation=None, remat="remat" in parts)
    if "int8" in parts:  # QLoRA: the frozen encoder in Keras' int8, the head float
        model.quantize("int8", filters=keras_vit.models.lora.frozen_layer)
    if "lora" in parts:
        model.enable_lora(rank)
    model.compile(
        keras.optimizers.SGD(1e-3) if optimizer == "sgd" else keras.optimizers.AdamW(1e-4),
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
    trained = sum(int(np.prod(v.shape)) for v in model.trainable_weights)
    print(json.dumps({
        "backend": keras.backend.backend(), "case": case, "jit_compile": jit_compile,
        "optimizer": optimizer, "batch_size": batch_size, "trained_parameters": trained,
        "first_step_peak_above_mb": round(first_peak),
        "step_peak_above_mb": round(status("VmHWM") - before),
        "process_peak_mb": round(status("VmHWM")),
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
    parser.add_argument("--cases", nargs="+", choices=CASES, default=["plain", "remat"])
    parser.add_argument("--optimizer", choices=("sgd", "adamw"), default="sgd")
    parser.add_argument("--rank", type=int, default=8, help="LoRA's rank")
    parser.add_argument("--xla-only", action="store_true", help="TensorFlow with XLA only")
    args = parser.parse_args(argv)
    for backend in args.backends:
        compiled = ("1",) if args.xla_only else ("1", "0")
        for jit_compile in compiled if backend == "tensorflow" else ("auto",):
            for case in args.cases:
                arguments = (case, jit_compile, args.batch_size, args.steps, args.optimizer)
                print(run(CASE, *arguments, args.rank, backend=backend), flush=True)
    print(json.dumps({"fp32_gemm_gflops": int(gemm_gflops(1024))}))


if __name__ == "__main__":
    main()
