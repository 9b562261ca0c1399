"""What every job (`train`, `pretrain`) does around its own model and data: one `Run`.

A run writes into its output folder: `model.keras` (the final model),
`history.csv`, `learning_curves.png`, `metrics.json`, `run.json` (its
settings), the job's own files (`class_names.json`), and while it runs
`backup/` (`CrashSafeBackup`: the model and optimizer state at the end of
the last finished epoch, written atomically). Starting the same command
again after an interruption continues from there; a loss that turns NaN
stops the run with that checkpoint kept. While a run works in a folder it
holds it (`.run.lock`): a second run there is refused.
"""

import json
import os
import shutil
import time
import warnings

COMMON_OUTPUT_FILES = (
    "model.keras",
    "history.csv",
    "learning_curves.png",
    "metrics.json",
    "run.json",
)
LOCK_FILE = ".run.lock"
# The output folders that runs of this process hold: {real path: open lock file}.
_HELD = {}


class Run:
    """One run of a job: its shared settings checked, its folder, its fit, its outputs.

    Created first, it checks the settings every job has before any data is
    read; then the job checks its own, and:

    - `open(settings)` makes the output folder and holds it until the job
      ends (`hold_output_dir`: another run there is refused), resumes an
      unfinished run there (refusing to replace a finished one unless
      `overwrite`; with `overwrite`, an unfinished run whose settings differ
      starts over), records the settings in `run.json` (a resumed run must
      have the recorded ones), seeds every generator and, if asked, makes
      the kernels deterministic;
    - `data_options(...)` are the pipeline options of its data;
    - `steps_per_epoch(data, dataset)` refuses data of less than a batch;
    - `fit(network, data, ...)` is `fit_with_checkpoints`;
    - `finish(network, metrics)` saves `model.keras`, draws the learning
      curves, drops the backup and writes `metrics.json` with the timings.

    Args:
        job: str, the job's name (recorded in `run.json`).
        output_dir, overwrite, epochs, batch_size, recipe, augmentation,
            seed, deterministic, log: as `keras_vit.training.train`.
        output_files: the job's files in the folder besides the common
            ones (removed when a finished run is replaced).

    Example:

    ```python
    run = Run("train", output_dir="out", overwrite=False, epochs=2,
              batch_size=128, recipe="small", augmentation="none", seed=0)
    run.open({"dataset": "fashion_mnist"})
    history = run.fit(model, data)
    result = run.finish(model, {})
    ```
    """

    def __init__(
        self,
        job,
        *,
        output_dir,
        overwrite,
        epochs,
        batch_size,
        recipe,
        augmentation,
        seed,
        deterministic=False,
        log=print,
        output_files=(),
    ):
        from keras_vit.data.augmentation import get_config
        from keras_vit.training.recipes import get_recipe

        self.started = time.perf_counter()
        for name, value in (("epochs", epochs), ("batch_size", batch_size)):
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise ValueError(f"`{name}` must be a positive int. Received: {name}={value!r}")
        self.recipe_name = recipe if isinstance(recipe, str) else repr(recipe)
        self.recipe = get_recipe(recipe)
        get_config(augmentation)
        self.job = job
        self.output_dir = os.fspath(output_dir)
        self.overwrite = overwrite
        self.epochs = epochs
        self.batch_size = batch_size
        self.augmentation = augmentation
        self.seed = seed
        self.deterministic = deterministic
        self.log = log
        self.output_files = COMMON_OUTPUT_FILES + tuple(output_files)
        self.resuming = False
        self.fit_seconds = 0.0

    @property
    def paths(self):
        """`{file name: path}` of the run's outputs."""
        return {name: os.path.join(self.output_dir, name) for name in self.output_files}

    def open(self, settings, output_dir=None):
        """Makes the output folder, records `settings`, seeds; `True` when resuming.

        Args:
            settings: dict of the job's own settings for `run.json`.
            output_dir: a folder other than the one given at creation (a
                multi-worker run's worker writes under the chief's).
        """
        import keras

        if output_dir is not None:
            self.output_dir = os.fspath(output_dir)
        os.makedirs(self.output_dir, exist_ok=True)
        hold_output_dir(self.output_dir)
        self.resuming = check_output_dir(self.output_dir, self.overwrite, self.output_files)
        settings = {
            "job": self.job,
            **settings,
            "batch_size": self.batch_size,
            "recipe": self.recipe_name,
            "augmentation": self.augmentation,
            "seed": self.seed,
            "epochs": self.epochs,
        }
        if self.resuming and self.overwrite and changed_settings(self.output_dir, settings):
            # Asked to overwrite a run that cannot resume with these settings:
            # start over. With its own settings it resumes, overwrite or not.
            shutil.rmtree(os.path.join(self.output_dir, "backup"))
            self.resuming = False
        record_run(self.output_dir, self.resuming, settings)
        keras.utils.set_random_seed(self.seed)
        if self.deterministic:
            deterministic_kernels()
        return self.resuming

    def data_options(self, image_size, channels, data_dir=None, download=False, **options):
        """The pipeline options of the run's data (`keras_vit.data.load` keywords)."""
        options = dict(
            image_size=image_size,
            channels=channels,
            seed=self.seed,
            deterministic=self.deterministic,  # batches in one order: bit-for-bit resumes
            autotune=self.recipe.data_autotune,
            **{k: v for k, v in options.items() if v is not None},
        )
        if data_dir is not None:
            options["data_dir"] = data_dir
        if download:
            options["download"] = True
        return options

    def training_crop(self, dataset):
        """The random-resized crop scale of `dataset`'s training images: the recipe's.

        Fashion-MNIST's is `None`: every crop would cut its centred 28-pixel items.
        """
        return None if dataset == "fashion_mnist" else self.recipe.crop_scale

    def steps_per_epoch(self, data, dataset, batch_size=None):
        """Training steps per epoch of a `keras_vit.data.Dataset`; fewer than one is an error."""
        batch_size = batch_size or self.batch_size
        steps = (data.size or 0) // batch_size
        if not steps:
            raise ValueError(
                f"Dataset {dataset!r} has {data.size or 0} training images, fewer than one "
                f"batch of batch_size={batch_size}; use a smaller `batch_size`."
            )
        return steps

    def fit(self, network, data, **kwargs):
        """`fit_with_checkpoints` into the run's folder; returns the history."""
        history, self.fit_seconds = fit_with_checkpoints(
            network,
            data,
            epochs=self.epochs,
            output_dir=self.output_dir,
            resuming=self.resuming,
            log=self.log,
            **kwargs,
        )
        return history

    def finish(self, network, metrics):
        """Saves the model and curves, drops the backup, writes `metrics.json`.

        Args:
            network: the trained model (saved as `model.keras`).
            metrics: dict of the job's own metrics; the backend, the epochs
                and the timings are added.

        Returns:
            `{"metrics": metrics, "paths": {file name: path}}`.
        """
        import keras

        from keras_vit.training.backup import replace_atomically

        paths = self.paths
        replace_atomically(paths["model.keras"], network.save)
        plot_history(paths["history.csv"], paths["learning_curves.png"])
        shutil.rmtree(os.path.join(self.output_dir, "backup"), ignore_errors=True)
        metrics = {
            **metrics,
            "backend": keras.backend.backend(),
            "epochs": self.epochs,
            "fit_seconds": round(self.fit_seconds, 1),
            "total_seconds": round(time.perf_counter() - self.started, 1),
        }
        replace_atomically(paths["metrics.json"], lambda path: _write_json(path, metrics))
        return {"metrics": metrics, "paths": paths}


