"""Throughput of keras_vit and its peers, side by side, against the GEMM limit.

One command measures, in the same run on the same machine (each
measurement in a fresh process, so backends and peak memory do not mix):

- the limit: a large square matrix multiplication (fp32, bf16) per framework;
- ViT-B/16 inference (224 px, batch 16) and ViT-S/16 training steps (224 px,
  batch 32, AdamW) of keras_vit on each backend (training also with half
  the patch tokens dropped, `patch_dropout_rate=0.5`), keras-hub's
  `ViTImageClassifier` (same configuration, random weights) on TensorFlow
  and JAX, and Hugging Face `ViTForImageClassification` on PyTorch;
- ViT-B/16 inference under `mixed_bfloat16` (keras_vit, keras-hub);
- peak resident memory of a ViT-B/16 training step at batch 32 (optional,
  `--memory`: one process per library);
- the main job's small model on Fashion-MNIST: training steps/s including
  its tf.data pipeline.

With `--gpu` it measures the accelerator instead: the bf16 GEMM limit and
ViT-B/16 training steps under `mixed_bfloat16` (224 px, batch 256, AdamW,
XLA on JAX; PyTorch autocast for Hugging Face), reported as images/s, % of
the measured bf16 GEMM rate and model FLOPs utilisation (MFU: % of the
GPU's datasheet dense bf16 peak); on JAX keras_vit's row says whether
attention compiled to cuDNN's fused kernel.

Images/s become GFLOP/s through the analytic count of
`keras_vit.models.flop_count` (2 FLOPs a multiply-add, training = 3x
forward), the same count for every library. It prints a table with
keras_vit / peer ratios and % of the fp32 GEMM rate of the same framework,
and writes it as JSON with `--json`. Peers that are not installed are
skipped with a note (keras-hub: `pip install --no-deps keras-hub==0.32.0`;
its ViT needs none of its tokenizer dependencies).

    python benchmarks/throughput.py [--backends tensorflow jax torch] [--memory]
        [--gpu] [--rounds N] [--json results.json] [--quick [--in-process]]

`--quick` runs every measurement on a tiny model for a few steps (the test
suite does, `--in-process`, so the benchmark cannot rot); its numbers mean
nothing.
"""

import argparse
import functools
import json
import os
import statistics
import subprocess
import sys
import time

from harness import (
    device_name,
    gemm_rate,
    pipelined,
    synchronize_torch,
    timed,
    torch_device,
)

FULL = {
    "gemm_size": 4096,
    "gemm_dtypes": ("float32", "bfloat16"),
    "inference": dict(variant="B/16", image_size=224, batch=16, steps=5),
    "training": dict(variant="S/16", image_size=224, batch=32, steps=4),
    "memory": dict(variant="B/16", image_size=224, batch=32, steps=2),
    "main_job_steps": 60,
}
QUICK = {
    "gemm_size": 128,
    "gemm_dtypes": ("float32", "bfloat16"),
    "inference": dict(variant="tiny", image_size=32, batch=4, steps=2),
    "training": dict(variant="tiny", image_size=32, batch=4, steps=2),
    "memory": dict(variant="tiny", image_size=32, batch=4, steps=1),
    "main_job_steps": 3,
}
# `--gpu`: large batches fill the chip; only training, in bf16.
GPU = {
    "gemm_size": 8192,
    "gemm_dtypes": ("bfloat16",),
    "training": dict(
        variant="B/16", image_size=224, batch=256, steps=20, precision="mixed_bfloat16"
    ),
}
GPU_QUICK = {
    "gemm_size": 128,
    "gemm_dtypes": ("bfloat16",),
    "training": dict(variant="tiny", image_size=32, batch=4, steps=2, precision="mixed_bfloat16"),
}
# Dense bf16 peaks from the vendors' datasheets (FLOP/s), by device name.
BF16_PEAKS = {"H100": 989.4e12, "H200": 989.4e12, "A100": 312e12, "L4": 121e12}
TINY = {"patch_size": 8, "hidden_dim": 32, "num_layers": 2, "num_heads": 2, "mlp_dim": 64}
CLASSES = 1000


