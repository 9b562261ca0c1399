"""The `keras-vit train` job: check, data, model, fit, finish.

Its run (folder, resume, seeding, outputs) is a `keras_vit.training.run.Run`;
besides the common outputs it writes `class_names.json` (and with LoRA
`model.lora.h5`, the adapters). Its settings are a
`TrainingSettings`.
"""

import dataclasses
import json
import math
import os
import typing

from keras_vit import _options
from keras_vit.models import layouts, lora
from keras_vit.models.parts import default_arguments, encoder_pooling
from keras_vit.models.variants import SMALL_MODEL, SMALL_MODELS  # noqa: F401 (re-exported)
from keras_vit.training.model_names import (
    check_image_size,
    default_channels,
    image_size_for,
    model_arguments,
    stem_strides,
)
from keras_vit.training.run import Run
from keras_vit.training.run_folder import removed_if_failed
from keras_vit.training.settings import (
    TrainingSettings,
    lora_targets,
    path_reference,
    settings_of,
)

OUTPUT_FILES = ("class_names.json", "model.lora.h5")  # beside a run's common ones
# Each job's defaults of the settings left unset (`TrainingSettings.JOB_DEFAULTS`).
DEFAULTS = {
    job: {k: v for k, v in defaults.items() if k != "output_dir"}
    for job, defaults in TrainingSettings.JOB_DEFAULTS.items()
}


def train(settings=None, /, *, verbose=2, log=print, **keywords):
    """Trains a ViT on a dataset and writes the run's outputs.

    With `weights`, fine-tunes instead: the model is the checkpoint's
    (`keras_vit.from_checkpoint`: a `.keras` file of an earlier run, an
    official `.npz`, a Hugging Face or timm file), moved to `image_size`
    (position embeddings resampled) with a new zero head when the dataset
    has another class count. Every setting is checked before any data is
    read or model built; a fine-tune reads its checkpoint once.

    Args:
        settings: a `TrainingSettings`, or the dataset (its first field:
            `"fashion_mnist"`, an image folder with `train/` and `test/`
            sub-folders of one folder per class, or with `validation_split`
            `train/` alone or the class folders at the top; or a TFDS name).
        verbose: Keras progress verbosity.
        log: function that prints a line.
        **keywords: `TrainingSettings` fields (each is an option of
            `keras-vit train`; its help says what it does), e.g. `model`
            (`"small"` or a variant name), `image_size` (default 28 for the
            small models, 224 for variants, a fine-tune's checkpoint's),
            `epochs` and `batch_size` (`DEFAULTS["train"]`: 9, 128; with
            `weights`, `DEFAULTS["finetune"]`: 3, 32), `recipe` (a name in
            `keras_vit.training.RECIPES` or a `Recipe`; `"small"`, with
            `weights` `"finetune"`: the new head fitted on the frozen
            features first, then AdamW at 3e-5), `weights`, `lora` (a rank:
            low-rank adapters on the frozen encoder's `lora_target`
            projections, trained with the head; `model.keras` is then the
            merged model and `model.lora.h5` the adapters), `teacher`,
            `distribute` (`batch_size` is then the global batch; in a
            multi-worker run the chief writes `output_dir`, worker N
            `output_dir/workers/N`), `overwrite`, `deterministic` (a run
            killed and resumed any number of times ends with the weights of
            an uninterrupted one).

    Returns:
        dict of the test metrics, timings and output paths.

    Example:

    ```python
    result = keras_vit.training.train("photos/", model="Ti/16", image_size=64, epochs=5)
    result["metrics"]["test_accuracy"]
    ```
    """
    from keras_vit.weights import reading_once

    settings = settings_of(TrainingSettings, settings, keywords).resolved()
    with removed_if_failed(settings.output_dir):
        with reading_once():  # a fine-tune's checkpoint: its architecture, then its weights
            job = _check(settings, log)
            data = _data(job)
            network, trained = _model(job, data)
        history = _fit(job, data, network, trained, verbose)
        return _finish(job, data, network, trained, history, verbose)


class _Job(typing.NamedTuple):
    """What the check step settles for the others."""

    settings: TrainingSettings  # resolved, with the run's image size
    run: Run
    recipe: object  # the `Recipe`, with the settings' overrides
    architecture: dict  # the model's (a fine-tune's: its checkpoint's)
    channels: int
    plan: object  # the `keras_vit.distribution` engine
    teacher: object  # the frozen teacher model, or None


