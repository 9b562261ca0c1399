"""`keras-vit` one step off the happy path: layouts checked first, runs that remember
themselves, interruptions, and messages that name the real cause."""

import fcntl
import json
import os
import re
import shutil
import signal
import stat
import subprocess
import sys
import time
import zipfile

import keras
import numpy as np
import pytest
import tensorflow as tf

import keras_vit
from keras_vit._options import options_named
from keras_vit.cli import build_parser, main
from keras_vit.training import TrainingSettings
from keras_vit.training.backup import latest_checkpoint
from keras_vit.training.run import Run
from keras_vit.training.run_folder import read_run, record_run
from tests import warm_interpreters
from tests.conftest import BACKEND, TINY, evaluated_accuracy, on_one_backend, own_jax_compilations
from tests.test_console import console_environment
from tests.training.test_train_command import write_dataset

TRAIN = ["--image-size", "16", "--batch-size", "8", "--epochs", "1"]


@pytest.fixture(scope="module")
def folders(tmp_path_factory):
    """A train/test folder, a train/-only folder and a flat folder (class folders at the top)."""
    root = tmp_path_factory.mktemp("folders")
    split = write_dataset(root / "split", per_class=16)
    shutil.copytree(os.path.join(split, "train"), root / "train_only" / "train")
    shutil.copytree(os.path.join(split, "train"), root / "flat")
    return {"split": split, "train_only": str(root / "train_only"), "flat": str(root / "flat")}


@pytest.fixture(scope="module")
def held_out_run(folders, tmp_path_factory):
    """A run trained on the flat folder with a held-out split."""
    out = str(tmp_path_factory.mktemp("runs") / "held_out")
    assert (
        main(
            [
                "train",
                "--dataset",
                folders["flat"],
                "--validation-split",
                "0.25",
                "--output-dir",
                out,
                *TRAIN,
            ]
        )
        == 0
    )
    return out


@pytest.mark.parametrize(
    "layout, found",
    [
        ("train_only", "has train/ but no test/"),
        ("flat", r"has class folders at the top \(dark, light\) and no train/ and test/"),
    ],
)
def test_a_folder_without_test_images_is_refused_before_training(folders, tmp_path, layout, found):
    out = tmp_path / "run"
    with pytest.raises(
        SystemExit,
        match=rf"{found}, so it has no test images\. Expected .*"
        r"/train/<class>/<images> .* --validation-split 0\.1",
    ):
        main(["train", "--dataset", folders[layout], "--output-dir", str(out), *TRAIN])
    assert not out.exists()  # refused before any folder was made


def test_a_held_out_split_of_a_folder_with_its_own_test_images_is_refused(folders, tmp_path):
    out = tmp_path / "run"
    with pytest.raises(
        SystemExit,
        match=r"'.*split' has a test/ folder, its own test images; "
        r".*Received: --validation-split 0\.25",
    ):
        main(
            [
                "train",
                "--dataset",
                folders["split"],
                "--validation-split",
                "0.25",
                "--output-dir",
                str(out),
                *TRAIN,
            ]
        )
    assert not out.exists()


@on_one_backend("torch", "the command's own work")
@pytest.mark.slow
def test_a_held_out_split_is_fixed_stratified_and_disjoint(folders, held_out_run):
    labels = np.repeat([0, 1, 2], [10, 20, 5])
    training, validation = keras_vit.data.held_out_split(labels, 0.2)
    again = keras_vit.data.held_out_split(labels, 0.2)
    assert np.array_equal(training, again[0]) and np.array_equal(validation, again[1])
    assert not set(training) & set(validation) and len(training) + len(validation) == 35
    assert np.bincount(labels[validation]).tolist() == [2, 4, 1]
    with open(os.path.join(held_out_run, "run.json")) as f:
        recorded = json.load(f)
    assert recorded["validation_split"] == 0.25 and recorded["dataset"] == folders["flat"]
    metrics = json.load(open(os.path.join(held_out_run, "metrics.json")))
    # Its test result is the held-out images' (evaluate reads the split from run.json).
    model_path = os.path.join(held_out_run, "model.keras")
    assert metrics["test_accuracy"] == pytest.approx(evaluated_accuracy(model_path), abs=1e-4)


