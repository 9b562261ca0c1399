"""The benchmarks run end to end (quick mode), and the FLOP count they use is right."""

import importlib.util
import json
import os
import statistics
import sys

import numpy as np
import pytest

from keras_vit.models import flop_count
from tests import warm_interpreters
from tests.conftest import BACKEND, load_benchmark, on_one_backend, randomize_weights

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
# A one-block ViT for the benchmarks' model-level helpers.
ONE_BLOCK = dict(
    patch_size=7,
    hidden_dim=32,
    num_layers=1,
    num_heads=2,
    mlp_dim=64,
    input_shape=(28, 28, 1),
    classes=10,
)


# The script as `python benchmarks/<script>.py ARGS` runs it, its fresh
# processes (`harness.fresh_process`: the GEMM rate, each training run)
# forked warm as the script's own interpreter is: what the quick runs check is
# the benchmark's code (its children's commands, JSON, medians), not an
# interpreter's start.
RUN_WARM = """
import runpy, sys, types
from tests import warm_interpreters
sys.path.insert(0, sys.argv[1].rsplit("/", 1)[0])
import harness
harness.subprocess = types.SimpleNamespace(run=warm_interpreters.run)
sys.argv = sys.argv[1:]
runpy.run_path(sys.argv[0], run_name="__main__")
"""


def run_benchmark(script, *arguments, timeout=900):
    """`benchmarks/<script>.py` with `arguments` in a fresh interpreter (TensorFlow's logs off)."""
    return warm_interpreters.run(
        [
            sys.executable,
            "-c",
            RUN_WARM,
            os.path.join(ROOT, "benchmarks", f"{script}.py"),
            *arguments,
        ],
        capture_output=True,
        text=True,
        timeout=timeout,
        env={**os.environ, "TF_CPP_MIN_LOG_LEVEL": "3"},
    )


@pytest.mark.backend_independent
def test_flop_count_of_vit_b16_matches_the_hand_count():
    tokens, dim, mlp = 197, 768, 3072
    embedding = 2 * 196 * (16 * 16 * 3) * dim  # 231,211,008
    block = (
        2 * tokens * dim * 3 * dim  # q, k, v: 697,171,968
        + 2 * tokens * tokens * dim  # q k^T: 59,610,624
        + 2 * tokens * tokens * dim  # attention x v: 59,610,624
        + 2 * tokens * dim * dim  # output projection: 232,390,656
        + 2 * tokens * dim * mlp * 2  # MLP: 1,859,125,248
    )
    head = 2 * dim * 1000
    assert embedding + 12 * block + head == 35_127_656_448
    assert flop_count("B/16") == 35_127_656_448  # 17.56 GMACs, as usually quoted
    assert flop_count("S/16", training=True) == 3 * flop_count("S/16")
    assert flop_count("B/16", image_size=384) > 3 * flop_count("B/16")  # 577 tokens
    # Patch dropout: a training step's blocks see 1 + ceil(0.5 * 196) = 99 tokens.
    kept = 99
    kept_block = 2 * kept * dim * 4 * dim + 2 * 2 * kept * kept * dim + 2 * 2 * kept * dim * mlp
    assert flop_count("B/16", training=True, patch_dropout_rate=0.5) == 3 * (
        embedding + 12 * kept_block + head
    )
    assert flop_count("B/16", patch_dropout_rate=0.5) == flop_count("B/16")  # inference


# Its peer is Hugging Face's under torch and keras-hub's under JAX and
# TensorFlow alike: torch and TensorFlow run every branch of its code.
@pytest.mark.skipif(BACKEND == "jax", reason="torch and TensorFlow run every branch of it")
@pytest.mark.slow
def test_the_throughput_benchmark_runs_quickly_in_process(tmp_path, capsys):
    throughput = load_benchmark("throughput")
    out = tmp_path / "results.json"
    assert (
        throughput.main(["--quick", "--in-process", "--backends", BACKEND, "--json", str(out)]) == 0
    )
    table = capsys.readouterr().out
    assert "| measurement | library | backend |" in table
    results = json.loads(out.read_text())["results"]
    measured = {(r["measurement"], r["library"]) for r in results if "error" not in r}
    for row in (
        "GEMM 128^3 float32",
        "inference tiny fp32",
        "training tiny fp32",
        "training tiny fp32 patch dropout 0.5",
    ):
        library = "framework" if row.startswith("GEMM") else "keras_vit"
        assert (row, library) in measured, (row, results)
    assert ("main job (small, Fashion-MNIST)", "keras_vit") in measured
    # Each row's derived figures are its own measurements': the model's
    # GFLOP/s over the day's GEMM row, keras_vit's rate over a peer's.
    gemm = next(r for r in results if r["measurement"] == "GEMM 128^3 float32")
    ours = {r["measurement"]: r for r in results if r["library"] == "keras_vit" and "gflops" in r}
    assert ours
    for row in ours.values():
        assert row["percent_of_fp32_gemm"] == pytest.approx(100 * row["gflops"] / gemm["gflops"])
    peer = "huggingface" if BACKEND == "torch" else "keras_hub"
    peer_module = "transformers" if peer == "huggingface" else "keras_hub"
    if importlib.util.find_spec(peer_module) is not None:
        ratios = [r for r in results if r["library"] == peer and "keras_vit_ratio" in r]
        assert ratios
        for row in ratios:
            expected = ours[row["measurement"]]["images_per_second"] / row["images_per_second"]
            assert row["keras_vit_ratio"] == pytest.approx(expected)
    else:
        assert f"{peer} is not installed" in table


