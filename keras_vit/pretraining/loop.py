"""The `keras-vit pretrain` job: self-supervision on a dataset's images, with resume.

A run writes into its output folder `model.keras` (the pre-training model:
encoder, and the objective's `[mask]` embedding and head or decoder),
`history.csv`, `learning_curves.png` and `metrics.json`, and while it runs
`backup/` (the same crash-safe checkpoints as `keras-vit train`; the same
command continues an interrupted run). `keras-vit finetune
OUTPUT_DIR/model.keras --dataset DATASET` then trains a classifier from the
encoder.
"""

from keras_vit.training.run import cleans_up_failed_output_dir

# MAE's decoder for the small models (its paper's is 512 wide, 8 deep,
# 16 heads, for encoders of width 768 and more).
SMALL_DECODER = dict(decoder_dim=64, decoder_depth=2, decoder_heads=4)


@cleans_up_failed_output_dir
def pretrain(
    dataset="fashion_mnist",
    *,
    objective="mpp",
    objective_options=None,
    model="small/4",
    image_size=None,
    patch_size=None,
    epochs=10,
    batch_size=128,
    recipe="small",
    augmentation="none",
    output_dir="keras_vit_pretrain",
    seed=0,
    data_dir=None,
    download=False,
    overwrite=False,
    gradient_accumulation_steps=None,
    deterministic=False,
    limit=None,
    verbose=2,
    log=print,
):
    """Pre-trains a ViT encoder without labels and writes the run's outputs.

    Args:
        dataset: `"fashion_mnist"`, an image folder or a TFDS name (its
            training images; labels are not used).
        objective: `"mpp"` (the paper's masked patch prediction), `"mae"`,
            or an objective object (`keras_vit.pretraining.MaskedPatchPrediction`, ...).
        objective_options: dict of the objective's options (e.g.
            `{"target": "color_grid"}`, `{"mask_ratio": 0.75}`); MAE's
            decoder defaults to `SMALL_DECODER` for the small models.
        model: `"small/4"` (a small ViT on 4x4 pixel patches) or a variant
            name (`"Ti/16"`, ...); models with a convolutional stem are refused.
        image_size, patch_size, epochs, batch_size, recipe, augmentation,
            output_dir, seed, data_dir, download, overwrite,
            gradient_accumulation_steps, deterministic, limit, verbose, log:
            as `keras_vit.training.train`.

    Returns:
        dict of the metrics (last epoch's loss, timings) and output paths.
    """
    import keras_vit
    from keras_vit import data as vit_data
    from keras_vit.data.augmentation import batch_augmentation
    from keras_vit.data.pipelines import check_limit
    from keras_vit.pretraining.objectives import get_objective
    from keras_vit.training.loop import SMALL_MODELS, check_image_size, model_arguments
    from keras_vit.training.run import Run, check_dataset_source, dataset_reference

    # Every argument is checked before any data is read or model built.
    run = Run(
        "pretrain",
        output_dir=output_dir,
        overwrite=overwrite,
        epochs=epochs,
        batch_size=batch_size,
        recipe=recipe,
        augmentation=augmentation,
        seed=seed,
        deterministic=deterministic,
        log=log,
    )
    recipe = run.recipe
    check_limit(limit)
    options = dict(objective_options or {})
    if objective == "mae" and model in SMALL_MODELS:
        options = {**SMALL_DECODER, **options}
    try:
        objective = get_objective(objective, **options)
    except TypeError as error:  # an option the objective does not have
        raise ValueError(f"objective_options={options!r}: {error}") from None
    arguments = model_arguments(model, patch_size)
    if arguments.get("stem_filters"):
        raise ValueError(
            f"model={model!r} has a convolutional stem, whose receptive field crosses "
            "patch borders and would show the encoder the pixels it must predict; "
            "pre-train 'small/4' or a variant of the paper."
        )
    image_size = image_size or (28 if model in SMALL_MODELS else 224)
    check_image_size(image_size, arguments["patch_size"])
    channels = 1 if (dataset == "fashion_mnist" and model in SMALL_MODELS) else 3
    check_dataset_source(dataset)
    run.open(
        {
            "dataset": dataset_reference(dataset),
            "data_dir": data_dir,
            "objective": objective.name if hasattr(objective, "name") else type(objective).__name__,
            "objective_options": options,
            "model": model,
            "image_size": image_size,
            "patch_size": patch_size,
            "gradient_accumulation_steps": gradient_accumulation_steps,
            "limit": limit,
        }
    )
    common = run.data_options(image_size, channels, data_dir, download)
    train_data = vit_data.load(
        dataset,
        "train",
        training=True,
        crop_scale=run.training_crop(dataset),
        flip=True,
        augmentation=batch_augmentation(augmentation, seed),
        batch_size=batch_size,
        limit=limit,
        **common,
    )
    steps_per_epoch = run.steps_per_epoch(train_data, dataset)
    encoder = keras_vit.VisionTransformer(
        **{**arguments, "pooling": None},
        include_top=False,
        input_shape=(image_size, image_size, channels),
        data_format="channels_last",  # the pipelines' images, whatever Keras' default
        dropout_rate=recipe.dropout_rate,
        drop_path_rate=recipe.drop_path_rate,
        seed=seed,
        name="encoder",
    )
    network = objective.build(encoder)
    recipe.compile(
        network,
        total_steps=steps_per_epoch * epochs,
        gradient_accumulation_steps=gradient_accumulation_steps,
        **objective.compile_arguments(),
    )
    log(
        f"data: {dataset} ({train_data.size} images, labels unused) at "
        f"{image_size}x{image_size}x{channels}"
    )
    log(
        f"objective: {objective}; encoder: {model} ViT, {encoder.count_params():,} "
        f"parameters ({network.count_params():,} with the objective's parts); recipe: {recipe}"
    )
    history = run.fit(network, objective.batches(train_data.data, network, seed), verbose=verbose)
    last = {key: float(values[-1]) for key, values in history.history.items() if values}
    return run.finish(
        network,
        {
            **last,
            "objective": type(objective).__name__,
            "encoder_parameters": encoder.count_params(),
        },
    )
