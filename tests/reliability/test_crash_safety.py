"""Killed runs lose nothing; a diverged run never overwrites its last good checkpoint."""

import csv
import json
import os
import random
import signal
import subprocess
import sys
import textwrap
import time

import keras
import numpy as np
import pytest

import keras_vit
from keras_vit.training import CrashSafeBackup, StopOnNonFiniteLoss, latest_checkpoint
from tests import warm_interpreters
from tests.conftest import INSTALLED_BACKENDS, TINY, on_one_backend, own_jax_compilations


class _Killed(BaseException):
    """Stands for SIGKILL inside a write: nothing after it runs."""


def tiny_model(learning_rate=1e-3):
    model = keras_vit.ViT(**TINY, classifier_activation=None)
    model.compile(optimizer=keras.optimizers.SGD(learning_rate), loss="mse")
    return model


def tiny_data(count=16):
    rng = np.random.default_rng(0)
    return rng.uniform(0, 255, (count, 16, 16, 3)).astype("float32"), rng.normal(size=(count, 5))


@pytest.mark.parametrize("length", ["known", "unknown"])
def test_a_resumed_fit_sees_the_shuffles_of_an_uninterrupted_one(tmp_path, length):
    """Epoch 3 after a restart from epoch 2's checkpoint: the batches of an unbroken run."""
    import tensorflow as tf

    from keras_vit.training.fitting import fit_with_checkpoints

    x, y = tiny_data(24)

    def data():  # a new pipeline, as a restarted process builds
        examples = tf.data.Dataset.from_tensor_slices((x, y.astype("float32")))
        if length == "unknown":  # an image folder's: examples may be dropped
            examples = examples.filter(lambda image, target: True)
        return examples.shuffle(24, seed=0).batch(8)

    def run(out, epochs, resuming=False):
        os.makedirs(out, exist_ok=True)
        keras.utils.set_random_seed(0)
        model = tiny_model(learning_rate=0.05)
        fit_with_checkpoints(
            model, data(), epochs=epochs, output_dir=out, resuming=resuming, verbose=0
        )
        return model.get_weights()

    unbroken = run(str(tmp_path / "unbroken"), 3)
    run(str(tmp_path / "restarted"), 2)  # ends with epoch 2's checkpoint
    resumed = run(str(tmp_path / "restarted"), 3, resuming=True)
    for a, b in zip(resumed, unbroken):
        np.testing.assert_array_equal(a, b)


def test_a_kill_during_a_save_leaves_the_previous_checkpoint(tmp_path):
    backup_dir = str(tmp_path / "backup")
    x, y = tiny_data()
    model = tiny_model()
    backup = CrashSafeBackup(backup_dir)
    model.fit(x, y, batch_size=8, epochs=1, callbacks=[backup], verbose=0)
    assert latest_checkpoint(backup_dir)[0] == 1
    after_one = model.get_weights()

    model.fit(x, y, batch_size=8, epochs=1, verbose=0)  # the weights move on
    original_save = model.save_weights

    def killed_mid_write(path, *args, **kwargs):
        with open(path, "wb") as f:
            f.write(b"\x89HDF\r\n\x1a\n half a file")
        raise _Killed

    model.save_weights = killed_mid_write
    backup._current_epoch = 2
    with pytest.raises(_Killed):
        backup._save_model()
    model.save_weights = original_save
    assert any(name.startswith(".partial") for name in os.listdir(backup_dir))
    assert latest_checkpoint(backup_dir)[0] == 1  # the half-written one is ignored

    # A restart restores epoch 1 exactly, and fit goes on after it.
    fresh = tiny_model()
    fresh_backup = CrashSafeBackup(backup_dir)
    fresh_backup.set_model(fresh)
    fresh_backup.on_train_begin()
    for a, b in zip(fresh.get_weights(), after_one):
        np.testing.assert_array_equal(a, b)
    assert fresh._initial_epoch == 1

    # The next save completes, replaces the stale partial write and epoch 1.
    model.fit(x, y, batch_size=8, epochs=3, initial_epoch=2, callbacks=[backup], verbose=0)
    assert sorted(os.listdir(backup_dir)) == ["epoch-000003"]


@keras.saving.register_keras_serializable(package="tests")
class ExplodingRate(keras.optimizers.schedules.LearningRateSchedule):
    """1e-3 for the first epoch's two steps, then a rate that overflows the weights."""

    def __call__(self, step):
        return keras.ops.where(step < 2, 1e-3, 1e38)

    def get_config(self):
        return {}


def test_a_diverged_run_stops_and_keeps_its_last_good_checkpoint(tmp_path):
    backup_dir = str(tmp_path / "backup")
    x, y = tiny_data()
    model = keras_vit.ViT(**TINY, classifier_activation=None)
    model.compile(optimizer=keras.optimizers.SGD(ExplodingRate()), loss="mse")
    guard, backup = StopOnNonFiniteLoss(), CrashSafeBackup(backup_dir)
    model.fit(x, y, batch_size=8, epochs=4, callbacks=[guard, backup], verbose=0)
    assert guard.failure is not None and guard.failure["epoch"] == 1
    assert not np.isfinite(guard.failure["loss"])
    epoch, folder = latest_checkpoint(backup_dir)
    assert epoch == 1 and backup.skipped_epochs == [2]  # the diverged epoch was not saved
    restored = tiny_model()
    restored.load_weights(os.path.join(folder, "model.weights.h5"))
    assert all(np.isfinite(w).all() for w in restored.get_weights())