def _check(settings, log):
    """Every setting checked, alone and together, then the run's folder opened."""
    from keras_vit.data.sources import check_training_layout
    from keras_vit.distribution import distribute as distribute_engine

    run = Run(settings, log=log, output_files=OUTPUT_FILES)  # each setting on its own
    recipe = _recipe(settings, run.recipe)
    _check_distillation(settings)
    for argument in ("weights", "teacher"):
        _check_not_replaced(getattr(settings, argument), settings.output_dir, argument)
    architecture, settings, channels = _architecture(settings)
    _check_distillation_token(settings, architecture)
    _check_lora(settings, architecture)
    _check_qat(settings, architecture)
    check_training_layout(settings.dataset, settings.validation_split)
    teacher = None
    if settings.teacher is not None:
        from keras_vit.training.distillation import check_teacher, load_teacher

        teacher = load_teacher(settings.teacher)
        # Its images now, its classes once the data's are known: both before training.
        size = settings.image_size
        check_teacher(teacher, (size, size, channels), name=_teacher_name(settings))
    # Before any TensorFlow computation: MultiWorkerMirroredStrategy must be
    # created first in the process.
    plan = distribute_engine(
        settings.distribute, model_parallel=settings.model_parallel, model=architecture
    )
    worker_dir = None
    if not plan.is_chief:
        worker_dir = os.path.join(settings.output_dir, "workers", str(plan.worker_index))
    run.open(settings, output_dir=worker_dir)
    return _Job(settings, run, recipe, architecture, channels, plan, teacher)


def _recipe(settings, recipe):
    """The recipe with the settings that change it (a `Recipe` checks its own fields)."""
    changes = {
        name: getattr(settings, name)
        for name in ("patch_dropout_rate", "layer_decay", "ema_momentum")
        if getattr(settings, name) is not None
    }
    if "patch_dropout_rate" in changes:
        changes["patch_dropout_rate"] = float(changes["patch_dropout_rate"])
    recipe = dataclasses.replace(recipe, **changes) if changes else recipe
    if settings.qat is not None:
        return recipe.for_qat()
    return recipe.for_lora() if settings.lora is not None else recipe


def _architecture(settings):
    """`(architecture, settings with the image size, channels)`: the model's or the checkpoint's."""
    if settings.weights is not None:
        from keras_vit.models import checkpoint_architecture

        architecture = checkpoint_architecture(settings.weights, argument="weights")
        if settings.patch_size is not None:
            raise ValueError(
                "A fine-tuned model keeps its checkpoint's patch size. "
                f"Received: {_options.given('patch_size', settings.patch_size)}"
            )
        image_size = settings.image_size or architecture["input_shape"][0]
        channels = architecture["input_shape"][-1]
        patch_size = architecture["patch_size"]
    else:
        architecture = model_arguments(settings.model, settings.patch_size)
        image_size = settings.image_size or image_size_for(settings.model)
        channels = default_channels(settings.dataset, settings.model)
        patch_size = architecture["patch_size"]
    check_image_size(image_size, patch_size, stem_strides(architecture))
    return architecture, dataclasses.replace(settings, image_size=image_size), channels


def _check_distillation(settings):
    """The settings of distillation: with a teacher, checked; without, left at their defaults."""
    from keras_vit.training.distillation import check_options, check_teacher_path

    if settings.teacher is None:
        defaults = TrainingSettings()
        for name in ("distillation", "distillation_token", "temperature"):
            value = getattr(settings, name)
            if value != getattr(defaults, name):
                raise ValueError(
                    f"{_options.name(name)} is a setting of distillation and needs a "
                    f"{_options.name('teacher')}. Received: {_options.given(name, value)}, "
                    "teacher=None"
                )
        return
    check_teacher_path(settings.teacher)
    check_options(settings.distillation, settings.temperature, mode_argument="distillation")
    if settings.distillation == "hard" and settings.temperature != 1.0:
        raise ValueError(
            f"{_options.name('temperature')} softens the teacher's predictions for "
            f"{_options.given('distillation', 'soft')}; hard distillation takes its top class. "
            f"Received: {_options.given('temperature', settings.temperature)}"
        )
    if settings.distribute is not None:
        raise ValueError(
            f"Distillation trains on one device: {_options.name('teacher')} with "
            f"{_options.name('distribute')} is not supported. Received: "
            f"{_options.given('teacher', settings.teacher)}, "
            f"{_options.given('distribute', settings.distribute)}"
        )