@on_one_backend("torch", "the command's own work")
@pytest.mark.slow
def test_evaluate_and_export_use_the_runs_own_data_by_default(folders, held_out_run, capsys):
    model = os.path.join(held_out_run, "model.keras")
    assert main(["evaluate", "--model", model]) == 0
    printed = capsys.readouterr().out
    # The 8 held-out images of the 32 (4 of each class), not Fashion-MNIST's 10,000.
    assert re.search(
        rf"{re.escape(folders['flat'])} test: accuracy [0-9.]+, cross-entropy "
        r"[0-9.]+ \(8 images\)",
        printed,
    ), printed
    metrics = json.load(open(os.path.join(held_out_run, "metrics.json")))
    reported = float(re.search(r"cross-entropy ([0-9.]+)", printed)[1])
    assert reported == pytest.approx(metrics["test_cross_entropy"], abs=1e-4)
    assert (
        main(
            [
                "export",
                model,
                "--format",
                "tflite",
                "--quantize",
                "int8",
                "--calibration-images",
                "8",
                "--check-images",
                "8",
                "--overwrite",
            ]
        )
        == 0
    )
    printed = capsys.readouterr().out
    assert f"on 8 {folders['flat']} images" in printed


def test_evaluate_reports_the_same_cross_entropy_for_a_softmax_head_on_every_backend(
    folders, tmp_path, capsys
):
    model = keras_vit.ViT(**{**TINY, "classes": 2}, seed=0)  # softmax head
    model.save(tmp_path / "model.keras")
    assert (
        main(["evaluate", "--model", str(tmp_path / "model.keras"), "--dataset", folders["split"]])
        == 0
    )
    reported = float(re.search(r"cross-entropy ([0-9.]+)", capsys.readouterr().out)[1])
    test = keras_vit.data.load(folders["split"], "test", image_size=16, batch_size=64)
    images, labels = next(iter(test.data))
    probabilities = keras.ops.convert_to_numpy(model(images.numpy()))
    expected = -np.mean(np.sum(labels.numpy() * np.log(probabilities), axis=-1))
    assert reported == pytest.approx(expected, abs=2e-4)  # no softmax applied twice


@pytest.mark.backend_independent
def test_resuming_with_other_settings_is_refused_naming_each_difference(tmp_path):
    settings = {"model": "small", "batch_size": 8, "recipe": "small", "epochs": 3}
    record_run(str(tmp_path), False, settings)
    record_run(str(tmp_path), True, {**settings, "epochs": 5})  # more epochs: allowed
    with pytest.raises(ValueError) as error, options_named(train_options()):
        record_run(
            str(tmp_path), True, {**settings, "model": "Ti/16", "batch_size": 16, "epochs": 5}
        )
    message = str(error.value)
    assert "--model 'Ti/16' (the run has 'small')" in message
    assert "--batch-size 16 (the run has 8)" in message
    assert "--overwrite" in message and len(message.splitlines()) == 1
    with pytest.raises(ValueError, match="epochs=2 \\(the run has 5\\)"):
        record_run(str(tmp_path), True, {**settings, "epochs": 2})


@pytest.mark.backend_independent
def test_overwrite_starts_over_an_unfinished_run_only_when_its_settings_differ(tmp_path):
    def open_run(batch_size, overwrite):
        settings = TrainingSettings(
            output_dir=str(tmp_path), overwrite=overwrite, epochs=3, batch_size=batch_size
        )
        return Run(settings.resolved()).open()

    assert open_run(8, overwrite=False) is False
    checkpoint = tmp_path / "backup" / "epoch_1.keras"
    checkpoint.parent.mkdir()
    checkpoint.write_bytes(b"a checkpoint")  # an unfinished run
    # Its own settings: it resumes, --overwrite or not, and keeps its checkpoint.
    assert open_run(8, overwrite=True) is True and checkpoint.exists()
    with pytest.raises(ValueError, match="batch_size=16 \\(the run has 8\\)"):
        open_run(16, overwrite=False)
    assert checkpoint.exists() and read_run(str(tmp_path))["batch_size"] == 8
    # Other settings with --overwrite, as the refusal offers: a fresh run.
    assert open_run(16, overwrite=True) is False
    assert not (tmp_path / "backup").exists()
    assert read_run(str(tmp_path))["batch_size"] == 16


