"""Every use of a private Keras, TensorFlow or LiteRT API, in one place.

Each function or class here works around something the public API does not
offer (the upstream issue or source is cited) and checks that the private
name still exists, so that a Keras or TensorFlow release that moves it fails
here, with a message naming the version, instead of somewhere inside a
training run. `tests/test_private_api.py` keeps every other module off
private names.
"""

import contextlib

import keras


def _private(owner, name, purpose):
    """`getattr(owner, name)`, or a clear error when this Keras no longer has it."""
    try:
        return getattr(owner, name)
    except AttributeError:
        owner_name = owner.__name__ if isinstance(owner, type) else type(owner).__name__
        raise RuntimeError(
            f"keras_vit needs {owner_name}.{name} ({purpose}), which Keras "
            f"{keras.__version__} does not have; keras_vit is tested with the Keras "
            "versions its requirements name."
        ) from None


def _require_private_method(base, name, purpose):
    if not callable(getattr(base, name, None)):
        raise RuntimeError(
            f"keras_vit overrides {base.__name__}.{name} ({purpose}), which Keras "
            f"{keras.__version__} does not have; keras_vit is tested with the Keras "
            "versions its requirements name."
        )


# --- Training: resuming from a backup ---------------------------------------

# `BackupAndRestore` has no public hooks for what it writes and reads
# (keras/src/callbacks/backup_and_restore.py: `_save_model`, `_load_model`,
# `_current_epoch`), nor a public way to tell `fit` where to start
# (`model._initial_epoch`, which the callback itself sets).
for _hook in ("_save_model", "_load_model"):
    _require_private_method(
        keras.callbacks.BackupAndRestore, _hook, "choosing what a backup writes and reads"
    )


class BackupHooks(keras.callbacks.BackupAndRestore):
    """`BackupAndRestore` whose saving and restoring are the subclass's `save()` / `restore()`."""

    def _save_model(self):
        self.save()

    def _load_model(self):
        self.restore()

    def save(self):
        raise NotImplementedError

    def restore(self):
        raise NotImplementedError

    @property
    def finished_epochs(self):
        """Epochs finished when `save()` runs (Keras' `_current_epoch`)."""
        return _private(self, "_current_epoch", "the epoch a backup holds")


def resume_fit_at(model, epoch):
    """Makes the next `fit` start after `epoch` (what `BackupAndRestore` does)."""
    _private(model, "_initial_epoch", "the epoch fit starts from")
    model._initial_epoch = epoch


# --- Training: clipping the gradient of all replicas ------------------------

# Keras' optimizers clip each replica's gradient and sum the clipped
# gradients afterwards, so under `tf.distribute` a global-norm clip of 1.0 on
# 4 replicas lets through up to 4.0 (tensorflow/tensorflow#33929 describes
# the two places to clip; Keras 3.15 clips in the first). `_clip_gradients`
# and `_all_reduce_sum_gradients` are the private steps to reorder.
# Only TensorFlow's optimizer all-reduces (tf.distribute); every backend's clips.
for _hook in ("_clip_gradients",) + (
    ("_all_reduce_sum_gradients",) if keras.backend.backend() == "tensorflow" else ()
):
    _require_private_method(
        keras.optimizers.Optimizer, _hook, "clipping the gradient summed over replicas"
    )


class SumReplicasBeforeClipping:
    """Mixin for a Keras optimizer: global-norm clipping of the whole batch's gradient.

    With Keras' own clipping each replica clips its share of the gradient,
    so a replicated step differs from one device's (docs/performance.md).
    """

    # Keras sums in `_backend_update_step`, after `_clip_gradients`; both
    # run in every replica's own thread, so the sum moves here, stateless.
    def _clip_gradients(self, grads):
        import tensorflow as tf

        context = tf.distribute.get_replica_context()
        if context is not None and context.num_replicas_in_sync > 1:
            summed = iter(
                context.all_reduce(tf.distribute.ReduceOp.SUM, [g for g in grads if g is not None])
            )
            grads = [None if g is None else next(summed) for g in grads]
        return super()._clip_gradients(grads)

    def _all_reduce_sum_gradients(self, grads_and_vars):
        return list(grads_and_vars)  # summed before clipping


# --- Training: a learning rate per variable --------------------------------

# Keras' optimizers have one rate and no parameter groups. A variable's rate
# is scaled where the backends' steps take the rate: `_backend_update_step`
# (PyTorch's updates many tensors at once, so it runs per group of equal
# rates) and `_apply_weight_decay`, which reads the optimizer's
# `_learning_rate`; a variable's index is `_get_variable_index`'s.
for _hook in ("_backend_update_step", "_apply_weight_decay", "_get_variable_index"):
    _require_private_method(keras.optimizers.Optimizer, _hook, "a learning rate per variable")