def _write_json(path, value):
    with open(path, "w") as f:
        json.dump(value, f, indent=2)


def hold_output_dir(output_dir):
    """Holds `output_dir` for this process's run; a folder another run holds is refused.

    The hold is an advisory lock (`flock`) on `output_dir/.run.lock`, which
    names the holder's process: the system drops it when the process ends,
    however it ends, so a killed run leaves no folder held. The job's
    `cleans_up_failed_output_dir` lets it go when the job returns or raises
    (a `Run` used without a job holds its folder until the process ends). A
    folder this process holds already stays held: a run that follows another
    in one process takes it over.

    Raises:
        ValueError: another process's run holds the folder.
    """
    try:
        import fcntl
    except ImportError:  # not a POSIX system: no hold
        return
    path = os.path.realpath(output_dir)
    if path in _HELD:
        return
    lock = open(os.path.join(path, LOCK_FILE), "a+")
    try:
        fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        lock.seek(0)
        holder = lock.read().strip()
        lock.close()
        raise ValueError(
            f"{output_dir!r} is in use by another run"
            f"{f' (process {holder})' if holder.isdigit() else ''}; wait for it to end, "
            "or pass another `output_dir`."
        ) from None
    lock.seek(0)
    lock.truncate()
    lock.write(str(os.getpid()))
    lock.flush()
    _HELD[path] = lock


def _let_go(paths):
    for path in paths:
        lock = _HELD.pop(path)
        try:
            os.remove(os.path.join(path, LOCK_FILE))
        except FileNotFoundError:  # the failed run's folder is gone
            pass
        lock.close()


