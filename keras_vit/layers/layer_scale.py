"""Per-channel learnable scaling of a residual branch."""

import keras
from keras import ops


@keras.saving.register_keras_serializable(package="keras_vit")
class LayerScale(keras.layers.Layer):
    """Multiplies each channel by a learnable factor (CaiT's LayerScale).

    Used on the residual branches of DINOv2 and CaiT-style blocks; the
    factors start small so that each block starts close to the identity.

    Args:
        init_value: float, the initial value of every factor.
        **kwargs: base layer keyword arguments, e.g. `name` and `dtype`.

    Call arguments:
        inputs: tensor of shape `(..., channels)`.

    Returns:
        `inputs * gamma`, same shape.

    Example:

    >>> layer = LayerScale(init_value=0.5)
    >>> float(layer(keras.ops.ones((2, 3, 4)))[0, 0, 0])
    0.5
    """

    def __init__(self, init_value, **kwargs):
        super().__init__(**kwargs)
        self.init_value = float(init_value)

    def build(self, input_shape):
        self.gamma = self.add_weight(
            name="gamma",
            shape=(input_shape[-1],),
            initializer=keras.initializers.Constant(self.init_value),
        )

    def call(self, inputs):
        return inputs * ops.cast(self.gamma, inputs.dtype)

    def compute_output_shape(self, input_shape):
        return tuple(input_shape)

    def get_config(self):
        config = super().get_config()
        config["init_value"] = self.init_value
        return config
