"""`keras-vit train / evaluate / predict`: outputs and bad input (kills: tests/reliability)."""

import contextlib
import csv
import json
import os

import keras
import numpy as np
import pytest
import tensorflow as tf

from keras_vit import data as vit_data
from keras_vit.cli import main
from keras_vit.training.batch_norm_statistics import recompute_batch_norm_statistics
from keras_vit.training.run_folder import read_run
from tests.conftest import evaluated_accuracy, on_one_backend


def write_dataset(root, per_class=48, shades=(("dark", 40), ("light", 200))):
    """A train/test folder of 16-px PNGs: one class per `(name, mean grey level)` of `shades`."""
    rng = np.random.default_rng(0)
    for split in ("train", "test"):
        for name, base in shades:
            folder = root / split / name
            os.makedirs(folder)
            for i in range(per_class if split == "train" else 8):
                image = np.clip(base + rng.normal(0, 20, (16, 16, 3)), 0, 255).astype("uint8")
                (folder / f"{i}.png").write_bytes(tf.io.encode_png(image).numpy())
    return str(root)


@contextlib.contextmanager
def killed_after_first_checkpoint():
    """Inside it, a run stops with `KeyboardInterrupt` right after its first checkpoint.

    As a kill at that moment would, in-process: the resume tests then start
    the same run again.
    """
    from keras_vit.training import backup

    save = backup.CrashSafeBackup.on_epoch_end

    def killed_after_epoch_1(self, epoch, logs=None):
        save(self, epoch, logs)
        raise KeyboardInterrupt

    backup.CrashSafeBackup.on_epoch_end = killed_after_epoch_1
    try:
        with pytest.raises(KeyboardInterrupt):
            yield
    finally:
        backup.CrashSafeBackup.on_epoch_end = save


def command(data, out, epochs):
    return [
        "train",
        "--dataset",
        data,
        "--image-size",
        "16",
        "--epochs",
        str(epochs),
        "--batch-size",
        "8",
        "--output-dir",
        out,
    ]


def history_epochs(out):
    with open(os.path.join(out, "history.csv")) as f:
        return [int(row["epoch"]) for row in csv.DictReader(f)]


