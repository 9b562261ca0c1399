"""The `keras-vit train` job: data, model, recipe, fit with resume, outputs.

A run writes into its output folder: `model.keras` (the final model),
`class_names.json`, `history.csv`, `learning_curves.png`, `metrics.json`,
and while it runs `backup/` (`CrashSafeBackup`: the model and optimizer
state at the end of the last finished epoch, written atomically). Starting
the same command again after an interruption continues from there; a loss
that turns NaN stops the run with that checkpoint kept.
"""

import json
import os
import shutil
import time
import warnings

import numpy as np

# The default model of `keras-vit train`: a small hybrid ViT for 28x28
# images (the paper's hybrid input, Xiao et al. 2021's convolutional stem):
# three 3x3 convolutions (strides 2, 1, 2) turn the image into a 7x7 map of
# 1x1 patches for 3 Transformer blocks. How it compares with the plain ViT,
# other stems and a small CNN on Fashion-MNIST: docs/training.md.
SMALL_MODEL = dict(
    patch_size=1, hidden_dim=64, num_layers=3, num_heads=4, mlp_dim=128,
    stem_filters=(32, 32, 64), stem_strides=(2, 1, 2), class_token=False, pooling="gap",
)
# The same width on 4x4 pixel patches (7x7 of them at 28 px) and 4 blocks:
# the paper's plain ViT, which masked-patch pre-training needs (a stem's
# receptive field would show the encoder the pixels it must predict).
SMALL_PATCH_MODEL = dict(
    patch_size=4, hidden_dim=64, num_layers=4, num_heads=4, mlp_dim=128,
    class_token=True, pooling="token",
)
SMALL_MODELS = {"small": SMALL_MODEL, "small/4": SMALL_PATCH_MODEL}

OUTPUT_FILES = ("model.keras", "class_names.json", "history.csv",
                "learning_curves.png", "metrics.json", "run.json")


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


def _stem_stride(arguments):
    filters = arguments.get("stem_filters") or ()
    strides = arguments.get("stem_strides") or (2,) * len(filters)
    return int(np.prod(strides))


def checkpoint_architecture(weights):
    """The `VisionTransformer` arguments of a checkpoint file, or a clear error."""
    from keras_vit.weights.architecture import infer_architecture
    from keras_vit.weights.readers import CHECKPOINT_SUFFIXES, read_tensors

    path = os.fspath(weights)
    if not os.path.isfile(path) or not path.endswith(CHECKPOINT_SUFFIXES):
        raise ValueError(
            f"weights={path!r} is not an existing checkpoint file ending in one "
            f"of {', '.join(CHECKPOINT_SUFFIXES)}."
        )
    return infer_architecture(path, read_tensors(path))[1]


def cleans_up_failed_output_dir(job):
    """Decorates a job: a run that fails before its first checkpoint leaves no folder behind.

    When the job created `output_dir` (it did not exist before the call) and
    raises (bad data, divergence, Ctrl-C) before a complete checkpoint is in
    `output_dir/backup`, the folder is removed; otherwise it is kept, so the
    same command resumes.
    """
    import functools
    import inspect

    signature = inspect.signature(job)

    @functools.wraps(job)
    def run(*args, **kwargs):
        from keras_vit.training.backup import latest_checkpoint

        bound = signature.bind(*args, **kwargs)
        bound.apply_defaults()
        output_dir = os.fspath(bound.arguments["output_dir"])
        existed = os.path.exists(output_dir)
        try:
            return job(*args, **kwargs)
        except BaseException:
            if not existed and os.path.isdir(output_dir) and (
                latest_checkpoint(os.path.join(output_dir, "backup")) is None
            ):
                shutil.rmtree(output_dir, ignore_errors=True)
            raise

    return run


def check_output_dir(output_dir, overwrite):
    """Refuses to replace a finished run unless `overwrite`; `True` if resuming."""
    backup = os.path.join(output_dir, "backup")
    if os.path.isdir(backup):
        return True
    finished = os.path.isfile(os.path.join(output_dir, "model.keras"))
    if finished and not overwrite:
        raise ValueError(
            f"{output_dir!r} already holds a finished run (model.keras); pass "
            "another output folder, or overwrite=True (--overwrite) to replace it."
        )
    if finished:
        for name in OUTPUT_FILES:
            path = os.path.join(output_dir, name)
            if os.path.exists(path):
                os.remove(path)
    return False