def _check_distillation_token(settings, architecture):
    """The distillation token sits beside a class token whose head pools it: a model with one."""
    if not settings.distillation_token:
        return
    if architecture.get("class_token") and architecture.get("pooling") in ("token", None):
        return
    which = (
        f"the checkpoint {_options.given('weights', settings.weights)}"
        if settings.weights is not None
        else _options.given("model", settings.model)
    )
    raise ValueError(
        f"{_options.name('distillation_token')} needs a model with a class token that its "
        f"head pools (DeiT's); {which} has "
        + (
            "none"
            if not architecture.get("class_token")
            else f"pooling={architecture['pooling']!r}"
        )
        + f". Use {_options.given('model', 'small/4')} (the small ViT with a class token) or a "
        "variant of the paper, e.g. Ti/16."
    )


def _check_lora(settings, architecture):
    """`lora_target` and `lora_base` with a rank; a rank that fits each adapted projection."""
    if settings.lora is None:
        for name, purpose in (
            ("lora_target", "chooses the projections that LoRA adapts"),
            ("lora_base", "chooses how LoRA's frozen encoder is stored"),
        ):
            if getattr(settings, name) is not None:
                raise ValueError(
                    f"{_options.name(name)} {purpose} and needs a rank, "
                    f"{_options.name('lora')}. Received: "
                    f"{_options.given(name, getattr(settings, name))} without "
                    f"{_options.name('lora')}"
                )
        return
    lora.check_rank_fits(
        settings.lora,
        lora_targets(settings.lora_target),
        architecture["hidden_dim"],
        architecture["mlp_dim"],
        "lora",
    )


def _check_qat(settings, architecture):
    """Quantization-aware training: of a float model of the plain layout, alone."""
    if settings.qat is None:
        return
    given = _options.given("qat", settings.qat)
    if settings.weights is None:
        raise ValueError(
            f"{given} fine-tunes a float model for LiteRT: name it (a fine-tuned .keras, or a "
            f"checkpoint) with {_options.name('weights')}."
        )
    for other in ("lora", "teacher"):
        if getattr(settings, other) is not None:
            raise ValueError(
                f"{given} trains every weight with LiteRT's rounding; it does not combine with "
                f"{_options.given(other, getattr(settings, other))}."
            )
    # The fine-tuned model: the file's, with a head (a new one on an encoder's file).
    layout = {
        **architecture,
        "include_top": True,
        "pooling": architecture.get("pooling")
        or encoder_pooling(architecture.get("class_token", default_arguments()["class_token"])),
    }
    unsupported = layouts.qat_unsupported(layout)
    if unsupported:
        raise ValueError(
            f"{given} simulates the plain ViT layout (patches of pixels, learned position "
            f"embeddings, class-token or average pooling, a linear head); "
            f"{settings.weights!r} has {layouts.described(unsupported)}."
        )


def _teacher_name(settings):
    return f"The teacher {str(settings.teacher)!r}"


def _check_not_replaced(path, output_dir, argument):
    """Refuses an input file that the run would write over (its `model.keras`)."""
    if path is None or not os.path.isfile(os.fspath(path)):
        return
    written = os.path.join(output_dir, "model.keras")
    if os.path.exists(written) and os.path.samefile(path, written):
        raise ValueError(
            f"{_options.name(argument)} {os.fspath(path)!r} is the model this run writes in "
            f"{_options.given('output_dir', output_dir)}: it would be replaced. Copy it "
            f"elsewhere or choose another {_options.name('output_dir')}."
        )


class _Data(typing.NamedTuple):
    train: object  # `keras_vit.data.Dataset` of the training batches
    test: object  # of the test batches, or None (a TFDS dataset without a test split)
    options: dict  # the pipelines' common options
    steps_per_epoch: int