def architecture(variant):
    from keras_vit.models import decode_variant

    return dict(TINY) if variant == "tiny" else decode_variant(variant)


# --- workers: each runs in its own process under one backend ---------------


def bf16_peak(device):
    """The datasheet dense bf16 FLOP/s of a device named `device`; `None` if unknown."""
    return next((peak for name, peak in BF16_PEAKS.items() if name in device), None)


def jax_attention_is_fused(hidden_dim, num_heads, tokens):
    """Whether keras_vit's attention, forward and backward, compiles to cuDNN's fused kernel.

    Compiles one `MultiHeadSelfAttention` layer of the model's width and
    token count under `mixed_bfloat16`, its gradient included, and looks
    for cuDNN's fused-attention custom calls in the optimised HLO.
    """
    import jax
    import keras

    from keras_vit.layers import MultiHeadSelfAttention

    layer = MultiHeadSelfAttention(num_heads, dtype="mixed_bfloat16")
    x = keras.ops.ones((2, tokens, hidden_dim), "bfloat16")
    layer.build(x.shape)

    def loss(weights, x):
        # Through `__call__` (not `stateless_call`), which casts the float32
        # weights to bf16 as in a model.
        mapping = list(zip(layer.trainable_variables, weights))
        with keras.StatelessScope(state_mapping=mapping):
            outputs = layer(x)
        return keras.ops.sum(keras.ops.cast(outputs, "float32"))

    weights = [v.value for v in layer.trainable_variables]
    hlo = jax.jit(jax.grad(loss)).lower(weights, x).compile().as_text()
    return "__cudnn$fmha" in hlo


def keras_model(library, variant, image_size, patch_dropout_rate=0.0):
    import keras

    arch = architecture(variant)
    shape = (image_size, image_size, 3)
    if library == "keras_vit":
        import keras_vit

        return keras_vit.ViT(
            **arch,
            input_shape=shape,
            classes=CLASSES,
            classifier_activation=None,
            include_rescaling=False,
            patch_dropout_rate=patch_dropout_rate,
        )
    import keras_hub

    backbone = keras_hub.models.ViTBackbone(
        image_shape=shape,
        patch_size=arch["patch_size"],
        num_layers=arch["num_layers"],
        num_heads=arch["num_heads"],
        hidden_dim=arch["hidden_dim"],
        mlp_dim=arch["mlp_dim"],
    )
    model = keras_hub.models.ViTImageClassifier(backbone, num_classes=CLASSES)
    assert isinstance(model, keras.Model)
    return model


def hf_model(variant, image_size):
    import torch
    from transformers import ViTConfig, ViTForImageClassification

    arch = architecture(variant)
    config = ViTConfig(
        image_size=image_size,
        patch_size=arch["patch_size"],
        hidden_size=arch["hidden_dim"],
        num_hidden_layers=arch["num_layers"],
        num_attention_heads=arch["num_heads"],
        intermediate_size=arch["mlp_dim"],
        num_labels=CLASSES,
    )
    torch.manual_seed(0)
    return ViTForImageClassification(config)


def inputs(batch, image_size, channels_first=False):
    import numpy as np

    rng = np.random.default_rng(0)
    shape = (
        (batch, 3, image_size, image_size) if channels_first else (batch, image_size, image_size, 3)
    )
    return rng.uniform(-1, 1, shape).astype("float32"), rng.integers(0, CLASSES, batch)


