"""LoRA fine-tuning runs: `keras-vit finetune CHECKPOINT --lora RANK` and `train(..., lora=)`."""

import contextlib
import io
import json
import os

import keras
import numpy as np
import pytest

import keras_vit
from keras_vit.cli import main
from keras_vit.training import train
from tests.conftest import last_json_line, on_one_backend, run_python
from tests.training.test_train_command import write_dataset


def weights_of(model):
    return {v.path: keras.ops.convert_to_numpy(v) for v in model.weights}


@on_one_backend("torch", "the command's own work")
@pytest.mark.slow
def test_a_lora_finetune_trains_the_adapters_and_head_and_writes_both_models(trained_run, tmp_path):
    checkpoint = os.path.join(trained_run.folder, "model.keras")
    data = write_dataset(tmp_path / "data", per_class=8, shades=(("a", 40), ("b", 120), ("c", 200)))
    out = str(tmp_path / "lora")
    printed = io.StringIO()
    with contextlib.redirect_stdout(printed):
        code = main(
            [
                "finetune",
                checkpoint,
                "--dataset",
                data,
                "--image-size",
                "16",
                "--epochs",
                "2",
                "--batch-size",
                "8",
                "--lora",
                "2",
                "--output-dir",
                out,
            ]
        )
    assert code == 0, printed.getvalue()
    start = keras.saving.load_model(checkpoint)
    merged = keras.saving.load_model(os.path.join(out, "model.keras"))
    # The saved model is a plain one: the adapters merged into its kernels.
    assert type(merged) is keras_vit.VisionTransformer and not merged.compiled
    assert not any("lora" in v.path for v in merged.weights)
    hidden = merged.get_layer("encoderblock_0").attention.qkv.kernel.shape[0]
    blocks = len([layer for layer in merged.layers if layer.name.startswith("encoderblock_")])
    # Per block: rank-2 factors of the query and the value (D x 2 and 2 x D
    # each) and the fused projection's bias (3 D); the new 3-class head.
    expected = blocks * (2 * (2 * hidden * 2) + 3 * hidden) + (hidden * 3 + 3)
    metrics = json.load(open(os.path.join(out, "metrics.json")))
    assert metrics["trainable_parameters"] == expected
    assert f"{expected:,} parameters trained" in printed.getvalue()
    assert "LoRA: rank 2 on query, value of every block" in printed.getvalue()
    assert "model.lora.h5" in printed.getvalue()
    recorded = json.load(open(os.path.join(out, "run.json")))
    assert (recorded["lora"], recorded["lora_target"]) == (2, "query,value")

    # The frozen encoder: only the query and value slices of each fused
    # kernel moved (and the biases beside them); the key slice, the MLPs
    # and the embeddings are the checkpoint's.
    before, after = weights_of(start), weights_of(merged)
    for path, value in after.items():
        if path.startswith("head/"):
            continue
        if path.endswith("attention/qkv/kernel"):
            np.testing.assert_array_equal(value[:, 1], before[path][:, 1])
            assert np.abs(value[:, [0, 2]] - before[path][:, [0, 2]]).max() > 0
        elif not path.endswith("attention/qkv/bias"):
            np.testing.assert_array_equal(value, before[path], err_msg=path)

    # The adapter file on the checkpoint is the saved model.
    adapted = keras_vit.from_checkpoint(
        checkpoint, classes=3, input_shape=(16, 16, 3), classifier_activation=None
    )
    adapted.enable_lora(2)
    adapted.load_lora_weights(os.path.join(out, "model.lora.h5"))
    images = np.random.default_rng(0).uniform(0, 255, (4, 16, 16, 3)).astype("float32")
    np.testing.assert_allclose(
        keras.ops.convert_to_numpy(adapted(images)),
        keras.ops.convert_to_numpy(merged(images)),
        atol=1e-4,
    )


@on_one_backend("torch", "the command's own work")
@pytest.mark.slow
def test_a_qlora_finetune_keeps_the_encoder_int8_and_trains_adapters_and_a_float_head(
    trained_run, tmp_path
):
    checkpoint = os.path.join(trained_run.folder, "model.keras")
    data = write_dataset(tmp_path / "data", per_class=8, shades=(("a", 40), ("b", 120), ("c", 200)))
    out = str(tmp_path / "qlora")
    result = train(
        data,
        weights=checkpoint,
        image_size=16,
        epochs=1,
        batch_size=8,
        lora=2,
        lora_base="int8",
        output_dir=out,
        verbose=0,
        log=lambda line: None,
    )
    saved = keras.saving.load_model(result["paths"]["model.keras"])
    qkv = saved.get_layer("encoderblock_0").attention.qkv
    assert qkv.quantization_mode == "int8" and saved.get_layer("head").quantization_mode is None
    assert json.load(open(os.path.join(out, "run.json")))["lora_base"] == "int8"
    # The int8 start, as the run quantized it: the key slice (not adapted)
    # keeps its levels and scales; the query and value slices moved.
    start = keras_vit.from_checkpoint(
        checkpoint, classes=3, input_shape=(16, 16, 3), classifier_activation=None
    )
    start.quantize("int8", filters=keras_vit.models.lora.frozen_layer)
    before = start.get_layer("encoderblock_0").attention.qkv
    levels = [keras.ops.convert_to_numpy(layer.kernel) for layer in (before, qkv)]
    assert levels[0].dtype == levels[1].dtype == np.int8
    np.testing.assert_array_equal(levels[1][:, 1], levels[0][:, 1])
    assert np.abs(levels[1][:, [0, 2]].astype(int) - levels[0][:, [0, 2]]).max() > 0
    # The adapters alone, on the int8 start: the saved model, to its requantization.
    start.enable_lora(2)
    start.load_lora_weights(result["paths"]["model.lora.h5"])
    images = np.random.default_rng(0).uniform(0, 255, (4, 16, 16, 3)).astype("float32")
    adapted, merged = (keras.ops.convert_to_numpy(m(images)) for m in (start, saved))
    np.testing.assert_allclose(adapted, merged, atol=0.05 * np.abs(merged).max())


