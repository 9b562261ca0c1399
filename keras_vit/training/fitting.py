"""`model.fit` that survives kills and stops on a diverged loss: a run's fit."""

import os
import time
import warnings


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
    (`keras_vit.training.batch_norm_statistics.PreciseBatchNorm`): the model saved and
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
        from keras_vit.training.batch_norm_statistics import PreciseBatchNorm

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