def inference(library, variant, image_size, batch, steps, precision="float32", jit_compile="auto"):
    """Images/s of forward passes."""
    if library == "huggingface":
        import torch

        model = hf_model(variant, image_size).eval()
        x = torch.tensor(inputs(batch, image_size, channels_first=True)[0])

        def step():
            with torch.no_grad():
                model(pixel_values=x)
    else:
        import keras

        keras.config.set_dtype_policy(precision)
        model = keras_model(library, variant, image_size)
        model.compile(jit_compile=jit_compile)
        x = inputs(batch, image_size)[0]
        step = lambda: model.predict_on_batch(x)  # noqa: E731
    seconds = timed(step, steps)
    return {"images_per_second": batch / seconds}


def training(
    library,
    variant,
    image_size,
    batch,
    steps,
    jit_compile="auto",
    precision="float32",
    patch_dropout_rate=0.0,
):
    """Images/s of AdamW training steps, and the process's peak memory.

    On a GPU the batch is placed on it once, so that the steps measure the
    device rather than host-to-device copies, and the steps queue up as in
    real training (Keras: `model.fit`; PyTorch: no synchronisation between
    steps) instead of waiting for each other; `precision="mixed_bfloat16"`
    is Keras' dtype policy, or autocast to bf16 for Hugging Face.
    With `patch_dropout_rate` (keras_vit), training drops that share of
    the patch tokens (`PatchDropout`).
    """
    import contextlib
    import resource

    import keras

    backend = "torch" if library == "huggingface" else keras.backend.backend()
    gpu = device_name(backend)
    extra = {}
    if library == "huggingface":
        import torch

        device = torch_device()
        model = hf_model(variant, image_size).to(device).train()
        optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4, weight_decay=0.1)
        x, y = inputs(batch, image_size, channels_first=True)
        x, y = torch.tensor(x, device=device), torch.tensor(y, device=device)
        autocast = (
            (lambda: torch.autocast(device, dtype=torch.bfloat16))
            if precision == "mixed_bfloat16"
            else contextlib.nullcontext
        )

        def step():
            optimizer.zero_grad()
            with autocast():
                loss = model(pixel_values=x, labels=y).loss
            loss.backward()
            optimizer.step()

        seconds = (
            pipelined(step, steps, finish=synchronize_torch)
            if gpu
            else timed(step, steps, warmup=1)
        )
    else:
        keras.config.set_dtype_policy(precision)
        model = keras_model(library, variant, image_size, patch_dropout_rate)
        model.compile(
            optimizer=keras.optimizers.AdamW(1e-4, weight_decay=0.1),
            loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
            jit_compile=jit_compile,
        )
        x, y = inputs(batch, image_size)
        if library == "keras_vit" and backend == "jax" and gpu:
            arch = architecture(variant)
            tokens = (image_size // arch["patch_size"]) ** 2 + 1
            extra["fused_attention"] = jax_attention_is_fused(
                arch["hidden_dim"], arch["num_heads"], tokens
            )
        if gpu:
            seconds = fit_seconds_per_step(
                model, keras.ops.convert_to_tensor(x), keras.ops.convert_to_tensor(y), steps
            )
        else:
            seconds = timed(lambda: model.train_on_batch(x, y), steps, warmup=1)
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # KiB -> MiB
    if gpu:
        extra["gpu_peak_memory_mb"] = gpu_peak_memory(backend) / 2**20
    return {"images_per_second": batch / seconds, "peak_memory_mb": peak, **gpu, **extra}


def fit_seconds_per_step(model, x, y, steps, warmup=3):
    """Seconds per step of `model.fit` over one batch held on the device.

    A first `fit` compiles; the timed one runs `steps` steps that Keras
    dispatches without waiting for each other, and returns once the last
    one's loss is known.
    """
    import keras

    def batches():
        while True:
            yield x, y

    # Keras' own `fit`: keras-hub's task overrides it to preprocess through
    # tf.data or grain (neither needed here: there is no preprocessor).
    fit = functools.partial(keras.Model.fit, model, batches(), epochs=1, verbose=0)
    fit(steps_per_epoch=warmup)
    start = time.perf_counter()
    fit(steps_per_epoch=steps)
    return (time.perf_counter() - start) / steps


def gpu_peak_memory(backend):
    """Bytes of GPU memory the process's allocator held at its peak."""
    if backend == "jax":
        import jax

        return jax.devices()[0].memory_stats()["peak_bytes_in_use"]
    if backend == "torch":
        import torch

        return torch.cuda.max_memory_allocated()
    import tensorflow as tf

    return tf.config.experimental.get_memory_info("GPU:0")["peak"]


def main_job(steps):
    """Training steps/s of `keras-vit train`'s model, its pipeline included."""
    import keras

    import keras_vit
    from keras_vit import data as vit_data
    from keras_vit.training import get_recipe, model_arguments

    data = vit_data.load(
        "fashion_mnist",
        "train",
        training=True,
        crop_scale=None,
        image_size=28,
        channels=1,
        batch_size=128,
    )
    model = keras_vit.ViT(
        **model_arguments("small"),
        input_shape=(28, 28, 1),
        classes=10,
        classifier_activation=None,
    )
    get_recipe("small").compile(model, total_steps=10 * steps)
    times = []

    class Clock(keras.callbacks.Callback):
        def on_train_batch_begin(self, batch, logs=None):
            self.start = time.perf_counter()

        def on_train_batch_end(self, batch, logs=None):
            times.append(time.perf_counter() - self.start)

    warmup = 5
    wall = time.perf_counter()
    model.fit(data.data.take(steps + warmup), epochs=1, verbose=0, callbacks=[Clock()])
    wall = time.perf_counter() - wall
    steady = sorted(times[warmup:])
    return {
        "steps_per_second": 1 / steady[len(steady) // 2],
        "batch": 128,
        "fit_seconds_with_compile": wall,
    }


WORKERS = {"gemm": gemm_rate, "inference": inference, "training": training, "main_job": main_job}


def measure(task):
    """Runs one measurement: a task dict as `plan` makes them."""
    task = dict(task)
    name, backend = task.pop("task"), task.pop("backend")
    if name == "gemm":  # the others run on KERAS_BACKEND's framework
        task["backend"] = backend
    import keras

    # Workers set Keras' global dtype policy; `--in-process` shares it.
    policy = keras.config.dtype_policy()
    try:
        return WORKERS[name](**task)
    finally:
        keras.config.set_dtype_policy(policy)


# --- the orchestrator -------------------------------------------------------


def installed(module):
    import importlib.util

    return importlib.util.find_spec(module) is not None


def run(backend, task, timeout, in_process=False):
    """A measurement in a fresh process (or this one); `None` and a note on failure."""
    if in_process:
        try:
            return measure({**task, "backend": backend}), None
        except Exception as error:  # a peer's failure is a note, not the end
            return None, f"{type(error).__name__}: {str(error)[:300]}"
    env = dict(os.environ, KERAS_BACKEND=backend, TF_CPP_MIN_LOG_LEVEL="3")
    if backend == "jax":
        env.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")
    try:
        done = subprocess.run(
            [sys.executable, __file__, "--worker", json.dumps({**task, "backend": backend})],
            env=env,
            capture_output=True,
            text=True,
            timeout=timeout,
        )
    except subprocess.TimeoutExpired:
        return None, f"timed out after {timeout} s"
    if done.returncode:
        return None, done.stderr.strip().splitlines()[-1] if done.stderr.strip() else "failed"
    return json.loads(done.stdout.strip().splitlines()[-1]), None


def plan(backends, settings, memory):
    """The measurements: `(row name, library, backend, task)`."""
    rows = []
    for backend in backends:
        for dtype in settings["gemm_dtypes"]:
            rows.append(
                (
                    f"GEMM {settings['gemm_size']}^3 {dtype}",
                    "framework",
                    backend,
                    {
                        "task": "gemm",
                        "backend": backend,
                        "size": settings["gemm_size"],
                        "dtype": dtype,
                    },
                )
            )
    peers = {"tensorflow": ["keras_hub"], "jax": ["keras_hub"], "torch": ["huggingface"]}
    training_config = settings["training"]
    if "inference" not in settings:  # --gpu: bf16 training only
        for backend in backends:
            for library in ["keras_vit", *peers[backend]]:
                rows.append(
                    (
                        f"training {training_config['variant']} bf16",
                        library,
                        backend,
                        {"task": "training", "library": library, **training_config},
                    )
                )
        return rows
    inference_config = settings["inference"]
    for backend in backends:
        for library in ["keras_vit", *peers[backend]]:
            rows.append(
                (
                    f"inference {inference_config['variant']} fp32",
                    library,
                    backend,
                    {"task": "inference", "library": library, **inference_config},
                )
            )
            if backend == "tensorflow":
                rows.append(
                    (
                        f"inference {inference_config['variant']} fp32 XLA",
                        library,
                        backend,
                        {
                            "task": "inference",
                            "library": library,
                            "jit_compile": True,
                            **inference_config,
                        },
                    )
                )
            if library != "huggingface" and backend != "torch":
                rows.append(
                    (
                        f"inference {inference_config['variant']} bf16",
                        library,
                        backend,
                        {
                            "task": "inference",
                            "library": library,
                            "precision": "mixed_bfloat16",
                            **inference_config,
                        },
                    )
                )
            rows.append(
                (
                    f"training {training_config['variant']} fp32",
                    library,
                    backend,
                    {"task": "training", "library": library, **training_config},
                )
            )
            if (
                backend == "tensorflow"
            ):  # Keras leaves XLA off on CPUs; keras_vit's recipes turn it on
                rows.append(
                    (
                        f"training {training_config['variant']} fp32 XLA",
                        library,
                        backend,
                        {
                            "task": "training",
                            "library": library,
                            "jit_compile": True,
                            **training_config,
                        },
                    )
                )
            if library == "keras_vit":  # half the patch tokens in training: cheaper steps
                rows.append(
                    (
                        f"training {training_config['variant']} fp32 patch dropout 0.5",
                        library,
                        backend,
                        {
                            "task": "training",
                            "library": library,
                            "patch_dropout_rate": 0.5,
                            **training_config,
                        },
                    )
                )
            if memory:
                rows.append(
                    (
                        f"memory {settings['memory']['variant']} training",
                        library,
                        backend,
                        {"task": "training", "library": library, **settings["memory"]},
                    )
                )
        rows.append(
            (
                "main job (small, Fashion-MNIST)",
                "keras_vit",
                backend,
                {"task": "main_job", "steps": settings["main_job_steps"]},
            )
        )
    return rows


def available(library):
    module = {
        "keras_vit": "keras_vit",
        "keras_hub": "keras_hub",
        "huggingface": "transformers",
        "framework": None,
    }[library]
    return module is None or installed(module)


def median_measurement(measurements):
    """Each value's median over the rounds that succeeded (`rounds` counts them).

    Peak memory takes the largest instead: it is a peak.
    """
    done = [m for m in measurements if m]
    if not done:
        return {}
    row = {"rounds": len(done)}
    for key in done[0]:
        values = [m[key] for m in done]
        if isinstance(values[0], (str, bool)):  # the device's name, the attention path
            row[key] = values[0]
        else:
            row[key] = max(values) if key.endswith("peak_memory_mb") else statistics.median(values)
    if len(done) > 1 and "images_per_second" in done[0]:
        row["images_per_second_rounds"] = [m["images_per_second"] for m in done]
    return row


def flops_per_image(task):
    from keras_vit.models import flop_count

    return flop_count(
        architecture(task["variant"]),
        task["image_size"],
        CLASSES,
        training=task["task"] == "training",
        patch_dropout_rate=task.get("patch_dropout_rate", 0.0),
    )


def _parser():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--backends", nargs="+", default=["tensorflow", "jax", "torch"])
    parser.add_argument(
        "--memory",
        action="store_true",
        help="also the peak memory of a ViT-B/16 training step at batch 32",
    )
    parser.add_argument(
        "--gpu",
        action="store_true",
        help="measure the GPU: bf16 GEMM and ViT-B/16 bf16 training at batch 256",
    )
    parser.add_argument("--json", default=None, help="write the results here")
    parser.add_argument("--quick", action="store_true", help="tiny model, few steps")
    parser.add_argument("--timeout", type=int, default=1200, help="seconds per measurement")
    parser.add_argument(
        "--in-process",
        action="store_true",
        help="run every measurement in this process (one backend: "
        "KERAS_BACKEND's; no per-library peak memory)",
    )
    parser.add_argument(
        "--only",
        nargs="+",
        default=None,
        metavar="MEASUREMENT",
        help="run only these measurements (names as in the table's first "
        "column; the GEMM rows always run)",
    )
    parser.add_argument(
        "--rounds",
        type=int,
        default=1,
        help="measure everything this many times, in turn, and report "
        "each row's median (keras_vit and its peer alternate)",
    )
    parser.add_argument("--worker", default=None, help=argparse.SUPPRESS)
    return parser


def main(argv=None):
    parser = _parser()
    args = parser.parse_args(argv)
    if args.worker is not None:
        print(json.dumps(measure(json.loads(args.worker))))
        return 0
    if args.in_process:
        import keras

        if args.backends != [keras.backend.backend()] or args.memory:
            parser.error(
                "--in-process measures KERAS_BACKEND's backend only "
                f"(--backends {keras.backend.backend()}), without --memory"
            )
    if args.rounds < 1:
        parser.error(f"--rounds must be at least 1. Received: --rounds {args.rounds}")
    for backend in args.backends:
        if backend not in ("tensorflow", "jax", "torch"):
            parser.error(f"--backends: unknown backend {backend!r}")
    backends = [b for b in args.backends if installed(b)]
    if backends and not args.in_process:
        # This process imports keras_vit only for the FLOP count; Keras'
        # default backend (TensorFlow) may not be installed (a GPU machine).
        os.environ.setdefault("KERAS_BACKEND", backends[0])
    notes = [f"backend {b} is not installed: skipped" for b in args.backends if b not in backends]
    if args.gpu:
        settings = GPU_QUICK if args.quick else GPU
    else:
        settings = QUICK if args.quick else FULL
    selected = select(plan(backends, settings, args.memory), args.only, notes)
    samples = measure_rounds(selected, args.rounds, args.timeout, args.in_process, notes)
    results = summarise(samples)
    print_table(results, notes)
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"settings": settings, "results": results, "notes": notes}, f, indent=2)
    return 0


