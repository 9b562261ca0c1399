"""What every job (`train`, `pretrain`) does around its own model and data: one `Run`.

A run writes into its output folder: `model.keras` (the final model),
`history.csv`, `learning_curves.png`, `metrics.json`, `run.json` (its
settings), the job's own files (`class_names.json`), and while it runs
`backup/` (`CrashSafeBackup`: the model and optimizer state at the end of
the last finished epoch, written atomically). Starting the same command
again after an interruption continues from there; a loss that turns NaN
stops the run with that checkpoint kept. While a run works in a folder it
holds it (`.run.lock`): a second run there is refused. The folder and
`run.json` are `run_folder`'s, the fit `fitting`'s, the curves `curves`'.
"""

import json
import os
import shutil
import time

from keras_vit import _options
from keras_vit.training.curves import plot_history
from keras_vit.training.fitting import fit_with_checkpoints
from keras_vit.training.run_folder import (
    changed_settings,
    check_output_dir,
    hold_output_dir,
    record_run,
)

COMMON_OUTPUT_FILES = (
    "model.keras",
    "history.csv",
    "learning_curves.png",
    "metrics.json",
    "run.json",
)


class Run:
    """One run of a job: its settings checked, its folder, its fit, its outputs.

    Created first, it checks the settings on their own before any data is
    read; then the job checks what they mean together, and:

    - `open()` makes the output folder and holds it until the job ends
      (`hold_output_dir`: another run there is refused), resumes an
      unfinished run there (refusing to replace a finished one unless
      `overwrite`; with `overwrite`, an unfinished run whose settings differ
      starts over), records the settings in `run.json` (a resumed run must
      have the recorded ones), seeds every generator and, if asked, makes
      the kernels deterministic;
    - `data_options(...)` are the pipeline options of its data;
    - `steps_per_epoch(data)` refuses data of less than a batch;
    - `fit(network, data, ...)` is `fit_with_checkpoints`;
    - `finish(network, metrics)` saves `model.keras`, draws the learning
      curves, drops the backup and writes `metrics.json` with the timings.

    Args:
        settings: the job's settings (`TrainingSettings`, ...), resolved
            (`settings.resolved()`: no `None` epochs, batch size, recipe or
            output folder).
        log: function that prints a line.
        output_files: the job's files in the folder besides the common
            ones (removed when a finished run is replaced).

    Example:

    ```python
    run = Run(TrainingSettings(output_dir="out", epochs=2).resolved())
    run.open()
    history = run.fit(model, data)
    result = run.finish(model, {})
    ```
    """

    def __init__(self, settings, *, log=print, output_files=()):
        from keras_vit.training.recipes import get_recipe

        self.started = time.perf_counter()
        settings.check()
        self.settings = settings
        self.recipe = get_recipe(settings.recipe)
        self.output_dir = os.fspath(settings.output_dir)
        self.log = log
        self.output_files = COMMON_OUTPUT_FILES + tuple(output_files)
        self.resuming = False
        self.fit_seconds = 0.0

    @property
    def paths(self):
        """`{file name: path}` of the run's outputs."""
        return {name: os.path.join(self.output_dir, name) for name in self.output_files}

    def open(self, settings=None, output_dir=None):
        """Makes the output folder, records the settings, seeds; `True` when resuming.

        Args:
            settings: the settings as the job resolved them (its image size,
                ...), if other than those given at creation.
            output_dir: a folder other than the settings' (a multi-worker
                run's worker writes under the chief's).
        """
        import keras

        if settings is not None:
            self.settings = settings
        if output_dir is not None:
            self.output_dir = os.fspath(output_dir)
        os.makedirs(self.output_dir, exist_ok=True)
        hold_output_dir(self.output_dir)
        overwrite = self.settings.overwrite
        self.resuming = check_output_dir(self.output_dir, overwrite, self.output_files)
        recorded = self.settings.recorded()
        if self.resuming and overwrite and changed_settings(self.output_dir, recorded):
            # Asked to overwrite a run that cannot resume with these settings:
            # start over. With its own settings it resumes, overwrite or not.
            shutil.rmtree(os.path.join(self.output_dir, "backup"))
            self.resuming = False
        record_run(self.output_dir, self.resuming, recorded)
        keras.utils.set_random_seed(self.settings.seed)
        if self.settings.deterministic:
            deterministic_kernels()
        return self.resuming

    def data_options(self, channels, **options):
        """The pipeline options of the run's data (`keras_vit.data.load` keywords)."""
        settings = self.settings
        options = dict(
            image_size=settings.image_size,
            channels=channels,
            seed=settings.seed,
            deterministic=settings.deterministic,  # batches in one order: bit-for-bit resumes
            autotune=self.recipe.data_autotune,
            **{k: v for k, v in options.items() if v is not None},
        )
        if settings.data_dir is not None:
            options["data_dir"] = settings.data_dir
        if settings.download:
            options["download"] = True
        return options

    def training_data(self, options, batch_size=None, shard=None):
        """The run's training batches (`keras_vit.data.load`): cropped, flipped, augmented.

        Args:
            options: the pipeline options (`data_options`).
            batch_size: the batch (default: the settings'; a replica's share
                when distributed).
            shard: `(num_shards, index)` of a multi-worker run's worker.
        """
        from keras_vit import data as vit_data
        from keras_vit.data.augmentation import batch_augmentation

        settings = self.settings
        return vit_data.load(
            settings.dataset,
            "train",
            training=True,
            crop_scale=self.training_crop(),
            flip=True,
            augmentation=batch_augmentation(settings.augmentation, settings.seed),
            batch_size=batch_size or settings.batch_size,
            shard=shard,
            limit=settings.limit,
            **options,
        )

    def training_crop(self):
        """The random-resized crop scale of the training images: the recipe's.

        Fashion-MNIST's is `None`: every crop would cut its centred 28-pixel items.
        """
        return None if self.settings.dataset == "fashion_mnist" else self.recipe.crop_scale

    def steps_per_epoch(self, data, batch_size=None):
        """Training steps per epoch of a `keras_vit.data.Dataset`; fewer than one is an error."""
        batch_size = batch_size or self.settings.batch_size
        steps = (data.size or 0) // batch_size
        if not steps:
            raise ValueError(
                f"Dataset {self.settings.dataset!r} has {data.size or 0} training images, fewer "
                f"than one batch of {_options.given('batch_size', batch_size)}; use a smaller "
                f"{_options.name('batch_size')}."
            )
        return steps

    def fit(self, network, data, **kwargs):
        """`fit_with_checkpoints` into the run's folder; returns the history."""
        history, self.fit_seconds = fit_with_checkpoints(
            network,
            data,
            epochs=self.settings.epochs,
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
            `{"metrics": metrics, "paths": {file name: path}}` of the files written.
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
            "epochs": self.settings.epochs,
            "fit_seconds": round(self.fit_seconds, 1),
            "total_seconds": round(time.perf_counter() - self.started, 1),
        }
        replace_atomically(paths["metrics.json"], lambda path: _write_json(path, metrics))
        # The files this run wrote (a job's optional ones only where it did).
        written = {name: path for name, path in paths.items() if os.path.exists(path)}
        return {"metrics": metrics, "paths": written}


def _write_json(path, value):
    with open(path, "w") as f:
        json.dump(value, f, indent=2)


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
