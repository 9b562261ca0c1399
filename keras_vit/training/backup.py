"""Crash-safe resume state and a guard against diverged training.

Keras' `BackupAndRestore` overwrites `latest.weights.h5` in place and then
`training_metadata.json`: a kill inside the first write leaves a broken
file, a kill between the two leaves weights of one epoch with the epoch
count of another (the resumed run then trains an epoch twice). Here each
checkpoint is a folder, `epoch-000003/` (weights with the optimizer state
and the epoch count), written whole under a temporary name and renamed in
one step; the previous one is removed only afterwards. A kill at any
moment leaves a complete checkpoint, and the newest complete one is what
a restart loads. A LoRA model's checkpoint also keeps its frozen kernels
and adapters apart (`lora_unmerged.npz`): Keras' weights file holds the
merged kernels only, and a load of it zeroes the adapters.
"""

import json
import math
import os
import shutil

import keras
import numpy as np

from keras_vit._compat import BackupHooks, resume_fit_at

_PREFIX = "epoch-"
_PARTIAL = ".partial"
_WEIGHTS = "model.weights.h5"
_STATE = "state.json"
# A LoRA model's frozen kernels and adapters, which its weights file merges.
_UNMERGED = "lora_unmerged.npz"


def replace_atomically(path, write):
    """Writes `path` through `write(temporary_path)`, then renames it into place.

    A reader (or a process killed mid-write) sees the old file or the new
    one, never half of one.
    """
    directory, name = os.path.split(os.path.abspath(path))
    # The name keeps its suffix: Keras insists on `.keras` / `.weights.h5`.
    temporary = os.path.join(directory, f"{_PARTIAL}-{name}")
    if os.path.isdir(temporary):
        shutil.rmtree(temporary)
    elif os.path.exists(temporary):
        os.remove(temporary)
    write(temporary)
    _sync(temporary)
    if os.path.isdir(path):  # a folder is only replaced by rename when gone
        shutil.rmtree(path)
    os.replace(temporary, path)
    _sync(directory)
    return path


def _sync(path):
    """Flushes a file or folder to disk, so that a rename never lands before its data."""
    if os.path.isdir(path):
        for entry in os.listdir(path):
            entry_path = os.path.join(path, entry)
            if os.path.isfile(entry_path):
                _sync(entry_path)
        flags = os.O_RDONLY | getattr(os, "O_DIRECTORY", 0)
    else:
        flags = os.O_RDONLY
    descriptor = os.open(path, flags)
    try:
        os.fsync(descriptor)
    finally:
        os.close(descriptor)


def latest_checkpoint(backup_dir):
    """`(epoch, folder)` of the newest complete checkpoint in `backup_dir`, or `None`."""
    if not os.path.isdir(backup_dir):
        return None
    complete = []
    for name in os.listdir(backup_dir):
        folder = os.path.join(backup_dir, name)
        if (
            name.startswith(_PREFIX)
            and name[len(_PREFIX) :].isdigit()
            and os.path.isfile(os.path.join(folder, _WEIGHTS))
            and os.path.isfile(os.path.join(folder, _STATE))
        ):
            complete.append((int(name[len(_PREFIX) :]), folder))
    return max(complete) if complete else None


def weights_are_finite(model):
    """Whether every weight of `model` (and its optimizer) is a finite number."""
    variables = list(model.weights)
    if model.optimizer is not None:
        variables += list(model.optimizer.variables)
    for variable in variables:
        value = keras.ops.convert_to_numpy(variable)
        if np.issubdtype(value.dtype, np.floating) and not np.isfinite(value).all():
            return False
    return True


