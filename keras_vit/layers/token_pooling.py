"""Reduces a token sequence to one vector per image."""

import keras
from keras import ops

POOLING_MODES = ("token", "gap", "max", "token_gap")


@keras.saving.register_keras_serializable(package="keras_vit")
class TokenPooling(keras.layers.Layer):
    """Pools the encoder's tokens into the image representation.

    `mode="token"` takes the class token (the first token), as the paper's
    classifier does. `mode="gap"` averages the patch tokens (the tokens
    after the `num_prefix_tokens` prefix tokens), the paper's global average
    pooling alternative. `mode="max"` takes the largest value of each
    feature over the patch tokens (keras.applications' `pooling="max"`).
    `mode="token_gap"` concatenates the class token and the average, as the
    DINOv2 classifiers do (output width `2 * hidden_dim`).

    Args:
        mode: `"token"`, `"gap"`, `"max"` or `"token_gap"`.
        num_prefix_tokens: int, the number of leading non-patch tokens
            (class, distillation and register tokens). Defaults to 1.
        token_index: int, the token that `"token"` takes: 0 for the class
            token, 1 for DeiT's distillation token. Defaults to 0.
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
    >>> keras.ops.convert_to_numpy(TokenPooling("max")(tokens)).tolist()
    [[8.0, 9.0, 10.0, 11.0]]
    """

    def __init__(self, mode="token", num_prefix_tokens=1, token_index=0, **kwargs):
        super().__init__(**kwargs)
        if mode not in POOLING_MODES:
            raise ValueError(f"`mode` must be one of {POOLING_MODES}. Received: mode={mode!r}")
        if mode in ("token", "token_gap") and not 0 <= token_index < num_prefix_tokens:
            raise ValueError(
                f"mode={mode!r} takes prefix token {token_index}, which needs "
                f"num_prefix_tokens > {token_index}. Received: "
                f"num_prefix_tokens={num_prefix_tokens!r}, token_index={token_index!r}"
            )
        self.mode = mode
        self.num_prefix_tokens = num_prefix_tokens
        self.token_index = token_index

    def _token(self, inputs):
        # A slice kept 3-D and then reshaped: TFLite's XNNPACK delegate does
        # not take strided slices that drop an axis, and a squeeze needs the
        # slice's length, which TensorFlow leaves unknown when the token
        # count is (a model of run-time resolution).
        index = self.token_index
        return ops.reshape(inputs[:, index : index + 1], (-1, inputs.shape[-1]))

    def call(self, inputs):
        if self.mode == "token":
            return self._token(inputs)
        if self.mode == "max":
            return ops.max(inputs[:, self.num_prefix_tokens :], axis=1)
        average = ops.mean(inputs[:, self.num_prefix_tokens :], axis=1)
        if self.mode == "gap":
            return average
        return ops.concatenate([self._token(inputs), average], axis=-1)

    def compute_output_shape(self, input_shape):
        width = input_shape[-1]
        if self.mode == "token_gap" and width is not None:
            width *= 2
        return (input_shape[0], width)

    def get_config(self):
        config = super().get_config()
        config.update(
            {
                "mode": self.mode,
                "num_prefix_tokens": self.num_prefix_tokens,
                "token_index": self.token_index,
            }
        )
        return config