@on_one_backend("torch", "the benchmark's own code")
@pytest.mark.slow
@pytest.mark.skipif(importlib.util.find_spec("keras_hub") is None, reason="needs keras-hub")
def test_the_families_benchmark_times_the_same_function_of_both_libraries(capsys):
    benchmark = load_benchmark("families_vs_keras_hub")
    assert benchmark.main(["--quick"]) == 0
    lines = capsys.readouterr().out.strip().splitlines()
    results = [json.loads(line) for line in lines if line.startswith("{")]
    assert [r["family"] for r in results] == ["DINOv3", "SigLIP"]
    for result in results:
        assert result["max_abs_difference"] <= 1e-5, result  # one function, timed twice
        rates = result["images_per_second"]
        ratio = rates["keras_vit"] / rates["keras_hub"]
        assert result["keras_vit_over_keras_hub"] == pytest.approx(ratio)


@on_one_backend("torch", "the benchmark's own code")
@pytest.mark.slow
def test_the_gpu_benchmark_runs_quickly_in_process(tmp_path, capsys):
    # Without a GPU it measures the CPU (no device, so no MFU): the bf16
    # GEMM and bf16 training rows must still run, and leave the global
    # dtype policy as they found it.
    import keras

    throughput = load_benchmark("throughput")
    out = tmp_path / "results.json"
    assert (
        throughput.main(
            ["--gpu", "--quick", "--in-process", "--backends", BACKEND, "--json", str(out)]
        )
        == 0
    )
    assert keras.config.dtype_policy().name == "float32"
    results = json.loads(out.read_text())["results"]
    measured = {(r["measurement"], r["library"]): r for r in results if "error" not in r}
    assert ("GEMM 128^3 bfloat16", "framework") in measured
    assert ("GEMM 128^3 float32", "framework") not in measured
    training = measured[("training tiny bf16", "keras_vit")]
    # Its GFLOP/s are its own rate times the tiny model's training FLOPs.
    task = {"task": "training", **throughput.GPU_QUICK["training"]}
    assert training["gflops"] == pytest.approx(
        training["images_per_second"] * throughput.flops_per_image(task) / 1e9
    )
    assert {r["measurement"] for r in results} <= {"GEMM 128^3 bfloat16", "training tiny bf16"}
    assert "| measurement | library | backend |" in capsys.readouterr().out


@pytest.mark.backend_independent
def test_model_flops_utilisation_uses_the_devices_bf16_peak():
    throughput = load_benchmark("throughput")
    assert throughput.bf16_peak("NVIDIA H100 80GB HBM3") == 989.4e12
    assert throughput.bf16_peak("NVIDIA A100-SXM4-40GB") == 312e12
    assert throughput.bf16_peak("cpu") is None


@on_one_backend("torch", "the benchmark's own code")
@pytest.mark.slow
def test_rounds_alternate_and_report_each_rows_median(tmp_path, capsys):
    throughput = load_benchmark("throughput")
    out = tmp_path / "results.json"
    assert (
        throughput.main(
            [
                "--quick",
                "--in-process",
                "--backends",
                BACKEND,
                "--rounds",
                "2",
                "--only",
                "training tiny fp32",
                "--json",
                str(out),
            ]
        )
        == 0
    )
    progress = [
        json.loads(line) for line in capsys.readouterr().out.splitlines() if line.startswith("{")
    ]
    # Round 1 visits every measurement before round 2 starts.
    assert [p["round"] for p in progress] == sorted(p["round"] for p in progress)
    assert {p["round"] for p in progress} == {1, 2}
    training = [
        r
        for r in json.loads(out.read_text())["results"]
        if r["measurement"] == "training tiny fp32"
    ]
    assert training
    for row in training:
        assert row["rounds"] == 2 and len(row["images_per_second_rounds"]) == 2
        assert row["images_per_second"] == pytest.approx(sum(row["images_per_second_rounds"]) / 2)


