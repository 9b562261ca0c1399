"""Training beyond one device: keras.distribution (JAX) and tf.distribute (TensorFlow).

The devices are simulated on the CPU (JAX: 4 CPU devices, TensorFlow: 2
logical CPUs); each such run is a fresh interpreter of the backend it
checks, since the device count is fixed when a backend starts. So those
checks do not depend on the backend of the suite that starts them.
"""

import json
import os
import socket
import subprocess
import sys

import keras
import numpy as np
import pytest

import keras_vit
from keras_vit.distribution import SHARDED_LAYOUTS, Distributed, device_mesh, distribute, layout_map
from tests import warm_interpreters
from tests.conftest import BACKEND, TINY, last_json_line, own_jax_compilations, run_python

# One fit step on 16 images, on one device and on each given engine, both
# from the same seed and data through `Distributed.dataset`. The model is of
# run-time resolution on an 8-pixel table: the 16-pixel images resample its
# position embeddings in the graph of every replica.
ONE_STEP = """
import json, numpy as np, keras, keras_vit
from keras_vit.distribution import distribute, simulate_cpu_devices
simulate_cpu_devices({devices})
from keras_vit.data import from_arrays
from keras_vit.training.recipes import RECIPES
rng = np.random.default_rng(0)
images = rng.uniform(0, 255, (16, 16, 16, 3)).astype("float32")
labels = rng.integers(0, 5, 16)
architecture = {architecture}

def make(batch_size, shard):
    return from_arrays(images, labels, image_size=16, batch_size=batch_size, shard=shard)

# Each run's recipe and LoRA rank (LoRA's adapters are added to the built
# model inside the plan's scope).
RUNS = {{"pretrain": ("pretrain", None), "paper_finetune": ("paper_finetune", None),
        "lora": ("pretrain", 2)}}
RUNS = {{run: RUNS[run] for run in {runs}}}

def one_step(plan, run):
    recipe, lora = RUNS[run]
    keras.utils.set_random_seed(7)
    with plan.scope():
        model = keras_vit.ViT(**architecture, classifier_activation=None)
        if lora:
            model.enable_lora(lora)
        # No warm-up: step 0 moves the weights. Both recipes clip the
        # gradient's global norm at 1.0, which this step exceeds.
        RECIPES[recipe].compile(model, total_steps=1)
        model.initial = [keras.ops.convert_to_numpy(v) for v in model.trainable_variables]
        model.fit(plan.dataset(make, 16).data, epochs=1, verbose=0)
    return model

result = {{}}
for recipe in RUNS:  # AdamW, SGD, and AdamW on LoRA's adapters
    reference = one_step(distribute(None), recipe)
    expected = {{v.path: np.asarray(keras.ops.convert_to_numpy(v))
                for v in reference.trainable_variables}}
    # The step moved the weights (so matching them means something).
    result["moved_" + recipe] = max(float(np.abs(a - expected[v.path]).max())
                                    for a, v in zip(reference.initial,
                                                    reference.trainable_variables))
    for kind in {kinds}:
        plan = distribute(kind, model_parallel=2, model=architecture)
        model = one_step(plan, recipe)
        result.setdefault(kind, dict(
            replicas=plan.num_replicas,
            engine=type(plan.engine).__name__,
            jit=bool(model.jit_compile),
        ))["error_" + recipe] = max(
            float(np.abs(expected[v.path] - keras.ops.convert_to_numpy(v)).max())
            for v in model.trainable_variables
        )
        if keras.backend.backend() == "jax" and recipe == "pretrain":
            # Partition specs without their trailing Nones.
            result[kind]["layouts"] = {{
                v.path: [str(s) if s else None for s in v.value.sharding.spec][
                    :max([i + 1 for i, s in enumerate(v.value.sharding.spec) if s] or [0])]
                for v in list(model.variables) + list(model.optimizer.variables)
            }}
            qkv = model.get_layer("encoderblock_0").attention.qkv.kernel.value
            result[kind]["qkv_shard_shape"] = list(qkv.addressable_shards[0].data.shape)
            result[kind]["devices"] = len(qkv.sharding.device_set)
print(json.dumps(result))
"""


