"""Puts kept tokens back in place and a learned mask token everywhere else."""

import keras
from keras import ops

from keras_vit.layers.select_tokens import check_num_prefix_tokens


@keras.saving.register_keras_serializable(package="keras_vit")
class RestoreMaskedTokens(keras.layers.Layer):
    """Rebuilds the full patch sequence from the tokens of the kept patches.

    MAE's decoder input (He et al. 2021): the encoder's outputs for the
    kept patches, followed by one learned `[mask]` token per dropped patch,
    are put back in image order with `restore` indices (the inverse of the
    permutation whose first entries chose the kept patches). Prefix tokens
    (class, registers) stay in front.

    Args:
        num_prefix_tokens: int >= 0, the number of leading non-patch tokens.
        initializer: initializer of the mask token. Defaults to a normal
            distribution of standard deviation 0.02 (MAE's).
        **kwargs: base layer keyword arguments, e.g. `name` and `dtype`.

    Call arguments:
        inputs: a list `[tokens, restore]`: tokens `(batch,
            num_prefix_tokens + num_kept, dim)` and int `restore`
            `(batch, num_patches)`: for each patch of the image, its place
            in the sequence "kept patches, then dropped ones".

    Returns:
        Tokens `(batch, num_prefix_tokens + num_patches, dim)`.

    Example:

    >>> layer = RestoreMaskedTokens(num_prefix_tokens=0, initializer="zeros")
    >>> kept = keras.ops.convert_to_tensor([[[5.0], [7.0]]])  # patches 2 and 0
    >>> restore = keras.ops.convert_to_tensor([[1, 2, 0]])
    >>> keras.ops.convert_to_numpy(layer([kept, restore]))[..., 0].tolist()
    [[7.0, 0.0, 5.0]]
    """

    def __init__(self, num_prefix_tokens=1, initializer=None, **kwargs):
        super().__init__(**kwargs)
        check_num_prefix_tokens(num_prefix_tokens)
        self.num_prefix_tokens = num_prefix_tokens
        self.initializer = keras.initializers.get(
            initializer or keras.initializers.TruncatedNormal(stddev=0.02)
        )

    def build(self, input_shape):
        tokens_shape, restore_shape = input_shape
        if len(tokens_shape) != 3 or tokens_shape[-1] is None:
            raise ValueError(
                "RestoreMaskedTokens expects tokens of shape (batch, num_tokens, "
                f"dim) with a known dim. Received: input_shape={input_shape}"
            )
        kept = tokens_shape[1] - self.num_prefix_tokens
        if restore_shape[1] is None or kept > restore_shape[1]:
            raise ValueError(
                f"`restore` must have one entry per patch, at least the {kept} "
                f"kept ones. Received: restore shape {tuple(restore_shape)}"
            )
        self.mask_token = self.add_weight(
            name="mask_token", shape=(tokens_shape[-1],), initializer=self.initializer
        )

    def call(self, inputs):
        tokens, restore = inputs
        prefix = tokens[:, : self.num_prefix_tokens]
        kept = tokens[:, self.num_prefix_tokens :]
        num_patches = restore.shape[1]
        masks = ops.broadcast_to(
            ops.cast(self.mask_token, tokens.dtype),
            (ops.shape(tokens)[0], num_patches - kept.shape[1], tokens.shape[-1]),
        )
        patches = ops.concatenate([kept, masks], axis=1)
        patches = ops.take_along_axis(patches, ops.cast(restore, "int32")[..., None], axis=1)
        return ops.concatenate([prefix, patches], axis=1) if self.num_prefix_tokens else patches

    def compute_output_shape(self, input_shape):
        tokens_shape, restore_shape = input_shape
        return (tokens_shape[0], self.num_prefix_tokens + restore_shape[1], tokens_shape[2])

    def get_config(self):
        config = super().get_config()
        config.update(
            {
                "num_prefix_tokens": self.num_prefix_tokens,
                "initializer": keras.initializers.serialize(self.initializer),
            }
        )
        return config
