"""The `keras-vit train` job: data, model, recipe, fit with resume, outputs.

Its run (folder, resume, seeding, outputs) is a `keras_vit.training.run.Run`;
besides the common outputs it writes `class_names.json`.
"""

import dataclasses
import json
import os

import numpy as np

from keras_vit.models.variants import SMALL_MODEL, SMALL_MODELS  # noqa: F401 (re-exported)
from keras_vit.training.run import (
    Run,
    check_dataset_source,
    cleans_up_failed_output_dir,
    dataset_reference,
    path_reference,
)

OUTPUT_FILES = ("class_names.json",)  # beside a run's common ones
# A run's defaults, the command's and `train`'s alike: from scratch (the main
# job: a small ViT on Fashion-MNIST), and fine-tuning a pretrained checkpoint,
# typically on a small dataset (small batches: a folder of a thousand images
# gives each epoch tens of steps).
DEFAULTS = {
    "train": dict(epochs=9, batch_size=128, recipe="small"),
    "finetune": dict(epochs=3, batch_size=32, recipe="finetune"),
}


def model_arguments(model, patch_size=None):
    """`VisionTransformer` architecture arguments for a model name.

    Args:
        model: `"small"` (the default of `keras-vit train`: a hybrid with
            a convolutional stem), `"small/4"` (the same width on 4x4 pixel
            patches, the default of `keras-vit pretrain`) or a variant of
            the paper's table (`"Ti/16"`, `"S/16"`, ...).
        patch_size: int or `None`, overrides the patch size.
    """
    from keras_vit.models import decode_variant

    if model in SMALL_MODELS:
        arguments = dict(SMALL_MODELS[model])
    else:
        arguments = dict(decode_variant(model), pooling="token", class_token=True)
    if patch_size is not None:
        arguments["patch_size"] = patch_size
    return arguments


def _stem_strides(arguments):
    filters = arguments.get("stem_filters") or ()
    return tuple(arguments.get("stem_strides") or (2,) * len(filters))


def check_image_size(image_size, patch_size, stem_strides=()):
    """A clear error unless `image_size` cuts into whole patches (after the stem, if any)."""
    from keras_vit.layers.conv_stem import stem_output_side

    if not isinstance(image_size, int) or isinstance(image_size, bool) or image_size < 1:
        raise ValueError(f"image_size={image_size!r} is not a positive int.")
    side = stem_output_side(image_size, stem_strides)
    if side % patch_size:
        if side == image_size:
            raise ValueError(
                f"image_size={image_size!r} is not a positive multiple of the patch size "
                f"{patch_size}."
            )
        raise ValueError(
            f"image_size={image_size!r} leaves a {side}-pixel feature map after the stem "
            f"(strides {tuple(stem_strides)}, each halving rounded up), not a multiple of "
            f"the patch size {patch_size}."
        )


def check_data_layout(dataset, validation_split):
    """Refuses, before any data is read, a folder without test images and no held-out split."""
    from keras_vit import data as vit_data

    folder = os.path.isdir(str(dataset)) and dataset != "fashion_mnist"
    if validation_split is not None:
        vit_data.held_out_split(np.zeros(2), validation_split)  # the value, checked
        if not folder:
            raise ValueError(
                "`validation_split` holds out images of an image folder; "
                f"{dataset!r} is not one. Received: validation_split={validation_split!r}"
            )
        if vit_data.folder_layout(dataset)["test"] is not None:
            # Either choice would leave some of the user's images out silently.
            raise ValueError(
                f"{dataset!r} has a test/ folder, its own test images; `validation_split` "
                "is for a folder without one. Leave out `validation_split` to test on test/. "
                f"Received: validation_split={validation_split!r}"
            )
        return
    if folder:
        layout = vit_data.folder_layout(dataset)
        if layout["test"] is None or layout["train"] is None and not layout["flat"]:
            raise ValueError(vit_data.pipelines.folder_layout_error(dataset, layout))