class CrashSafeBackup(BackupHooks):
    """`BackupAndRestore` whose checkpoints survive a kill at any moment.

    At the end of every epoch the model's weights, the optimizer state and
    the epoch count go into a new `backup_dir/epoch-NNNNNN/`, written under
    a temporary name and renamed whole; the older checkpoint is deleted
    after. An epoch whose loss or weights are not finite (a diverged step)
    is never saved: the last good checkpoint stays the one to resume from. At the start of
    training the newest complete checkpoint is restored and `fit` goes on
    from the epoch after it. The folder is kept when training ends; remove
    it once the run's outputs are written.

    Args:
        backup_dir: str, the folder of the checkpoints.

    Example:

    ```python
    model.fit(data, epochs=10, callbacks=[CrashSafeBackup("run/backup")])
    # killed; the same call again continues after the last finished epoch
    ```
    """

    def __init__(self, backup_dir):
        super().__init__(
            backup_dir, save_freq="epoch", delete_checkpoint=False, double_checkpoint=False
        )
        self.skipped_epochs = []

    def on_train_begin(self, logs=None):
        self.restore()

    def restore(self):
        found = latest_checkpoint(self.backup_dir)
        if found is None:
            return
        epoch, folder = found
        if self.model.optimizer is not None and not self.model.optimizer.built:
            self.model.optimizer.build(self.model.trainable_variables)
        self.model.load_weights(os.path.join(folder, _WEIGHTS))
        _restore_unmerged(self.model, folder)
        resume_fit_at(self.model, epoch)

    def on_epoch_end(self, epoch, logs=None):
        self._epoch_loss = (logs or {}).get("loss")
        super().on_epoch_end(epoch, logs)

    def save(self):
        epoch = self.finished_epochs
        loss = getattr(self, "_epoch_loss", None)
        if (loss is not None and not math.isfinite(float(loss))) or not weights_are_finite(
            self.model
        ):
            self.skipped_epochs.append(epoch)
            return
        os.makedirs(self.backup_dir, exist_ok=True)
        previous = latest_checkpoint(self.backup_dir)

        def write(folder):
            os.makedirs(folder)
            self.model.save_weights(os.path.join(folder, _WEIGHTS))
            _save_unmerged(self.model, folder)
            with open(os.path.join(folder, _STATE), "w") as f:
                json.dump({"epoch": epoch}, f)

        replace_atomically(os.path.join(self.backup_dir, f"{_PREFIX}{epoch:06d}"), write)
        if previous is not None and previous[0] != epoch:
            shutil.rmtree(previous[1], ignore_errors=True)


def _save_unmerged(model, folder):
    from keras_vit.models.lora import unmerged_variables

    variables = unmerged_variables(model)
    if variables:
        np.savez(
            os.path.join(folder, _UNMERGED),
            **{variable.path: keras.ops.convert_to_numpy(variable) for variable in variables},
        )


def _restore_unmerged(model, folder):
    from keras_vit.models.lora import unmerged_variables

    variables = unmerged_variables(model)
    if not variables:
        return
    path = os.path.join(folder, _UNMERGED)
    if not os.path.isfile(path):
        raise ValueError(f"The checkpoint {folder} is not of a LoRA model: it has no {_UNMERGED}.")
    with np.load(path) as saved:
        missing = [variable.path for variable in variables if variable.path not in saved.files]
        if missing:
            raise ValueError(
                f"The checkpoint {folder} is not of this LoRA model: it lacks {missing[0]}."
            )
        for variable in variables:
            variable.assign(saved[variable.path])


class StopOnNonFiniteLoss(keras.callbacks.Callback):
    """Stops training at the first batch whose loss is NaN or infinite.

    Unlike `keras.callbacks.TerminateOnNaN` it remembers where (`epoch`,
    `batch`, `loss`) so the caller can say so; with `CrashSafeBackup` the
    weights of the diverged epoch are not saved.
    """

    def __init__(self):
        super().__init__()
        self.epoch = 0
        self.failure = None

    def on_epoch_begin(self, epoch, logs=None):
        self.epoch = epoch

    def on_train_batch_end(self, batch, logs=None):
        loss = (logs or {}).get("loss")
        if loss is not None and not math.isfinite(float(loss)):
            self.failure = {"epoch": self.epoch, "batch": batch, "loss": float(loss)}
            self.model.stop_training = True
