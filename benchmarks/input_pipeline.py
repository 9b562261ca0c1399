"""Throughput of the training input pipeline alone (no model).

Iterates whole epochs of `keras_vit.data` pipelines over Fashion-MNIST and
prints images/s as JSON lines, so the pipeline's share of an epoch of the
main job can be told apart from the model's.

    python benchmarks/input_pipeline.py [--epochs 2] [--batch-size 256]
"""

import argparse
import json
import time


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--epochs", type=int, default=2)
    parser.add_argument("--batch-size", type=int, default=256)
    args = parser.parse_args()
    from keras_vit import data as vit_data

    cases = {
        "fashion_mnist train (flip)": dict(training=True, crop_scale=None),
        "fashion_mnist train (crop+flip)": dict(training=True, crop_scale=(0.35, 1.0)),
        "fashion_mnist test": dict(training=False),
    }
    for name, kwargs in cases.items():
        split = "train" if kwargs["training"] else "test"
        dataset = vit_data.fashion_mnist(
            split, image_size=28, channels=1, batch_size=args.batch_size, **kwargs
        )
        for epoch in range(args.epochs):
            start = time.perf_counter()
            images = sum(int(x.shape[0]) for x, _ in dataset.data)
            seconds = time.perf_counter() - start
            print(
                json.dumps(
                    {
                        "pipeline": name,
                        "epoch": epoch,
                        "images": images,
                        "seconds": round(seconds, 2),
                        "images_per_s": round(images / seconds),
                    }
                )
            )


if __name__ == "__main__":
    main()
