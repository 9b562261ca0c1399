"""The schedule and optimizers that a trained model's `.keras` file names.

`keras_vit.training` compiles models with them; they live on the library
floor so that `import keras_vit` registers them, and any `.keras` file that
a training run wrote loads with its optimizer, whether or not the training
package was imported.
"""

import math

import keras
from keras import ops

from keras_vit._compat import SumReplicasBeforeClipping


@keras.saving.register_keras_serializable(package="keras_vit")
class WarmupDecay(keras.optimizers.schedules.LearningRateSchedule):
    """Linear warm-up from 0 to `peak_learning_rate`, then cosine or linear decay.

    Args:
        peak_learning_rate: float, the rate reached at `warmup_steps`.
        total_steps: int, the step at which the decay ends.
        warmup_steps: int, steps of linear warm-up.
        decay: `"cosine"` or `"linear"`.
        end_learning_rate: float, the rate at `total_steps` and after.

    Example:

    >>> schedule = WarmupDecay(1e-3, total_steps=100, warmup_steps=10)
    >>> [round(float(schedule(s)), 6) for s in (0, 5, 10, 55, 100)]
    [0.0, 0.0005, 0.001, 0.0005, 0.0]
    """

    def __init__(
        self,
        peak_learning_rate,
        total_steps,
        warmup_steps=0,
        decay="cosine",
        end_learning_rate=0.0,
    ):
        if decay not in ("cosine", "linear"):
            raise ValueError(f"`decay` must be 'cosine' or 'linear'. Received: decay={decay!r}")
        if not isinstance(total_steps, int) or total_steps < 1:
            raise ValueError(
                f"`total_steps` must be a positive int. Received: total_steps={total_steps!r}"
            )
        if not isinstance(warmup_steps, int) or not 0 <= warmup_steps <= total_steps:
            raise ValueError(
                f"`warmup_steps` must be an int in [0, total_steps={total_steps}]. "
                f"Received: warmup_steps={warmup_steps!r}"
            )
        self.peak_learning_rate = float(peak_learning_rate)
        self.total_steps = total_steps
        self.warmup_steps = warmup_steps
        self.decay = decay
        self.end_learning_rate = float(end_learning_rate)

    def __call__(self, step):
        step = ops.cast(step, "float32")
        peak, end = self.peak_learning_rate, self.end_learning_rate
        warmup = step / max(self.warmup_steps, 1) * peak
        progress = ops.clip(
            (step - self.warmup_steps) / max(self.total_steps - self.warmup_steps, 1),
            0.0,
            1.0,
        )
        if self.decay == "cosine":
            shape = 0.5 * (1.0 + ops.cos(math.pi * progress))
        else:
            shape = 1.0 - progress
        return ops.where(step < self.warmup_steps, warmup, end + (peak - end) * shape)

    def get_config(self):
        return {
            "peak_learning_rate": self.peak_learning_rate,
            "total_steps": self.total_steps,
            "warmup_steps": self.warmup_steps,
            "decay": self.decay,
            "end_learning_rate": self.end_learning_rate,
        }


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
            schedule, rate = self._learning_rate, self.learning_rate
            self._learning_rate = lambda rate=rate * scale: rate
            try:
                super()._apply_weight_decay(group)
            finally:
                self._learning_rate = schedule

    def get_config(self):
        return {**super().get_config(), "learning_rate_scales": dict(self.learning_rate_scales)}


@keras.saving.register_keras_serializable(package="keras_vit")
class ScaledAdamW(ScaledLearningRates, keras.optimizers.AdamW):
    """`keras.optimizers.AdamW` with a rate of its own for each variable (`ScaledLearningRates`).

    Example:

    >>> import numpy as np
    >>> low, high = keras.Variable(np.ones(2), name="low"), keras.Variable(np.ones(2), name="high")
    >>> optimizer = ScaledAdamW(0.1, learning_rate_scales={low.path: 0.1})
    >>> optimizer.apply([np.ones(2), np.ones(2)], [low, high])
    >>> [round(float(v[0]), 4) for v in (low, high)]  # Adam's first step: the rate
    [0.99, 0.8996]
    """


@keras.saving.register_keras_serializable(package="keras_vit")
class ScaledSGD(ScaledLearningRates, keras.optimizers.SGD):
    """`keras.optimizers.SGD` with a rate of its own for each variable (`ScaledLearningRates`)."""


@keras.saving.register_keras_serializable(package="keras_vit")
class ReplicatedAdamW(SumReplicasBeforeClipping, ScaledAdamW):
    """`ScaledAdamW` that clips the summed gradient of all replicas."""


@keras.saving.register_keras_serializable(package="keras_vit")
class ReplicatedSGD(SumReplicasBeforeClipping, ScaledSGD):
    """`ScaledSGD` that clips the summed gradient of all replicas."""
