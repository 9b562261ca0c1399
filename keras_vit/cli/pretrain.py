"""`keras-vit pretrain`: self-supervised pre-training (masked patch prediction or MAE)
of a ViT encoder.

Its options are the fields of `keras_vit.pretraining.PretrainingSettings`.
"""

from keras_vit.cli.options import add_settings, progress, settings_from
from keras_vit.cli.preflight import TRAINING, check_writable, fail

NEEDS = TRAINING


def add_parser(command):
    from keras_vit.pretraining.settings import COMMAND_DEFAULTS, PretrainingSettings

    pretrain = command(
        "pretrain",
        help="self-supervised pre-training: masked patch prediction (the paper's) or MAE",
        description=(
            "Pre-trains a ViT encoder on the training images of a dataset without "
            "their labels, with model.fit on a tf.data pipeline that computes the "
            "masks and targets: the paper's masked patch prediction (--objective "
            "mpp: 50% of the patch embeddings corrupted, 80/10/10 [mask]/other "
            "patch/kept, predict each one's 3-bit mean colour) or MAE (--objective "
            "mae). Saves model.keras, history.csv, learning_curves.png and "
            "metrics.json in OUTPUT_DIR; resumes like `keras-vit train`. Then: "
            "keras-vit finetune OUTPUT_DIR/model.keras --dataset DATASET."
        ),
    )
    add_settings(pretrain, PretrainingSettings, "pretrain", COMMAND_DEFAULTS["pretrain"])
    pretrain.set_defaults(run=run, needs=NEEDS)


def run(args):
    """Pre-trains a ViT encoder without labels and saves the run."""
    from keras_vit.pretraining import PretrainingSettings, pretrain

    try:
        check_writable(args.output_dir, "--output-dir", folder=True)
        result = pretrain(settings_from(args, PretrainingSettings), verbose=progress())
    except (ValueError, RuntimeError) as error:
        fail("pretrain", error)
    metrics, paths = result["metrics"], result["paths"]
    shown = ", ".join(f"{k} {metrics[k]:.4f}" for k in ("loss", "accuracy") if k in metrics)
    print(
        f"last epoch: {shown}; pre-trained in {metrics['fit_seconds']:.0f} s, "
        f"{metrics['total_seconds']:.0f} s in all"
    )
    for name, path in paths.items():
        print(f"  {name:<20} {path}")
    print(f"fine-tune it: {finetune_command(paths['model.keras'], args)}")
    return 0


def finetune_command(model, args):
    """The `keras-vit finetune` command line for `model` on the data it was pre-trained on.

    A folder without `test/` images gets a held-out share of its training
    images to test on (`--validation-split`), as `finetune` needs there.
    """
    import os
    import shlex

    words = ["keras-vit", "finetune", model, "--dataset", args.dataset]
    if args.data_dir is not None:
        words += ["--data-dir", args.data_dir]
    if os.path.isdir(args.dataset) and not os.path.isdir(os.path.join(args.dataset, "test")):
        words += ["--validation-split", "0.1"]
    return shlex.join(words + ["--recipe", "small"])
