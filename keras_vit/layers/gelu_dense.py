"""GELU as a serializable activation, and the MLP's Dense + GELU layer.

Both compute through `keras_vit.ops.gelu` (a backward pass that keeps only
the pre-activation; `keras.ops.gelu` with the fast kernels switched off).
"""

import keras

from keras_vit.ops.gelu import gelu


@keras.saving.register_keras_serializable(package="keras_vit")
def gelu_approximate(x):
    """GELU in its tanh approximation (original ViT checkpoints)."""
    return gelu(x, approximate=True)


@keras.saving.register_keras_serializable(package="keras_vit")
def gelu_exact(x):
    """GELU with the exact erf (Hugging Face ViT, DINOv2)."""
    return gelu(x, approximate=False)


@keras.saving.register_keras_serializable(package="keras_vit")
class GeluDense(keras.layers.Dense):
    """`keras.layers.Dense` followed by `gelu`, which is told `training`.

    The MLP's first layer. GELU runs inside this layer's `call` rather than
    after it: TensorFlow's oneDNN remapper fuses the matmul, bias and GELU
    into one kernel at inference only when they sit in one layer (a GELU
    applied to the output of a nested `Dense` stayed eight element-wise
    passes), and `training` picks GELU's kernels (see `gelu`).

    Args:
        units: int, the output width.
        approximate: bool, the tanh approximation of GELU (`True`) or the
            exact erf form (`False`).
        **kwargs: the other arguments of `keras.layers.Dense` (not
            `activation`), e.g. `kernel_initializer` and `name`.

    Example:
    >>> layer = GeluDense(8, approximate=False)
    >>> tuple(layer(keras.ops.ones((2, 4))).shape)
    (2, 8)
    """

    def __init__(self, units, approximate=True, **kwargs):
        if "activation" in kwargs:
            raise TypeError(
                "GeluDense applies GELU itself and takes no `activation`. "
                f"Received: activation={kwargs['activation']!r}"
            )
        super().__init__(units, **kwargs)
        self.approximate = approximate

    def call(self, inputs, training=None):
        return gelu(super().call(inputs), self.approximate, training=bool(training))

    def quantize(self, mode=None, type_check=True, config=None):
        # Keras' Dense refuses to quantize subclasses, whose `call` it cannot
        # vouch for; this one is Dense's, then GELU (see `quantized_call`).
        super().quantize(mode, type_check=False, config=config)

    def quantized_call(self, inputs, training=None):
        # After `quantize()` Keras calls this instead of `call`.
        outputs = super().quantized_call(inputs, training=training)
        return gelu(outputs, self.approximate, training=bool(training))

    def get_config(self):
        config = super().get_config()
        del config["activation"]
        config["approximate"] = self.approximate
        return config
