"""A learnable token prepended to a token sequence."""

import keras
from keras import ops


@keras.saving.register_keras_serializable(package="keras_vit")
class ClassToken(keras.layers.Layer):
    """Prepends a learnable class token (`[class]`) to a token sequence.

    The token's output after the encoder is the image representation that
    the classification head reads (`pooling="token"`). It is initialised to
    zeros, as in the reference implementation.

    Args:
        initializer: initializer of the token. Defaults to `"zeros"`.
        **kwargs: base layer keyword arguments, e.g. `name` and `dtype`.

    Call arguments:
        inputs: tokens of shape `(batch, num_tokens, hidden_dim)`.

    Returns:
        Tokens of shape `(batch, num_tokens + 1, hidden_dim)`, the class
        token first.

    Example:

    >>> layer = ClassToken()
    >>> tuple(layer(keras.ops.ones((2, 196, 64))).shape)
    (2, 197, 64)
    """

    def __init__(self, initializer="zeros", **kwargs):
        super().__init__(**kwargs)
        self.initializer = keras.initializers.get(initializer)

    def build(self, input_shape):
        if len(input_shape) != 3 or input_shape[-1] is None:
            raise ValueError(
                "ClassToken expects tokens of shape "
                "(batch, num_tokens, hidden_dim) with a known hidden_dim. "
                f"Received: input_shape={tuple(input_shape)}"
            )
        self.token = self.add_weight(
            name="token",
            shape=(1, 1, input_shape[-1]),
            initializer=self.initializer,
        )

    def call(self, inputs):
        batch_size = ops.shape(inputs)[0]
        token = ops.cast(self.token, inputs.dtype)
        token = ops.broadcast_to(token, (batch_size, 1, inputs.shape[-1]))
        return ops.concatenate([token, inputs], axis=1)

    def compute_output_shape(self, input_shape):
        tokens = None if input_shape[1] is None else input_shape[1] + 1
        return (input_shape[0], tokens, input_shape[2])

    def get_config(self):
        config = super().get_config()
        config["initializer"] = keras.initializers.serialize(self.initializer)
        return config
