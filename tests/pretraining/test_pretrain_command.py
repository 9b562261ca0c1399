"""`keras-vit pretrain`, then `keras-vit finetune` of its model; resume after a kill."""

import csv
import json
import os
import shlex

import numpy as np
import pytest

from keras_vit.cli import main
from keras_vit.pretraining import pretrain
from keras_vit.training.run_folder import read_run
from tests.conftest import last_json_line, on_one_backend, run_python
from tests.training.test_train_command import write_dataset

SMALL_MAE = [
    "--objective",
    "mae",
    "--decoder-dim",
    "16",
    "--decoder-depth",
    "1",
    "--decoder-heads",
    "2",
]


def pretrain_command(data, out, epochs, *extra):
    return [
        "pretrain",
        "--dataset",
        data,
        "--image-size",
        "16",
        "--epochs",
        str(epochs),
        "--batch-size",
        "16",
        "--output-dir",
        out,
        *extra,
    ]


@on_one_backend("torch", "the command's own work")
@pytest.mark.slow
def test_pretrain_writes_the_run_and_finetune_starts_from_its_encoder(tmp_path, capsys):
    import keras

    data = write_dataset(tmp_path / "data")
    out = str(tmp_path / "pretrain")
    assert main(pretrain_command(data, out, 2, *SMALL_MAE, "--limit", "32")) == 0
    printed = capsys.readouterr().out
    assert "(32 images, labels unused)" in printed and read_run(out)["limit"] == 32
    for name in ("model.keras", "history.csv", "learning_curves.png", "metrics.json"):
        assert os.path.isfile(os.path.join(out, name)), name
    assert not os.path.exists(os.path.join(out, "backup"))
    metrics = json.load(open(os.path.join(out, "metrics.json")))
    assert metrics["objective"] == "MaskedAutoencoder" and np.isfinite(metrics["loss"])
    with open(os.path.join(out, "history.csv")) as f:
        assert [int(r["epoch"]) for r in csv.DictReader(f)] == [1, 2]
    pretrained = keras.saving.load_model(os.path.join(out, "model.keras"))
    assert pretrained.get_layer("visible_tokens") is not None

    # Fine-tuning with zero epochs of change would prove nothing; check the
    # model it starts from instead: `train(weights=...)` builds it through
    # from_checkpoint, as `keras-vit finetune` does.
    from keras_vit.models import checkpoint_architecture

    architecture = checkpoint_architecture(os.path.join(out, "model.keras"))
    assert architecture["hidden_dim"] == 64 and architecture["input_shape"] == (16, 16, 3)
    # The fine-tune command that pretrain printed, on the data it pre-trained on.
    (line,) = [line for line in printed.splitlines() if line.startswith("fine-tune it: ")]
    command = shlex.split(line[len("fine-tune it: ") :])
    assert command[:3] == ["keras-vit", "finetune", os.path.join(out, "model.keras")]
    assert command[command.index("--dataset") + 1] == data
    finetuned = str(tmp_path / "finetune")
    assert (
        main([*command[1:], "--epochs", "1", "--batch-size", "16", "--output-dir", finetuned]) == 0
    )
    assert "test accuracy:" in capsys.readouterr().out
    assert read_run(finetuned)["job"] == "finetune"
    classifier = keras.saving.load_model(os.path.join(finetuned, "model.keras"))
    assert classifier.output_shape == (None, 2)


@pytest.mark.backend_independent
def test_the_printed_finetune_command_holds_out_test_images_of_a_folder_without_test(tmp_path):
    from keras_vit.cli import build_parser
    from keras_vit.cli.pretrain import finetune_command

    plain = tmp_path / "plain"
    (plain / "a").mkdir(parents=True)
    split = tmp_path / "split"
    (split / "test").mkdir(parents=True)
    for data, held_out in ((plain, True), (split, False), ("fashion_mnist", False)):
        args = build_parser().parse_args(["pretrain", "--dataset", str(data)])
        command = shlex.split(finetune_command("model.keras", args))
        assert ("--validation-split" in command) == held_out, command
        build_parser().parse_args(command[1:])  # a command the parser takes


def test_pretrain_refuses_bad_arguments_before_any_work(tmp_path):
    out = str(tmp_path / "never")
    for extra, message in (
        (["--model", "small"], "convolutional stem"),
        (["--image-size", "30"], "--image-size 30 is not a positive multiple of the patch size 4"),
    ):
        with pytest.raises(SystemExit, match=message):
            main(["pretrain", "--output-dir", out, *extra])
        assert not os.path.exists(out)
    with pytest.raises(ValueError, match=r"Received: limit=0"):
        pretrain(output_dir=out, limit=0)
    assert not os.path.exists(out)


@on_one_backend("jax", "a command's resume: every backend's is crash safety's killed runs")
@pytest.mark.slow
def test_a_killed_pretraining_run_resumes_to_the_weights_of_an_unbroken_one(tmp_path):
    data = write_dataset(tmp_path / "data")
    code = f"""
        import json, numpy as np, keras
        from keras_vit.pretraining import pretrain
        from tests.training.test_train_command import killed_after_first_checkpoint

        lines = []

        def run(out, epochs=2):
            return pretrain({data!r}, objective="mpp", image_size=16, epochs=epochs,
                            batch_size=16, output_dir=out, deterministic=True, verbose=0,
                            log=lines.append)

        run({str(tmp_path / "unbroken")!r})
        with killed_after_first_checkpoint():  # as a kill right after a checkpoint
            run({str(tmp_path / "killed")!r})
        del lines[:]
        run({str(tmp_path / "killed")!r})
        a = keras.saving.load_model({str(tmp_path / "unbroken" / "model.keras")!r})
        b = keras.saving.load_model({str(tmp_path / "killed" / "model.keras")!r})
        numpy = keras.ops.convert_to_numpy
        diff = max(float(np.abs(numpy(x) - numpy(y)).max()) for x, y in zip(a.weights, b.weights))
        print(json.dumps({{"difference": diff, "log": lines}}))
    """
    result = last_json_line(run_python(code))
    assert any("resuming from" in line and "(1 of 2 epochs done)" in line for line in result["log"])
    assert result["difference"] == 0.0
    with open(tmp_path / "killed" / "history.csv") as f:
        assert [int(r["epoch"]) for r in csv.DictReader(f)] == [1, 2]