@pytest.mark.backend_independent
def test_median_measurement_skips_failures_and_keeps_the_largest_peak():
    median_measurement = load_benchmark("throughput").median_measurement
    row = median_measurement(
        [
            {"images_per_second": 3.0, "peak_memory_mb": 900.0},
            None,
            {"images_per_second": 1.0, "peak_memory_mb": 1000.0},
            {"images_per_second": 2.0, "peak_memory_mb": 950.0},
        ]
    )
    assert row["rounds"] == 3 and row["images_per_second"] == 2.0
    assert row["peak_memory_mb"] == 1000.0
    assert row["images_per_second_rounds"] == [3.0, 1.0, 2.0]
    assert median_measurement([None, None]) == {}


@pytest.mark.backend_independent
def test_rounds_must_be_positive(capsys):
    with pytest.raises(SystemExit):
        load_benchmark("throughput").main(["--quick", "--rounds", "0"])
    assert "--rounds must be at least 1. Received: --rounds 0" in capsys.readouterr().err


@pytest.mark.slow
def test_mixed_precision_agreement_compares_float32_with_bfloat16(tmp_path):
    import keras
    import numpy as np

    import keras_vit

    benchmark = load_benchmark("mixed_precision_agreement")
    model = keras_vit.ViT(**ONE_BLOCK)
    head = [layer for layer in model.layers if isinstance(layer, keras.layers.Dense)][-1]
    rng = np.random.default_rng(0)
    head.kernel.assign(rng.normal(0, 1, head.kernel.shape).astype("float32"))
    path = str(tmp_path / "model.keras")
    model.save(path)

    result = benchmark.agreement(path, limit=200, batch_size=100)

    assert result["images"] == 200
    # bfloat16 really ran (outputs moved) and stayed close to float32.
    assert 0 < result["max_abs_output_difference"] < 0.2
    assert result["top1_agreement"] >= 0.9
    # The float32 accuracy is the model's on those images; bfloat16's differs
    # from it by at most the images the two disagree on.
    images, labels = benchmark.test_images(200, 100)
    predicted = model.predict(images, batch_size=100, verbose=0).argmax(-1)
    assert result["accuracy_float32"] == pytest.approx(np.mean(predicted == labels))
    gap = abs(result["accuracy_mixed_bfloat16"] - result["accuracy_float32"])
    assert gap <= 1 - result["top1_agreement"] + 1e-9
    assert keras.config.dtype_policy().name == "float32"  # restored


def test_int8_weights_are_each_output_channels_256_levels_and_nothing_else_moves():
    import numpy as np

    import keras_vit

    model = randomize_weights(keras_vit.ViT(**ONE_BLOCK), scale=1.0)
    before = {variable.path: np.asarray(variable) for variable in model.weights}

    load_benchmark("real_weights").with_int8_weights(model)

    kernels = 0
    for variable in model.weights:
        old, new = before[variable.path], np.asarray(variable)
        if "kernel" not in variable.path:
            np.testing.assert_array_equal(new, old)  # biases, norms, tokens, positions
            continue
        kernels += 1
        # Output channels: q/k/v's (heads, head_dim) per projection, else the last axis.
        if variable.path.endswith("qkv/kernel"):
            old_columns = old.reshape(old.shape[0], -1)
        else:
            old_columns = old.reshape(-1, old.shape[-1])
        new_columns = new.reshape(old_columns.shape)
        scale = np.abs(old_columns).max(axis=0) / 127
        levels = new_columns / scale
        np.testing.assert_allclose(levels, np.round(levels), atol=1e-3)
        assert np.abs(np.round(levels)).max() == 127
        assert 0 < np.abs(new_columns - old_columns).max() <= scale.max() / 2 + 1e-6
    # patch embedding, q/k/v, output projection, two MLP layers, head
    assert kernels == 6


def int8_dense_layers(path):
    """How many FULLY_CONNECTED ops of a `.tflite` file take int8 inputs."""
    from keras_vit.export import litert_runtime as litert

    return sum(
        op["op_name"] == "FULLY_CONNECTED" and op["inputs"][0]["dtype"].__name__ == "int8"
        for op in litert.graph_ops(path)
    )


