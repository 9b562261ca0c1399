"""PatchDropout: trains on a random subset of the patch tokens."""

import math

import keras
from keras import ops

from keras_vit import _options
from keras_vit.layers.select_tokens import check_num_prefix_tokens


def check_rate(rate, name="rate"):
    """Refuses a dropped share that is not a number in `[0, 1)`, naming `name`."""
    if isinstance(rate, bool) or not isinstance(rate, (int, float)) or not 0 <= rate < 1:
        raise ValueError(
            f"{_options.name(name)} must be a float in [0, 1). "
            f"Received: {_options.given(name, rate)}"
        )
    return float(rate)


def kept_patch_count(num_patches, rate):
    """How many of `num_patches` patch tokens a training step keeps at `rate`."""
    return max(1, math.ceil((1.0 - rate) * num_patches))


@keras.saving.register_keras_serializable(package="keras_vit")
class PatchDropout(keras.layers.Layer):
    """Keeps a random subset of each image's patch tokens in training.

    PatchDropout (Liu et al. 2022; FLIP, Li et al. 2023; timm's
    `patch_drop_rate`): after the position embeddings are added, every
    image keeps `ceil((1 - rate) * num_patches)` of its patch tokens, drawn
    at random, and the Transformer blocks see only those. A block's cost
    falls with the token count, so training steps get cheaper; the model
    learns from partial views, a regularisation. The prefix tokens (class,
    distillation, register) are always kept, in front. At inference the
    layer is the identity: every token is seen.

    Args:
        rate: float in `[0, 1)`, the share of the patch tokens dropped.
        num_prefix_tokens: int >= 0, the number of leading non-patch
            tokens, always kept.
        seed: int or `None`, seed of the random draws.
        **kwargs: base layer keyword arguments, e.g. `name` and `dtype`.

    Call arguments:
        inputs: tokens `(batch, num_prefix_tokens + num_patches, dim)`.
        training: bool, whether to drop.

    Returns:
        Tokens `(batch, num_prefix_tokens + kept, dim)` in training (the
        kept patches in their original order), `inputs` otherwise.

    Example:

    >>> tokens = keras.ops.ones((2, 1 + 16, 8))
    >>> layer = PatchDropout(rate=0.5, num_prefix_tokens=1, seed=0)
    >>> tuple(layer(tokens, training=True).shape)
    (2, 9, 8)
    >>> tuple(layer(tokens).shape)
    (2, 17, 8)
    """

    def __init__(self, rate, num_prefix_tokens=1, seed=None, **kwargs):
        super().__init__(**kwargs)
        rate = check_rate(rate)
        check_num_prefix_tokens(num_prefix_tokens)
        self.rate = rate
        self.num_prefix_tokens = num_prefix_tokens
        self.seed = seed
        self.seed_generator = keras.random.SeedGenerator(seed)

    def call(self, inputs, training=None):
        num_patches = inputs.shape[1]
        if num_patches is None:
            raise ValueError(
                "PatchDropout needs a static token count (a fixed-size model); "
                f"received tokens of shape {inputs.shape}."
            )
        num_patches -= self.num_prefix_tokens
        keep = kept_patch_count(num_patches, self.rate)
        if not training or keep == num_patches:
            return inputs
        noise = keras.random.uniform((ops.shape(inputs)[0], num_patches), seed=self.seed_generator)
        # The `keep` smallest draws of each row, back in token order (a
        # sorted gather keeps neighbouring patches neighbours in memory).
        indices = ops.sort(ops.argsort(noise, axis=-1)[:, :keep], axis=-1)
        prefix = inputs[:, : self.num_prefix_tokens]
        patches = ops.take_along_axis(
            inputs[:, self.num_prefix_tokens :], ops.expand_dims(indices, -1), axis=1
        )
        if self.num_prefix_tokens:
            return ops.concatenate([prefix, patches], axis=1)
        return patches

    def compute_output_shape(self, input_shape):
        # Inference keeps every token; the functional graph is built for it.
        return tuple(input_shape)

    def get_config(self):
        config = super().get_config()
        config.update(
            {"rate": self.rate, "num_prefix_tokens": self.num_prefix_tokens, "seed": self.seed}
        )
        return config