@cleans_up_failed_output_dir
def train(
    dataset="fashion_mnist",
    *,
    model="small",
    image_size=None,
    patch_size=None,
    epochs=None,
    batch_size=None,
    recipe=None,
    augmentation="none",
    output_dir="keras_vit_run",
    seed=0,
    data_dir=None,
    overwrite=False,
    weights=None,
    distribute=None,
    model_parallel=2,
    gradient_accumulation_steps=None,
    patch_dropout_rate=None,
    layer_decay=None,
    ema_momentum=None,
    remat=False,
    teacher=None,
    distillation=None,
    distillation_token=False,
    temperature=1.0,
    validate_every=None,
    deterministic=False,
    validation_split=None,
    download=False,
    limit=None,
    verbose=2,
    log=print,
):
    """Trains a ViT on a dataset and writes the run's outputs.

    With `weights`, fine-tunes instead: the model is the checkpoint's
    (`keras_vit.from_checkpoint`: a `.keras` file of an earlier
    run, an official `.npz`, a Hugging Face or timm file), moved to
    `image_size` (position embeddings resampled) with a new zero head when
    the dataset has another class count.

    Args:
        dataset: `"fashion_mnist"`, an image folder (with `train/` and
            `test/` sub-folders of one folder per class; or, with
            `validation_split`, `train/` alone or the class folders at the
            top), or a TFDS name.
        model: `"small"` or a variant name (`"Ti/16"`, ...).
        image_size: int; defaults to 28 for the small models (Fashion-MNIST's
            size, whatever the data), 224 for variants, and with `weights`
            to the checkpoint's.
        patch_size: int, overrides the model's patch size.
        epochs, batch_size, seed: training length, batch, determinism;
            `epochs` and `batch_size` default to `DEFAULTS["train"]` (9, 128)
            or, with `weights`, `DEFAULTS["finetune"]` (3, 32).
        recipe: a name in `keras_vit.training.RECIPES` or a `Recipe`;
            defaults to `"small"`, with `weights` to `"finetune"` (the new
            head fitted on the frozen features first, then AdamW at 3e-5).
        augmentation: a preset in `keras_vit.data.augmentation.PRESETS`.
        output_dir: folder for the outputs (and the resume backup).
        data_dir: TFDS data folder.
        overwrite: replace a finished run in `output_dir`, or start over
            an unfinished one whose settings differ (with its own settings
            it resumes either way).
        weights: `None` (train from scratch) or a checkpoint to fine-tune;
            `model` and `patch_size` then come from it.
        distribute: `None` (one device), `"data"` or `"model"` (see
            `keras_vit.distribution.distribute`); `batch_size` is then the
            global batch over all replicas. In a multi-worker run the
            chief writes `output_dir`, worker N `output_dir/workers/N`.
        model_parallel: devices per model copy for `distribute="model"`.
        gradient_accumulation_steps: `None` or an int >= 2: update the
            weights every this many batches (an effective batch of
            `batch_size` times this).
        patch_dropout_rate: `None` (the recipe's) or a float in `[0, 1)`:
            the share of each image's patch tokens that training drops
            before the Transformer blocks (`keras_vit.layers.PatchDropout`):
            cheaper steps where the blocks dominate (many tokens: a high
            resolution); evaluation sees every token.
        layer_decay: `None` (the recipe's) or a float in `(0, 1]`: layer-wise
            learning-rate decay (`keras_vit.training.layer_decay_scales`:
            block `i` of `L` at `layer_decay ** (L - i)` of the rate, the
            embedding lowest), for fine-tuning a pretrained model.
        ema_momentum: `None` (the recipe's) or a float in `(0, 1)`: the
            run validates, reports and saves an exponential moving average
            of the weights (Keras' `use_ema`; the checkpoints keep the
            trained weights and the average).
        remat: bool, recompute each block's activations in the backward
            pass (`VisionTransformer(remat=True)`): less memory per step,
            the same gradients.
        teacher: `None` or a `.keras` file of a classifier of the same
            images and classes (a CNN, a ViT): the model learns from its
            predictions as well as the labels (`Distiller`, DeiT's loss);
            the teacher is loaded, frozen, and never saved over. The saved
            model is the student alone.
        distillation: with `teacher`, `"hard"` (the default: the
            teacher's top class, DeiT's best) or `"soft"` (its softmax at
            `temperature`, KL divergence).
        distillation_token: bool, with `teacher`: the student gets DeiT's
            distillation token and a second head that learns the teacher,
            the class head the labels; inference averages the two.
        temperature: positive float, for `distillation="soft"`.
        validate_every: evaluate on the test split every this many epochs
            (and after the last); `None`: after the last epoch only, whose
            result is the run's test metrics.
        deterministic: bool, the training batches in one order (see
            `keras_vit.data.make_pipeline`) and TensorFlow's (and torch's)
            kernels deterministic, so that a run killed and resumed any
            number of times ends with the weights of an uninterrupted one.
        validation_split: for an image folder without `test/` (a folder
            with one is refused): the share of each class's training images
            held out as the test images (`keras_vit.data.held_out_split`,
            the same files every time).
        download: let TFDS download and prepare a dataset that is not
            prepared in `data_dir` (without it, such a dataset fails at once).
        limit: `None` or an int: train on the first `limit` training images
            only (a quick trial run); the test split stays whole.
        verbose: Keras progress verbosity.
        log: function that prints a line.

    Returns:
        dict of the test metrics, timings and output paths.
    """
    import keras_vit
    from keras_vit import data as vit_data
    from keras_vit.data.augmentation import batch_augmentation
    from keras_vit.data.pipelines import check_limit
    from keras_vit.distribution import distribute as distribute_engine
    from keras_vit.training.backup import replace_atomically

    job = "train" if weights is None else "finetune"
    epochs = DEFAULTS[job]["epochs"] if epochs is None else epochs
    batch_size = DEFAULTS[job]["batch_size"] if batch_size is None else batch_size
    recipe = DEFAULTS[job]["recipe"] if recipe is None else recipe
    # Every argument is checked before any data is read or model built.
    run = Run(
        job,
        output_dir=output_dir,
        overwrite=overwrite,
        epochs=epochs,
        batch_size=batch_size,
        recipe=recipe,
        augmentation=augmentation,
        seed=seed,
        deterministic=deterministic,
        log=log,
        output_files=OUTPUT_FILES,
    )
    recipe = run.recipe
    check_limit(limit)
    if not isinstance(remat, bool):
        raise TypeError(f"`remat` must be a bool. Received: remat={remat!r}")
    if patch_dropout_rate is not None:
        from keras_vit.layers.patch_dropout import check_rate

        recipe = dataclasses.replace(
            recipe, patch_dropout_rate=check_rate(patch_dropout_rate, "patch_dropout_rate")
        )
    # A `Recipe` checks its own fields (a ValueError naming the argument).
    if layer_decay is not None:
        recipe = dataclasses.replace(recipe, layer_decay=layer_decay)
    if ema_momentum is not None:
        recipe = dataclasses.replace(recipe, ema_momentum=ema_momentum)
    distill = _distillation_options(teacher, distillation, distillation_token, temperature)
    for argument, path in (("weights", weights), ("teacher", teacher)):
        _check_not_replaced(path, output_dir, argument)
    if distill and distribute is not None:
        raise ValueError(
            "Distillation trains on one device: `teacher` with `distribute` is not supported. "
            f"Received: teacher={teacher!r}, distribute={distribute!r}"
        )
    if validate_every is not None and (not isinstance(validate_every, int) or validate_every < 1):
        raise ValueError(
            "`validate_every` must be None or a positive int. "
            f"Received: validate_every={validate_every!r}"
        )
    if gradient_accumulation_steps is not None and (
        not isinstance(gradient_accumulation_steps, int) or gradient_accumulation_steps < 2
    ):
        raise ValueError(
            "`gradient_accumulation_steps` must be None or an int >= 2. "
            f"Received: gradient_accumulation_steps={gradient_accumulation_steps!r}"
        )
    if weights is not None:
        source = keras_vit.models.checkpoint_architecture(weights, argument="weights")
        if patch_size is not None:
            raise ValueError(
                "A fine-tuned model keeps its checkpoint's patch size. "
                f"Received: patch_size={patch_size!r}"
            )
        arguments = {"patch_size": source["patch_size"]}
        image_size = image_size or source["input_shape"][0]
        channels = source["input_shape"][-1]
        strides = _stem_strides(source)
    else:
        arguments = model_arguments(model, patch_size)
        image_size = image_size or (28 if model in SMALL_MODELS else 224)
        channels = 1 if (dataset == "fashion_mnist" and model in SMALL_MODELS) else 3
        strides = _stem_strides(arguments)
    check_image_size(image_size, arguments["patch_size"], strides)
    check_dataset_source(dataset)
    check_data_layout(dataset, validation_split)
    if distill:
        from keras_vit.training.distillation import check_teacher, load_teacher

        teacher_model = load_teacher(teacher)
        teacher_name = f"The teacher {str(teacher)!r}"
        # Its images now, its classes once the data's are known: both before training.
        check_teacher(teacher_model, (image_size, image_size, channels), name=teacher_name)
    # Before any TensorFlow computation: MultiWorkerMirroredStrategy must
    # be created first in the process.
    plan = distribute_engine(
        distribute,
        model_parallel=model_parallel,
        model=source if weights is not None else arguments,
    )
    run.open(
        {
            "dataset": dataset_reference(dataset),
            "data_dir": data_dir,
            "validation_split": validation_split,
            "model": None if weights is not None else model,
            "weights": path_reference(weights),
            "image_size": image_size,
            "patch_size": patch_size,
            "distribute": distribute,
            "gradient_accumulation_steps": gradient_accumulation_steps,
            "limit": limit,
            "patch_dropout_rate": patch_dropout_rate,
            "layer_decay": layer_decay,
            "ema_momentum": ema_momentum,
            "remat": remat,
            **distill,
        },
        output_dir=None
        if plan.is_chief
        else os.path.join(output_dir, "workers", str(plan.worker_index)),
    )
    common = run.data_options(
        image_size, channels, data_dir, download, validation_split=validation_split
    )

    def training_data(batch, shard):
        return vit_data.load(
            dataset,
            "train",
            training=True,
            crop_scale=run.training_crop(dataset),
            flip=True,
            augmentation=batch_augmentation(augmentation, seed),
            batch_size=batch,
            shard=shard,
            limit=limit,
            **common,
        )

    train_data = plan.dataset(training_data, batch_size)
    try:
        test_data = vit_data.load(dataset, "test", batch_size=batch_size, **common)
    except (ValueError, RuntimeError):
        if os.path.isdir(str(dataset)):
            raise  # a folder's layout was checked above: this is a real error
        test_data = None  # a TFDS dataset without a test split
    log(
        f"data: {dataset} ({train_data.size or '?'} training images, "
        f"{train_data.num_classes} classes) at {image_size}x{image_size}x{channels}"
    )
    if distribute is not None:
        log(
            f"distributed: {distribute} parallel, {plan.num_replicas} replicas "
            f"({type(plan.engine).__name__}), worker {plan.worker_index + 1} of "
            f"{plan.num_workers}, global batch {batch_size}"
        )
    if distill:
        check_teacher(
            teacher_model,
            (image_size, image_size, channels),
            train_data.num_classes,
            name=teacher_name,
        )
    options = dict(
        input_shape=(image_size, image_size, channels),
        data_format="channels_last",  # the pipelines' images, whatever Keras' default
        classes=train_data.num_classes,
        classifier_activation=None,
        dropout_rate=recipe.dropout_rate,
        drop_path_rate=recipe.drop_path_rate,
        patch_dropout_rate=recipe.patch_dropout_rate,
        remat=remat,
        seed=seed,
        name="vit",
    )
    if distillation_token:
        options["distillation_token"] = True
    steps_per_epoch = run.steps_per_epoch(train_data, dataset)
    with plan.scope():
        if weights is not None:
            if source["pooling"] is None:  # an encoder's tokens (a pre-training model)
                options["pooling"] = "token" if source["class_token"] else "gap"
            network = keras_vit.from_checkpoint(weights, include_top=True, **options)
            model = f"fine-tuned {os.path.basename(str(weights))}"
        else:
            network = keras_vit.VisionTransformer(**arguments, **options)
        trained = network
        if distill:
            from keras_vit.training.distillation import Distiller

            trained = Distiller(
                network,
                teacher_model,
                mode=distill["distillation"],
                temperature=distill["temperature"],
            )
        recipe.compile(
            trained,
            total_steps=steps_per_epoch * epochs,
            gradient_accumulation_steps=gradient_accumulation_steps,
        )
        plan.prepare(trained)
    log(f"model: {model} ViT, {network.count_params():,} parameters; recipe: {recipe}")
    if distill:
        log(
            f"teacher: {teacher} ({teacher_model.count_params():,} parameters, frozen), "
            f"{distill['distillation']} distillation"
            + (", distillation token" if distillation_token else "")
        )
    if weights is not None and recipe.head_first and not run.resuming:
        from keras_vit.training.finetuning import fit_new_heads

        with plan.scope():
            fit_new_heads(
                network,
                vit_data.load(dataset, "train", batch_size=batch_size, limit=limit, **common).data,
                log=log,
            )

    def statistics_data():
        # Every training image alike (no crop, flip or mixing), in one
        # shuffled order each time; the same images on every worker.
        return vit_data.load(
            dataset,
            "train",
            training=True,
            crop_scale=None,
            flip=False,
            batch_size=batch_size,
            limit=limit,
            **common,
        ).data

    validation_freq = validate_every or epochs
    with plan.scope():
        history = run.fit(
            trained,
            train_data.data,
            validation_data=test_data.data if test_data is not None else None,
            validation_freq=validation_freq,
            statistics_data=statistics_data,
            verbose=verbose,
        )
        metrics = {}
        if test_data is not None:
            logs = history.history
            if epochs % validation_freq == 0 and history.epoch and history.epoch[-1] == epochs - 1:
                results = {
                    k[len("val_") :]: v[-1] for k, v in logs.items() if k.startswith("val_")
                }  # the final model's
            else:
                results = trained.evaluate(test_data.data, verbose=verbose, return_dict=True)
            # `loss` includes the recipe's label smoothing; `cross_entropy` does not.
            metrics = {f"test_{name}": float(value) for name, value in results.items()}

    def write_class_names(path):
        with open(path, "w") as f:
            json.dump(list(train_data.class_names), f)

    replace_atomically(run.paths["class_names.json"], write_class_names)
    metrics.update(
        parameters=network.count_params(), distribute=distribute, replicas=plan.num_replicas
    )
    return run.finish(network, metrics)