@pytest.mark.skipif(
    BACKEND != "tensorflow",
    reason="the benchmark quantises in-process, with TensorFlow's converter",
)
@pytest.mark.slow
def test_float_blocks_keeps_the_worst_blocks_dense_layers_in_float(tmp_path):
    import keras

    import keras_vit

    two_blocks = {**ONE_BLOCK, "num_layers": 2, "input_shape": (28, 28, 3)}
    randomize_weights(keras_vit.ViT(**two_blocks)).save(tmp_path / "classifier.keras")

    float_blocks = load_benchmark("real_weights").int8_float_blocks
    with pytest.raises(ValueError, match=r"from 0 to 1 .*counts=\(0, 2\)"):
        float_blocks(str(tmp_path), image_size=28, counts=(0, 2))

    rows = float_blocks(
        str(tmp_path), image_size=28, test=16, calibration=16, counts=(0, 1), ranking=4
    )

    worst = rows[-1]["float_blocks"]
    assert [row["float_blocks"] for row in rows] == [None, [], worst]
    assert worst in (["encoderblock_0"], ["encoderblock_1"])
    # q/k/v, the output projection and the MLP's two layers per int8 block
    # (and the head, in the file `tflite` writes).
    files = ["int8", "int8_float0", "int8_float1"]
    int8_layers = [int8_dense_layers(tmp_path / f"classifier_{name}.tflite") for name in files]
    assert int8_layers == [9, 8, 4]
    assert not (tmp_path / "classifier_int8_only_one_block.tflite").exists()
    # Each row's figures are its file's, recomputed here on the same test images.
    benchmark = load_benchmark("real_weights")
    images, labels = benchmark.fashion_mnist_at(28, "test", 16)
    classifier = keras.saving.load_model(tmp_path / "classifier.keras")
    expected = classifier.predict(images, verbose=0).argmax(-1)
    for row, name in zip(rows, files):
        runner = keras_vit.export.TFLiteModel(str(tmp_path / f"classifier_{name}.tflite"))
        served = np.asarray(runner(images)).argmax(-1)
        assert row["top1_agreement"] == pytest.approx(np.mean(served == expected)), name
        assert row["accuracy"] == pytest.approx(np.mean(served == labels)), name


# `quantize` on each backend is tests/models/test_keras_model_api.py's.
@on_one_backend("torch", "the benchmark's own code")
def test_exports_scores_keras_own_quantization_beside_the_float_model(tmp_path):
    import keras_vit

    model = keras_vit.ViT(**{**ONE_BLOCK, "input_shape": (28, 28, 3)})
    randomize_weights(model).save(tmp_path / "classifier.keras")
    rows = load_benchmark("real_weights").exports(
        str(tmp_path), image_size=28, test=16, calibration=16, modes=["keras_int8"]
    )
    assert [row["export"] for row in rows] == ["keras", "keras, model.quantize('int8')"]
    # The row's figures are those of the quantized model, recomputed here.
    benchmark = load_benchmark("real_weights")
    images, labels = benchmark.fashion_mnist_at(28, "test", 16)
    logits = model.predict(images, verbose=0)
    model.quantize("int8")
    outputs = model.predict(images, verbose=0)
    assert rows[1]["max_abs_error"] == pytest.approx(np.abs(outputs - logits).max(), rel=1e-4)
    agreement = np.mean(outputs.argmax(-1) == logits.argmax(-1))
    assert rows[1]["top1_agreement"] == pytest.approx(agreement)
    assert rows[1]["accuracy"] == pytest.approx(np.mean(outputs.argmax(-1) == labels))
    assert all(isinstance(row["latency_ms"], float) for row in rows)  # (timed: no fixed value)