def _deterministic_kernels():
    """Deterministic kernels where the backend has a switch for them."""
    import keras

    if keras.backend.backend() == "tensorflow":
        import tensorflow as tf

        tf.config.experimental.enable_op_determinism()
    elif keras.backend.backend() == "torch":
        import torch

        torch.use_deterministic_algorithms(True)
    # JAX: XLA's CPU kernels are deterministic already.


def _epoch_csv_logger():
    import keras

    class EpochCSVLogger(keras.callbacks.CSVLogger):
        """Keras' CSVLogger with epochs counted from 1, as `model.fit` prints them."""

        def on_epoch_end(self, epoch, logs=None):
            super().on_epoch_end(epoch + 1, logs)

    return EpochCSVLogger


def _truncate_history(csv_path, epochs_done):
    """Keeps the rows of `history.csv` of the epochs a checkpoint holds."""
    import csv

    if not os.path.isfile(csv_path):
        return
    with open(csv_path, newline="") as f:
        rows = list(csv.reader(f))
    if not rows:
        return
    kept = [rows[0]] + [r for r in rows[1:] if r and int(r[0]) <= epochs_done]
    with open(csv_path, "w", newline="") as f:
        csv.writer(f).writerows(kept)


def plot_history(csv_path, png_path):
    """Plots loss and accuracy per epoch from a `history.csv`."""
    import csv

    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    with open(csv_path) as f:
        rows = list(csv.DictReader(f))
    if not rows:
        return None
    from matplotlib.ticker import MaxNLocator

    epochs = [int(r["epoch"]) for r in rows]  # counted from 1, as the run printed them
    figure, axes = plt.subplots(1, 2, figsize=(9, 3.5))

    def number(text):
        try:
            return float(text)
        except (TypeError, ValueError):  # "NA": not evaluated that epoch
            return None

    for axis, metric in zip(axes, ("loss", "accuracy")):
        if metric not in rows[0]:  # e.g. pixel regression: a loss only
            axis.set_visible(False)
            continue
        for prefix, label in (("", "train"), ("val_", "test")):
            points = [(e, number(r.get(prefix + metric))) for e, r in zip(epochs, rows)]
            points = [(e, v) for e, v in points if v is not None]
            if points:
                axis.plot(*zip(*points), "o-", label=label)
        axis.set_xlabel("epoch")
        if max(epochs) - min(epochs) < 20:
            axis.set_xticks(range(min(epochs), max(epochs) + 1))
        else:
            axis.xaxis.set_major_locator(MaxNLocator(integer=True))
        axis.set_xlim(min(epochs) - 0.5, max(epochs) + 0.5)
        axis.set_title(metric)
        axis.grid(alpha=0.3)
        axis.legend()
    figure.tight_layout()
    figure.savefig(png_path, dpi=100)
    plt.close(figure)
    return png_path


def fit_with_checkpoints(
    model, data, *, epochs, output_dir, resuming=False, validation_data=None,
    validation_freq=1, verbose=2, log=print,
):
    """`model.fit` that survives kills and stops on a diverged loss.

    Writes `history.csv` (one row per epoch, counted from 1) and `backup/` (`CrashSafeBackup`)
    into `output_dir`; when `resuming`, restarts from the newest complete
    checkpoint there, keeps the history rows of the epochs it holds, and
    replays the finished epochs' shuffles of `data` so the next epoch sees
    the order (and masks) of an uninterrupted run. A non-finite loss stops
    the run with a `RuntimeError` that says where the last good checkpoint is.

    Returns:
        `(history, fit_seconds)`.
    """
    import keras

    from keras_vit.training.backup import (
        CrashSafeBackup,
        StopOnNonFiniteLoss,
        latest_checkpoint,
    )

    history_csv = os.path.join(output_dir, "history.csv")
    if not resuming and os.path.exists(history_csv):
        os.remove(history_csv)
    backup_dir = os.path.join(output_dir, "backup")
    guard = StopOnNonFiniteLoss()
    EpochCSVLogger = _epoch_csv_logger()
    # The history row of an epoch is written before its checkpoint: a kill
    # in between leaves a row that the resumed run drops and writes again.
    callbacks = [
        guard,
        EpochCSVLogger(history_csv, append=True),
        CrashSafeBackup(backup_dir),
    ]
    resumed = latest_checkpoint(backup_dir) if resuming else None
    if resuming:
        _truncate_history(history_csv, resumed[0] if resumed else 0)
    if resumed is not None:
        log(f"resuming from {resumed[1]} ({resumed[0]} of {epochs} epochs done)")
        # tf.data draws each epoch's shuffle from the dataset's seed, one
        # draw per iteration: replaying the finished epochs' draws gives
        # the next epoch the order it has in an uninterrupted run (without
        # this it would get the first epoch's).
        if hasattr(data, "cardinality"):  # not a tf.distribute dataset
            for _ in range(resumed[0]):
                iter(data)
    fit_start = time.perf_counter()
    with warnings.catch_warnings():
        # A tf.distribute dataset has no length until its first epoch ends,
        # which Keras reports as running out of data; it did not.
        warnings.filterwarnings("ignore", message="Your input ran out of data")
        history = model.fit(
            data,
            epochs=epochs,
            validation_data=validation_data,
            validation_freq=validation_freq,
            callbacks=callbacks,
            verbose=verbose,
            shuffle=False,  # the pipeline shuffles
        )
    fit_seconds = time.perf_counter() - fit_start
    if guard.failure is not None:
        found = latest_checkpoint(backup_dir)
        kept = (f"the last good checkpoint (after epoch {found[0]}) is kept in {found[1]}"
                if found else "no epoch had finished, so there is no checkpoint")
        raise RuntimeError(
            f"Training diverged: the loss was {guard.failure['loss']} at epoch "
            f"{guard.failure['epoch'] + 1}, batch {guard.failure['batch'] + 1}; {kept}. "
            "Nothing was saved over it; lower the learning rate (another --recipe) "
            "or check the data."
        )
    return history, fit_seconds


