"""Learnable tokens inserted into a token sequence after its leading tokens."""

import keras
from keras import ops


@keras.saving.register_keras_serializable(package="keras_vit")
class RegisterTokens(keras.layers.Layer):
    """Inserts `num_tokens` learnable register tokens after the first `index` tokens.

    Registers (Darcet et al. 2023, "Vision Transformers Need Registers", as
    in DINOv2 with registers) are extra tokens without a position
    embedding: they are inserted after the position embeddings are added,
    between the class token and the patches, and the encoder's output for
    them is discarded. They give the model scratch space, which removes the
    high-norm artefact tokens in its attention maps.

    Args:
        num_tokens: int >= 1, the number of register tokens.
        index: int >= 0, the number of leading tokens (class token,
            distillation token) that stay before the registers. Defaults to 1.
        initializer: initializer of the tokens. Defaults to `"zeros"`, as in
            the reference implementation.
        **kwargs: base layer keyword arguments, e.g. `name` and `dtype`.

    Call arguments:
        inputs: tokens of shape `(batch, num_tokens_in, hidden_dim)`.

    Returns:
        Tokens of shape `(batch, num_tokens_in + num_tokens, hidden_dim)`.

    Example:

    >>> layer = RegisterTokens(4)
    >>> tuple(layer(keras.ops.ones((2, 197, 64))).shape)
    (2, 201, 64)
    """

    def __init__(self, num_tokens, index=1, initializer="zeros", **kwargs):
        super().__init__(**kwargs)
        if not isinstance(num_tokens, int) or num_tokens < 1:
            raise ValueError(
                f"`num_tokens` must be a positive int. Received: num_tokens={num_tokens!r}"
            )
        if not isinstance(index, int) or index < 0:
            raise ValueError(f"`index` must be an int >= 0. Received: index={index!r}")
        self.num_tokens = num_tokens
        self.index = index
        self.initializer = keras.initializers.get(initializer)

    def build(self, input_shape):
        if len(input_shape) != 3 or input_shape[-1] is None:
            raise ValueError(
                "RegisterTokens expects tokens of shape "
                "(batch, num_tokens, hidden_dim) with a known hidden_dim. "
                f"Received: input_shape={tuple(input_shape)}"
            )
        if input_shape[1] is not None and input_shape[1] < self.index:
            raise ValueError(
                f"Cannot insert registers after {self.index} tokens into a "
                f"sequence of {input_shape[1]}."
            )
        self.tokens = self.add_weight(
            name="tokens",
            shape=(1, self.num_tokens, input_shape[-1]),
            initializer=self.initializer,
        )

    def call(self, inputs):
        batch_size = ops.shape(inputs)[0]
        tokens = ops.cast(self.tokens, inputs.dtype)
        tokens = ops.broadcast_to(tokens, (batch_size, self.num_tokens, inputs.shape[-1]))
        return ops.concatenate([inputs[:, : self.index], tokens, inputs[:, self.index :]], axis=1)

    def compute_output_shape(self, input_shape):
        tokens = None if input_shape[1] is None else input_shape[1] + self.num_tokens
        return (input_shape[0], tokens, input_shape[2])

    def get_config(self):
        config = super().get_config()
        config.update(
            {
                "num_tokens": self.num_tokens,
                "index": self.index,
                "initializer": keras.initializers.serialize(self.initializer),
            }
        )
        return config