def _data(job):
    """The training pipeline (over the replicas), the test pipeline, the steps per epoch."""
    from keras_vit import data as vit_data

    settings, run = job.settings, job.run
    common = run.data_options(job.channels, validation_split=settings.validation_split)

    def training_data(batch, shard):
        return run.training_data(common, batch, shard)

    train_data = job.plan.dataset(training_data, settings.batch_size)
    try:
        test = vit_data.load(settings.dataset, "test", batch_size=settings.batch_size, **common)
    except (ValueError, RuntimeError):
        if os.path.isdir(str(settings.dataset)):
            raise  # a folder's layout was checked: this is a real error
        test = None  # a TFDS dataset without a test split
    size = settings.image_size
    run.log(
        f"data: {settings.dataset} ({train_data.size or '?'} training images, "
        f"{train_data.num_classes} classes) at {size}x{size}x{job.channels}"
    )
    if settings.distribute is not None:
        plan = job.plan
        run.log(
            f"distributed: {settings.distribute} parallel, {plan.num_replicas} replicas "
            f"({type(plan.engine).__name__}), worker {plan.worker_index + 1} of "
            f"{plan.num_workers}, global batch {settings.batch_size}"
        )
    if job.teacher is not None:
        from keras_vit.training.distillation import check_teacher

        check_teacher(
            job.teacher,
            (size, size, job.channels),
            train_data.num_classes,
            name=_teacher_name(settings),
        )
    return _Data(train_data, test, common, run.steps_per_epoch(train_data))


def _model(job, data):
    """`(network, trained)`: the ViT (the checkpoint's, for a fine-tune), and what `fit` trains.

    `trained` is the network, or with a teacher the `Distiller` around both;
    compiled with the recipe, inside the distribution's scope.
    """
    import keras_vit

    settings, recipe = job.settings, job.recipe
    size = settings.image_size
    options = dict(
        input_shape=(size, size, job.channels),
        data_format="channels_last",  # the pipelines' images, whatever Keras' default
        classes=data.train.num_classes,
        classifier_activation=None,
        dropout_rate=recipe.dropout_rate,
        drop_path_rate=recipe.drop_path_rate,
        patch_dropout_rate=recipe.patch_dropout_rate,
        remat=settings.remat,
        seed=settings.seed,
        name="vit",
    )
    if settings.distillation_token:
        options["distillation_token"] = True
    with job.plan.scope():
        if settings.weights is not None:
            if job.architecture["pooling"] is None:  # an encoder's tokens (pre-training)
                options["pooling"] = encoder_pooling(job.architecture["class_token"])
            network = keras_vit.from_checkpoint(settings.weights, include_top=True, **options)
            name = f"fine-tuned {os.path.basename(str(settings.weights))}"
        else:
            network = keras_vit.ViT(**job.architecture, **options)
            name = settings.model
        if settings.lora_base is not None:
            network.quantize(settings.lora_base, filters=lora.frozen_layer)
        if settings.lora is not None:
            network.enable_lora(settings.lora, target=lora_targets(settings.lora_target))
        if settings.qat is not None:
            network = _quantization_aware(job, data, network)
        trained = network
        if job.teacher is not None:
            from keras_vit.training.distillation import Distiller

            trained = Distiller(
                network,
                job.teacher,
                mode=settings.distillation,
                temperature=settings.temperature,
            )
        recipe.compile(
            trained,
            total_steps=data.steps_per_epoch * settings.epochs,
            gradient_accumulation_steps=settings.gradient_accumulation_steps,
        )
        job.plan.prepare(trained)
    job.run.log(f"model: {name} ViT, {network.count_params():,} parameters; recipe: {recipe}")
    if settings.lora is not None:
        trainable = _trainable_parameters(network)
        job.run.log(
            f"LoRA: rank {settings.lora} on {settings.lora_target.replace(',', ', ')} of every "
            f"block; {trainable:,} parameters trained "
            f"({trainable / network.count_params():.2%}: the adapters, their biases and the head)"
        )
    if job.teacher is not None:
        job.run.log(
            f"teacher: {settings.teacher} ({job.teacher.count_params():,} parameters, "
            f"frozen), {settings.distillation} distillation"
            + (", distillation token" if settings.distillation_token else "")
        )
    return network, trained


