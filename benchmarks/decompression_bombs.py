"""Decompression bombs: peak memory of decoding them, unbounded and with keras_vit's limits.

Each case runs in a fresh process, which reads its resident memory
(`ru_maxrss`) after TensorFlow is loaded and warm, then after decoding one
crafted file (`tests/bombs.py`) to a 224x224 RGB model input:
`unbounded` is what the pipelines did before the limits (`tf.io.decode_image`,
float32, resize), `bounded` is `keras_vit.data.pipeline.decode_for_eval`,
which reads the header first. Prints one JSON line per case.

    python benchmarks/decompression_bombs.py [--size 23000]
"""

import argparse
import json
import os
import subprocess
import sys
import tempfile
import textwrap

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

CASE = textwrap.dedent(
    """
    import json, resource, sys, time
    import tensorflow as tf
    from keras_vit.data.pipeline import center_crop, decode_for_eval, to_channels

    def peak_mb():
        return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024

    def unbounded(encoded):
        image = tf.io.decode_image(encoded, expand_animations=False)
        return center_crop(to_channels(tf.cast(image, tf.float32), 3), (224, 224))

    def bounded(encoded):
        return decode_for_eval(encoded, (224, 224), channels=3)

    decode = {"unbounded": unbounded, "bounded": bounded}[sys.argv[2]]
    small = tf.io.encode_png(tf.zeros((224, 224, 1), tf.uint8))
    decode(small)  # warm: kernels loaded, first allocations made
    before = peak_mb()
    encoded = tf.constant(open(sys.argv[1], "rb").read())
    start = time.perf_counter()
    try:
        decode(encoded)
        outcome = "decoded"
    except tf.errors.InvalidArgumentError as error:
        outcome = "refused: " + error.message.strip().splitlines()[0][:90]
    print(json.dumps({"outcome": outcome, "seconds": round(time.perf_counter() - start, 3),
                      "peak_mb_before": round(before), "peak_mb_after": round(peak_mb())}))
    """
)


def bombs(size):
    import importlib.util

    import tensorflow as tf

    # The suite's crafted files (standard library only), read from their file.
    spec = importlib.util.spec_from_file_location("bombs", os.path.join(ROOT, "tests", "bombs.py"))
    crafted = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(crafted)
    gif_bomb, jpeg_bomb, png_bomb = crafted.gif_bomb, crafted.jpeg_bomb, crafted.png_bomb

    small_jpeg = tf.io.encode_jpeg(tf.zeros((8, 8, 1), tf.uint8)).numpy()
    return {
        f"png_{size}x{size}_1bit": png_bomb(size, size),
        f"gif_{size}x{size}": gif_bomb(size, size),
        f"jpeg_{size}x{size}_truncated": jpeg_bomb(small_jpeg, size, size),
    }


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--size",
        type=int,
        default=23000,
        help="declared width and height (TensorFlow's PNG decoder refuses "
        "more than about 2**29 pixels by itself)",
    )
    parser.add_argument("--modes", nargs="+", default=["bounded", "unbounded"])
    args = parser.parse_args()
    environment = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "3", "PYTHONPATH": ROOT}
    with tempfile.TemporaryDirectory() as directory:
        for name, data in bombs(args.size).items():
            path = os.path.join(directory, name)
            with open(path, "wb") as f:
                f.write(data)
            for mode in args.modes:
                done = subprocess.run(
                    [sys.executable, "-c", CASE, path, mode],
                    env=environment,
                    capture_output=True,
                    text=True,
                )
                row = {"file": name, "bytes": len(data), "mode": mode}
                if done.returncode:
                    row["outcome"] = f"process died (exit {done.returncode})"
                    row["stderr"] = done.stderr.strip().splitlines()[-1:] if done.stderr else []
                else:
                    row.update(json.loads(done.stdout.strip().splitlines()[-1]))
                print(json.dumps(row), flush=True)


if __name__ == "__main__":
    main()