def one_step(backend, devices, kinds, runs=("pretrain", "paper_finetune", "lora")):
    """ONE_STEP's result in a fresh interpreter (a backend fixes its device count as it starts)."""
    architecture = {**TINY, "input_shape": (None, None, 3), "base_image_size": 8}
    code = ONE_STEP.format(devices=devices, architecture=architecture, kinds=kinds, runs=runs)
    return last_json_line(run_python(code, backend=backend))


def tiny_variables():
    model = keras_vit.ViT(**TINY)
    return {v.path: tuple(v.shape) for v in model.variables}


def test_layout_map_shards_attention_and_mlp_kernels_and_replicates_the_rest():
    mesh = device_mesh(2, devices=["cpu:0", "cpu:1", "cpu:2", "cpu:3"])
    assert mesh.shape == (2, 2) and list(mesh.axis_names) == ["batch", "model"]
    layouts = layout_map(keras_vit.ViT(**TINY), mesh)
    expected = {
        "attention/qkv/kernel": (None, None, "model", None),  # (D, 3, heads, head_dim)
        "attention/qkv/bias": (None, "model", None),
        "attention/out/kernel": ("model", None, None),  # (heads, head_dim, D)
        "mlp_dense_1/kernel": (None, "model"),
        "mlp_dense_1/bias": ("model",),
        "mlp_dense_2/kernel": ("model", None),
    }
    sharded = 0
    for path, shape in tiny_variables().items():
        layout = layouts[path]
        suffix = next((s for s in expected if path.endswith(s)), None)
        if suffix is None:
            assert layout is None, path  # replicated
            continue
        sharded += 1
        assert tuple(layout.axes) == expected[suffix], path
        assert len(layout.axes) == len(shape), path
        # The split axis really is the heads / hidden-units axis.
        split = layout.axes.index("model")
        assert shape[split] in (TINY["num_heads"], TINY["mlp_dim"]), (path, shape)
    assert sharded == 6 * TINY["num_layers"]
    # A nested encoder's paths match too.
    assert layouts["vit/encoderblock_3/attention/qkv/kernel"] is not None
    assert len(SHARDED_LAYOUTS) == 6


def test_layout_map_refuses_heads_or_mlp_that_do_not_divide():
    mesh = device_mesh(2, devices=["cpu:0", "cpu:1"])
    with pytest.raises(ValueError, match="num_heads=3 does not divide over the 2 devices"):
        layout_map("Ti/16", mesh)  # Ti has 3 heads
    with pytest.raises(ValueError, match="mlp_dim=33 does not divide"):
        layout_map({"num_heads": 4, "mlp_dim": 33}, mesh)
    with pytest.raises(ValueError, match="model_parallel"):
        device_mesh(3, devices=["cpu:0", "cpu:1"])
    with pytest.raises(ValueError, match="has no keras_vit attention layers"):
        layout_map(keras.Sequential([keras.Input((3,)), keras.layers.Dense(2)]), mesh)
    layout_map("B/16", mesh)  # 12 heads, 3072 units: fine


def test_engines_refuse_what_they_cannot_do_before_any_work():
    with pytest.raises(ValueError, match="kind"):
        distribute("pipeline")
    if BACKEND == "torch":
        with pytest.raises(ValueError, match="JAX or TensorFlow backend"):
            distribute("data")
    if BACKEND == "tensorflow":
        with pytest.raises(ValueError, match="runs on the JAX backend"):
            distribute("model")
    plan = Distributed("data", engine=None, num_replicas=4)
    with pytest.raises(ValueError, match="batch_size=30 does not split over the 4"):
        plan.dataset(lambda batch, shard: None, 30)


def test_each_worker_reads_its_own_shard_in_batches_of_its_share():
    calls = []

    def make(batch_size, shard):
        calls.append((batch_size, shard))
        return "dataset"

    # A JAX-style engine (Keras assembles the global batch): 2 processes, 4 devices.
    plan = Distributed("data", engine=object(), num_replicas=4, num_workers=2, worker_index=1)
    assert plan.dataset(make, 16) == "dataset" and not plan.is_chief
    assert calls == [(8, (2, 1))]
    Distributed("data", engine=object(), num_replicas=4).dataset(make, 16)
    assert calls[-1] == (16, None)


