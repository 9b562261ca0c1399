"""Running an exported `.onnx` file with ONNX Runtime alone (no Keras, no keras_vit).

This file imports only the standard library, NumPy and ONNX Runtime, so it
shows what a deployment sees. `keras_vit.export.check_onnx` runs it as a
script in a fresh interpreter:

    python onnx_only.py MODEL.onnx IMAGES.npy OUTPUTS.npy THREADS LATENCY_RUNS

It writes the outputs for every image (batches of up to 64, the batch
axis is dynamic) and prints one JSON line: the input's name and shape, the
median latency of one image (batch 1) and whether Keras was imported.
"""

import json
import sys
import time


def main(argv):
    import numpy as np
    import onnxruntime

    model_path, images_path, outputs_path, threads, latency_runs = argv
    options = onnxruntime.SessionOptions()
    options.intra_op_num_threads = int(threads)
    options.inter_op_num_threads = 1
    session = onnxruntime.InferenceSession(model_path, options, providers=["CPUExecutionProvider"])
    (feed,) = session.get_inputs()
    images = np.load(images_path).astype("float32")
    outputs = [
        session.run(None, {feed.name: images[start : start + 64]})[0]
        for start in range(0, len(images), 64)
    ]
    np.save(outputs_path, np.concatenate(outputs))
    one = images[:1]
    times = []
    for index in range(int(latency_runs) + 5):
        start = time.perf_counter()
        session.run(None, {feed.name: one})
        if index >= 5:  # warm-up runs are not counted
            times.append((time.perf_counter() - start) * 1000)
    print(
        json.dumps(
            {
                "input": {
                    "name": feed.name,
                    "shape": [d if isinstance(d, int) else -1 for d in feed.shape],
                },
                "latency_ms": float(np.median(times)) if times else None,
                "keras_imported": "keras" in sys.modules,
                "onnxruntime_version": onnxruntime.__version__,
            }
        )
    )
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
