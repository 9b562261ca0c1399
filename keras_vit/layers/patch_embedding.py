"""Linear projection of non-overlapping image patches."""

import keras
from keras import ops

from keras_vit.layers import fake_quantization


def _pair(value, name):
    """`16` -> `(16, 16)`; `(14, 16)` stays; anything else is an error."""
    pair = (value, value) if isinstance(value, int) else value
    if (
        not isinstance(pair, (tuple, list))
        or len(pair) != 2
        or not all(isinstance(v, int) and not isinstance(v, bool) for v in pair)
        or min(pair) < 1
    ):
        raise ValueError(
            f"`{name}` must be a positive int or a pair of positive ints. "
            f"Received: {name}={value!r}"
        )
    return tuple(pair)


def patch_grid(image_size, patch_size, pad_to_patches=False):
    """The patch grid `(rows, cols)` of an image, or a clear error.

    Args:
        image_size: `(height, width)` of the image.
        patch_size: int or `(height, width)` of one patch.
        pad_to_patches: bool, whether the image is padded on the right and
            bottom to whole patches (the grid rounds up) rather than required
            to be a multiple of the patch size.

    Returns:
        `(height // patch_height, width // patch_width)`, rounded up with
        `pad_to_patches`.

    Raises:
        ValueError: when a side is not divisible by the patch size and
            `pad_to_patches` is False.
    """
    patch_size = _pair(patch_size, "patch_size")
    for side, size, patch in zip(("height", "width"), image_size, patch_size):
        if size is not None and size % patch and not pad_to_patches:
            raise ValueError(
                f"image {side} {size} is not divisible by patch size {patch} (pad_to_patches=True "
                f"pads it to whole patches). Received: image_size={tuple(image_size)}, "
                f"patch_size={patch_size}"
            )
    return tuple(
        None if size is None else -(-size // patch) for size, patch in zip(image_size, patch_size)
    )


def _checked_multiple(images, size, patch_size):
    """`images`, failing at run time unless their sides are multiples of the patch.

    Only TensorFlow graphs trace with sides unknown (JAX and PyTorch see
    every shape), so the check is TensorFlow's assertion op, which names the
    size received.
    """
    import tensorflow as tf

    height, width = size
    fits = tf.logical_and(tf.equal(height % patch_size[0], 0), tf.equal(width % patch_size[1], 0))
    check = tf.debugging.Assert(
        fits,
        [
            f"image height and width must be multiples of the patch size {patch_size}; "
            "received height, width:",
            height,
            width,
        ],
    )
    with tf.control_dependencies([check]):
        return tf.identity(images)


@keras.saving.register_keras_serializable(package="keras_vit")
class PatchEmbedding(keras.layers.Layer):
    """Cuts an image into `P×P` patches and projects each one linearly.

    This is the "linear projection of flattened patches" of ViT, computed as
    a convolution whose kernel size and stride are both the patch size. The
    kernel is stored in HWIO layout `(P, P, channels, hidden_dim)`, the layout
    of the official checkpoints' `embedding/kernel`, so they copy straight in.
    The patch grid is flattened row by row into a token sequence (or kept
    as a grid with `flatten=False`).

    Images of a size known only at run time (a model with
    `input_shape=(None, None, C)`) are checked when they arrive: a side
    that is not a multiple of the patch size is an error naming both,
    where a strided convolution would silently drop the remainder. With
    `pad_to_patches=True` such images are padded with zeros on the right
    and bottom to whole patches instead (timm's `dynamic_img_pad`).

    Args:
        patch_size: int or `(height, width)`, the size of one patch.
        hidden_dim: int, the width `D` of each token.
        use_bias: bool, whether the projection has a bias. Defaults to `True`.
        kernel_initializer: initializer of the kernel. Defaults to
            `"lecun_normal"`, as in the reference implementation.
        bias_initializer: initializer of the bias. Defaults to `"zeros"`.
        flatten: bool, whether to return a token sequence (`True`) or the
            patch grid `(batch, rows, cols, hidden_dim)` (`False`).
            Defaults to `True`.
        pad_to_patches: bool, whether images of sides that are not multiples
            of the patch size are zero-padded on the right and bottom to
            whole patches (`True`) or refused (`False`, the default).
        qat: `None`, `"int8"` or `"int8_full"`: the LiteRT mode that training
            simulates (`layers.fake_quantization`): the kernel rounded per
            output channel, the images and the outputs per tensor.
        round_outputs: bool, whether a `qat` layer rounds its outputs
            (`False` where the layer after rounds them: LiteRT then computes
            the convolution straight into that point's int8 range).
        **kwargs: base layer keyword arguments, e.g. `name` and `dtype`.

    Call arguments:
        inputs: images of shape `(batch, height, width, channels)`, whose
            height and width are multiples of the patch size.

    Returns:
        Tokens of shape `(batch, (height // P) * (width // P), hidden_dim)`,
        or `(batch, height // P, width // P, hidden_dim)` with
        `flatten=False`.

    Example:

    >>> layer = PatchEmbedding(patch_size=16, hidden_dim=64)
    >>> tuple(layer(keras.ops.ones((2, 32, 48, 3))).shape)
    (2, 6, 64)
    >>> padded = PatchEmbedding(patch_size=16, hidden_dim=64, pad_to_patches=True)
    >>> tuple(padded(keras.ops.ones((2, 30, 40, 3))).shape)
    (2, 6, 64)
    """

    def __init__(
        self,
        patch_size,
        hidden_dim,
        use_bias=True,
        kernel_initializer="lecun_normal",
        bias_initializer="zeros",
        flatten=True,
        pad_to_patches=False,
        qat=None,
        round_outputs=True,
        **kwargs,
    ):
        super().__init__(**kwargs)
        self.qat = fake_quantization.check_qat(qat)
        self.round_outputs = bool(round_outputs)
        self.patch_size = _pair(patch_size, "patch_size")
        if not isinstance(hidden_dim, int) or hidden_dim < 1:
            raise ValueError(
                f"`hidden_dim` must be a positive int. Received: hidden_dim={hidden_dim!r}"
            )
        self.hidden_dim = hidden_dim
        self.use_bias = use_bias
        self.flatten = flatten
        self.pad_to_patches = bool(pad_to_patches)
        self.kernel_initializer = keras.initializers.get(kernel_initializer)
        self.bias_initializer = keras.initializers.get(bias_initializer)

    def build(self, input_shape):
        if len(input_shape) != 4:
            raise ValueError(
                "PatchEmbedding expects images of shape "
                "(batch, height, width, channels). "
                f"Received: input_shape={tuple(input_shape)}"
            )
        channels = input_shape[-1]
        if channels is None:
            raise ValueError(
                "The channel axis of the images must be known. "
                f"Received: input_shape={tuple(input_shape)}"
            )
        patch_grid(input_shape[1:3], self.patch_size, self.pad_to_patches)
        self.input_spec = keras.InputSpec(ndim=4, axes={-1: channels})
        self.kernel = self.add_weight(
            name="kernel",
            shape=(*self.patch_size, channels, self.hidden_dim),
            initializer=self.kernel_initializer,
        )
        self.bias = (
            self.add_weight(
                name="bias",
                shape=(self.hidden_dim,),
                initializer=self.bias_initializer,
            )
            if self.use_bias
            else None
        )
        points = {"inputs": "activations"}
        if self.round_outputs:
            points["outputs"] = "dense_outputs"
        self.quantizers = fake_quantization.quantizers(self.qat, points)

    def call(self, inputs, training=None):
        size = tuple(ops.shape(inputs)[1:3])
        if self.pad_to_patches:
            # Sides known or not (a TensorFlow graph of any size), the same op.
            padding = [
                (0, 0 if side is None else (-side) % patch)
                for side, patch in zip(size, self.patch_size)
            ]
            inputs = ops.pad(inputs, [(0, 0), *padding, (0, 0)])
        elif all(isinstance(side, int) for side in size):
            patch_grid(size, self.patch_size)
        elif None not in size and keras.backend.backend() == "tensorflow":
            # A TensorFlow graph for images of any size. (A PyTorch trace, for
            # ONNX, sees its sides as tensors too: TensorFlow's check would
            # turn its images into a constant.)
            inputs = _checked_multiple(inputs, size, self.patch_size)
        kernel = self.kernel
        if self.quantizers:
            inputs = fake_quantization.at_point(self.quantizers, "inputs", inputs, training)
            if fake_quantization.rounds(self.quantizers):
                kernel = fake_quantization.fake_quantized_kernel(kernel, (0, 1, 2))
        x = ops.conv(
            inputs,
            kernel,
            strides=self.patch_size,
            padding="valid",
            data_format="channels_last",  # whatever the global image format
        )
        if self.bias is not None:
            x = x + self.bias
        x = fake_quantization.at_point(self.quantizers, "outputs", x, training)
        if not self.flatten:
            return x
        return ops.reshape(x, (ops.shape(x)[0], -1, self.hidden_dim))

    def compute_output_shape(self, input_shape):
        rows, cols = patch_grid(input_shape[1:3], self.patch_size, self.pad_to_patches)
        if not self.flatten:
            return (input_shape[0], rows, cols, self.hidden_dim)
        tokens = None if rows is None or cols is None else rows * cols
        return (input_shape[0], tokens, self.hidden_dim)

    def get_config(self):
        config = super().get_config()
        config.update(
            {
                "patch_size": self.patch_size,
                "hidden_dim": self.hidden_dim,
                "use_bias": self.use_bias,
                "kernel_initializer": keras.initializers.serialize(self.kernel_initializer),
                "bias_initializer": keras.initializers.serialize(self.bias_initializer),
                "flatten": self.flatten,
                "pad_to_patches": self.pad_to_patches,
                "qat": self.qat,
                "round_outputs": self.round_outputs,
            }
        )
        return config
