"""The schedule and optimizers that a trained model's `.keras` file names.

`keras_vit.training` compiles models with them; they live on the library
floor so that `import keras_vit` registers them, and any `.keras` file that
a training run wrote loads with its optimizer, whether or not the training
package was imported.
"""

import math

import keras
from keras import ops

from keras_vit._compat import ScaledLearningRates, SumReplicasBeforeClipping


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