@pytest.mark.backend_independent  # the benchmark's own code: children, JSON, medians
@pytest.mark.slow
def test_main_job_against_the_cnn_quick_run_reports_both_and_the_ratios(tmp_path):
    # The benchmark's own code (children, JSON, medians), on TensorFlow's
    # children: training through `keras-vit train` on each backend is
    # tests/test_console.py's.
    out = tmp_path / "main_job.json"
    done = run_benchmark(
        "main_job_vs_cnn",
        "--quick",
        "--rounds",
        "1",
        "--backends",
        "tensorflow",
        "--seed",
        "3",
        "--json",
        str(out),
    )
    assert done.returncode == 0, done.stderr[-3000:]
    results = json.loads(out.read_text())
    assert results["gemm_fp32_gflops"] > 0 and results["quick"]
    (round_,) = results["rounds"]
    assert round_["cnn"]["parameters"] == 242_218  # the CNN exactly as specified
    for model in ("cnn", "vit"):
        run = round_[model]
        # One epoch on 1,024 images learns: chance is 0.1, and 0.2 of 512 test
        # images is 7 standard deviations above it (0.29 for TensorFlow's ViT).
        assert run["test_accuracy"] > 0.2
        assert len(run["epoch_seconds"]) == 1, run
        assert run["seed"] == 3  # as each run itself reports it
    row = results["summary"]["tensorflow"]
    expected = 100 * (round_["vit"]["test_accuracy"] - round_["cnn"]["test_accuracy"])
    assert row["median_accuracy_points"] == pytest.approx(expected, abs=0.01)
    assert row["median_time_ratio"] == pytest.approx(
        round_["vit"]["wall_seconds"] / round_["cnn"]["wall_seconds"], abs=1e-3
    )
    assert "| tensorflow |" in done.stdout


@pytest.mark.backend_independent  # the benchmark's own code: children, JSON, medians
@pytest.mark.slow
def test_distillation_quick_run_trains_the_teacher_and_reports_each_student(tmp_path):
    out = tmp_path / "distillation.json"
    done = run_benchmark(
        "distillation",
        "--quick",
        "--backend",
        "tensorflow",  # (the benchmark's code; any backend's children would do)
        "--students",
        "alone",
        "hard+token",
        "--json",
        str(out),
    )
    assert done.returncode == 0, done.stderr[-3000:]
    results = json.loads(out.read_text())
    (round_,) = results["rounds"]
    assert round_["teacher"]["parameters"] == 242_218  # the main job's CNN
    assert round_["teacher"]["test_accuracy"] > 0.3  # the CNN learns in one epoch (chance 0.1)
    for name in ("alone", "hard+token"):
        run = round_[name]
        # Each student's accuracy is its run's, over the 10,000 test images
        # (one quick epoch leaves a ViT near chance: no more is asked of it).
        assert run["test_accuracy"] * 10_000 == pytest.approx(
            round(run["test_accuracy"] * 10_000), abs=1e-3
        )
        assert run["fit_seconds"] < run["wall_seconds"]  # the fit, inside its process's time
        points = 100 * (run["test_accuracy"] - round_["teacher"]["test_accuracy"])
        assert results["summary"][name]["points_over_teacher"] == pytest.approx(points, abs=0.01)
    # The distillation token, its position and its head (width 64, 10 classes).
    extra = 64 + 64 + (64 * 10 + 10)
    assert round_["hard+token"]["parameters"] == round_["alone"]["parameters"] + extra
    assert "| ViT small/4 hard+token |" in done.stdout


@on_one_backend("jax", "the benchmark's own code (it runs on JAX and TensorFlow)")
@pytest.mark.slow
def test_run_time_resolution_quick_run_times_both_models_and_checks_they_agree(tmp_path):
    out = tmp_path / "resolution.json"
    done = run_benchmark(
        "run_time_resolution",
        "--quick",
        "--rounds",
        "2",
        "--backends",
        BACKEND,
        "--json",
        str(out),
    )
    assert done.returncode == 0, done.stderr[-3000:]
    (result,) = json.loads(out.read_text())
    assert result["backend"] == BACKEND and result["gemm_gflops"] > 0
    assert [row["size"] for row in result["rows"]] == [16, 24]
    for row in result["rows"]:
        # The overhead is the two times' own ratio, to their rounding (0.005 ms each).
        fixed, dynamic = row["fixed_ms"], row["dynamic_ms"]
        rounding = 100 * 0.005 * (1 / fixed + dynamic / fixed**2) + 0.01
        assert row["overhead_percent"] == pytest.approx(100 * (dynamic / fixed - 1), abs=rounding)
        assert row["max_abs_difference"] < 1e-4, row  # the same numbers either way
    assert "overhead" in done.stdout


@pytest.mark.slow
def test_export_latency_quick_run_measures_keras_onnx_and_litert():
    if BACKEND != "tensorflow":
        pytest.skip("one backend is enough: exports from the others rebuild on TensorFlow")
    done = run_benchmark(
        "export_latency",
        "--quick",
        "--modes",
        "keras",
        "onnx",
        "none",
    )
    assert done.returncode == 0, done.stderr[-3000:]
    rows = {row["mode"]: row for row in map(json.loads, done.stdout.strip().splitlines())}
    assert set(rows) == {"keras", "onnx", "none"}
    assert all(row["latency_ms"] > 0 for row in rows.values())
    for mode in ("onnx", "none"):
        assert rows[mode]["max_abs_error"] < 1e-4, rows[mode]


