"""One front for the engines that train on many devices.

JAX: `keras.distribution` (`DataParallel`, `ModelParallel` with
`layout_map`), one process or many (`jax.distributed` through
`keras.distribution.initialize`). TensorFlow: `tf.distribute`
(`MirroredStrategy` on one host, `MultiWorkerMirroredStrategy` when
`TF_CONFIG` names several tasks). Nothing here trains; it picks the
engine, gives its scope, and feeds it data the way it wants.
"""

import contextlib
import dataclasses
import json
import os

from keras_vit import _options
from keras_vit._compat import mirrored_strategy
from keras_vit.distribution.layouts import BATCH_AXIS, device_mesh, layout_map

KINDS = ("data", "model")


def simulate_cpu_devices(count):
    """Splits the host CPU into `count` devices, before the backend starts.

    For trying distributed training on one machine (and for tests): JAX
    gets `count` CPU devices (`jax_num_cpu_devices`, the same as
    `XLA_FLAGS=--xla_force_host_platform_device_count`), TensorFlow `count`
    logical CPUs. Call it before the first computation of the process.

    Args:
        count: int >= 1.
    """
    import keras

    if not isinstance(count, int) or isinstance(count, bool) or count < 1:
        raise ValueError(f"`count` must be a positive int. Received: count={count!r}")
    backend = keras.backend.backend()
    try:
        if backend == "jax":
            import jax

            jax.config.update("jax_num_cpu_devices", count)
        elif backend == "tensorflow":
            import tensorflow as tf

            cpu = tf.config.list_physical_devices("CPU")[0]
            tf.config.set_logical_device_configuration(
                cpu, [tf.config.LogicalDeviceConfiguration()] * count
            )
        else:
            raise ValueError(
                f"Simulated devices need the JAX or TensorFlow backend; this is {backend!r}."
            )
    except RuntimeError as error:
        raise RuntimeError(
            f"simulate_cpu_devices({count}) must run before the {backend} backend "
            f"computes anything in this process ({error})."
        ) from None


def _tf_config_tasks():
    """The number of tasks `TF_CONFIG` names (0 when it is not set)."""
    config = os.environ.get("TF_CONFIG")
    if not config:
        return 0
    try:
        cluster = json.loads(config).get("cluster", {})
    except (json.JSONDecodeError, AttributeError):
        raise ValueError(f"TF_CONFIG is not a JSON object: {config!r}") from None
    return sum(len(tasks) for kind, tasks in cluster.items() if kind in ("chief", "worker"))