@on_one_backend("tensorflow", "a command's resume: every backend's is crash safety's killed runs")
@pytest.mark.slow
def test_a_killed_lora_finetune_resumes_with_its_adapters_bit_for_bit(trained_run, tmp_path):
    checkpoint = os.path.join(trained_run.folder, "model.keras")
    data = write_dataset(tmp_path / "data", per_class=16)
    code = f"""
        import json, os, h5py, numpy as np, keras
        from keras_vit.training import train
        from tests.training.test_train_command import killed_after_first_checkpoint

        lines = []

        def run(out):
            return train({data!r}, weights={checkpoint!r}, image_size=16, epochs=2,
                         batch_size=8, lora=2, lora_target="query,value,mlp_dense_1",
                         output_dir=out, deterministic=True, verbose=0, log=lines.append)

        run({str(tmp_path / "unbroken")!r})
        with killed_after_first_checkpoint():  # as a kill right after a checkpoint
            run({str(tmp_path / "killed")!r})
        kept = sorted(os.listdir(
            {str(tmp_path / "killed" / "backup")!r} + "/epoch-000001"))
        del lines[:]
        run({str(tmp_path / "killed")!r})
        numpy = keras.ops.convert_to_numpy
        a = keras.saving.load_model({str(tmp_path / "unbroken" / "model.keras")!r})
        b = keras.saving.load_model({str(tmp_path / "killed" / "model.keras")!r})
        merged = max(float(np.abs(numpy(x) - numpy(y)).max()) for x, y in zip(a.weights, b.weights))
        adapters = []
        with h5py.File({str(tmp_path / "unbroken" / "model.lora.h5")!r}) as x, h5py.File(
            {str(tmp_path / "killed" / "model.lora.h5")!r}
        ) as y:
            x.visititems(lambda name, item: adapters.append(
                float(np.abs(np.asarray(item) - np.asarray(y[name])).max())
                if hasattr(item, "shape") else 0.0))
        print(json.dumps({{"merged": merged, "adapters": adapters, "kept": kept, "log": lines}}))
    """
    result = last_json_line(run_python(code))
    assert any("resuming from" in line and "(1 of 2 epochs done)" in line for line in result["log"])
    assert "lora_unmerged.npz" in result["kept"]
    assert len(result["adapters"]) > 3 and max(result["adapters"]) == 0.0
    assert result["merged"] == 0.0


def test_lora_settings_are_refused_before_any_work(trained_run, tmp_path, capsys):
    checkpoint = os.path.join(trained_run.folder, "model.keras")
    out = str(tmp_path / "never")
    common = ["finetune", checkpoint, "--image-size", "16", "--output-dir", out]
    with pytest.raises(SystemExit):
        main(common + ["--lora", "0"])
    assert "--lora: must be a positive whole number, not '0'" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        main(common + ["--lora", "2", "--lora-base", "int4"])
    assert "--lora-base: invalid choice: 'int4' (choose from 'int8')" in capsys.readouterr().err
    for extra, message in (
        (["--lora", "2", "--lora-target", "query,attention"], r"--lora-target must name"),
        (["--lora-target", "value"], r"--lora-target chooses the projections .* needs a rank"),
        (["--lora", "100000"], r"--lora must be at most the query projection's smaller side"),
        (["--lora-base", "int8"], r"--lora-base chooses how LoRA's frozen encoder .* rank"),
    ):
        with pytest.raises(SystemExit, match=message):
            main(common + extra)
        assert not os.path.exists(out)
    for keywords, message in (
        (dict(lora=2.5), r"`lora` must be a positive int .* Received: lora=2.5"),
        (dict(lora=2, lora_target=["query"]), r"`lora_target` must be a str"),
        (dict(lora_target="key"), r"Received: lora_target='key' without `lora`"),
    ):
        with pytest.raises((ValueError, TypeError), match=message):
            train(weights=checkpoint, output_dir=out, **keywords)
        assert not os.path.exists(out)
