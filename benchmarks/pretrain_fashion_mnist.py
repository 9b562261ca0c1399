"""Does masked-patch pre-training help with few labels? Fashion-MNIST, this CPU.

Pre-trains the `small/4` ViT (4x4 pixel patches, 4 blocks, width 64) on the
60,000 training images without labels, once per objective (the paper's
masked patch prediction, and MAE), with `keras_vit.pretraining.pretrain`
(what `keras-vit pretrain` runs). Then, for each seed, draws a
class-balanced 1% and 10% of the labels and fine-tunes a classifier from
each pre-trained encoder and from scratch, with the same recipe ("small":
AdamW, cosine, label smoothing), the same steps and the same batches;
reports test accuracy on the 10,000 test images (mean and spread over the
seeds) as a table and as JSON.

    python benchmarks/pretrain_fashion_mnist.py [--pretrain-epochs 8] [--seeds 0 1 2]
        [--work-dir DIR] [--json results.json]

Pre-training runs are kept in --work-dir and resumed or reused when the
command runs again (about 8 + 6 minutes of pre-training and 15 of
fine-tuning with the defaults, on TensorFlow on a 2-core CPU).
"""

import argparse
import json
import os
import statistics
import time

# Fine-tuning budget per label fraction: (batch size, epochs).
BUDGETS = {0.01: (50, 40), 0.1: (100, 15)}


def labelled_subset(labels, fraction, seed):
    """Indices of a class-balanced `fraction` of the examples."""
    import numpy as np

    rng = np.random.default_rng(seed)
    chosen = []
    for label in np.unique(labels):
        members = np.flatnonzero(labels == label)
        count = max(1, int(round(fraction * len(members))))
        chosen.append(rng.choice(members, count, replace=False))
    return np.sort(np.concatenate(chosen))


def finetune(pretrained, images, labels, test, fraction, seed):
    """Test accuracy of a classifier trained on a labelled subset."""
    import keras

    import keras_vit
    from keras_vit import data as vit_data
    from keras_vit.models.variants import SMALL_MODELS
    from keras_vit.pretraining import transfer_encoder
    from keras_vit.training import get_recipe

    batch_size, epochs = BUDGETS[fraction]
    subset = labelled_subset(labels, fraction, seed)
    keras.utils.set_random_seed(seed)
    train = vit_data.from_arrays(
        images[subset],
        labels[subset],
        image_size=28,
        channels=1,
        training=True,
        crop_scale=None,
        batch_size=batch_size,
        seed=seed,
    )
    model = keras_vit.ViT(
        **SMALL_MODELS["small/4"],
        input_shape=(28, 28, 1),
        classes=10,
        classifier_activation=None,
        seed=seed,
    )
    if pretrained is not None:
        transfer_encoder(pretrained, model)
    recipe = get_recipe("small")
    recipe.compile(model, total_steps=len(subset) // batch_size * epochs)
    model.fit(train.data, epochs=epochs, verbose=0, shuffle=False)
    _, accuracy = model.evaluate(test.data, verbose=0)
    return float(accuracy), len(subset)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pretrain-epochs", type=int, default=8)
    parser.add_argument("--objectives", nargs="+", default=["mpp", "mae"])
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--fractions", type=float, nargs="+", default=sorted(BUDGETS))
    parser.add_argument("--work-dir", default="keras_vit_pretrain_benchmark")
    parser.add_argument("--json", default=None, help="also write the results here")
    args = parser.parse_args()
    for fraction in args.fractions:
        if fraction not in BUDGETS:
            parser.error(f"--fractions: {fraction} has no budget; choose from {sorted(BUDGETS)}")

    import keras
    import numpy as np

    from keras_vit import data as vit_data
    from keras_vit.data import load_fashion_mnist
    from keras_vit.pretraining import pretrain

    images, labels = load_fashion_mnist("train")
    test_images, test_labels = load_fashion_mnist("test")
    test = vit_data.from_arrays(test_images, test_labels, image_size=28, channels=1, batch_size=500)
    results = {"backend": keras.backend.backend(), "pretraining": {}, "finetuning": []}

    pretrained = {"scratch": None}
    for objective in args.objectives:
        output_dir = os.path.join(args.work_dir, objective)
        model_path = os.path.join(output_dir, "model.keras")
        if not os.path.isfile(model_path):
            start = time.perf_counter()
            run = pretrain(
                "fashion_mnist",
                objective=objective,
                epochs=args.pretrain_epochs,
                output_dir=output_dir,
                batch_size=128,
            )
            results["pretraining"][objective] = {
                **run["metrics"],
                "wall_seconds": round(time.perf_counter() - start, 1),
            }
        pretrained[objective] = model_path

    for fraction in args.fractions:
        for seed in args.seeds:
            for name, path in pretrained.items():
                start = time.perf_counter()
                accuracy, count = finetune(path, images, labels, test, fraction, seed)
                row = dict(
                    init=name,
                    fraction=fraction,
                    labels=count,
                    seed=seed,
                    test_accuracy=accuracy,
                    seconds=round(time.perf_counter() - start, 1),
                )
                results["finetuning"].append(row)
                print(json.dumps(row), flush=True)

    print(f"\n| labels | {' | '.join(pretrained)} |")
    print("|---|" + "---|" * len(pretrained))
    for fraction in args.fractions:
        cells = []
        for name in pretrained:
            values = [
                r["test_accuracy"]
                for r in results["finetuning"]
                if r["init"] == name and r["fraction"] == fraction
            ]
            spread = statistics.stdev(values) if len(values) > 1 else 0.0
            cells.append(f"{100 * np.mean(values):.2f}% ± {100 * spread:.2f}")
        print(f"| {fraction:.0%} | {' | '.join(cells)} |")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(results, f, indent=2)


if __name__ == "__main__":
    main()
