"""Long runs stay flat: resident memory over thousands of predict / serving calls.

For each backend, in a fresh process: the main job's small ViT answers
`--calls` batches of `--batch-size` images through `model.predict` (and, on TensorFlow, through the
exported SavedModel's serving signature loaded with `tf.saved_model.load`).
Resident memory (VmRSS) is read after a warm-up of `--warmup` calls and at
the end; the growth per 1,000 calls is printed as a JSON line per case.

    python benchmarks/memory_growth.py [--backends tensorflow jax torch] [--calls 5000]
        [--warmup 500] [--batch-size 32]
"""

import argparse
import json
import textwrap

from harness import fresh_process, python_code

CASE = textwrap.dedent(
    """
    import json, os, sys, tempfile
    import numpy as np

    def rss_mb():
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1]) / 1024

    import keras, keras_vit
    from keras_vit.models.variants import SMALL_MODEL

    calls, warmup, batch_size = (int(arg) for arg in sys.argv[1:4])
    model = keras_vit.ViT(**SMALL_MODEL, input_shape=(28, 28, 1), classes=10)
    batch = np.random.default_rng(0).uniform(0, 255, (batch_size, 28, 28, 1)).astype("float32")
    cases = {"predict": lambda: model.predict(batch, verbose=0)}
    if keras.backend.backend() == "tensorflow":
        import tensorflow as tf
        folder = keras_vit.export.saved_model(model, tempfile.mkdtemp(), version=1, warmup=False)
        serve = tf.saved_model.load(folder).signatures["serving_default"]
        images = tf.constant(batch)
        cases["serving signature"] = lambda: serve(images=images)
    for name, call in cases.items():
        for _ in range(warmup):
            call()
        before = rss_mb()
        for _ in range(calls - warmup):
            call()
        after = rss_mb()
        print(json.dumps({
            "backend": keras.backend.backend(), "case": name, "calls": calls,
            "rss_after_warmup_mb": round(before, 1), "rss_end_mb": round(after, 1),
            "growth_mb": round(after - before, 1),
            "growth_mb_per_1000_calls": round((after - before) * 1000 / (calls - warmup), 2),
        }), flush=True)
    """
)


def measure(backend, calls, warmup, batch_size=32):
    """The JSON results of one backend's fresh process."""
    output = fresh_process(python_code(CASE, calls, warmup, batch_size), backend).stdout
    return [json.loads(line) for line in output.splitlines() if line.startswith("{")]


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--backends", nargs="+", default=["tensorflow", "jax", "torch"])
    parser.add_argument("--calls", type=int, default=5000)
    parser.add_argument("--warmup", type=int, default=500)
    parser.add_argument("--batch-size", type=int, default=32)
    args = parser.parse_args(argv)
    if not 0 < args.warmup < args.calls:
        parser.error(f"--warmup must be in (0, --calls). Received: --warmup {args.warmup}")
    results = []
    for backend in args.backends:
        for result in measure(backend, args.calls, args.warmup, args.batch_size):
            print(json.dumps(result), flush=True)
            results.append(result)
    return results


if __name__ == "__main__":
    main()
