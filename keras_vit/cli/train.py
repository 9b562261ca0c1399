"""`keras-vit train` and `keras-vit finetune`: a ViT trained (or a checkpoint
fine-tuned), evaluated, and its run saved.

Their options are the fields of `keras_vit.training.TrainingSettings`.
"""

from keras_vit.cli.options import add_settings, positive_int, progress, settings_from
from keras_vit.cli.preflight import TRAINING, check_writable, fail

NEEDS = TRAINING


def add_parser(command):
    from keras_vit.training.settings import COMMAND_DEFAULTS, TrainingSettings

    train = command(
        "train",
        help="train a ViT (default: a small ViT on Fashion-MNIST), evaluate, save",
        description=(
            "Trains a ViT with model.fit on a tf.data pipeline, evaluates it on "
            "the test split, and saves model.keras, class_names.json, "
            "history.csv, learning_curves.png and metrics.json in OUTPUT_DIR. "
            "Interrupted? Run the same command again: it resumes from the last "
            "finished epoch."
        ),
    )
    add_settings(train, TrainingSettings, "train", COMMAND_DEFAULTS["train"])
    _add_cpu_devices(train)
    train.set_defaults(run=run, needs=NEEDS)

    finetune = command(
        "finetune",
        help="fine-tune a checkpoint (optionally at a higher resolution), evaluate, save",
        description=(
            "Fine-tunes a checkpoint (a model.keras of an earlier run, an official "
            ".npz, a Hugging Face or timm .safetensors) on a dataset: position "
            "embeddings resampled to --image-size; for another class count a new "
            "head, fitted first on the frozen model's features, then every weight "
            "trained at a small AdamW rate (--lora RANK: low-rank adapters of the "
            "frozen encoder instead; --recipe paper_finetune: the paper's SGD). "
            "Same outputs and resume as `keras-vit train`."
        ),
    )
    add_settings(finetune, TrainingSettings, "finetune", COMMAND_DEFAULTS["finetune"])
    _add_cpu_devices(finetune)
    finetune.set_defaults(run=run, needs=NEEDS)


def _add_cpu_devices(parser):
    # Read by `keras-vit` itself before the backend starts (not a setting of the run).
    parser.add_argument(
        "--cpu-devices",
        type=positive_int,
        default=None,
        help="split the CPU into this many devices (to try --distribute on one machine)",
    )


def run(args):
    """Trains (or, with a checkpoint, fine-tunes) a ViT and saves the run."""
    from keras_vit.training import TrainingSettings, train

    try:
        check_writable(args.output_dir, "--output-dir", folder=True)
        result = train(settings_from(args, TrainingSettings), verbose=progress())
    except (ValueError, RuntimeError) as error:
        fail(args.command, error)
    metrics, paths = result["metrics"], result["paths"]
    if "test_accuracy" in metrics:
        print(
            f"test accuracy: {metrics['test_accuracy']:.4f}, "
            f"cross-entropy {metrics['test_cross_entropy']:.4f}"
        )
    print(f"trained in {metrics['fit_seconds']:.0f} s, {metrics['total_seconds']:.0f} s in all")
    for name, path in paths.items():
        print(f"  {name:<20} {path}")
    return 0