RUN_FILE = "run.json"
# Settings a run can be resumed with other values of.
_MAY_CHANGE = ("epochs",)


def _reference(path):
    return os.path.abspath(os.fspath(path)) if path is not None and os.path.exists(
        os.fspath(path)) else path


def dataset_reference(dataset):
    """How a run records its dataset: a folder by its absolute path, a name as it is."""
    return _reference(dataset)


def check_dataset_source(dataset):
    """Refuses at once a dataset that is no folder, no TFDS name, not Fashion-MNIST."""
    if dataset == "fashion_mnist" or os.path.isdir(str(dataset)):
        return
    if os.sep in str(dataset) or str(dataset).startswith("."):
        raise ValueError(f"Dataset folder {dataset!r} does not exist.")
    from keras_vit.data.pipelines import check_tfds_name

    try:
        check_tfds_name(dataset)
    except ValueError:
        raise ValueError(
            f"Unknown dataset {dataset!r}: not 'fashion_mnist', not a folder, "
            "and not a TFDS name (see `tfds.list_builders()`)."
        ) from None


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
        return
    if folder:
        layout = vit_data.folder_layout(dataset)
        if layout["test"] is None or layout["train"] is None and not layout["flat"]:
            raise ValueError(vit_data.pipelines.folder_layout_error(dataset, layout))


def read_run(output_dir):
    """The settings recorded in `output_dir/run.json`, or None."""
    path = os.path.join(output_dir, RUN_FILE)
    if not os.path.isfile(path):
        return None
    with open(path) as f:
        return json.load(f)


def record_run(output_dir, resuming, settings):
    """Writes the run's settings; a resumed run must have the recorded ones.

    Raises:
        ValueError: resuming with other settings (more epochs are allowed),
            naming each difference, before anything is loaded.
    """
    from keras_vit.training.backup import replace_atomically

    settings = json.loads(json.dumps(settings))  # tuples as lists, as read back
    recorded = read_run(output_dir) if resuming else None
    if recorded is not None:
        changed = [key for key in sorted(set(settings) | set(recorded))
                   if key not in _MAY_CHANGE and settings.get(key) != recorded.get(key)]
        if recorded.get("epochs") is not None and settings.get("epochs", 0) < recorded["epochs"]:
            changed.append("epochs")
        if changed:
            differences = ", ".join(
                f"{key}={settings.get(key)!r} (the run has {recorded.get(key)!r})" for key in changed
            )
            raise ValueError(
                f"{output_dir!r} holds an unfinished run with other settings: {differences}. "
                "Resume it with its own settings (epochs may grow), start it over with "
                "overwrite=True, or choose another output folder."
            )

    def write(path):
        with open(path, "w") as f:
            json.dump(settings, f, indent=2)

    replace_atomically(os.path.join(output_dir, RUN_FILE), write)