def _quantization_aware(job, data, network):
    """The QAT copy of the float `network` (its new head fitted first), ranges calibrated.

    Calibrated on the first training images (no augmentation); a resumed
    run's copy then takes every weight and range from its checkpoint.
    """
    import numpy as np

    from keras_vit.models.quantization_aware import (
        MIN_CALIBRATION_IMAGES,
        quantization_aware_copy,
    )

    _fit_new_heads(job, data, network)
    batches, count = [], 0
    for images, _ in _training_images(job, data):
        batches.append(np.asarray(images))
        count += len(batches[-1])
        if count >= CALIBRATION_IMAGES:
            break
    calibration = np.concatenate(batches)[:CALIBRATION_IMAGES]
    if len(calibration) < MIN_CALIBRATION_IMAGES:
        raise ValueError(
            f"{_options.given('qat', job.settings.qat)} calibrates its ranges on at least "
            f"{MIN_CALIBRATION_IMAGES} training images; {job.settings.dataset!r} has "
            f"{len(calibration)}."
        )
    copy = quantization_aware_copy(network, job.settings.qat, calibration)
    job.run.log(
        f"quantization-aware: LiteRT {job.settings.qat} simulated (its residual stream "
        f"rotated, norms folded), ranges calibrated on {len(calibration)} training images"
    )
    return copy


# The training images that set a quantization-aware run's first ranges.
CALIBRATION_IMAGES = 256


def _training_images(job, data, **options):
    from keras_vit import data as vit_data

    settings = job.settings
    return vit_data.load(
        settings.dataset,
        "train",
        batch_size=settings.batch_size,
        limit=settings.limit,
        **data.options,
        **options,
    ).data


def _fit_new_heads(job, data, network):
    """A fine-tune's new head, fitted on the frozen features (not on resuming), once."""
    settings = job.settings
    if settings.weights is None or not job.recipe.head_first or job.run.resuming:
        return
    from keras_vit.training.finetuning import fit_new_heads

    with job.plan.scope():
        fit_new_heads(network, _training_images(job, data), log=job.run.log)


def _fit(job, data, network, trained, verbose):
    """A fine-tune's new head first (not on resuming), then `fit` with checkpoints."""
    settings = job.settings
    if settings.qat is None:  # (a quantization-aware run's was fitted before its copy)
        _fit_new_heads(job, data, network)

    def statistics_data():
        # Every training image alike (no crop, flip or mixing), in one
        # shuffled order each time; the same images on every worker.
        return _training_images(job, data, training=True, crop_scale=None, flip=False)

    with job.plan.scope():
        return job.run.fit(
            trained,
            data.train.data,
            validation_data=data.test.data if data.test is not None else None,
            validation_freq=settings.validate_every or settings.epochs,
            statistics_data=statistics_data,
            verbose=verbose,
        )


def _finish(job, data, network, trained, history, verbose):
    """The test metrics (the last validation's, else an evaluation), class names, the files."""
    from keras_vit.training.backup import replace_atomically

    settings = job.settings
    epochs, validation_freq = settings.epochs, settings.validate_every or settings.epochs
    metrics = {}
    if data.test is not None:
        logs = history.history
        if epochs % validation_freq == 0 and history.epoch and history.epoch[-1] == epochs - 1:
            results = {k[len("val_") :]: v[-1] for k, v in logs.items() if k.startswith("val_")}
        else:
            with job.plan.scope():
                results = trained.evaluate(data.test.data, verbose=verbose, return_dict=True)
        # `loss` includes the recipe's label smoothing; `cross_entropy` does not.
        metrics = {f"test_{name}": float(value) for name, value in results.items()}

    def write_class_names(path):
        with open(path, "w") as f:
            json.dump(list(data.train.class_names), f)

    replace_atomically(job.run.paths["class_names.json"], write_class_names)
    saved = network
    if settings.lora is not None:
        from keras_vit.models.lora import merge_lora

        replace_atomically(job.run.paths["model.lora.h5"], network.save_lora_weights)
        # model.keras is the plain model (the adapters' optimizer state would
        # not load into it).
        saved = merge_lora(network)
    metrics.update(
        parameters=saved.count_params(),
        trainable_parameters=_trainable_parameters(network),
        distribute=settings.distribute,
        replicas=job.plan.num_replicas,
    )
    return job.run.finish(saved, metrics)


def _trainable_parameters(network):
    return int(sum(math.prod(variable.shape) for variable in network.trainable_weights))


# How a run records a file or folder (`run.json`).
dataset_reference = path_reference