class ScaledLearningRates:
    """Mixin for a Keras optimizer: each variable's step at its own share of the rate.

    Keras' optimizers have one learning rate; fine-tuning a pretrained
    model wants lower rates for its lower layers (layer-wise rate decay).
    Scaling a variable's gradient does not do it (Adam divides the scale
    away), so the rate itself is scaled, inside the optimizer's step: each
    variable's update, and its decoupled weight decay, use `learning_rate *
    learning_rate_scales[variable.path]` (1 for a path not listed), exactly
    as an optimizer of that rate on that variable alone would.

    Args:
        learning_rate_scales: dict `{variable path: float}`, e.g. from
            `keras_vit.training.layer_decay_scales`.
        **kwargs: the optimizer's arguments.
    """

    def __init__(self, *args, learning_rate_scales=None, **kwargs):
        super().__init__(*args, **kwargs)
        scales = dict(learning_rate_scales or {})
        for path, scale in scales.items():
            if not isinstance(scale, (int, float)) or isinstance(scale, bool) or scale < 0:
                raise ValueError(
                    "`learning_rate_scales` must map variable paths to non-negative numbers. "
                    f"Received: {path!r}: {scale!r}"
                )
        self.learning_rate_scales = {path: float(scale) for path, scale in scales.items()}

    def build(self, variables):
        super().build(variables)
        # By index: TensorFlow's step hands over its own variables, without paths.
        self._variable_scales = [self.learning_rate_scales.get(v.path, 1.0) for v in variables]

    def _groups(self, variables):
        """`(scale, indices)` of `variables` that share a scale."""
        groups = {}
        for index, variable in enumerate(variables):
            scale = self._variable_scales[self._get_variable_index(variable)]
            groups.setdefault(scale, []).append(index)
        return groups.items()

    def _backend_update_step(self, grads, trainable_variables, learning_rate):
        # Each backend's own step (PyTorch's updates many tensors at once), per scale.
        for scale, indices in self._groups(trainable_variables):
            super()._backend_update_step(
                [grads[i] for i in indices],
                [trainable_variables[i] for i in indices],
                learning_rate if scale == 1.0 else learning_rate * scale,
            )

    def _apply_weight_decay(self, variables):
        for scale, indices in self._groups(variables):
            group = [variables[i] for i in indices]
            if self.weight_decay is None or not any(self._use_weight_decay(v) for v in group):
                continue
            if scale == 1.0:
                super()._apply_weight_decay(group)
                continue
            # The decay reads `self.learning_rate`: this group's, while it runs.
            schedule = _private(self, "_learning_rate", "the rate weight decay reads")
            rate = self.learning_rate
            self._learning_rate = lambda rate=rate * scale: rate
            try:
                super()._apply_weight_decay(group)
            finally:
                self._learning_rate = schedule

    def get_config(self):
        return {**super().get_config(), "learning_rate_scales": dict(self.learning_rate_scales)}


# --- Layers: every layer of a model, nested ones included ------------------

# Keras 3 has no public walk of the layers inside layers (a `ConvStem`'s
# BatchNorms are attributes of the stem, not layers of the model).


def all_layers(model):
    """Every layer of `model` below it, nested layers included."""
    flatten = _private(model, "_flatten_layers", "the layers inside layers")
    return list(flatten(include_self=False, recursive=True))


def forget_traced_functions(model):
    """Drops a model's traced train, test and predict functions, as Keras' `quantize` does.

    A function traced before a layer changed (new variables, another call
    path) would go on computing the old graph on TensorFlow, and on JAX
    without the new variables. (Keras has no public reset; `quantize` sets
    these attributes, and `make_*_function` rebuilds what is `None`.)
    """
    if isinstance(model, keras.Model):
        model.train_function = model.test_function = model.predict_function = None


# --- Models: the layer that made a symbolic tensor ----------------------------

# A functional model's KerasTensor knows the layer that made it only through
# `_keras_history` (keras/src/backend/common/keras_tensor.py); Keras has no
# public getter. The encoder reads it to see whether its tokens come out of
# a quantization point.


def producing_layer(tensor):
    """The layer whose call made the symbolic `tensor`, or `None` (an input, an eager tensor)."""
    history = getattr(tensor, "_keras_history", None)
    return None if history is None else history.operation