@cleans_up_failed_output_dir
def train(
    dataset="fashion_mnist",
    *,
    model="small",
    image_size=None,
    patch_size=None,
    epochs=8,
    batch_size=128,
    recipe="small",
    augmentation="none",
    output_dir="keras_vit_run",
    seed=0,
    data_dir=None,
    overwrite=False,
    weights=None,
    distribute=None,
    model_parallel=2,
    gradient_accumulation_steps=None,
    validate_every=None,
    deterministic=False,
    validation_split=None,
    download=False,
    verbose=2,
    log=print,
):
    """Trains a ViT on a dataset and writes the run's outputs.

    With `weights`, fine-tunes instead: the model is the checkpoint's
    (`keras_vit.weights.from_checkpoint`: a `.keras` file of an earlier
    run, an official `.npz`, a Hugging Face or timm file), moved to
    `image_size` (position embeddings resampled) with a new zero head when
    the dataset has another class count.

    Args:
        dataset: `"fashion_mnist"`, an image folder (with `train/` and
            `test/` sub-folders of one folder per class; or, with
            `validation_split`, `train/` alone or the class folders at the
            top), or a TFDS name.
        model: `"small"` or a variant name (`"Ti/16"`, ...).
        image_size: int; defaults to the data's (28 for Fashion-MNIST) for
            `"small"`, 224 for variants.
        patch_size: int, overrides the model's patch size.
        epochs, batch_size, seed: training length, batch, determinism.
        recipe: a name in `keras_vit.training.RECIPES` or a `Recipe`.
        augmentation: a preset in `keras_vit.data.augmentation.PRESETS`.
        output_dir: folder for the outputs (and the resume backup).
        data_dir: TFDS data folder.
        overwrite: replace a finished run in `output_dir`.
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
        validate_every: evaluate on the test split every this many epochs
            (and after the last); `None`: after the last epoch only, whose
            result is the run's test metrics.
        deterministic: bool, make TensorFlow's (and torch's) kernels
            deterministic too, so that a run killed and resumed any number
            of times ends with the weights of an uninterrupted one.
        validation_split: for an image folder without `test/`: the share of
            each class's training images held out as the test images
            (`keras_vit.data.held_out_split`, the same files every time).
        download: let TFDS download and prepare a dataset that is not
            prepared in `data_dir` (without it, such a dataset fails at once).
        verbose: Keras progress verbosity.
        log: function that prints a line.

    Returns:
        dict of the test metrics, timings and output paths.
    """
    import keras

    import keras_vit
    from keras_vit import data as vit_data
    from keras_vit.data.augmentation import batch_augmentation, get_config
    from keras_vit.distribution import distribute as distribute_engine
    from keras_vit.training.backup import replace_atomically
    from keras_vit.training.recipes import get_recipe

    start = time.perf_counter()
    # Every argument is checked before any data is read or model built.
    recipe_name = recipe if isinstance(recipe, str) else repr(recipe)
    recipe = get_recipe(recipe)
    get_config(augmentation)
    for name, value in (("epochs", epochs), ("batch_size", batch_size)):
        if not isinstance(value, int) or value < 1:
            raise ValueError(f"`{name}` must be a positive int. Received: {name}={value!r}")
    if validate_every is not None and (not isinstance(validate_every, int) or validate_every < 1):
        raise ValueError(
            f"`validate_every` must be None or a positive int. Received: validate_every={validate_every!r}"
        )
    if gradient_accumulation_steps is not None and (
        not isinstance(gradient_accumulation_steps, int) or gradient_accumulation_steps < 2
    ):
        raise ValueError(
            "`gradient_accumulation_steps` must be None or an int >= 2. "
            f"Received: gradient_accumulation_steps={gradient_accumulation_steps!r}"
        )
    if weights is not None:
        source = checkpoint_architecture(weights)
        if patch_size is not None:
            raise ValueError(
                "A fine-tuned model keeps its checkpoint's patch size. "
                f"Received: patch_size={patch_size!r}"
            )
        arguments = {"patch_size": source["patch_size"]}
        image_size = image_size or source["input_shape"][0]
        channels = source["input_shape"][-1]
        stride = _stem_stride(source)
    else:
        arguments = model_arguments(model, patch_size)
        image_size = image_size or (28 if model in SMALL_MODELS else 224)
        channels = 1 if (dataset == "fashion_mnist" and model in SMALL_MODELS) else 3
        stride = _stem_stride(arguments)
    patch = arguments["patch_size"] * stride
    if not isinstance(image_size, int) or image_size < 1 or image_size % patch:
        what = f"the patch size {patch}"
        if stride > 1:
            what = f"{patch} (patch size {arguments['patch_size']} x stem stride {stride})"
        raise ValueError(f"image_size={image_size!r} is not a positive multiple of {what}.")
    check_dataset_source(dataset)
    check_data_layout(dataset, validation_split)
    # Before any TensorFlow computation: MultiWorkerMirroredStrategy must
    # be created first in the process.
    plan = distribute_engine(
        distribute, model_parallel=model_parallel,
        model=source if weights is not None else arguments,
    )
    if not plan.is_chief:
        output_dir = os.path.join(output_dir, "workers", str(plan.worker_index))
    os.makedirs(output_dir, exist_ok=True)
    resuming = check_output_dir(output_dir, overwrite)
    record_run(output_dir, resuming, {
        "job": "train", "dataset": dataset_reference(dataset), "data_dir": data_dir,
        "validation_split": validation_split,
        "model": None if weights is not None else model, "weights": _reference(weights),
        "image_size": image_size, "patch_size": patch_size, "batch_size": batch_size,
        "recipe": recipe_name, "augmentation": augmentation, "seed": seed,
        "distribute": distribute, "gradient_accumulation_steps": gradient_accumulation_steps,
        "epochs": epochs,
    })

    keras.utils.set_random_seed(seed)
    if deterministic:
        _deterministic_kernels()
    common = dict(image_size=image_size, channels=channels, seed=seed)
    if data_dir is not None:
        common["data_dir"] = data_dir
    if download:
        common["download"] = True
    if validation_split is not None:
        common["validation_split"] = validation_split
    small_images = dataset == "fashion_mnist"

    def training_data(batch, shard):
        return vit_data.load(
            dataset, "train", training=True,
            crop_scale=None if small_images else (0.08, 1.0),
            flip=True,
            augmentation=batch_augmentation(augmentation, seed),
            batch_size=batch, shard=shard,
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
    options = dict(
        input_shape=(image_size, image_size, channels),
        classes=train_data.num_classes,
        classifier_activation=None,
        dropout_rate=recipe.dropout_rate,
        drop_path_rate=recipe.drop_path_rate,
        seed=seed,
        name="vit",
    )
    steps_per_epoch = (train_data.size or 0) // batch_size or None
    if steps_per_epoch is None:
        raise ValueError(
            f"Dataset {dataset!r} has {train_data.size or 0} training images, fewer than one "
            f"batch of batch_size={batch_size}; use a smaller `batch_size`."
        )
    with plan.scope():
        if weights is not None:
            from keras_vit.weights import from_checkpoint

            if source["pooling"] is None:  # an encoder's tokens (a pre-training model)
                options["pooling"] = "token" if source["class_token"] else "gap"
            network = from_checkpoint(weights, include_top=True, **options)
            model = f"fine-tuned {os.path.basename(str(weights))}"
        else:
            network = keras_vit.VisionTransformer(**arguments, **options)
        recipe.compile(
            network, total_steps=steps_per_epoch * epochs,
            gradient_accumulation_steps=gradient_accumulation_steps,
        )
        plan.prepare(network)
    log(f"model: {model} ViT, {network.count_params():,} parameters; recipe: {recipe}")

    validation_freq = validate_every or epochs
    with plan.scope():
        history, fit_seconds = fit_with_checkpoints(
            network, train_data.data, epochs=epochs, output_dir=output_dir,
            resuming=resuming, validation_data=test_data.data if test_data is not None else None,
            validation_freq=validation_freq, verbose=verbose, log=log,
        )
        metrics = {}
        if test_data is not None:
            logs = history.history
            if epochs % validation_freq == 0 and history.epoch and history.epoch[-1] == epochs - 1:
                results = {k[len("val_"):]: v[-1] for k, v in logs.items()
                           if k.startswith("val_")}  # the final model's
            else:
                results = network.evaluate(test_data.data, verbose=verbose, return_dict=True)
            # `loss` includes the recipe's label smoothing; `cross_entropy` does not.
            metrics = {f"test_{name}": float(value) for name, value in results.items()}
    paths = {name: os.path.join(output_dir, name) for name in OUTPUT_FILES}
    replace_atomically(paths["model.keras"], network.save)
    with open(paths["class_names.json"], "w") as f:
        json.dump(list(train_data.class_names), f)
    plot_history(os.path.join(output_dir, "history.csv"), paths["learning_curves.png"])
    shutil.rmtree(os.path.join(output_dir, "backup"), ignore_errors=True)
    metrics.update(
        backend=keras.backend.backend(),
        parameters=network.count_params(),
        epochs=epochs,
        distribute=distribute,
        replicas=plan.num_replicas,
        fit_seconds=round(fit_seconds, 1),
        total_seconds=round(time.perf_counter() - start, 1),
    )
    def write_metrics(path):
        with open(path, "w") as f:
            json.dump(metrics, f, indent=2)

    replace_atomically(paths["metrics.json"], write_metrics)
    return {"metrics": metrics, "paths": paths}
