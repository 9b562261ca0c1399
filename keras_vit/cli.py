"""The `keras-vit` command line."""

import argparse
import os
import sys
import time


def _demo(args):
    """Builds a small ViT, trains it briefly on real Fashion-MNIST, predicts."""
    import keras
    import numpy as np
    import tensorflow as tf

    import keras_vit
    from keras_vit.data import CLASS_NAMES, load_fashion_mnist

    start = time.perf_counter()
    keras.utils.set_random_seed(args.seed)
    print(f"keras_vit {keras_vit.__version__} on Keras {keras.__version__}, "
          f"backend {keras.backend.backend()}")
    print(f"ViT-B/16 at 224 px, 1000 classes: "
          f"{keras_vit.models.parameter_count('B/16'):,} parameters (paper: 86,567,656)")

    train_images, train_labels = load_fashion_mnist("train")
    if args.limit:
        train_images, train_labels = train_images[: args.limit], train_labels[: args.limit]
    test_images, test_labels = load_fashion_mnist("test")
    print(f"Fashion-MNIST: {len(train_images):,} training and "
          f"{len(test_images):,} test images of {train_images.shape[1:]}")

    model = keras_vit.VisionTransformer(
        patch_size=4, hidden_dim=64, num_layers=4, num_heads=4, mlp_dim=128,
        input_shape=(28, 28, 1), classes=len(CLASS_NAMES),
        classifier_activation=None, seed=args.seed, name="vit_demo",
    )
    model.summary()
    steps = len(train_images) // args.batch_size * args.epochs
    model.compile(
        optimizer=keras.optimizers.AdamW(
            keras.optimizers.schedules.CosineDecay(
                0.0, steps, warmup_target=2e-3, warmup_steps=steps // 10
            ),
            weight_decay=0.05,
            global_clipnorm=1.0,
        ),
        loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
        metrics=["accuracy"],
    )
    options = tf.data.Options()
    options.autotune.enabled = False  # avoids start-of-epoch stalls on 2 cores
    train = (
        tf.data.Dataset.from_tensor_slices((train_images, train_labels))
        .shuffle(len(train_images), seed=args.seed)
        .batch(args.batch_size, drop_remainder=True)
        .with_options(options)
        .prefetch(2)
    )
    test = tf.data.Dataset.from_tensor_slices((test_images, test_labels)).batch(512)
    model.fit(train, epochs=args.epochs, shuffle=False, verbose=2)
    _, accuracy = model.evaluate(test.with_options(options), verbose=0)
    print(f"test accuracy after {args.epochs} epoch(s): {accuracy:.4f}")

    logits = model.predict(test_images[:1], verbose=0)[0]
    probabilities = np.exp(logits - logits.max())
    probabilities /= probabilities.sum()
    print(f"test image 0 (true class: {CLASS_NAMES[test_labels[0]]}):")
    for index in np.argsort(probabilities)[::-1][:3]:
        print(f"  {CLASS_NAMES[index]:<12} {probabilities[index]:.3f}")
    print(f"done in {time.perf_counter() - start:.0f} s")
    return 0


def _convert(args):
    """Converts a checkpoint into a `.keras` model file."""
    if not args.destination.endswith(".keras"):
        raise SystemExit(
            f"keras-vit convert: DST must end in .keras. Received: {args.destination!r}"
        )
    if os.path.exists(args.destination) and not args.overwrite:
        raise SystemExit(
            f"keras-vit convert: {args.destination!r} exists; pass --overwrite "
            "to replace it."
        )
    if not os.path.isfile(args.source):
        raise SystemExit(f"keras-vit convert: no such file: {args.source!r}")
    if args.image_size is not None and args.image_size <= 0:
        raise SystemExit(
            f"keras-vit convert: --image-size must be positive. Received: {args.image_size}"
        )
    from keras_vit.weights import from_checkpoint

    overrides = {}
    if args.image_size:
        overrides["input_shape"] = (args.image_size, args.image_size, 3)
    if args.classes is not None:
        overrides.update(include_top=True, classes=args.classes)
    if args.no_top:
        overrides["include_top"] = False
    try:
        model = from_checkpoint(args.source, num_heads=args.num_heads, **overrides)
    except (ValueError, TypeError) as error:
        raise SystemExit(f"keras-vit convert: {error}") from None
    model.save(args.destination, overwrite=True)
    blocks = [layer for layer in model.layers if layer.name.startswith("encoderblock_")]
    print(
        f"{args.source} -> {args.destination}: {len(blocks)} blocks, width "
        f"{blocks[0].input.shape[-1]}, {blocks[0].num_heads} heads, input "
        f"{model.input_shape[1:]}, output {model.output_shape[1:]}, "
        f"{model.count_params():,} parameters"
    )
    return 0


def build_parser():
    parser = argparse.ArgumentParser(
        prog="keras-vit",
        description="The Vision Transformer for Keras 3.",
    )
    commands = parser.add_subparsers(dest="command", metavar="COMMAND")
    demo = commands.add_parser(
        "demo",
        help="build a small ViT, train it briefly on Fashion-MNIST, predict",
    )
    demo.add_argument("--epochs", type=int, default=1)
    demo.add_argument("--batch-size", type=int, default=128)
    demo.add_argument("--seed", type=int, default=0)
    demo.add_argument(
        "--limit", type=int, default=None, help="use only the first N training images"
    )
    demo.set_defaults(run=_demo)

    convert = commands.add_parser(
        "convert",
        help="convert an official .npz, Hugging Face or timm checkpoint to .keras",
        description=(
            "Builds the ViT that SRC describes (width, depth, heads, patch, "
            "resolution, head, GELU form, LayerNorm epsilon and pixel "
            "normalisation of its source) and saves it with its weights as DST."
        ),
    )
    convert.add_argument("source", metavar="SRC", help="checkpoint file")
    convert.add_argument("destination", metavar="DST", help="output .keras file")
    convert.add_argument(
        "--image-size", type=int, default=None,
        help="build at this resolution (position embeddings resampled)",
    )
    convert.add_argument(
        "--classes", type=int, default=None,
        help="a new zero-initialised head of this many classes",
    )
    convert.add_argument("--no-top", action="store_true", help="drop the head")
    convert.add_argument(
        "--num-heads", type=int, default=None,
        help="attention heads, for files without config.json outside the variant table",
    )
    convert.add_argument("--overwrite", action="store_true", help="replace DST")
    convert.set_defaults(run=_convert)
    return parser


def main(argv=None):
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.command is None:
        parser.print_help()
        return 2
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    return args.run(args)


if __name__ == "__main__":
    sys.exit(main())
