"""Draws the figures of docs/images: what a 12-layer ViT trained on Fashion-MNIST looks at.

    KERAS_BACKEND=jax python examples/make_figures.py     # about 4 minutes on one H100
    .venv/bin/python examples/make_figures.py --out figures/ --patch-size 4 --epochs 1

Trains a plain ViT with twelve blocks (the depth of ViT-B; width 128, 4 heads,
2x2-pixel patches: a 14x14 grid, no convolutional stem) on the Fashion-MNIST
training images, then writes the paper's section 4.5 figures over the first
test images into --out: attention_rollout.png, attention_distance.png (mean
attention distance of every head against depth, the paper's Fig. 7) and
position_similarity.png. Prints the test accuracy and the attention
distances it drew. The figures in docs/images come from the defaults, run with
JAX on a GPU (on this 2-core CPU the defaults take hours; `--patch-size 4
--epochs 3` about 12 minutes, with a 7x7 grid too small to show the trend).
"""

import argparse
import os

import keras
import numpy as np

import keras_vit
from keras_vit import inspect as vit_inspect
from keras_vit.data import CLASS_NAMES, load_fashion_mnist
from keras_vit.inspect import figures

FIGURES = ("attention_rollout.png", "attention_distance.png", "position_similarity.png")


def train(args, seed=0):
    keras.utils.set_random_seed(seed)
    images, labels = load_fashion_mnist("train", **args.data)
    images, labels = images[: args.limit].astype("float32"), labels[: args.limit]
    model = keras_vit.ViT(
        patch_size=args.patch_size,
        hidden_dim=128,
        num_layers=12,
        num_heads=4,
        mlp_dim=256,
        input_shape=(28, 28, 1),
        classes=len(CLASS_NAMES),
        classifier_activation=None,
        seed=seed,
        name="vit_12_layers",
    )
    steps = args.epochs * (len(images) // args.batch_size)
    model.compile(
        optimizer=keras.optimizers.AdamW(
            keras.optimizers.schedules.CosineDecay(
                0.0, steps, warmup_target=1e-3, warmup_steps=max(steps // 10, 1)
            ),
            weight_decay=0.05,
            global_clipnorm=1.0,
        ),
        loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
        metrics=["accuracy"],
    )
    model.fit(images, labels, batch_size=args.batch_size, epochs=args.epochs, verbose=2)
    return model


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default=os.path.join("docs", "images"), help="output folder")
    parser.add_argument("--patch-size", type=int, default=2, help="patch size in pixels")
    parser.add_argument("--epochs", type=int, default=20, help="training epochs")
    parser.add_argument("--batch-size", type=int, default=128, help="images per step")
    parser.add_argument("--limit", type=int, default=60000, help="training images")
    parser.add_argument(
        "--test-images", type=int, default=10000, help="test images the accuracy is measured on"
    )
    parser.add_argument(
        "--fashion-mnist",
        default=None,
        help="folder of the Fashion-MNIST .gz files (default: Debian's)",
    )
    args = parser.parse_args()
    args.data = {"data_dir": args.fashion_mnist} if args.fashion_mnist else {}

    model = train(args)
    test_images, test_labels = load_fashion_mnist("test", **args.data)
    _, accuracy = model.evaluate(
        test_images[: args.test_images].astype("float32"),
        test_labels[: args.test_images],
        verbose=0,
    )
    print(f"test accuracy: {accuracy:.4f}")

    # The first test image of four classes: an ankle boot, a pullover, trousers, a shirt.
    shown = np.asarray([int(np.flatnonzero(test_labels == c)[0]) for c in (9, 2, 1, 6)])
    images = test_images[:64].astype("float32")
    assert shown.max() < len(images)
    prefix, grid, patch = vit_inspect.token_layout(model)
    attention = vit_inspect.attention_maps(model, images)  # (layers, images, heads, T, T)
    distances = vit_inspect.mean_attention_distance(attention, grid, patch, prefix)
    print(
        "mean attention distance (pixels), one row per layer, one column per head "
        f"(uniform attention: {vit_inspect.uniform_attention_distance(grid, patch):.1f}):"
    )
    for layer, row in enumerate(distances, start=1):
        print(f"  layer {layer:2d}: " + " ".join(f"{d:5.1f}" for d in row))
    rollouts = vit_inspect.attention_rollout(attention, prefix, grid)

    os.makedirs(args.out, exist_ok=True)
    drawn = {
        FIGURES[0]: figures.rollout_overlay(
            images[shown], rollouts[shown], [CLASS_NAMES[i] for i in test_labels[shown]]
        ),
        FIGURES[1]: figures.attention_distance_plot(
            distances,
            image_size=(28, 28),
            patch_size=patch,
            uniform=vit_inspect.uniform_attention_distance(grid, patch),
        ),
        FIGURES[2]: figures.position_similarity_grid(vit_inspect.position_similarity(model)),
    }
    for name, figure in drawn.items():
        print(figures.save(figure, os.path.join(args.out, name)))


if __name__ == "__main__":
    main()