# --- Models: keras.RematScope ---------------------------------------------

# Every Keras operation reads the active `keras.RematScope` when it is made
# (keras/src/ops/operation.py: `self._remat_mode`), and there is no public
# getter (keras/src/backend/common/remat.py: `get_current_remat_mode`).
# keras_vit's blocks take a scope over with their own `remat`: Keras'
# wrapper of a whole layer's call cannot pass `training` on TensorFlow
# graphs (`custom_gradient` takes keyword arguments only eagerly), the
# model's own wrapper stops JAX building it, and recomputed dropout would
# draw other units than the forward pass.


def remat_scope():
    """The active `keras.RematScope`'s `(mode, output_size_threshold, layer_names)`, or None."""
    from keras.src.backend.common import remat

    return _private(remat, "get_current_remat_mode", "the active RematScope")()


def without_keras_remat(operations):
    """Switches Keras' own rematerialisation off on `operations` (their blocks took it over)."""
    for operation in operations:
        _private(operation, "_remat_mode", "an operation's RematScope")
        operation._remat_mode = None


# --- Layers: variables added to a built layer ------------------------------

# A built layer refuses new variables; Keras' own `enable_lora` unlocks its
# tracker to add the adapters (keras/src/layers/core/einsum_dense.py), which
# `layers.Projection`'s LoRA on slices of the fused q/k/v kernel does too.


@contextlib.contextmanager
def state_unlocked(layer):
    """Lets a built `layer` add variables inside the block, as Keras' `enable_lora` does."""
    tracker = _private(layer, "_tracker", "a layer's variable tracker")
    tracker.unlock()
    try:
        yield
    finally:
        tracker.lock()


def stored_kernel(layer):
    """The kernel variable a Keras `Dense`/`EinsumDense` stores, without a LoRA update.

    Keras keeps it in `_kernel`; with LoRA their `kernel` is the merged one
    (the frozen kernel plus the adapters' product), which is also all that
    `save_weights` writes (and a load zeroes the adapters).
    """
    return _private(layer, "_kernel", "a Dense layer's stored kernel")


def lora_frozen_kernel(layer):
    """The frozen kernel of a LoRA layer, without its adapters' update (`stored_kernel`)."""
    return stored_kernel(layer)


# --- Layers: a DTypePolicyMap given to every layer -------------------------

# A layer given a `DTypePolicyMap` (keras-hub's way: every layer gets the
# model's `dtype`) holds the whole map, and Keras reads its mode two ways:
# `quantization_mode` looks the layer's path up in it, but
# `_get_kernel_with_merged_lora` (called by `save_own_variables`) and
# `stateless_call` read `dtype_policy.quantization_mode`, the map's own, None
# (keras/src/layers/core/einsum_dense.py, dense.py, layer.py): a quantized
# layer built from a map saves its int8 kernel without its scale ("Invalid
# dtype: object"). Keras' functional deserialization gives each layer its own
# entry instead, which the setter of `dtype_policy` cannot (given a map, it
# writes into the map).


def hold_own_policies(model):
    """Each layer of `model` that holds a `DTypePolicyMap` holds its own entry of it instead."""
    for layer in all_layers(model):
        policy = _private(layer, "_dtype_policy", "the dtype policy a layer holds")
        if isinstance(policy, keras.dtype_policies.DTypePolicyMap) and layer.path:
            layer._dtype_policy = policy[layer.path]


# --- Layers: LoRA of another shape on Keras' int8 EinsumDense ------------

# Keras' int8 EinsumDense adds its own LoRA term inside `_int8_call` and, when
# saving, merges its own factors into the int8 kernel
# (`_get_kernel_with_merged_lora`: dequantize, add, requantize with the
# layer's scale layout); neither has a hook for adapters of another shape
# (keras/src/layers/core/einsum_dense.py), as `layers.Projection`'s per-slot
# LoRA of the fused q/k/v kernel.
for _hook in (
    "_int8_call",
    "_get_kernel_with_merged_lora",
    "_adjust_scale_for_dequant",
    "_adjust_scale_for_quant",
):
    _require_private_method(
        keras.layers.EinsumDense, _hook, "LoRA of another shape on an int8 kernel"
    )