def _distillation_options(teacher, distillation, distillation_token, temperature):
    """The run settings of distillation (`{}` without a teacher), checked."""
    from keras_vit.training.distillation import check_options, check_teacher_path

    if not isinstance(distillation_token, bool):
        raise TypeError(
            "`distillation_token` must be a bool. "
            f"Received: distillation_token={distillation_token!r}"
        )
    if teacher is None:
        for name, value, default in (
            ("distillation", distillation, None),
            ("distillation_token", distillation_token, False),
            ("temperature", temperature, 1.0),
        ):
            if value != default:
                raise ValueError(
                    f"`{name}` is a setting of distillation and needs a `teacher`. "
                    f"Received: {name}={value!r}, teacher=None"
                )
        return {}
    check_teacher_path(teacher)
    distillation = "hard" if distillation is None else distillation
    check_options(distillation, temperature, mode_argument="distillation")
    if distillation == "hard" and temperature != 1.0:
        raise ValueError(
            "`temperature` softens the teacher's predictions for distillation='soft'; "
            f"hard distillation takes its top class. Received: temperature={temperature!r}"
        )
    return {
        "teacher": path_reference(teacher),  # as `run.json` records it
        "distillation": distillation,
        "distillation_token": distillation_token,
        "temperature": float(temperature),
    }


def _check_not_replaced(path, output_dir, argument):
    """Refuses an input file that the run would write over (its `model.keras`)."""
    if path is None or not os.path.isfile(os.fspath(path)):
        return
    written = os.path.join(output_dir, "model.keras")
    if os.path.exists(written) and os.path.samefile(path, written):
        raise ValueError(
            f"`{argument}` {os.fspath(path)!r} is the model this run writes in "
            f"output_dir={output_dir!r}: it would be replaced. Copy it elsewhere or "
            "choose another output_dir."
        )