def cleans_up_failed_output_dir(job):
    """Decorates a job: a run that fails before its first checkpoint leaves no folder behind.

    When the job created `output_dir` (it did not exist before the call) and
    raises (bad data, divergence, Ctrl-C) before a complete checkpoint is in
    `output_dir/backup`, the folder is removed; otherwise it is kept, so the
    same command resumes. Either way the folders the job held
    (`hold_output_dir`) are let go.
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
        held_before = set(_HELD)
        try:
            return job(*args, **kwargs)
        except BaseException:
            if (
                not existed
                and os.path.isdir(output_dir)
                and (latest_checkpoint(os.path.join(output_dir, "backup")) is None)
            ):
                shutil.rmtree(output_dir, ignore_errors=True)
            raise
        finally:
            _let_go(set(_HELD) - held_before)

    return run


def check_output_dir(output_dir, overwrite, output_files=()):
    """Refuses to replace a finished run unless `overwrite`; `True` if resuming.

    Replacing one removes its `output_files` first.
    """
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
        for name in output_files:
            path = os.path.join(output_dir, name)
            if os.path.exists(path):
                os.remove(path)
    return False


def deterministic_kernels():
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
    model,
    data,
    *,
    epochs,
    output_dir,
    resuming=False,
    validation_data=None,
    validation_freq=1,
    statistics_data=None,
    verbose=2,
    log=print,
):
    """`model.fit` that survives kills and stops on a diverged loss.

    Writes `history.csv` (one row per epoch, counted from 1) and `backup/` (`CrashSafeBackup`)
    into `output_dir`; when `resuming`, restarts from the newest complete
    checkpoint there, keeps the history rows of the epochs it holds, and
    replays the finished epochs' shuffles of `data` so the next epoch sees
    the order (and masks) of an uninterrupted run. A non-finite loss stops
    the run with a `RuntimeError` that says where the last good checkpoint is.
    With `statistics_data` (a function that returns batches of training
    images without augmentation), the model's BatchNorm statistics are
    recomputed on them before each validation and after the last epoch
    (`keras_vit.training.batch_norm.PreciseBatchNorm`): the model saved and
    the accuracy reported are what inference gives, after a run of any length.

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
    # Before the checkpoint (which keeps what they set), in this order:
    # validation on the averaged weights that `fit` puts into the model at
    # its end, the BatchNorm statistics of those weights, the checkpoint of
    # the trained weights.
    before = []
    if getattr(model.optimizer, "use_ema", False):
        before.append(keras.callbacks.SwapEMAWeights())
    statistics = None
    if statistics_data is not None:
        from keras_vit.training.batch_norm import PreciseBatchNorm

        statistics = PreciseBatchNorm(statistics_data, log=log)
        before.append(statistics)
    callbacks = before + callbacks
    resumed = latest_checkpoint(backup_dir) if resuming else None
    if resuming:
        _truncate_history(history_csv, resumed[0] if resumed else 0)
    if resumed is not None:
        log(f"resuming from {resumed[1]} ({resumed[0]} of {epochs} epochs done)")
        # tf.data draws a shuffle from the dataset's seed at each iterator
        # it opens: replaying the finished epochs' draws gives the next
        # epoch the order it has in an uninterrupted run (without this it
        # would get the first epoch's).
        if hasattr(data, "cardinality"):  # not a tf.distribute dataset
            for _ in range(resumed[0] * iterators_per_epoch(data)):
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
    if statistics is not None and guard.failure is None:
        statistics.finish()
    fit_seconds = time.perf_counter() - fit_start
    if guard.failure is not None:
        found = latest_checkpoint(backup_dir)
        kept = (
            f"the last good checkpoint (after epoch {found[0]}) is kept in {found[1]}"
            if found
            else "no epoch had finished, so there is no checkpoint"
        )
        raise RuntimeError(
            f"Training diverged: the loss was {guard.failure['loss']} at epoch "
            f"{guard.failure['epoch'] + 1}, batch {guard.failure['batch'] + 1}; {kept}. "
            "Nothing was saved over it; lower the learning rate (another --recipe) "
            "or check the data."
        )
    return history, fit_seconds


def iterators_per_epoch(data):
    """How many iterators Keras' `fit` opens on a `tf.data.Dataset` per epoch.

    Keras' epoch iterator opens one at each epoch's start; on TensorFlow,
    for data of a known length, it opens the next epoch's at the end of an
    epoch as well, and the next epoch opens its own all the same: two.
    """
    import keras

    known = int(data.cardinality()) >= 0
    return 2 if keras.backend.backend() == "tensorflow" and known else 1


RUN_FILE = "run.json"


# Settings a run can be resumed with other values of.
_MAY_CHANGE = ("epochs",)


def path_reference(path):
    return (
        os.path.abspath(os.fspath(path))
        if path is not None and os.path.exists(os.fspath(path))
        else path
    )


def dataset_reference(dataset):
    """How a run records its dataset: a folder by its absolute path, a name as it is."""
    return path_reference(dataset)


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


def read_run(output_dir):
    """The settings recorded in `output_dir/run.json`, or None."""
    path = os.path.join(output_dir, RUN_FILE)
    if not os.path.isfile(path):
        return None
    with open(path) as f:
        return json.load(f)


def changed_settings(output_dir, settings):
    """The names of `settings` an unfinished run in `output_dir` cannot resume with.

    Every recorded setting must be the same, except that `epochs` may grow.
    """
    settings = json.loads(json.dumps(settings))  # tuples as lists, as read back
    recorded = read_run(output_dir)
    if recorded is None:
        return []
    changed = [
        key
        for key in sorted(set(settings) | set(recorded))
        if key not in _MAY_CHANGE and settings.get(key) != recorded.get(key)
    ]
    if recorded.get("epochs") is not None and settings.get("epochs", 0) < recorded["epochs"]:
        changed.append("epochs")
    return changed


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
        changed = changed_settings(output_dir, settings)
        if changed:
            differences = ", ".join(
                f"{key}={settings.get(key)!r} (the run has {recorded.get(key)!r})"
                for key in changed
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