class EinsumDenseWithOwnLoRA(keras.layers.EinsumDense):
    """An `EinsumDense` whose int8 call and merged save use the subclass's own LoRA.

    While `own_lora` is true, the int8 call is Keras' without its LoRA term,
    plus `own_lora_outputs(inputs, outputs_shape)`; the kernel saved is the
    int8 kernel dequantized, `own_lora_update()` added and requantized as
    Keras' `quantize` does (the same per-channel scale layout): Keras'
    QLoRA, with adapters of the subclass's shape.
    """

    own_lora = False

    def own_lora_outputs(self, inputs, outputs_shape):
        raise NotImplementedError

    def own_lora_update(self):
        raise NotImplementedError

    def dequantized_kernel(self):
        """The int8 kernel as floats (levels divided by their scales), the kernel's shape."""
        scale = self._adjust_scale_for_dequant(self.kernel_scale)
        return keras.ops.divide(keras.ops.cast(self._kernel, self.compute_dtype), scale)

    def _int8_call(self, inputs, training=None):
        if not self.own_lora:
            return super()._int8_call(inputs, training)
        self.lora_enabled = False  # (Keras' term of its own factors' shape: not these)
        try:
            outputs = super()._int8_call(inputs, training)
        finally:
            self.lora_enabled = True
        return outputs + self.own_lora_outputs(inputs, keras.ops.shape(outputs))

    def _get_kernel_with_merged_lora(self):
        if not self.own_lora or self.quantization_mode != "int8":
            return super()._get_kernel_with_merged_lora()
        merged = keras.ops.add(self.dequantized_kernel(), self.own_lora_update())
        kernel, scale = keras.quantizers.abs_max_quantize(
            merged, axis=self._kernel_reduced_axes, to_numpy=True
        )
        return kernel, self._adjust_scale_for_quant(scale, "kernel"), None


def merged_quantized_kernel(layer):
    """`(kernel, kernel_scale)` of a quantized LoRA layer, its adapters merged as Keras saves it."""
    merge = _private(layer, "_get_kernel_with_merged_lora", "a quantized LoRA layer's merge")
    kernel, scale, _ = merge()
    return kernel, scale


# --- Distribution: building before a multi-worker fit -----------------------


def build_for_multi_worker(model, data_batch, scope):
    """Builds `model`'s optimizer and metrics from `data_batch` shapes inside `scope`.

    Under `MultiWorkerMirroredStrategy`, Keras 3 builds them at the start of
    `fit` from a batch averaged with `strategy.reduce`, which that strategy
    refuses (keras-team/keras#20585); `_symbolic_build` builds them from
    shapes alone, and clearing `_distribute_strategy` lets `fit` take the
    strategy from the scope it runs in.
    """
    symbolic_build = _private(model, "_symbolic_build", "building from shapes")
    _private(model, "_distribute_strategy", "the strategy fit runs under")
    with scope:
        symbolic_build(data_batch=data_batch)
    model._distribute_strategy = None
    return model


# --- Distribution: several MirroredStrategy in one process -----------------

_mirrored_strategies_made = 0


def mirrored_strategy(devices):
    """`tf.distribute.MirroredStrategy(devices)` whose collective ops no earlier one shares.

    Every MirroredStrategy numbers the groups of its collective all-reduces
    from the same key (the class attribute `_collective_key_base`, which only
    TensorFlow's own tests change: tensorflow/python/distribute/
    mirrored_strategy.py), and the runtime keeps a group's shapes: a second
    model of another size trained in the same process finds the first one's
    group and fails ("Shape mismatch in the collective instance"). Each
    strategy made here numbers its groups from a base of its own.
    """
    import tensorflow as tf

    global _mirrored_strategies_made
    strategy_class = tf.distribute.MirroredStrategy
    default_base = _private(strategy_class, "_collective_key_base", "numbering collective ops")
    _mirrored_strategies_made += 1
    strategy_class._collective_key_base = default_base + 100_000 * _mirrored_strategies_made
    try:
        return strategy_class(list(devices))
    finally:
        strategy_class._collective_key_base = default_base


# --- TensorFlow: whether XLA may run ----------------------------------------


def op_determinism_enabled():
    """Whether `tf.config.experimental.enable_op_determinism()` is in effect.

    TensorFlow has a public setter but no public getter; Keras reads the
    same private function (keras/src/trainers/trainer.py, `model_supports_jit`).
    """
    from tensorflow.python.framework import config

    return _private(config, "is_op_determinism_enabled", "op determinism")()


# --- LiteRT: the ops of a converted model -----------------------------------


def litert_ops(interpreter):
    """`[{"op_name": ..., ...}]` of a LiteRT interpreter's graph (after delegation).

    LiteRT has no public listing of a model's ops (`Interpreter._get_ops_details`
    is what its own analyzer tools read).
    """
    return _private(interpreter, "_get_ops_details", "listing a model's ops")()