def select(planned, only, notes):
    """The planned measurements that `--only` keeps and whose library is installed."""
    selected = []
    for name, library, backend, task in planned:
        if only and name not in only and task["task"] != "gemm":
            continue
        if not available(library):
            note = f"{library} is not installed: {name} on {backend} skipped"
            if note not in notes:
                notes.append(note)
            continue
        selected.append((name, library, backend, task))
    return selected


def measure_rounds(selected, rounds, timeout, in_process, notes):
    """`{(name, library, backend): (task, measurements, failures)}` over `rounds` rounds.

    Rounds go through every measurement in turn, so that keras_vit and its
    peer alternate and the machine's drift falls on both; each is printed.
    """
    samples = {}
    for round_index in range(rounds):
        for name, library, backend, task in selected:
            measured, failure = run(backend, task, timeout, in_process)
            sample = samples.setdefault((name, library, backend), (task, [], []))
            sample[1].append(measured)
            if failure:
                sample[2].append(failure)
                notes.append(f"{library} {name} on {backend} failed: {failure}")
            print(
                json.dumps(
                    {
                        "round": round_index + 1,
                        "measurement": name,
                        "library": library,
                        "backend": backend,
                        **(measured or {"error": failure}),
                    }
                ),
                flush=True,
            )
    return samples


