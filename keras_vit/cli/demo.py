"""`keras-vit demo`: the default ViT trained briefly on real Fashion-MNIST, then a prediction.

The training is `keras_vit.training.train` with its defaults (what `keras-vit
train` runs), one epoch; the prediction reads the run's saved model back.
"""

import time

from keras_vit.cli.options import non_negative_int, positive_int, progress
from keras_vit.cli.preflight import TRAINING, check_writable, fail
from keras_vit.cli.run_model import load_run_model

NEEDS = TRAINING  # it runs `train()`


def add_parser(command):
    demo = command(
        "demo",
        help="train the default ViT briefly on Fashion-MNIST, save it, predict",
    )
    demo.add_argument("--epochs", type=positive_int, default=1, help="training epochs")
    demo.add_argument("--batch-size", type=positive_int, default=128, help="images per step")
    demo.add_argument("--seed", type=non_negative_int, default=0, help="random seed")
    demo.add_argument(
        "--limit", type=positive_int, default=None, help="use only the first N training images"
    )
    demo.add_argument(
        "--output-dir",
        default="keras_vit_demo",
        help="folder for the run's files (replaced on each demo)",
    )
    demo.set_defaults(run=run, needs=NEEDS)


def run(args):
    import keras
    import numpy as np

    import keras_vit
    from keras_vit.data import CLASS_NAMES, load_fashion_mnist
    from keras_vit.training import train

    start = time.perf_counter()
    print(
        f"keras_vit {keras_vit.__version__} on Keras {keras.__version__}, "
        f"backend {keras.backend.backend()}"
    )
    print(
        f"ViT-B/16 at 224 px, 1000 classes: "
        f"{keras_vit.models.parameter_count('B/16'):,} parameters (paper: 86,567,656)"
    )
    try:
        check_writable(args.output_dir, "--output-dir", folder=True)
        result = train(
            "fashion_mnist",
            epochs=args.epochs,
            batch_size=args.batch_size,
            seed=args.seed,
            limit=args.limit,
            output_dir=args.output_dir,
            overwrite=True,
            verbose=progress(),
        )
    except (ValueError, RuntimeError) as error:
        fail("demo", error)
    print(f"test accuracy after {args.epochs} epoch(s): {result['metrics']['test_accuracy']:.4f}")

    model, _ = load_run_model(result["paths"]["model.keras"])
    test_images, test_labels = load_fashion_mnist("test")
    logits = model.predict(test_images[:1].astype("float32"), verbose=0)[0]
    probabilities = np.exp(logits - logits.max())
    probabilities /= probabilities.sum()
    print(
        f"test image 0 (true class: {CLASS_NAMES[test_labels[0]]}), "
        f"by {result['paths']['model.keras']}:"
    )
    for index in np.argsort(probabilities)[::-1][:3]:
        print(f"  {CLASS_NAMES[index]:<12} {probabilities[index]:.3f}")
    print(f"done in {time.perf_counter() - start:.0f} s")
    return 0