@pytest.mark.backend_independent
@pytest.mark.slow
def test_jax_data_and_model_parallel_steps_match_one_device():
    # AdamW on the weights and on LoRA's adapters (SGD's step is TensorFlow's
    # test: there each replica's gradient is clipped apart; here the global
    # batch's gradient is one).
    result = one_step("jax", devices=4, kinds=("data", "model"), runs=("pretrain", "lora"))
    data, model = result["data"], result["model"]
    assert result["moved_pretrain"] > 5e-4
    assert (data["engine"], data["replicas"]) == ("DataParallel", 4)
    assert (model["engine"], model["replicas"]) == ("ModelParallel", 2)  # 2 x 2 mesh
    # Same global batch and seed: the same weights after one step (LoRA's
    # adapters, added to the distributed model, too).
    assert result["moved_lora"] > 5e-4
    for recipe in ("pretrain", "lora"):
        assert data["error_" + recipe] <= 1e-5 and model["error_" + recipe] <= 1e-5
    # Data parallel: every variable replicated over the 4 devices.
    assert all(spec == [] for spec in data["layouts"].values())
    # Model parallel: heads and hidden units split over the model axis,
    # for the weights and the optimizer's slots alike.
    layouts = model["layouts"]
    assert layouts["encoderblock_0/attention/qkv/kernel"] == [None, None, "model"]
    assert layouts["encoderblock_0/attention/qkv/bias"] == [None, "model"]
    assert layouts["encoderblock_1/attention/out/kernel"] == ["model"]
    assert layouts["encoderblock_0/mlp_dense_2/kernel"] == ["model"]
    assert layouts["encoderblock_0/mlp_dense_1/bias"] == ["model"]
    slots = [p for p in layouts if "encoderblock_0_attention_qkv_kernel" in p]
    assert slots and all(layouts[p] == [None, None, "model"] for p in slots)
    assert layouts["patch_embedding/kernel"] == layouts["encoder_norm/gamma"] == []
    # Each device holds half of the heads of a q/k/v kernel.
    assert model["qkv_shard_shape"] == [TINY["hidden_dim"], 3, TINY["num_heads"] // 2, 8]
    assert model["devices"] == 4


@pytest.mark.backend_independent
@pytest.mark.slow
def test_tensorflow_mirrored_step_matches_one_device():
    result = one_step("tensorflow", devices=2, kinds=("data",))
    data = result["data"]
    assert result["moved_pretrain"] > 5e-4 and result["moved_paper_finetune"] > 5e-4
    assert (data["engine"], data["replicas"]) == ("MirroredStrategy", 2)
    # Keras alone clips each replica's gradient before the sum: 1e-3 off
    # with SGD; keras_vit's optimizers clip the sum (1e-9).
    assert data["error_pretrain"] <= 1e-5 and data["error_paper_finetune"] <= 1e-5
    assert result["moved_lora"] > 5e-4 and data["error_lora"] <= 1e-5
    assert data["jit"] is False  # XLA cannot reach mirrored variables


# Two data-parallel plans in one process, all-reducing tensors of other
# shapes: each MirroredStrategy numbers its collectives from a base of its
# own (plain ones share theirs and fail: "Shape mismatch in the collective
# instance"), as two trainings of models of other sizes need.
TWO_STRATEGIES = """
import json, tensorflow as tf
from keras_vit.distribution import distribute, simulate_cpu_devices
simulate_cpu_devices(2)
sums = []
for size in (3, 5):
    strategy = distribute("data").engine
    step = tf.function(lambda: strategy.run(lambda: tf.distribute.get_replica_context().all_reduce(
        tf.distribute.ReduceOp.SUM, tf.ones([size]))))
    sums.append(float(tf.reduce_sum(strategy.experimental_local_results(step())[0])))
print(json.dumps(sums))
"""


@pytest.mark.backend_independent
@pytest.mark.slow
def test_tensorflow_plans_of_one_process_keep_their_collectives_apart():
    assert last_json_line(run_python(TWO_STRATEGIES, backend="tensorflow")) == [6.0, 10.0]


def _free_ports(count):
    sockets = [socket.socket() for _ in range(count)]
    for s in sockets:
        s.bind(("localhost", 0))
    ports = [s.getsockname()[1] for s in sockets]
    for s in sockets:
        s.close()
    return ports


def worker_environment(backend, addresses, index):
    """How each engine learns about its cluster: TF_CONFIG, or Keras' variables for JAX."""
    if backend == "tensorflow":
        config = {"cluster": {"worker": addresses}, "task": {"type": "worker", "index": index}}
        return {"TF_CONFIG": json.dumps(config)}
    return {
        "KERAS_DISTRIBUTION_JOB_ADDRESSES": ",".join(addresses),
        "KERAS_DISTRIBUTION_NUM_PROCESSES": str(len(addresses)),
        "KERAS_DISTRIBUTION_PROCESS_ID": str(index),
    }


@pytest.mark.backend_independent
@pytest.mark.slow
@pytest.mark.parametrize("backend", ["tensorflow", "jax"])
def test_two_workers_on_localhost_train_and_agree_on_the_weights(backend, tmp_path):
    # TensorFlow: MultiWorkerMirroredStrategy; JAX: jax.distributed (Gloo on the CPU).
    from tests.training.test_train_command import history_epochs, write_dataset

    data = write_dataset(tmp_path / "data", per_class=32)
    out = str(tmp_path / "run")
    addresses = [f"localhost:{port}" for port in _free_ports(2)]
    workers = []
    for index in range(2):
        # Workers compile at the same time: a compilation cache each.
        env = dict(
            os.environ,
            KERAS_BACKEND=backend,
            TF_CPP_MIN_LOG_LEVEL="3",
            **worker_environment(backend, addresses, index),
            **own_jax_compilations(tmp_path / f"jax_compilations_{index}"),
        )
        workers.append(
            warm_interpreters.Popen(
                [
                    sys.executable,
                    "-m",
                    "keras_vit.cli",
                    "train",
                    "--dataset",
                    data,
                    "--image-size",
                    "16",
                    "--epochs",
                    "2",
                    "--batch-size",
                    "16",
                    "--output-dir",
                    out,
                    "--distribute",
                    "data",
                ],
                env=env,
                stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT,
                text=True,
            )
        )
    try:
        logs = [w.communicate(timeout=900)[0] for w in workers]
    finally:
        for w in workers:
            w.kill()
    for index, (worker, log) in enumerate(zip(workers, logs)):
        assert worker.returncode == 0, f"worker {index}:\n{log[-3000:]}"
        assert f"worker {index + 1} of 2" in log and "2 replicas" in log
    chief, other = out, os.path.join(out, "workers", "1")
    assert history_epochs(chief) == history_epochs(other) == [1, 2]
    models = [keras.models.load_model(os.path.join(d, "model.keras")) for d in (chief, other)]
    for a, b in zip(*(m.get_weights() for m in models)):
        np.testing.assert_allclose(a, b, atol=1e-6)
    metrics = json.load(open(os.path.join(chief, "metrics.json")))
    assert metrics["replicas"] == 2 and metrics["distribute"] == "data"


@pytest.mark.backend_independent
@pytest.mark.slow
def test_train_command_runs_model_parallel_on_simulated_devices(tmp_path):
    from tests.training.test_train_command import write_dataset

    data = write_dataset(tmp_path / "data", per_class=16)
    out = str(tmp_path / "run")
    result = warm_interpreters.run(
        [
            sys.executable,
            "-m",
            "keras_vit.cli",
            "train",
            "--dataset",
            data,
            "--image-size",
            "16",
            "--epochs",
            "1",
            "--batch-size",
            "8",
            "--output-dir",
            out,
            "--distribute",
            "model",
            "--model-parallel",
            "2",
            "--cpu-devices",
            "4",
        ],
        env=dict(os.environ, KERAS_BACKEND="jax", TF_CPP_MIN_LOG_LEVEL="3"),
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    assert "model parallel, 2 replicas (ModelParallel)" in result.stdout
    metrics = json.load(open(os.path.join(out, "metrics.json")))
    assert (metrics["distribute"], metrics["replicas"]) == ("model", 2)
    model = keras.models.load_model(os.path.join(out, "model.keras"))
    assert model.output_shape == (None, 2)