def summarise(samples):
    """The table's rows: each measurement's median, its GFLOP/s against the GEMM rates."""
    results, gemm_rates = [], {}
    for (name, library, backend), (task, measurements, failures) in samples.items():
        row = {
            "measurement": name,
            "library": library,
            "backend": backend,
            **median_measurement(measurements),
        }
        if "rounds" not in row:  # failed in every round
            row["error"] = failures[-1]
        elif task["task"] == "gemm":
            gemm_rates[(backend, task["dtype"])] = row["gflops"]
        elif "images_per_second" in row:
            row["gflops"] = row["images_per_second"] * flops_per_image(task) / 1e9
        results.append(row)
    for row in results:
        _compare(row, results, gemm_rates)
    return results


def _compare(row, results, gemm_rates):
    """Adds a row's shares of the GEMM rates and of the peak, and keras_vit's ratio to it."""
    limit = gemm_rates.get((row["backend"], "float32"))
    if "gflops" in row and limit and row["library"] != "framework":
        row["percent_of_fp32_gemm"] = 100 * row["gflops"] / limit
    bf16_limit = gemm_rates.get((row["backend"], "bfloat16"))
    if "gflops" in row and bf16_limit and row["library"] != "framework" and "device" in row:
        row["percent_of_bf16_gemm"] = 100 * row["gflops"] / bf16_limit
    peak = bf16_peak(row.get("device", ""))
    if "gflops" in row and peak:
        row["mfu_percent"] = 100 * row["gflops"] * 1e9 / peak
    if row["library"] not in ("keras_vit", "framework") and "images_per_second" in row:
        ours = next(
            (
                r
                for r in results
                if r["library"] == "keras_vit"
                and r["backend"] == row["backend"]
                and r["measurement"] == row["measurement"]
                and "images_per_second" in r
            ),
            None,
        )
        if ours:
            row["keras_vit_ratio"] = ours["images_per_second"] / row["images_per_second"]


