"""`keras-vit pretrain`: self-supervised pre-training (masked patch prediction or MAE)
of a ViT encoder.
"""

from keras_vit.cli.common import (
    TRAINING,
    add_run_arguments,
    check_writable,
    fail,
    fraction,
    positive_int,
    progress,
)

NEEDS = TRAINING


def add_parser(command):
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
    pretrain.add_argument(
        "--objective",
        choices=("mpp", "mae"),
        default="mpp",
        help="masked patch prediction (the paper's) or MAE",
    )
    pretrain.add_argument(
        "--model", default="small/4", help="'small/4' or a variant of the paper, e.g. Ti/16"
    )
    pretrain.add_argument(
        "--patch-size",
        type=positive_int,
        default=None,
        help="patch size in pixels (default: the model's)",
    )
    pretrain.add_argument(
        "--target",
        choices=("mean_color", "color_grid", "pixels"),
        default="mean_color",
        help="mpp: what to predict per corrupted patch",
    )
    pretrain.add_argument(
        "--corruption-rate", type=fraction, default=0.5, help="mpp: fraction of patches corrupted"
    )
    pretrain.add_argument(
        "--mask-ratio", type=fraction, default=0.75, help="mae: fraction of patches dropped"
    )
    pretrain.add_argument(
        "--decoder-dim", type=positive_int, default=None, help="mae decoder width"
    )
    pretrain.add_argument(
        "--decoder-depth", type=positive_int, default=None, help="mae decoder blocks"
    )
    pretrain.add_argument(
        "--decoder-heads", type=positive_int, default=None, help="mae decoder heads"
    )
    add_run_arguments(
        pretrain,
        epochs=10,
        batch_size=128,
        recipe="small",
        output_dir="keras_vit_pretrain",
        distributed=False,
    )
    pretrain.set_defaults(run=run, needs=NEEDS)


def run(args):
    """Pre-trains a ViT encoder without labels and saves the run."""
    from keras_vit.pretraining import pretrain

    if args.objective == "mpp":
        options = {"target": args.target, "corruption_rate": args.corruption_rate}
    else:
        options = {"mask_ratio": args.mask_ratio}
        options.update(
            {
                key: value
                for key, value in (
                    ("decoder_dim", args.decoder_dim),
                    ("decoder_depth", args.decoder_depth),
                    ("decoder_heads", args.decoder_heads),
                )
                if value is not None
            }
        )
    try:
        check_writable(args.output_dir, "--output-dir", folder=True)
        result = pretrain(
            args.dataset,
            objective=args.objective,
            objective_options=options,
            model=args.model,
            image_size=args.image_size,
            patch_size=args.patch_size,
            epochs=args.epochs,
            batch_size=args.batch_size,
            recipe=args.recipe,
            augmentation=args.augmentation,
            output_dir=args.output_dir,
            seed=args.seed,
            data_dir=args.data_dir,
            download=args.download,
            overwrite=args.overwrite,
            gradient_accumulation_steps=args.accumulate,
            deterministic=args.deterministic,
            limit=args.limit,
            verbose=progress(),
        )
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
    """The `keras-vit finetune` command line for `model` on the data it was pre-trained on."""
    import shlex

    words = ["keras-vit", "finetune", model, "--dataset", args.dataset]
    if args.data_dir is not None:
        words += ["--data-dir", args.data_dir]
    return shlex.join(words + ["--recipe", "small"])
