"""Reduces a token sequence to one vector per image."""

import keras
from keras import ops

POOLING_MODES = ("token", "gap")


@keras.saving.register_keras_serializable(package="keras_vit")
class TokenPooling(keras.layers.Layer):
    """Pools the encoder's tokens into the image representation.

    `mode="token"` takes the class token (the first token), as the paper's
    classifier does. `mode="gap"` averages the patch tokens (the tokens
    after the `num_prefix_tokens` prefix tokens), the paper's global average
    pooling alternative.

    Args:
        mode: `"token"` or `"gap"`.
        num_prefix_tokens: int, the number of leading non-patch tokens
            (1 with a class token). Defaults to 1.
        **kwargs: base layer keyword arguments, e.g. `name` and `dtype`.

    Call arguments:
        inputs: tokens of shape `(batch, num_tokens, hidden_dim)`.

    Returns:
        A tensor of shape `(batch, hidden_dim)`.

    Example:

    >>> tokens = keras.ops.reshape(keras.ops.arange(12.0), (1, 3, 4))
    >>> keras.ops.convert_to_numpy(TokenPooling("token")(tokens)).tolist()
    [[0.0, 1.0, 2.0, 3.0]]
    >>> keras.ops.convert_to_numpy(TokenPooling("gap")(tokens)).tolist()
    [[6.0, 7.0, 8.0, 9.0]]
    """

    def __init__(self, mode="token", num_prefix_tokens=1, **kwargs):
        super().__init__(**kwargs)
        if mode not in POOLING_MODES:
            raise ValueError(
                f"`mode` must be one of {POOLING_MODES}. Received: mode={mode!r}"
            )
        if mode == "token" and num_prefix_tokens < 1:
            raise ValueError(
                "mode='token' needs a class token (num_prefix_tokens >= 1). "
                f"Received: num_prefix_tokens={num_prefix_tokens!r}"
            )
        self.mode = mode
        self.num_prefix_tokens = num_prefix_tokens

    def call(self, inputs):
        if self.mode == "token":
            return inputs[:, 0]
        return ops.mean(inputs[:, self.num_prefix_tokens :], axis=1)

    def compute_output_shape(self, input_shape):
        return (input_shape[0], input_shape[-1])

    def get_config(self):
        config = super().get_config()
        config.update(
            {"mode": self.mode, "num_prefix_tokens": self.num_prefix_tokens}
        )
        return config
