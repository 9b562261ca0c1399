"""Corrupts chosen patch embeddings: the input side of masked patch prediction."""

import keras
from keras import ops


@keras.saving.register_keras_serializable(package="keras_vit")
class PatchCorruption(keras.layers.Layer):
    """Replaces chosen patch embeddings by a learned `[mask]` embedding or others.

    The paper's masked patch prediction (Dosovitskiy et al. 2020, §4.6 and
    Appendix B.1.2) corrupts patch *embeddings* as BERT corrupts words:
    of the chosen patches, most become a learned `[mask]` embedding, some
    the embedding of another patch, some stay as they are. Which patch gets
    what is decided outside the model (by the data pipeline, see
    `keras_vit.pretraining.MaskedPatchPrediction`), so that the model is a
    plain functional model that `model.fit` trains on every backend; this
    layer only applies the decision.

    Args:
        initializer: initializer of the `[mask]` embedding. Defaults to
            a normal distribution of standard deviation 0.02 (BERT's).
        **kwargs: base layer keyword arguments, e.g. `name` and `dtype`.

    Call arguments:
        inputs: a list `[tokens, mask, source]`: patch embeddings
            `(batch, num_patches, hidden_dim)`; `mask`, 1 where the
            embedding becomes `[mask]` and 0 elsewhere, `(batch,
            num_patches)`; `source`, int `(batch, num_patches)`, the patch
            whose embedding goes to each position before masking (a
            position's own index leaves it unchanged).

    Returns:
        Tokens of the shape of `tokens`.

    Example:

    >>> layer = PatchCorruption(initializer="ones")
    >>> tokens = keras.ops.reshape(keras.ops.arange(6.0), (1, 3, 2))
    >>> mask = keras.ops.convert_to_tensor([[0, 1, 0]])
    >>> source = keras.ops.convert_to_tensor([[0, 1, 0]])
    >>> keras.ops.convert_to_numpy(layer([tokens, mask, source])).tolist()
    [[[0.0, 1.0], [1.0, 1.0], [0.0, 1.0]]]
    """

    def __init__(self, initializer=None, **kwargs):
        super().__init__(**kwargs)
        self.initializer = keras.initializers.get(
            initializer or keras.initializers.TruncatedNormal(stddev=0.02)
        )

    def build(self, input_shape):
        tokens_shape = input_shape[0]
        if len(tokens_shape) != 3 or tokens_shape[-1] is None:
            raise ValueError(
                "PatchCorruption expects tokens of shape (batch, num_patches, "
                f"hidden_dim) with a known hidden_dim. Received: input_shape={input_shape}"
            )
        for name, shape in zip(("mask", "source"), input_shape[1:]):
            if tuple(shape[1:]) != tuple(tokens_shape[1:2]):
                raise ValueError(
                    f"`{name}` must have shape (batch, {tokens_shape[1]}), one "
                    f"entry per patch. Received: {name} shape {tuple(shape)}"
                )
        self.mask_token = self.add_weight(
            name="mask_token", shape=(tokens_shape[-1],), initializer=self.initializer
        )

    def call(self, inputs):
        tokens, mask, source = inputs
        source = ops.cast(source, "int32")
        tokens = ops.take_along_axis(tokens, source[..., None], axis=1)
        mask = ops.cast(mask, tokens.dtype)[..., None]
        mask_token = ops.cast(self.mask_token, tokens.dtype)
        return tokens * (1 - mask) + mask_token * mask

    def compute_output_shape(self, input_shape):
        return tuple(input_shape[0])

    def get_config(self):
        config = super().get_config()
        config["initializer"] = keras.initializers.serialize(self.initializer)
        return config
