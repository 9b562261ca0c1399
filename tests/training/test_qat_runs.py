"""Quantization-aware fine-tuning runs: `keras-vit finetune MODEL --qat MODE` and `train(qat=)`."""

import contextlib
import io
import json
import os

import keras
import numpy as np
import pytest

import keras_vit
from keras_vit.cli import main
from keras_vit.models import qat_mode
from keras_vit.training import train
from tests.conftest import last_json_line, on_one_backend, run_python
from tests.training.test_train_command import write_dataset

SHADES = (("a", 40), ("b", 120), ("c", 200))


@pytest.fixture(scope="module")
def float_checkpoint(tmp_path_factory):
    """A float ViT of the plain layout with a 3-class head, as a fine-tune's `.keras` file."""
    model = keras_vit.ViT(
        patch_size=4,
        hidden_dim=16,
        num_layers=1,
        num_heads=2,
        mlp_dim=32,
        input_shape=(16, 16, 3),
        classes=3,
        classifier_activation=None,
        layer_scale_init=0.5,
    )
    rng = np.random.default_rng(0)
    for variable in model.weights:
        variable.assign((rng.normal(size=variable.shape) * 0.3).astype("float32"))
    path = str(tmp_path_factory.mktemp("float") / "model.keras")
    model.save(path)
    return path


@on_one_backend("torch", "the command's own work")
@pytest.mark.slow
def test_a_qat_finetune_writes_a_model_that_trained_with_the_rounding(float_checkpoint, tmp_path):
    data = write_dataset(tmp_path / "data", per_class=16, shades=SHADES)
    out = str(tmp_path / "qat")
    printed = io.StringIO()
    with contextlib.redirect_stdout(printed):
        code = main(
            [
                "finetune",
                float_checkpoint,
                "--dataset",
                data,
                "--image-size",
                "16",
                "--epochs",
                "1",
                "--batch-size",
                "8",
                "--qat",
                "int8_full",
                "--output-dir",
                out,
            ]
        )
    assert code == 0, printed.getvalue()
    assert "quantization-aware: LiteRT int8_full simulated" in printed.getvalue()
    assert "ranges calibrated on 48 training images" in printed.getvalue()
    assert json.load(open(os.path.join(out, "run.json")))["qat"] == "int8_full"
    model = keras.saving.load_model(os.path.join(out, "model.keras"))
    assert qat_mode(model) == "int8_full"
    # Trained: the weights moved from the float model's (rotated, folded)
    # copy, and the ranges from their calibration.
    start = keras_vit.models.quantization_aware_copy(
        keras.saving.load_model(float_checkpoint), "int8_full", np.zeros((48, 16, 16, 3))
    )
    before = {v.path: keras.ops.convert_to_numpy(v) for v in start.weights}
    kernel = "encoderblock_0/attention/qkv/kernel"
    assert np.abs(keras.ops.convert_to_numpy(model.get_layer("encoderblock_0").attention.qkv.kernel)
                  - before[kernel]).max() > 0  # fmt: skip
    assert not any(v.path.endswith("norm/gamma") for v in model.weights)


@on_one_backend("torch", "a command's resume: every backend's is crash safety's killed runs")
@pytest.mark.slow
def test_a_killed_qat_finetune_resumes_bit_for_bit(float_checkpoint, tmp_path):
    data = write_dataset(tmp_path / "data", per_class=16, shades=SHADES)
    code = f"""
        import json, numpy as np, keras
        from keras_vit.training import train
        from tests.training.test_train_command import killed_after_first_checkpoint

        lines = []

        def run(out):
            return train({data!r}, weights={float_checkpoint!r}, image_size=16, epochs=2,
                         batch_size=8, qat="int8", output_dir=out, deterministic=True,
                         verbose=0, log=lines.append)

        run({str(tmp_path / "unbroken")!r})
        with killed_after_first_checkpoint():  # as a kill right after a checkpoint
            run({str(tmp_path / "killed")!r})
        del lines[:]
        run({str(tmp_path / "killed")!r})
        numpy = keras.ops.convert_to_numpy
        a = keras.saving.load_model({str(tmp_path / "unbroken" / "model.keras")!r})
        b = keras.saving.load_model({str(tmp_path / "killed" / "model.keras")!r})
        paths = [v.path for v in a.weights]
        difference = max(float(np.abs(numpy(x) - numpy(y)).max())
                         for x, y in zip(a.weights, b.weights))
        print(json.dumps({{"difference": difference, "paths": paths, "log": lines}}))
    """
    result = last_json_line(run_python(code))
    assert any("resuming from" in line and "(1 of 2 epochs done)" in line for line in result["log"])
    assert any(path.endswith("_quantizer/high") for path in result["paths"])
    assert result["difference"] == 0.0


def test_qat_settings_are_refused_before_any_work(float_checkpoint, trained_run, tmp_path, capsys):
    out = str(tmp_path / "never")
    common = ["finetune", float_checkpoint, "--image-size", "16", "--output-dir", out]
    with pytest.raises(SystemExit):
        main(common + ["--qat", "int4"])
    assert "--qat: invalid choice: 'int4'" in capsys.readouterr().err
    with pytest.raises(SystemExit, match=r"--qat 'int8' .* does not combine with --lora 2"):
        main(common + ["--qat", "int8", "--lora", "2"])
    stem = os.path.join(trained_run.folder, "model.keras")  # the small hybrid: a conv stem
    with pytest.raises(SystemExit, match=r"simulates the plain ViT layout.*stem_filters="):
        main(["finetune", stem, "--image-size", "16", "--output-dir", out, "--qat", "int8"])
    assert not os.path.exists(out)
    for keywords, message in (
        (dict(qat="int16x8", weights=float_checkpoint), r"`qat` must be None or one of"),
        (dict(qat="int8"), r"qat='int8' fine-tunes a float model .* with `weights`"),
    ):
        with pytest.raises(ValueError, match=message):
            train(output_dir=out, **keywords)
        assert not os.path.exists(out)
    tiny = write_dataset(tmp_path / "tiny", per_class=4, shades=SHADES)
    with pytest.raises(ValueError, match="at least 32 training images; .* has 12"):
        train(
            tiny,
            weights=float_checkpoint,
            image_size=16,
            batch_size=4,
            qat="int8",
            output_dir=out,
            verbose=0,
        )
    assert not os.path.exists(out)