@dataclasses.dataclass
class Distributed:
    """A distribution engine chosen for this process, and how to use it.

    Attributes:
        kind: `None` (one device), `"data"` or `"model"`.
        engine: the `tf.distribute.Strategy` or `keras.distribution.Distribution`.
        num_replicas: data-parallel copies of the model in all processes;
            the global batch is split over them.
        num_workers: processes (hosts) taking part.
        worker_index: this process's index among them.
    """

    kind: str
    engine: object
    num_replicas: int
    num_workers: int = 1
    worker_index: int = 0

    @property
    def is_chief(self):
        """Whether this process writes the run's outputs."""
        return self.worker_index == 0

    def scope(self):
        """The context in which the model is built, compiled and fitted."""
        return self.engine.scope()

    def dataset(self, make, global_batch_size):
        """The training data for this engine.

        Args:
            make: function `(batch_size, shard)` -> `keras_vit.data.Dataset`,
                with `shard` `None` or `(num_shards, index)` (see
                `keras_vit.data.make_pipeline`).
            global_batch_size: int, the batch of one optimizer step over
                all replicas.

        Returns:
            `keras_vit.data.Dataset` whose `data` `model.fit` takes. Each
            worker (process) reads only its shard of the examples, in
            batches of `global_batch_size / num_workers`; TensorFlow cuts
            them per replica, Keras' JAX trainer assembles the global batch
            over the devices of all processes.
        """
        if global_batch_size % self.num_replicas:
            raise ValueError(
                f"{_options.given('batch_size', global_batch_size)} does not split over the "
                f"{self.num_replicas} data-parallel replicas; use a multiple of "
                f"{self.num_replicas}."
            )
        shard = (self.num_workers, self.worker_index) if self.num_workers > 1 else None
        if not hasattr(self.engine, "distribute_datasets_from_function"):
            return make(global_batch_size // self.num_workers, shard)

        def per_pipeline(context):
            shard = None
            if context.num_input_pipelines > 1:
                shard = (context.num_input_pipelines, context.input_pipeline_id)
            return make(context.get_per_replica_batch_size(global_batch_size), shard).data

        # The metadata (class names, size) of this worker's pipeline.
        described = make(global_batch_size // self.num_workers, shard)
        data = self.engine.distribute_datasets_from_function(per_pipeline)
        return dataclasses.replace(described, data=data)

    def prepare(self, model):
        """Readies a compiled `model` for `fit` inside `scope()`.

        Under `MultiWorkerMirroredStrategy`, Keras 3 (3.15; keras#20585)
        builds the optimizer and metrics at the start of `fit` from a
        batch averaged with `strategy.reduce`, which that strategy refuses
        ("Attempt to convert a value (PerReplica...) to a Tensor"). They
        are built here from the model's shapes alone instead, and `fit`
        takes the strategy from the scope it runs in.
        """
        if not (self.num_workers > 1 and hasattr(self.engine, "distribute_datasets_from_function")):
            return model  # not a multi-worker tf.distribute strategy
        import numpy as np

        from keras_vit._compat import build_for_multi_worker

        example = (
            np.zeros((1,) + tuple(model.input_shape[1:]), "float32"),
            np.zeros((1,) + tuple(model.output_shape[1:]), "float32"),
        )
        return build_for_multi_worker(model, example, self.scope())


class _NoDistribution:
    def scope(self):
        return contextlib.nullcontext()


def distribute(kind=None, *, model_parallel=2, model=None, devices=None):
    """The engine for `kind` on this backend.

    Args:
        kind: `None` (one device), `"data"` (data parallel over every
            device: `keras.distribution.DataParallel` on JAX,
            `tf.distribute.MirroredStrategy`, or
            `MultiWorkerMirroredStrategy` when `TF_CONFIG` names several
            tasks, on TensorFlow) or `"model"` (JAX only:
            `keras.distribution.ModelParallel` with `layout_map`, the
            model split over `model_parallel` devices, data parallel over
            the rest).
        model_parallel: int, devices per model copy for `kind="model"`.
        model: for `kind="model"`, what `layout_map` checks (a variant
            name, a dict with `num_heads` and `mlp_dim`, or a model).
        devices: device names (JAX: `keras.distribution.list_devices()`
            names; TensorFlow: e.g. `"/cpu:0"`), or `None` for all.

    Returns:
        `Distributed`.

    Example:

    ```python
    plan = keras_vit.distribution.distribute("data")
    with plan.scope():
        model = keras_vit.ViTS16(classes=10)
        model.compile(...)
        model.fit(plan.dataset(make, global_batch_size=256).data)
    ```
    """
    import keras

    if kind is None:
        return Distributed(kind=None, engine=_NoDistribution(), num_replicas=1)
    if kind not in KINDS:
        raise ValueError(f"`kind` must be None, 'data' or 'model'. Received: kind={kind!r}")
    backend = keras.backend.backend()
    if backend == "jax":
        return _jax_engine(kind, model_parallel, model, devices)
    if backend == "tensorflow":
        if kind == "model":
            raise ValueError(
                "kind='model' (model parallelism) runs on the JAX backend "
                "(keras.distribution.ModelParallel); on TensorFlow use kind='data'."
            )
        return _tensorflow_engine(devices)
    raise ValueError(
        f"Distributed training runs on the JAX or TensorFlow backend; this is {backend!r}."
    )


def initialize():
    """Joins a multi-process JAX job described by the environment.

    Reads `KERAS_DISTRIBUTION_JOB_ADDRESSES` (the coordinator's
    `host:port` first), `KERAS_DISTRIBUTION_NUM_PROCESSES` and
    `KERAS_DISTRIBUTION_PROCESS_ID` (Keras' names) and calls
    `keras.distribution.initialize`, i.e. `jax.distributed.initialize`.
    Does nothing when the job has one process.
    """
    import keras

    processes = int(os.environ.get("KERAS_DISTRIBUTION_NUM_PROCESSES", "1") or 1)
    if processes > 1 and keras.backend.backend() == "jax":
        keras.distribution.initialize()
    return processes


def _jax_engine(kind, model_parallel, model, devices):
    import jax
    import keras

    initialize()
    devices = list(devices) if devices is not None else keras.distribution.list_devices()
    if kind == "data":
        # The data comes sharded per process (`Distributed.dataset`).
        engine = keras.distribution.DataParallel(devices=devices, auto_shard_dataset=False)
        replicas = len(devices)
    else:
        mesh = device_mesh(model_parallel, devices)
        engine = keras.distribution.ModelParallel(
            layout_map=layout_map(model, mesh),
            batch_dim_name=BATCH_AXIS,
            auto_shard_dataset=False,
        )
        replicas = mesh.shape[0]
    return Distributed(kind, engine, replicas, jax.process_count(), jax.process_index())


def _tensorflow_engine(devices):
    import tensorflow as tf

    if _tf_config_tasks() > 1:
        strategy = _multi_worker_strategy()
        resolver = strategy.cluster_resolver
        tasks = resolver.cluster_spec().as_dict()
        workers = sum(len(tasks.get(kind, ())) for kind in ("chief", "worker"))
        # The chief (or, without one, worker 0) is index 0.
        index = resolver.task_id + (1 if resolver.task_type == "worker" and "chief" in tasks else 0)
        return Distributed("data", strategy, strategy.num_replicas_in_sync, workers, index)
    if devices is None:  # MirroredStrategy's own default is the GPUs, or CPU:0 alone
        devices = [
            d.name
            for d in tf.config.list_logical_devices("GPU") or tf.config.list_logical_devices("CPU")
        ]
    strategy = mirrored_strategy(devices)
    return Distributed("data", strategy, strategy.num_replicas_in_sync)


def _multi_worker_strategy():
    """`tf.distribute.MultiWorkerMirroredStrategy`, made usable by Keras 3's `fit`.

    Keras 3.15 reduces every training step's scalar metrics over the
    workers with `strategy.reduce("MEAN", value, axis=0)`, which fails for a
    scalar ("Invalid reduction dimension 0 for input with 0 dimensions";
    keras#20585). Reducing a scalar along no axis is what it means.
    """
    import tensorflow as tf

    class MultiWorkerMirroredStrategy(tf.distribute.MultiWorkerMirroredStrategy):
        def reduce(self, reduce_op, value, axis):
            local = tf.nest.flatten(self.experimental_local_results(value))
            if axis is not None and local and local[0].shape.rank == 0:
                axis = None
            return super().reduce(reduce_op, value, axis)

    return MultiWorkerMirroredStrategy()