def test_file_latency_quick_run_times_each_file_in_alternating_rounds():
    if BACKEND != "tensorflow":
        pytest.skip("one backend is enough: the files run in their own runtimes")
    done = run_benchmark("file_latency", "--quick")
    assert done.returncode == 0, done.stderr[-3000:]
    gemm, *rows = map(json.loads, done.stdout.strip().splitlines())
    assert set(gemm) == {"gemm_fp32_gflops"}
    assert [os.path.basename(row["path"]) for row in rows] == [
        "tiny_float.tflite",
        "tiny_int8.tflite",
    ]
    for row in rows:
        assert row["kind"] == "a TFLite model" and len(row["round_ms"]) == 2
        assert row["latency_ms"] == pytest.approx(statistics.median(row["round_ms"]), abs=1e-3)


@pytest.mark.backend_independent
def test_main_job_summary_gives_each_backends_second_epoch_over_tensorflows():
    summarise = load_benchmark("main_job_vs_cnn").summarise

    def round_(backend, vit_epochs, vit_seconds):
        runs = {"cnn": (0.91, 100.0, [30, 25]), "vit": (0.90, vit_seconds, vit_epochs)}
        return {
            model: {
                "backend": backend,
                "test_accuracy": accuracy,
                "wall_seconds": wall,
                "epoch_seconds": epochs,
            }
            for model, (accuracy, wall, epochs) in runs.items()
        }

    rounds = [
        round_("tensorflow", [50, 40], 140.0),
        round_("jax", [70, 46], 150.0),
        round_("tensorflow", [52, 44], 150.0),
        round_("jax", [66, 54], 160.0),
    ]
    summary = summarise(rounds)
    assert summary["tensorflow"]["median_vit_second_epoch_seconds"] == 42
    assert summary["jax"]["median_vit_second_epoch_seconds"] == 50
    assert summary["jax"]["vit_second_epoch_over_tensorflow"] == pytest.approx(50 / 42, abs=1e-3)
    assert "vit_second_epoch_over_tensorflow" not in summary["tensorflow"]
    assert summary["jax"]["median_time_ratio"] == pytest.approx(1.55)
    # One-epoch runs (--quick) have no second epoch: no ratio rather than a wrong one.
    quick = summarise([round_("tensorflow", [5], 10.0), round_("jax", [6], 12.0)])
    assert quick["jax"]["median_vit_second_epoch_seconds"] is None
    assert "vit_second_epoch_over_tensorflow" not in quick["jax"]


@pytest.mark.backend_independent
def test_main_job_summary_compares_a_backend_without_a_cnn_run_with_tensorflow_only():
    summarise = load_benchmark("main_job_vs_cnn").summarise

    def vit(backend, accuracy, epochs):
        return {
            "backend": backend,
            "test_accuracy": accuracy,
            "wall_seconds": 100.0,
            "epoch_seconds": epochs,
        }

    cnn = {
        "backend": "tensorflow",
        "test_accuracy": 0.91,
        "wall_seconds": 80.0,
        "epoch_seconds": [9, 8],
    }
    summary = summarise(
        [
            {"vit": vit("tensorflow", 0.92, [40, 30]), "cnn": cnn},
            {"vit": vit("jax", 0.9175, [50, 36])},
        ]
    )
    assert summary["tensorflow"]["median_accuracy_points"] == pytest.approx(1.0)
    assert summary["tensorflow"]["median_time_ratio"] == pytest.approx(1.25)
    jax = summary["jax"]
    assert "median_time_ratio" not in jax and "median_cnn_accuracy" not in jax
    assert jax["vit_second_epoch_over_tensorflow"] == pytest.approx(1.2)
    assert jax["vit_accuracy_points_minus_tensorflow"] == pytest.approx(-0.25)


@pytest.mark.backend_independent
def test_main_job_refuses_a_cnn_backend_that_is_not_among_the_backends():
    done = run_benchmark(
        "main_job_vs_cnn",
        "--quick",
        "--backends",
        "tensorflow",
        "--cnn-backends",
        "jax",
        timeout=900,
    )
    assert done.returncode == 2
    assert "--cnn-backends" in done.stderr and "['jax']" in done.stderr
