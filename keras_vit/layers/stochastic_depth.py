"""Stochastic depth: drops a whole residual branch per sample."""

import keras
from keras import ops


@keras.saving.register_keras_serializable(package="keras_vit")
class StochasticDepth(keras.layers.Layer):
    """Drops a residual branch for randomly chosen samples ("drop path").

    In training, each sample's branch output is zeroed with probability
    `rate` and the kept ones are scaled by `1 / (1 - rate)`; at inference
    it is the identity (Huang et al. 2016, as used by DeiT and AugReg).

    Args:
        rate: float in `[0, 1)`, the probability of dropping a sample's branch.
        seed: int, seed of the random draws.
        **kwargs: base layer keyword arguments, e.g. `name` and `dtype`.

    Call arguments:
        inputs: the residual branch's output, `(batch, ...)`.
        training: bool, whether to drop.

    Returns:
        A tensor of the shape of `inputs`.

    Example:

    >>> layer = StochasticDepth(rate=0.5, seed=0)
    >>> out = layer(keras.ops.ones((1000, 4, 8)), training=True)
    >>> kept = keras.ops.convert_to_numpy(out)[:, 0, 0] > 0
    >>> bool(0.4 < kept.mean() < 0.6)
    True
    """

    def __init__(self, rate, seed=None, **kwargs):
        super().__init__(**kwargs)
        if not 0 <= rate < 1:
            raise ValueError(f"`rate` must be in [0, 1). Received: rate={rate!r}")
        self.rate = rate
        self.seed = seed
        self.seed_generator = keras.random.SeedGenerator(seed)
        # Nothing to build (as Keras' Dropout): `model.quantize()` refuses a
        # model with a layer not built, and a block traced symbolically never
        # calls this one.
        self.built = True

    def call(self, inputs, training=None):
        if not training or self.rate == 0:
            return inputs
        noise_shape = (ops.shape(inputs)[0],) + (1,) * (len(inputs.shape) - 1)
        return keras.random.dropout(
            inputs, self.rate, noise_shape=noise_shape, seed=self.seed_generator
        )

    def compute_output_shape(self, input_shape):
        return tuple(input_shape)

    def get_config(self):
        config = super().get_config()
        config.update({"rate": self.rate, "seed": self.seed})
        return config
