"""Keeps the prefix tokens and a chosen subset (or none) of the patch tokens."""

import keras
from keras import ops


def check_num_prefix_tokens(num_prefix_tokens):
    """Refuses a prefix-token count that is not an int >= 0, naming the value."""
    if not isinstance(num_prefix_tokens, int) or num_prefix_tokens < 0:
        raise ValueError(
            "`num_prefix_tokens` must be an int >= 0. Received: "
            f"num_prefix_tokens={num_prefix_tokens!r}"
        )


@keras.saving.register_keras_serializable(package="keras_vit")
class SelectTokens(keras.layers.Layer):
    """Gathers chosen patch tokens, after the prefix tokens (or without them).

    MAE's encoder (He et al. 2021) sees only the patches that are not
    masked: this layer takes, for every image, the patch tokens at the
    given indices (their position embeddings already added), keeping the
    class and other prefix tokens in front. Without indices it drops the
    prefix and keeps every patch, as prediction heads over patches need.

    Args:
        num_prefix_tokens: int >= 0, the number of leading non-patch tokens.
        keep_prefix: bool, whether the output starts with the prefix tokens.
        **kwargs: base layer keyword arguments, e.g. `name` and `dtype`.

    Call arguments:
        inputs: tokens `(batch, num_prefix_tokens + num_patches, dim)`, or
            a list `[tokens, indices]` with int `indices` `(batch, count)`,
            the patches to keep (0 is the first patch after the prefix).

    Returns:
        Tokens `(batch, [num_prefix_tokens +] count, dim)`; `count` is
        `num_patches` without indices.

    Example:

    >>> tokens = keras.ops.reshape(keras.ops.arange(8.0), (1, 4, 2))
    >>> indices = keras.ops.convert_to_tensor([[2, 0]])
    >>> out = SelectTokens(num_prefix_tokens=1)([tokens, indices])
    >>> keras.ops.convert_to_numpy(out).tolist()
    [[[0.0, 1.0], [6.0, 7.0], [2.0, 3.0]]]
    >>> tuple(SelectTokens(1, keep_prefix=False)(tokens).shape)
    (1, 3, 2)
    """

    def __init__(self, num_prefix_tokens=1, keep_prefix=True, **kwargs):
        super().__init__(**kwargs)
        check_num_prefix_tokens(num_prefix_tokens)
        self.num_prefix_tokens = num_prefix_tokens
        self.keep_prefix = bool(keep_prefix)

    def call(self, inputs):
        tokens, indices = inputs if isinstance(inputs, (list, tuple)) else (inputs, None)
        prefix = tokens[:, : self.num_prefix_tokens]
        patches = tokens[:, self.num_prefix_tokens :]
        if indices is not None:
            indices = ops.cast(indices, "int32")[..., None]
            patches = ops.take_along_axis(patches, indices, axis=1)
        if self.keep_prefix and self.num_prefix_tokens:
            return ops.concatenate([prefix, patches], axis=1)
        return patches

    def compute_output_shape(self, input_shape):
        if isinstance(input_shape, (list, tuple)) and isinstance(input_shape[0], (list, tuple)):
            tokens_shape, indices_shape = input_shape
            count = indices_shape[1]
        else:
            tokens_shape = input_shape
            count = None if tokens_shape[1] is None else tokens_shape[1] - self.num_prefix_tokens
        if self.keep_prefix and count is not None:
            count += self.num_prefix_tokens
        return (tokens_shape[0], count, tokens_shape[2])

    def get_config(self):
        config = super().get_config()
        config.update(
            {"num_prefix_tokens": self.num_prefix_tokens, "keep_prefix": self.keep_prefix}
        )
        return config