def print_table(results, notes):
    gpu = any("device" in row for row in results)
    if gpu:
        devices = sorted({row["device"] for row in results if "device" in row})
        print(f"\ndevice: {', '.join(devices)}")
        print(
            "\n| measurement | library | backend | images/s | GFLOP/s | % bf16 GEMM | MFU % "
            "| keras_vit / this | fused attention | GPU peak MB |"
        )
        print("|---|---|---|---|---|---|---|---|---|---|")
    else:
        print(
            "\n| measurement | library | backend | images/s | GFLOP/s | % fp32 GEMM "
            "| keras_vit / this | peak MB |"
        )
        print("|---|---|---|---|---|---|---|---|")
    for row in results:

        def cell(key, spec, row=row):
            return format(row[key], spec) if key in row else ""

        rate = cell("images_per_second", ".2f") or (
            f"{row['steps_per_second']:.2f} steps/s" if "steps_per_second" in row else ""
        )
        gflops = cell("gflops", ".1f")
        first = (
            f"| {row['measurement']} | {row['library']} | {row['backend']} | {rate} | {gflops} | "
        )
        if gpu:
            print(
                first + f"{cell('percent_of_bf16_gemm', '.0f')} | {cell('mfu_percent', '.1f')} | "
                f"{cell('keras_vit_ratio', '.2f')} | {cell('fused_attention', '')} | "
                f"{cell('gpu_peak_memory_mb', '.0f')} |"
            )
        else:
            print(
                first
                + f"{cell('percent_of_fp32_gemm', '.0f')} | {cell('keras_vit_ratio', '.2f')} | "
                + (cell("peak_memory_mb", ".0f") if row["measurement"].startswith("memory") else "")
                + " |"
            )
    for note in notes:
        print(f"note: {note}")


if __name__ == "__main__":
    sys.exit(main())
