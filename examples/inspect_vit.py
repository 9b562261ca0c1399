"""What does a ViT look at? The figures of the paper's section 4.5 for a model.

    .venv/bin/python examples/inspect_vit.py                      # the main job's model
    .venv/bin/python examples/inspect_vit.py --model my.keras --out figures/

With no `keras_vit_run/model.keras` (from `keras-vit train`), it first trains
a plain ViT (4x4-pixel patches, no stem) on Fashion-MNIST for a short while.
Prints the mean attention distance of every head and layer and writes the
figures (PNG) into `--out`.
"""

import argparse
import os

import keras

import keras_vit
from keras_vit import inspect as vit_inspect
from keras_vit.data import CLASS_NAMES, load_fashion_mnist


def train_plain_vit(epochs, limit):
    keras.utils.set_random_seed(0)
    images, labels = load_fashion_mnist("train")
    model = keras_vit.ViT(
        patch_size=4,
        hidden_dim=64,
        num_layers=4,
        num_heads=4,
        mlp_dim=128,
        input_shape=(28, 28, 1),
        classes=len(CLASS_NAMES),
        classifier_activation=None,
    )
    model.compile(
        optimizer=keras.optimizers.AdamW(2e-3, global_clipnorm=1.0),
        loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
    )
    model.fit(
        images[:limit].astype("float32"), labels[:limit], batch_size=128, epochs=epochs, verbose=2
    )
    return model


parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
parser.add_argument("--model", default="keras_vit_run/model.keras")
parser.add_argument("--out", default="keras_vit_inspect")
parser.add_argument("--epochs", type=int, default=3, help="when training a plain ViT")
parser.add_argument("--limit", type=int, default=60000, help="training images, idem")
args = parser.parse_args()

if os.path.isfile(args.model):
    model = keras.saving.load_model(args.model, compile=False)
else:
    print(f"{args.model} not found: training a plain ViT first")
    model = train_plain_vit(args.epochs, args.limit)

test_images, test_labels = load_fashion_mnist("test")
images = test_images[:64].astype("float32")
prefix, grid, patch = vit_inspect.token_layout(model)
attention = vit_inspect.attention_maps(model, images)  # (layers, images, heads, T, T)
distances = vit_inspect.mean_attention_distance(attention, grid, patch, prefix)
print(f"{prefix} prefix token(s), {grid[0]}x{grid[1]} patches of {patch[0]}x{patch[1]} px")
print("mean attention distance (pixels), one row per layer, one column per head:")
for layer, row in enumerate(distances):
    print(f"  layer {layer}: " + " ".join(f"{d:5.1f}" for d in row))
paths = vit_inspect.write_figures(
    model, images[:4], args.out, [CLASS_NAMES[i] for i in test_labels[:4]]
)
for name, path in paths.items():
    print(f"  {name:<20} {path}")
