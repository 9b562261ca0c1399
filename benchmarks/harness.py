"""What the benchmarks share: the day's GEMM rate, fresh processes, timing.

These machines' speed moves about 2x from day to day, so every timed result
is printed beside the day's fp32 matrix-product rate (`gemm_rate`), and
side-by-side comparisons run in fresh interpreters (`fresh_process`). The
scripts import this module by name (it sits beside them:
`python benchmarks/<script>.py` puts the folder on the path).

    python benchmarks/harness.py gemm [--size 4096] [--backend tensorflow] [--dtype float32]
"""

import argparse
import json
import os
import subprocess
import sys
import time
import typing

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def timed(step, steps, warmup=2):
    """Median seconds of `step()` over `steps` calls, after `warmup` calls."""
    for _ in range(warmup):
        step()
    times = []
    for _ in range(steps):
        start = time.perf_counter()
        step()
        times.append(time.perf_counter() - start)
    times.sort()
    return times[len(times) // 2]


def keras_latency_ms(model, batch, runs=20, warmup=3):
    """Median milliseconds of Keras' compiled `predict_on_batch` on `batch` (one image: latency).

    The outputs are read back to NumPy inside the timing, so an asynchronous
    backend's call is timed to its result.
    """
    import numpy as np

    return timed(lambda: np.asarray(model.predict_on_batch(batch)), runs, warmup) * 1000


def pipelined(step, steps, finish, warmup=3):
    """Seconds per `step()` when steps queue up on the GPU; `finish()` waits for them."""
    for _ in range(warmup):
        step()
    finish()
    start = time.perf_counter()
    for _ in range(steps):
        step()
    finish()
    return (time.perf_counter() - start) / steps


def device_name(backend):
    """`{"device": name}` of the GPU the backend computes on; `{}` on a CPU."""
    if backend == "jax":
        import jax

        device = jax.devices()[0]
        return {"device": device.device_kind} if device.platform == "gpu" else {}
    if backend == "torch":
        import torch

        return {"device": torch.cuda.get_device_name()} if torch.cuda.is_available() else {}
    import tensorflow as tf

    gpus = tf.config.list_physical_devices("GPU")
    if not gpus:
        return {}
    return {"device": tf.config.experimental.get_device_details(gpus[0]).get("device_name", "GPU")}


def torch_device():
    import torch

    return "cuda" if torch.cuda.is_available() else "cpu"


def synchronize_torch():
    """Waits for queued GPU work (PyTorch runs it asynchronously)."""
    import torch

    if torch.cuda.is_available():
        torch.cuda.synchronize()


def gemm_rate(size=4096, dtype="float32", backend="tensorflow"):
    """The rate of a `size`^3 matrix product in `backend`'s own framework, in this process.

    On a GPU the products queue up (one wait at the end), as a model's do;
    on a CPU each is timed on its own and the median of 5 taken.

    Returns:
        `{"gflops": ..., "seconds": ..., "device": ...}` (no device on a CPU).
    """
    import numpy as np

    a = np.random.default_rng(0).normal(size=(size, size)).astype("float32")
    gpu = device_name(backend)
    if backend == "tensorflow":
        import tensorflow as tf

        x = tf.cast(tf.constant(a), dtype)
        matmul = tf.function(lambda: tf.matmul(x, x))
        step = lambda: matmul().numpy()  # noqa: E731
        seconds = timed(step, steps=5)
    elif backend == "jax":
        import jax
        import jax.numpy as jnp

        x = jnp.asarray(a, dtype=dtype)
        matmul = jax.jit(lambda m: m @ m)
        last = [None]

        def step():
            last[0] = matmul(x)

        finish = lambda: last[0].block_until_ready()  # noqa: E731
        seconds = pipelined(step, 20, finish) if gpu else timed(lambda: (step(), finish()), steps=5)
    else:
        import torch

        x = torch.tensor(a, device=torch_device()).to(getattr(torch, dtype))
        step = lambda: torch.matmul(x, x)  # noqa: E731
        seconds = pipelined(step, 20, synchronize_torch) if gpu else timed(step, steps=5)
    return {"gflops": 2 * size**3 / seconds / 1e9, "seconds": seconds, **gpu}


class Finished(typing.NamedTuple):
    stdout: str
    seconds: float  # wall-clock, from the start of the process to its exit


def fresh_process(command, backend="tensorflow", environment=None):
    """Runs `command` (a list) in a fresh process of `backend`, TensorFlow's logs off.

    The repository is on its `PYTHONPATH`. A failure is a `RuntimeError`
    with the end of its standard error.
    """
    environment = {
        **os.environ,
        "KERAS_BACKEND": backend,
        "TF_CPP_MIN_LOG_LEVEL": "3",
        "PYTHONPATH": os.pathsep.join(filter(None, (ROOT, os.environ.get("PYTHONPATH")))),
        **(environment or {}),
    }
    start = time.perf_counter()
    done = subprocess.run(command, env=environment, capture_output=True, text=True, check=False)
    seconds = time.perf_counter() - start
    if done.returncode:
        raise RuntimeError(f"{' '.join(command)} failed under {backend}:\n{done.stderr[-3000:]}")
    return Finished(done.stdout, round(seconds, 1))


def python_code(code, *arguments):
    """The command that runs `code` (a string) with `arguments` in a new interpreter."""
    return [sys.executable, "-c", code, *map(str, arguments)]


def gemm_gflops(size=4096, backend="tensorflow"):
    """The day's fp32 GEMM rate, GFLOP/s: `gemm_rate` in a fresh process of `backend`.

    A fresh process, so that the benchmark's own process keeps its backend
    and memory as they were.
    """
    command = [sys.executable, os.path.abspath(__file__), "gemm", "--size", str(size)]
    command += ["--backend", backend]
    finished = fresh_process(command, backend)
    return round(json.loads(finished.stdout.strip().splitlines()[-1])["gflops"], 1)


def print_gemm_rate(size=4096):
    """Prints the day's fp32 GEMM rate as a JSON line (timed rows follow it)."""
    print(json.dumps({"gemm_fp32_gflops": gemm_gflops(size)}), flush=True)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    commands = parser.add_subparsers(dest="command", required=True)
    gemm = commands.add_parser("gemm", help="the GEMM rate of a backend, as a JSON line")
    gemm.add_argument("--size", type=int, default=4096)
    gemm.add_argument("--dtype", default="float32")
    gemm.add_argument("--backend", default="tensorflow")
    args = parser.parse_args(argv)
    print(json.dumps(gemm_rate(args.size, args.dtype, args.backend)))


if __name__ == "__main__":
    main()
