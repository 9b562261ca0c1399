"""`keras-vit train` and `keras-vit finetune`: a ViT trained (or a checkpoint
fine-tuned), evaluated, and its run saved.
"""

from keras_vit.cli.common import (
    TRAINING,
    add_run_arguments,
    check_writable,
    decay_factor,
    fail,
    fraction,
    positive_float,
    positive_int,
    progress,
)

NEEDS = TRAINING


def add_parser(command):
    from keras_vit.training.loop import DEFAULTS

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
    train.add_argument(
        "--model", default="small", help="'small' or a variant of the paper, e.g. Ti/16, S/16"
    )
    train.add_argument(
        "--patch-size",
        type=positive_int,
        default=None,
        help="patch size in pixels (default: the model's)",
    )
    add_run_arguments(train, **DEFAULTS["train"], output_dir="keras_vit_run")
    _add_training_options(train)
    train.set_defaults(run=run, needs=NEEDS)

    finetune = command(
        "finetune",
        help="fine-tune a checkpoint (optionally at a higher resolution), evaluate, save",
        description=(
            "Fine-tunes a checkpoint (a model.keras of an earlier run, an official "
            ".npz, a Hugging Face or timm .safetensors) on a dataset: position "
            "embeddings resampled to --image-size; for another class count a new "
            "head, fitted first on the frozen model's features, then every weight "
            "trained at a small AdamW rate (--recipe paper_finetune: the paper's "
            "SGD). Same outputs and resume as `keras-vit train`."
        ),
    )
    finetune.add_argument(
        "weights",
        metavar="CHECKPOINT",
        help="a .keras file, an official .npz, a Hugging Face or timm file",
    )
    add_run_arguments(finetune, **DEFAULTS["finetune"], output_dir="keras_vit_finetune")
    _add_training_options(finetune)
    finetune.set_defaults(run=run, needs=NEEDS)


def _add_training_options(parser):
    parser.add_argument(
        "--patch-dropout",
        type=fraction,
        default=None,
        metavar="RATE",
        help="train on a random share 1 - RATE of each image's patch tokens "
        "(cheaper steps at high resolution; evaluation sees all)",
    )
    parser.add_argument(
        "--layer-decay",
        type=decay_factor,
        default=None,
        metavar="FACTOR",
        help="layer-wise learning-rate decay in (0, 1]: block i of L trains at "
        "FACTOR**(L-i) of the rate, the embedding lowest, the head at the full rate "
        "(default: the recipe's, 1 for every recipe)",
    )
    parser.add_argument(
        "--ema",
        type=fraction,
        default=None,
        metavar="MOMENTUM",
        help="validate, report and save an exponential moving average of the weights, "
        "MOMENTUM in (0, 1) its weight at each step, e.g. 0.99 (default: the recipe's, "
        "none for every recipe)",
    )
    parser.add_argument(
        "--teacher",
        default=None,
        metavar="PATH",
        help="a .keras classifier of the same images and classes (a CNN, a ViT) to learn "
        "from besides the labels (DeiT's distillation); it is never trained, and "
        "model.keras is the student alone",
    )
    parser.add_argument(
        "--distillation",
        choices=("hard", "soft"),
        default=None,
        help="with --teacher: learn its top class (hard, the default) or its softmax "
        "at --temperature (soft)",
    )
    parser.add_argument(
        "--distillation-token",
        action="store_true",
        help="with --teacher: a DeiT distillation token and second head learn the "
        "teacher, the class head the labels; inference averages both",
    )
    parser.add_argument(
        "--temperature",
        type=positive_float,
        default=1.0,
        help="with --distillation soft: the softmax temperature (default 1)",
    )
    parser.add_argument(
        "--remat",
        action="store_true",
        help="recompute each block's activations in the backward pass instead of keeping "
        "them (gradient checkpointing): less memory per step for about a third more compute",
    )


def run(args):
    """Trains (or, with a checkpoint, fine-tunes) a ViT and saves the run."""
    from keras_vit.training import train

    weights = getattr(args, "weights", None)
    try:
        check_writable(args.output_dir, "--output-dir", folder=True)
        result = train(
            args.dataset,
            model=getattr(args, "model", "small"),
            image_size=args.image_size,
            patch_size=getattr(args, "patch_size", None),
            epochs=args.epochs,
            batch_size=args.batch_size,
            recipe=args.recipe,
            augmentation=args.augmentation,
            output_dir=args.output_dir,
            seed=args.seed,
            data_dir=args.data_dir,
            overwrite=args.overwrite,
            weights=weights,
            distribute=args.distribute,
            model_parallel=args.model_parallel,
            gradient_accumulation_steps=args.accumulate,
            patch_dropout_rate=args.patch_dropout,
            layer_decay=args.layer_decay,
            ema_momentum=args.ema,
            remat=args.remat,
            teacher=args.teacher,
            distillation=args.distillation,
            distillation_token=args.distillation_token,
            temperature=args.temperature,
            validate_every=args.validate_every,
            deterministic=args.deterministic,
            validation_split=args.validation_split,
            download=args.download,
            limit=args.limit,
            verbose=progress(),
        )
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