@on_one_backend("torch", "the command's own work")
@pytest.mark.slow
def test_train_writes_the_run_and_evaluate_predict_use_it(
    trained_run, image_folder, tmp_path, capsys
):
    data, out = image_folder, trained_run.folder  # `keras-vit train`, 2 epochs (conftest)
    printed = trained_run.printed
    assert "test accuracy:" in printed and "learning_curves.png" in printed
    for name in (
        "model.keras",
        "class_names.json",
        "history.csv",
        "learning_curves.png",
        "metrics.json",
    ):
        assert os.path.isfile(os.path.join(out, name)), name
    assert not os.path.exists(os.path.join(out, "backup"))
    with open(os.path.join(out, "learning_curves.png"), "rb") as f:
        assert f.read(8) == b"\x89PNG\r\n\x1a\n"
    metrics = json.load(open(os.path.join(out, "metrics.json")))
    assert metrics["epochs"] == 2
    # The run's test result is its saved model's, on its own test images.
    assert metrics["test_accuracy"] == pytest.approx(
        evaluated_accuracy(os.path.join(out, "model.keras")), abs=1e-4
    )
    assert history_epochs(out) == [1, 2]
    # Evaluated once, after the last epoch: that is the run's test result.
    with open(os.path.join(out, "history.csv")) as f:
        rows = list(csv.DictReader(f))
    assert rows[0]["val_accuracy"] == "NA"
    assert float(rows[-1]["val_accuracy"]) == pytest.approx(metrics["test_accuracy"])

    model = os.path.join(out, "model.keras")
    # Saved with the BatchNorm statistics of the training images at inference,
    # not moving averages that still remember their start after 24 steps.
    assert "BatchNorm statistics recomputed on" in printed
    saved = keras.models.load_model(model)
    kept = [np.array(w) for w in saved.non_trainable_weights]
    images = vit_data.load(data, "train", image_size=16, batch_size=8).data
    recompute_batch_norm_statistics(saved, lambda: images)
    for kept_statistics, statistics in zip(kept, saved.non_trainable_weights):
        np.testing.assert_allclose(statistics, kept_statistics, rtol=1e-4, atol=1e-5)
    assert main(["evaluate", "--model", model, "--dataset", data]) == 0
    assert "accuracy" in capsys.readouterr().out
    image = os.path.join(data, "test", "light", "0.png")
    assert main(["predict", image, "--model", model, "--top-k", "2"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0] == image and {line.split()[0] for line in lines[1:]} == {"dark", "light"}

    # A finished run is not replaced by accident.
    with pytest.raises(SystemExit, match="already holds a finished run"):
        main(command(data, out, 2))

    # Fine-tuning the run's model at a higher resolution.
    tuned = str(tmp_path / "tuned")
    assert (
        main(
            [
                "finetune",
                model,
                "--dataset",
                data,
                "--image-size",
                "24",
                "--epochs",
                "1",
                "--batch-size",
                "8",
                "--output-dir",
                tuned,
                "--remat",
            ]
        )
        == 0
    )
    assert "test accuracy:" in capsys.readouterr().out
    assert [read_run(d)["job"] for d in (out, tuned)] == ["train", "finetune"]
    assert [read_run(d)["remat"] for d in (out, tuned)] == [False, True]
    import keras_vit

    tuned_model = keras.saving.load_model(os.path.join(tuned, "model.keras"))
    assert tuned_model.input_shape == (None, 24, 24, 3)
    assert tuned_model.get_layer("encoderblock_0").remat  # trained with recomputation
    # The default stem halves 24 px three times: a 3x3 grid.
    assert tuned_model.get_layer("position_embedding").grid_size == (3, 3)
    stem = tuned_model.get_layer("stem")
    assert stem.downsampling == keras_vit.training.SMALL_MODEL["stem_downsampling"]
    assert stem.filters == keras_vit.training.SMALL_MODEL["stem_filters"]
    assert isinstance(tuned_model.get_layer("encoderblock_0"), keras_vit.layers.TransformerBlock)
    for arguments, message in (
        (["finetune", os.path.join(out, "missing.keras")], "not an existing checkpoint file"),
    ):
        with pytest.raises(SystemExit, match=message):
            main(arguments + ["--output-dir", str(tmp_path / "bad")])


@pytest.mark.parametrize(
    "arguments, message",
    [
        (["--dataset", "no_such_dataset_xyz"], "Unknown dataset 'no_such_dataset_xyz'"),
        (["--dataset", "/no/such/folder"], "does not exist"),
        (
            ["--patch-size", "3"],
            r"--image-size 28 leaves a 4-pixel feature map after the stem "
            r"\(strides \(2, 2, 2\), each halving rounded up\), not a multiple of "
            r"the patch size 3",
        ),
        (["--recipe", "fast"], "--recipe 'fast'"),
        (["--augmentation", "huge"], "--augmentation 'huge'"),
    ],
)
def test_bad_arguments_fail_fast(tmp_path, arguments, message):
    with pytest.raises(SystemExit, match=message):
        main(["train", "--output-dir", str(tmp_path / "run")] + arguments)
    assert not os.path.exists(tmp_path / "run")


@pytest.mark.parametrize(
    "arguments, message",
    [
        ({"limit": 0}, "Received: limit=0"),
        ({"image_size": -8}, "image_size=-8 is not a positive int"),
        ({"image_size": 28, "patch_size": 3}, "leaves a 4-pixel feature map after the stem"),
        # The small model's patch is in pixels of its stem's feature map: 8 of them
        # cut a 64-pixel image's 8x8 map into one patch (a softmax over one token).
        (
            {"image_size": 64, "patch_size": 8},
            r"cuts the 8x8 feature map .* of 64x64 images \(a patch of 8 of its pixels is "
            r"64x64 image pixels\) into 1 patch: a ViT needs two or more",
        ),
        (
            {"image_size": 16, "patch_size": 16, "model": "small/4"},
            "cuts 16x16 images into 1 patch",
        ),
        ({"patch_dropout_rate": 1.0}, "Received: patch_dropout_rate=1.0"),
        ({"patch_dropout_rate": "half"}, "Received: patch_dropout_rate='half'"),
        ({"layer_decay": 0}, r"must be a number in \(0, 1\].*Received: layer_decay=0"),
        ({"layer_decay": 1.5}, "Received: layer_decay=1.5"),
    ],
)
def test_a_bad_limit_or_patch_dropout_fails_before_any_work(tmp_path, arguments, message):
    from keras_vit.training import train

    with pytest.raises(ValueError, match=message):
        train(output_dir=str(tmp_path / "run"), dataset="/no/such/folder", **arguments)
    assert not os.path.exists(tmp_path / "run")


def test_empty_folder_fails_fast(tmp_path):
    os.makedirs(tmp_path / "data" / "train" / "a")
    os.makedirs(tmp_path / "data" / "test" / "a")
    with pytest.raises(SystemExit, match="no images"):
        main(command(str(tmp_path / "data"), str(tmp_path / "run"), 1))


@pytest.mark.slow
def test_predict_rejects_files_that_are_not_images(trained_run, tmp_path, capsys):
    out = trained_run.folder
    bad = tmp_path / "bad.png"
    bad.write_text("hello")
    with pytest.raises(SystemExit, match="no image could be read"):
        main(["predict", str(bad), "--model", os.path.join(out, "model.keras")])
    assert f"{bad}: not a JPEG/PNG/GIF/BMP/WebP image" in capsys.readouterr().err


@on_one_backend("torch", "the command's own work")
@pytest.mark.slow
def test_a_recipe_with_patch_dropout_trains_the_model_on_part_of_its_tokens(tmp_path):
    import dataclasses

    from keras_vit.training import RECIPES, train

    data = write_dataset(tmp_path / "data", per_class=16)
    recipe = dataclasses.replace(RECIPES["small"], patch_dropout_rate=0.5)
    result = train(
        data,
        image_size=16,
        epochs=1,
        batch_size=8,
        recipe=recipe,
        output_dir=str(tmp_path / "run"),
        verbose=0,
        log=lambda line: None,
    )
    model = keras.saving.load_model(result["paths"]["model.keras"])
    assert model.get_layer("patch_dropout").rate == 0.5
    assert result["metrics"]["test_accuracy"] == pytest.approx(
        evaluated_accuracy(result["paths"]["model.keras"]), abs=1e-4
    )
    with open(os.path.join(tmp_path, "run", "run.json")) as f:
        assert "patch_dropout_rate=0.5" in json.load(f)["recipe"]
    # The command line's --patch-dropout sets it over the recipe's, and the
    # run records it: fine-tuning that run's model on part of its tokens.
    tuned = str(tmp_path / "tuned")
    assert (
        main(
            [
                "finetune",
                result["paths"]["model.keras"],
                "--dataset",
                data,
                "--image-size",
                "24",
                "--epochs",
                "1",
                "--batch-size",
                "8",
                "--patch-dropout",
                "0.75",
                "--output-dir",
                tuned,
            ]
        )
        == 0
    )
    with open(os.path.join(tuned, "run.json")) as f:
        assert json.load(f)["patch_dropout_rate"] == 0.75
    tuned_model = keras.saving.load_model(os.path.join(tuned, "model.keras"))
    assert tuned_model.get_layer("patch_dropout").rate == 0.75


def png(path, grey):
    path.parent.mkdir(parents=True, exist_ok=True)
    image = np.full((16, 16, 3), grey, "uint8")
    path.write_bytes(tf.io.encode_png(image).numpy())


@pytest.mark.parametrize(
    "layout, split, message",
    [
        # One class: a run would report 100% accuracy of a meaningless model.
        ({"train/a": 4, "test/a": 2}, None, r"images of 1 class\(es\) \(images per class: a: 4\)"),
        # An empty class folder: a class the model would have and never see.
        (
            {"a": 4, "b": 0, "c": 4},
            0.5,
            r"\['b'\] hold no image \(images per class: a: 4, b: 0, c: 4",
        ),
        # Held out of one image: no test image of `a`, or no training one.
        ({"a": 1, "b": 4}, 0.2, r"leaves class\(es\) \['a'\] without a test or a training image"),
        # test/ of other classes: its labels would be other classes' indices.
        (
            {"train/a": 2, "train/b": 2, "test/a": 1, "test/c": 1},
            None,
            r"has the classes \['a', 'c'\]",
        ),
    ],
)
def test_a_folder_that_cannot_train_a_classifier_is_refused_before_any_work(
    tmp_path, layout, split, message
):
    from keras_vit.training import train

    for folder, count in layout.items():
        (tmp_path / "data" / folder).mkdir(parents=True, exist_ok=True)
        for index in range(count):
            png(tmp_path / "data" / folder / f"{index}.png", 40 * index)
    out = tmp_path / "run"
    with pytest.raises(ValueError, match=message):
        # Batches of 2, one epoch: each folder has the images to train on, so
        # only its own flaw refuses it.
        train(
            str(tmp_path / "data"),
            validation_split=split,
            output_dir=str(out),
            image_size=16,
            batch_size=2,
            epochs=1,
        )
    assert not out.exists()