@on_one_backend("torch", "the command's own work")
@pytest.mark.slow
def test_the_train_command_reports_divergence_and_writes_no_model(tmp_path):
    from keras_vit.training import Recipe, train
    from tests.training.test_train_command import write_dataset

    data = write_dataset(tmp_path / "data", per_class=16)
    out = str(tmp_path / "run")
    with pytest.raises(RuntimeError, match=r"Training diverged: the loss was (nan|inf)"):
        train(
            data,
            image_size=16,
            epochs=2,
            batch_size=8,
            output_dir=out,
            verbose=0,
            recipe=Recipe(learning_rate=1e38, warmup_fraction=0.0),
        )
    assert not os.path.exists(os.path.join(out, "model.keras"))


def history_epochs(out):
    with open(os.path.join(out, "history.csv")) as f:
        return [int(row["epoch"]) for row in csv.DictReader(f)]


# Every run is a fresh interpreter of the backend checked, whichever suite
# starts them (this one only compares the weights they saved).
@pytest.mark.backend_independent
@pytest.mark.slow
@pytest.mark.parametrize("backend", INSTALLED_BACKENDS)
def test_killed_runs_resume_to_the_weights_of_an_uninterrupted_run(backend, tmp_path):
    """SIGKILL twice (mid-epoch, right at a checkpoint); restart each time.

    (A kill at a random moment, a third, landed before the first epoch on a
    loaded machine: in the interpreter's start, where nothing is written.)
    """
    from tests.training.test_train_command import write_dataset

    data = write_dataset(tmp_path / "data", per_class=48)
    # A JAX process killed in a write of its compilation cache leaves the entry
    # truncated: these runs share a cache of their own.
    env = dict(
        os.environ,
        KERAS_BACKEND=backend,
        TF_CPP_MIN_LOG_LEVEL="3",
        **own_jax_compilations(tmp_path / "jax_compilations"),
    )

    def arguments(out):
        return [
            "train",
            "--dataset",
            data,
            "--image-size",
            "16",
            "--epochs",
            "5",
            "--batch-size",
            "8",
            "--output-dir",
            out,
            "--deterministic",
        ]

    def command(out):
        return [sys.executable, "-m", "keras_vit.cli", *arguments(out)]

    reference = str(tmp_path / "uninterrupted")
    out = str(tmp_path / "killed")
    backup_dir = os.path.join(out, "backup")
    rng = random.Random(0)

    def checkpoints():
        found = latest_checkpoint(backup_dir)
        return found[0] if found else 0

    def partial_write():
        return os.path.isdir(backup_dir) and any(
            name.startswith(".partial") for name in os.listdir(backup_dir)
        )

    kills = []
    for moment in ("mid-epoch", "at a checkpoint"):
        process = warm_interpreters.Popen(
            command(out), env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
        )
        done_before, started = checkpoints(), time.time()
        while time.time() < started + 300 and process.poll() is None:
            if moment == "mid-epoch" and checkpoints() > done_before:
                time.sleep(rng.uniform(0.05, 0.5))  # inside the next epoch
                break
            if moment == "at a checkpoint" and (partial_write() or checkpoints() > done_before):
                break  # while it is written, or the instant after
            time.sleep(0.002)
        if process.poll() is not None:
            continue  # it finished before this kill: nothing to kill
        process.send_signal(signal.SIGKILL)
        process.wait()
        kills.append((moment, checkpoints()))
    assert len(kills) == 2, kills
    # The resume in a fresh interpreter, as a user's; then, in the same one,
    # the uninterrupted run from scratch (runs of one seed agree wherever
    # they run: tests/pretraining/test_pretrain_command.py).
    both = textwrap.dedent(f"""
        from keras_vit.cli import main
        for arguments in {[arguments(out), arguments(reference)]!r}:
            assert main(arguments) == 0, arguments
    """)
    result = warm_interpreters.run(
        [sys.executable, "-c", both], env=env, capture_output=True, text=True, timeout=600
    )
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    assert result.stdout.count("resuming from") == 1
    assert not os.path.exists(backup_dir)  # removed once the outputs are written
    assert history_epochs(out) == list(range(1, 6))  # every epoch once
    assert json.load(open(os.path.join(out, "metrics.json")))["epochs"] == 5

    final = keras.models.load_model(os.path.join(out, "model.keras")).get_weights()
    expected = keras.models.load_model(os.path.join(reference, "model.keras")).get_weights()
    difference = max(float(np.abs(a - b).max()) for a, b in zip(final, expected))
    print(f"kills survived: {kills}; largest weight difference: {difference}")
    assert difference == 0.0


@pytest.mark.backend_independent  # the benchmark measures a fresh interpreter of `backend`
@pytest.mark.slow
@pytest.mark.parametrize("backend", INSTALLED_BACKENDS)
def test_repeated_predict_and_serving_calls_keep_memory_flat(backend):
    """`benchmarks/memory_growth.py` end to end, short (the README reports 5,000 calls)."""
    from tests.conftest import load_benchmark

    benchmark = load_benchmark("memory_growth")
    # Resident memory may climb over the first calls and then level off (the
    # allocators' pools and Keras' caches filling); only what grows after
    # that is a leak. torch's climb lasted 300 predicts on Keras 3.14 (60 MB,
    # flat for the next thousand); TensorFlow and JAX level off within 50
    # (Keras 3.15), and a TensorFlow predict costs 50 ms: the 250 calls
    # measured come after a warm-up of 100 there.
    # One image a call: what leaks is per call (Keras' and the runtimes'
    # caches and pools), not per image, and the calls cost a third as much.
    warmup = 350 if backend == "torch" else 100
    results = benchmark.measure(backend, calls=warmup + 250, warmup=warmup, batch_size=1)
    expected = {"predict", "serving signature"} if backend == "tensorflow" else {"predict"}
    assert {r["case"] for r in results} == expected
    for result in results:
        # A leak of 100 kB a call would be 25 MB here; the allocators'
        # own ups and downs stay within a few MB.
        assert result["growth_mb"] < 20, result