@pytest.mark.slow
def test_ctrl_c_prints_one_line_exits_130_and_the_same_command_resumes(folders, tmp_path):
    out = tmp_path / "run"
    command = [
        sys.executable,
        "-m",
        "keras_vit_launcher",
        "train",
        "--dataset",
        folders["split"],
        "--image-size",
        "16",
        "--batch-size",
        "8",
        "--epochs",
        "40",
        "--output-dir",
        str(out),
    ]
    # As from a terminal: Python's own SIGINT handler (a warm interpreter installs
    # it, as a fresh one does when SIGINT is at its default; `make test` runs the
    # suites in the background, whose cold children would start with it ignored).
    # The libraries' quiet start is tests/test_console.py's: their log level is
    # set. A signalled JAX process may leave a cache entry half-written: its own
    # compilation cache.
    environment = console_environment(
        TF_CPP_MIN_LOG_LEVEL="3", **own_jax_compilations(tmp_path / "jax_compilations")
    )
    process = warm_interpreters.Popen(
        command, env=environment, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )
    deadline = time.time() + 600  # a loaded CI machine: epochs can take a while
    # Checkpoints replace each other: wait for any of epoch 2 or later.
    while (latest_checkpoint(str(out / "backup")) or (0,))[0] < 2:
        if time.time() > deadline or process.poll() is not None:
            process.kill()
            pytest.fail(f"no second checkpoint: {process.communicate()[1][-2000:]}")
        time.sleep(0.2)
    process.send_signal(signal.SIGINT)
    stdout, stderr = process.communicate(timeout=120)
    assert process.returncode == 130, stderr
    assert "Traceback" not in stderr
    lines = [line for line in stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and re.fullmatch(
        r"keras-vit train: interrupted after epoch \d+ \(checkpoint in .*\); run the same "
        r"command again to resume\.",
        lines[0],
    ), stderr
    # Other settings: refused in one line, before anything is loaded.
    changed = [
        *command[: command.index("--batch-size")],
        "--batch-size",
        "4",
        *command[command.index("--batch-size") + 2 :],
    ]
    with pytest.raises(SystemExit) as refused:
        main(changed[command.index("train") :])
    message = str(refused.value.code)
    assert message.splitlines() == [message] and "--batch-size 4 (the run has 8)" in message


def test_a_folder_that_another_run_holds_is_refused_and_free_when_that_run_ends(folders, tmp_path):
    out = tmp_path / "run"
    out.mkdir()
    holder = open(out / ".run.lock", "w")  # as another process's run holds it
    fcntl.flock(holder, fcntl.LOCK_EX | fcntl.LOCK_NB)
    holder.write("4242")
    holder.flush()
    arguments = ["train", "--dataset", folders["split"], "--output-dir", str(out), *TRAIN]
    with pytest.raises(
        SystemExit,
        match=rf"^keras-vit train: '{out}' is in use by another run "
        r"\(process 4242\); wait for it to end, or pass another "
        r"--output-dir\.$",
    ):
        main(arguments)
    assert os.listdir(out) == [".run.lock"]  # nothing of the refused run
    # The holder ends (killed or not, the system drops its lock); its file stays.
    holder.close()
    # Past the hold, a run fails on its data (one batch is more than the folder has).
    with pytest.raises(SystemExit, match="fewer than one batch"):
        main([*arguments, "--batch-size", "512"])
    assert ".run.lock" not in os.listdir(out)  # the run let the folder go


def test_a_failed_run_leaves_no_empty_folder_and_numbers_are_checked(folders, tmp_path, capsys):
    out = tmp_path / "run"
    with pytest.raises(
        SystemExit,
        match=r"fewer than one batch of --batch-size 512; use a "
        r"smaller --batch-size",
    ):
        main(
            [
                "train",
                "--dataset",
                folders["split"],
                "--image-size",
                "16",
                "--batch-size",
                "512",
                "--output-dir",
                str(out),
            ]
        )
    assert not out.exists()
    for option, value in (
        ("--image-size", "0"),
        ("--epochs", "-1"),
        ("--batch-size", "x"),
        ("--validation-split", "1.5"),
        ("--patch-dropout", "1"),
    ):
        with pytest.raises(SystemExit) as exit_:
            main(["train", "--output-dir", str(out), option, value])
        assert exit_.value.code == 2
        assert f"argument {option}: must be" in capsys.readouterr().err
    assert not out.exists()


def test_outputs_that_cannot_be_written_get_one_line_before_any_work(tmp_path):
    # /sys takes no files, whoever asks (permissions alone would not stop root).
    model = tmp_path / "model.keras"
    keras_vit.ViT(**TINY).save(model)
    image = tmp_path / "image.png"
    image.write_bytes(tf.io.encode_png(np.zeros((16, 16, 3), "uint8")).numpy())
    a_file = tmp_path / "notes.txt"
    a_file.write_text("kept")
    cases = [
        (
            ["train", "--output-dir", "/sys/keras_vit_run"],
            r"keras-vit train: --output-dir /sys/keras_vit_run: cannot write in /sys \(.+\)",
        ),
        (
            ["finetune", str(model), "--output-dir", "/sys/tuned"],
            r"--output-dir /sys/tuned: cannot",
        ),
        (["pretrain", "--output-dir", "/sys/pretrained"], r"--output-dir /sys/pretrained: cannot"),
        (
            ["export", str(model), "--format", "tflite", "--output", "/sys/model.tflite"],
            r"keras-vit export: --output /sys/model.tflite: cannot write in /sys \(.+\)",
        ),
        (["export", str(model), "--output", "/sys/serving"], r"--output /sys/serving: cannot"),
        (
            ["inspect", str(model), str(image), "--out", "/sys/figures"],
            r"--out /sys/figures: cannot",
        ),
        (["demo", "--output-dir", "/sys/demo"], r"keras-vit demo: --output-dir /sys/demo: cannot"),
        (["convert", str(model), "/sys/x.keras"], r"keras-vit convert: DST /sys/x.keras: cannot"),
        (["train", "--output-dir", str(a_file)], rf"--output-dir {a_file} is a file, not a folder"),
        (
            ["inspect", str(model), str(image), "--out", str(a_file / "figures")],
            rf"--out {a_file / 'figures'}: {a_file} is a file, not a folder",
        ),
    ]
    for arguments, message in cases:
        with pytest.raises(SystemExit) as exit_:
            main(arguments)
        shown = str(exit_.value.code)
        assert re.search(message, shown), (arguments, shown)
        assert len(shown.splitlines()) == 1
    assert sorted(os.listdir(tmp_path)) == ["image.png", "model.keras", "notes.txt"]
    assert a_file.read_text() == "kept"


@on_one_backend("torch", "the command's own work")
def test_bad_model_files_get_one_line_naming_the_file_and_the_cause(tmp_path):
    text = tmp_path / "notes.keras"
    text.write_text("not a model")
    real = tmp_path / "real.keras"
    keras_vit.ViT(**TINY).save(real)
    truncated = tmp_path / "truncated.keras"
    truncated.write_bytes(real.read_bytes()[:2000])
    no_config = tmp_path / "no_config.keras"
    with zipfile.ZipFile(no_config, "w") as archive:
        archive.writestr("metadata.json", "{}")
    encoder = tmp_path / "encoder.keras"
    keras_vit.ViT(**{**TINY, "include_top": False, "pooling": None}).save(encoder)
    cnn = tmp_path / "cnn.keras"
    keras.Sequential(
        [
            keras.Input((16, 16, 3)),
            keras.layers.Conv2D(2, 3),
            keras.layers.GlobalAveragePooling2D(),
            keras.layers.Dense(5),
        ]
    ).save(cnn)
    image = tmp_path / "image.png"
    image.write_bytes(tf.io.encode_png(np.zeros((16, 16, 3), "uint8")).numpy())
    # Exports, as the commands meet them: a TFLite FlatBuffer's first bytes, an
    # .onnx file, a SavedModel version folder.
    tflite = tmp_path / "model_int8.tflite"
    tflite.write_bytes(b"\x1c\0\0\0TFL3" + bytes(24))
    onnx = tmp_path / "model.onnx"
    onnx.write_bytes(b"\x08\x07\x12\x07keras2onnx")
    served = tmp_path / "serving" / "vit" / "1"
    served.mkdir(parents=True)
    (served / "saved_model.pb").write_bytes(b"")
    exported = r" is {}, not a \.keras model file: give the model\.keras it was exported from"
    cases = [
        # Commands that take a .keras model only say what the export is ...
        (["export", str(tflite)], f"{tflite}" + exported.format("a TFLite model")),
        (["inspect", str(onnx), str(image)], f"{onnx}" + exported.format("an ONNX model")),
        (
            ["export", str(served), "--format", "onnx"],
            f"{served}" + exported.format("an exported SavedModel folder"),
        ),
        # ... evaluate and predict run exports, and name a broken one's cause.
        (
            ["evaluate", "--model", str(tflite)],
            f"'{tflite}' is not a TFLite model the runtime can load: .*schema version",
        ),
        (
            ["predict", str(image), "--model", str(onnx)],
            f"'{onnx}' is not an ONNX model ONNX Runtime can load",
        ),
        (
            ["predict", str(image), "--model", str(served)],
            f"'{served}' is not a SavedModel TensorFlow can load",
        ),
        (
            ["predict", str(image), "--model", str(text)],
            f"{text} is not a .keras model file: it is not a zip archive",
        ),
        (["evaluate", "--model", str(truncated)], f"{truncated} is not a .keras model file"),
        (["export", str(no_config)], f"{no_config} is a zip archive without config.json"),
        (
            ["predict", str(image), "--model", str(encoder)],
            rf"{encoder} is not an image classifier .* keras-vit finetune {encoder}",
        ),
        (["inspect", str(cnn), str(image)], rf"{cnn}: .* is not a ViT built by keras_vit"),
    ]
    for arguments, message in cases:
        with pytest.raises(SystemExit) as exit_:
            main(arguments)
        shown = str(exit_.value.code)
        assert re.search(message, shown), (arguments, shown)
        assert len(shown.splitlines()) == 1 and "Traceback" not in shown


def test_an_unprepared_tfds_dataset_is_refused_at_once_naming_download(tmp_path, monkeypatch):
    # "At once": TFDS is asked to read what is prepared and nothing more, so
    # neither a preparation nor a connection is attempted (a wall-clock bound
    # would also count a loaded machine's first import of TFDS).
    import socket

    import tensorflow_datasets as tfds

    attempted = []

    def prepare(builder, *args, **kwargs):
        attempted.append(f"download_and_prepare of {builder.name}")
        raise AssertionError("the refusal prepared the dataset")

    def connect(sock, address, *args, **kwargs):
        attempted.append(f"connection to {address}")
        raise OSError("the test allows no connection")

    monkeypatch.setattr(tfds.core.DatasetBuilder, "download_and_prepare", prepare)
    monkeypatch.setattr(socket.socket, "connect", connect)
    monkeypatch.setattr(socket.socket, "connect_ex", connect)
    with pytest.raises(SystemExit) as exit_:
        main(
            [
                "train",
                "--dataset",
                "cifar10",
                "--data-dir",
                str(tmp_path / "tfds"),
                "--output-dir",
                str(tmp_path / "run"),
            ]
        )
    assert attempted == []
    message = str(exit_.value.code)
    assert "'cifar10' (train) is not prepared in" in message and "--download" in message
    assert "--data-dir" in message and "data_dir" not in message.replace("--data_dir", "")
    assert not (tmp_path / "run").exists()


def train_options():
    """`{argument: option}` of `keras-vit train`, as its parser records them."""
    return build_parser().parse_args(["train"]).options


@pytest.mark.backend_independent
def test_messages_name_the_options_the_command_took():
    from keras_vit.training.run import Run

    def steps_error():
        class Data:
            size = 3

        run = Run(TrainingSettings(dataset="x", batch_size=8).resolved())
        with pytest.raises(ValueError) as error:
            run.steps_per_epoch(Data())
        return str(error.value)

    assert steps_error() == (
        "Dataset 'x' has 3 training images, fewer than one batch of batch_size=8; "
        "use a smaller `batch_size`."
    )
    with options_named(train_options()):
        assert steps_error() == (
            "Dataset 'x' has 3 training images, fewer than one batch of --batch-size 8; "
            "use a smaller --batch-size."
        )
    export_options = build_parser().parse_args(["export", "m.keras"]).options
    with options_named(export_options), pytest.raises(ValueError) as error:
        keras_vit.export.litert._check_quantization("int4")
    assert str(error.value).startswith("--quantize must be one of") and "--quantize 'int4'" in str(
        error.value
    )
    with options_named(export_options):
        from keras_vit import _options

        assert (
            f"pass {_options.code('overwrite', True)} to replace it, or another "
            f"{_options.name('version')}."
        ) == "pass --overwrite to replace it, or another --output version folder."
    with options_named(train_options()):
        from keras_vit.training.settings import _check_accumulation

        with pytest.raises(
            ValueError, match="--accumulate must be None or an int >= 2. Received: --accumulate 1"
        ):
            _check_accumulation(1)


@pytest.mark.skipif(
    BACKEND == "torch",
    reason="exported through a TensorFlow child process; "
    "the files are written the same way (tests/export)",
)
@pytest.mark.slow
def test_exports_get_the_umasks_permissions(tmp_path):
    old = os.umask(0o022)
    try:
        model = keras_vit.ViT(**TINY)
        version = keras_vit.export.saved_model(model, str(tmp_path / "serving"), warmup=False)
        result = keras_vit.export.tflite(model, str(tmp_path / "vit.tflite"))
    finally:
        os.umask(old)
    modes = {}
    for root, folders, files in os.walk(version):
        for name in folders + files:
            modes[os.path.join(root, name)] = stat.S_IMODE(
                os.stat(os.path.join(root, name)).st_mode
            )
    modes[version] = stat.S_IMODE(os.stat(version).st_mode)
    for path in (result["path"], str(tmp_path / "vit.tflite.json")):
        modes[path] = stat.S_IMODE(os.stat(path).st_mode)
    for path, mode in modes.items():
        assert mode == (0o755 if os.path.isdir(path) else 0o644), (path, oct(mode))


# In process under TensorFlow; in a TensorFlow child under torch, as under JAX.
@pytest.mark.skipif(BACKEND == "jax", reason="torch's run shows the child's lines")
@pytest.mark.slow
def test_int8_export_and_running_it_print_only_the_packages_own_lines(tmp_path):
    # A fresh process: LiteRT announces its delegate once per process.
    code = (
        "import numpy as np, keras_vit\n"
        f"model = keras_vit.ViT(**{TINY!r})\n"
        "images = np.random.default_rng(0).uniform(0, 255, (8, 16, 16, 3)).astype('float32')\n"
        f"keras_vit.export.tflite(model, {str(tmp_path / 'm.tflite')!r}, quantization='int8',\n"
        "                         representative_data=images)\n"
        f"runner = keras_vit.export.TFLiteModel({str(tmp_path / 'm.tflite')!r})\n"
        "print('exported', runner(images[:1]).shape)\n"
    )
    done = warm_interpreters.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        env={**console_environment(), "TF_CPP_MIN_LOG_LEVEL": "3"},
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines()[-1] == f"exported (1, {TINY['classes']})"
    output = done.stdout + done.stderr
    assert "fully_quantize" not in output and "tf.lite.Interpreter is deprecated" not in output
    assert "XNNPACK" not in output, output


@pytest.mark.backend_independent
def test_recipes_read_as_one_line():
    small = str(keras_vit.training.RECIPES["small"])
    assert small == (
        "AdamW, learning rate 0.002 (10% warm-up, then cosine decay), weight "
        "decay 0.05, gradient clip 1, label smoothing 0.1"
    )
    assert str(keras_vit.training.RECIPES["finetune"]) == (
        "a new head fitted on the frozen features first, AdamW, learning rate 3e-05 (10% "
        "warm-up, then cosine decay), weight decay 0.05, gradient clip 1"
    )


def test_inspect_says_what_it_skipped_and_draws_no_empty_frames(tmp_path, capsys):
    from keras_vit.inspect import figures

    stem = keras_vit.ViT(**{**TINY, "patch_size": 1}, stem_filters=(8, 8), stem_strides=(2, 2))
    stem.save(tmp_path / "stem.keras")
    image = tmp_path / "image.png"
    image.write_bytes(tf.io.encode_png(np.zeros((16, 16, 3), "uint8")).numpy())
    assert (
        main(
            [
                "inspect",
                str(tmp_path / "stem.keras"),
                str(image),
                "--out",
                str(tmp_path / "figures"),
            ]
        )
        == 0
    )
    assert re.search(
        r"embedding_filters +skipped: the model has a convolutional stem", capsys.readouterr().out
    )
    figure = figures.embedding_filter_grid(np.zeros((9, 4, 4, 3)), columns=7)
    visible = [axis for axis in figure.axes if axis.get_visible()]
    assert len(visible) == 9  # two rows of 7 frames, the last 5 hidden
    figures.save(figure, os.devnull)


@pytest.mark.backend_independent
def test_learning_curves_count_epochs_like_the_history(tmp_path):
    from matplotlib import image as mpimg  # noqa: F401 (matplotlib present)

    from keras_vit.training import curves

    csv_path = tmp_path / "history.csv"
    csv_path.write_text("epoch,accuracy,loss,val_accuracy,val_loss\n1,0.5,1.0,0.6,0.9\n")
    captured = {}
    import matplotlib.figure

    original = matplotlib.figure.Figure.savefig

    def keep(self, *args, **kwargs):
        captured["axes"] = self.axes
        return original(self, *args, **kwargs)

    matplotlib.figure.Figure.savefig = keep
    try:
        curves.plot_history(str(csv_path), str(tmp_path / "curves.png"))
    finally:
        matplotlib.figure.Figure.savefig = original
    axis = captured["axes"][0]
    assert axis.get_xlim() == (0.5, 1.5)
    assert [tick for tick in axis.get_xticks() if 0.5 <= tick <= 1.5] == [1.0]


def test_exporting_a_model_of_any_size_names_the_option_export_takes(tmp_path):
    model = tmp_path / "any_size.keras"
    keras_vit.ViT(**{**TINY, "input_shape": (None, None, 3)}).save(model)
    for export_format in ("tflite", "onnx"):
        with pytest.raises(SystemExit) as exit_:
            main(["export", str(model), "--format", export_format])
        shown = str(exit_.value.code)
        assert "name the size to export it at, e.g. --image-size 224." in shown, shown
        assert "--model" not in shown  # (export takes MODEL, positional)


def test_a_keras_quantized_model_is_refused_by_the_tflite_export_in_one_line(tmp_path):
    model = tmp_path / "int8.keras"
    quantized = keras_vit.ViT(**TINY)
    quantized.quantize("int8")
    quantized.save(model)
    with pytest.raises(SystemExit) as exit_:
        main(["export", str(model), "--format", "tflite", "--quantize", "int8"])
    shown = str(exit_.value.code)
    assert "LiteRT cannot convert Keras' 'int8' layers" in shown, shown
    assert "SavedModel" in shown and len(shown.splitlines()) == 1, shown
    assert not any(path.suffix == ".tflite" for path in tmp_path.iterdir())
