"""The `keras-vit pretrain` job: self-supervision on a dataset's images, with resume.

A run writes into its output folder `model.keras` (the pre-training model:
encoder, and the objective's `[mask]` embedding and head or decoder),
`history.csv`, `learning_curves.png` and `metrics.json`, and while it runs
`backup/` (the same crash-safe checkpoints as `keras-vit train`; the same
command continues an interrupted run). `keras-vit finetune
OUTPUT_DIR/model.keras --dataset DATASET` then trains a classifier from the
encoder. Its steps are the train job's (check, data, model, fit, finish);
its settings a `PretrainingSettings`.
"""

import dataclasses

from keras_vit import _options
from keras_vit.pretraining.settings import SMALL_DECODER, PretrainingSettings  # noqa: F401
from keras_vit.training.model_names import (
    check_image_size,
    default_channels,
    image_size_for,
    model_arguments,
)
from keras_vit.training.run import Run
from keras_vit.training.run_folder import removed_if_failed
from keras_vit.training.settings import settings_of


def pretrain(settings=None, /, *, verbose=2, log=print, **keywords):
    """Pre-trains a ViT encoder without labels and writes the run's outputs.

    Args:
        settings: a `PretrainingSettings`, or the dataset (its first field:
            `"fashion_mnist"`, an image folder or a TFDS name; its training
            images, labels unused).
        verbose: Keras progress verbosity.
        log: function that prints a line.
        **keywords: `PretrainingSettings` fields: `objective` (`"mpp"`, the
            paper's masked patch prediction, `"mae"`, or an objective
            object: `keras_vit.pretraining.MaskedPatchPrediction`, ...),
            `objective_options` (e.g. `{"target": "color_grid"}`,
            `{"mask_ratio": 0.75}`; MAE's decoder defaults to `SMALL_DECODER`
            for the small models), `model` (`"small/4"`, a small ViT on 4x4
            pixel patches, or a variant name; models with a convolutional
            stem are refused), and those of `keras_vit.training.train`
            (`image_size`, `epochs`, `batch_size`, `recipe`, `output_dir`, ...).

    Returns:
        dict of the metrics (last epoch's loss, timings) and output paths.

    Example:

    ```python
    result = keras_vit.pretraining.pretrain("fashion_mnist", objective="mae", epochs=2)
    ```
    """
    settings = settings_of(PretrainingSettings, settings, keywords).resolved()
    with removed_if_failed(settings.output_dir):
        run, objective, architecture, channels = _check(settings, log)
        train_data = _data(run, channels)
        network, encoder = _model(run, objective, architecture, channels, train_data)
        history = run.fit(
            network, objective.batches(train_data.data, network, run.settings.seed), verbose=verbose
        )
        last = {key: float(values[-1]) for key, values in history.history.items() if values}
        return run.finish(
            network,
            {
                **last,
                "objective": type(objective).__name__,
                "encoder_parameters": encoder.count_params(),
            },
        )


def _check(settings, log):
    """Every setting checked, then the run's folder opened."""
    from keras_vit.data.sources import check_source
    from keras_vit.pretraining.objectives import get_objective

    run = Run(settings, log=log)
    options = settings.objective_options
    try:
        objective = get_objective(settings.objective, **options)
    except TypeError as error:  # an option the objective does not have
        raise ValueError(f"objective_options={options!r}: {error}") from None
    architecture = model_arguments(settings.model, settings.patch_size)
    if architecture.get("stem_filters"):
        raise ValueError(
            f"{_options.given('model', settings.model)} has a convolutional stem, whose "
            "receptive field crosses patch borders and would show the encoder the pixels it "
            "must predict; pre-train 'small/4' or a variant of the paper."
        )
    image_size = settings.image_size or image_size_for(settings.model)
    check_image_size(image_size, architecture["patch_size"])
    check_source(settings.dataset)
    settings = dataclasses.replace(settings, image_size=image_size)
    run.open(settings)
    return run, objective, architecture, default_channels(settings.dataset, settings.model)


def _data(run, channels):
    """The training images (their labels unused)."""
    return run.training_data(run.data_options(channels))


def _model(run, objective, architecture, channels, train_data):
    """`(network, encoder)`: the objective's model around a new encoder, compiled."""
    import keras_vit

    settings, recipe = run.settings, run.recipe
    steps_per_epoch = run.steps_per_epoch(train_data)
    size = settings.image_size
    encoder = keras_vit.ViT(
        **{**architecture, "pooling": None},
        include_top=False,
        input_shape=(size, size, channels),
        data_format="channels_last",  # the pipelines' images, whatever Keras' default
        dropout_rate=recipe.dropout_rate,
        drop_path_rate=recipe.drop_path_rate,
        seed=settings.seed,
        name="encoder",
    )
    network = objective.build(encoder)
    recipe.compile(
        network,
        total_steps=steps_per_epoch * settings.epochs,
        gradient_accumulation_steps=settings.gradient_accumulation_steps,
        **objective.compile_arguments(),
    )
    run.log(
        f"data: {settings.dataset} ({train_data.size} images, labels unused) at "
        f"{size}x{size}x{channels}"
    )
    run.log(
        f"objective: {objective}; encoder: {settings.model} ViT, {encoder.count_params():,} "
        f"parameters ({network.count_params():,} with the objective's parts); recipe: {recipe}"
    )
    return network, encoder
