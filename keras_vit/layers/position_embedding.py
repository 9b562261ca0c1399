"""Position embeddings: learned 1-D, fixed 2-D sin-cos, and grid resampling."""

import math

import keras
import numpy as np
from keras import ops

from keras_vit.layers.patch_embedding import _pair

POSITION_EMBEDDING_KINDS = ("learned", "sincos2d")
RESAMPLE_METHODS = ("bicubic", "bicubic_antialias", "bilinear")
# timm's and Hugging Face's (PyTorch's `interpolate(mode="bicubic")`): every
# default of a resampling method in the package is this one.
DEFAULT_RESAMPLE_METHOD = "bicubic"


def sincos_2d_position_embeddings(grid_size, hidden_dim, num_prefix_tokens=1):
    """Fixed 2-D sin-cos position embeddings (as in MAE).

    The first half of the channels encodes the column, the second half the
    row, each as `[sin(p * w), cos(p * w)]` with frequencies
    `w_i = 1 / 10000 ** (i / (hidden_dim / 4))`. Prefix tokens (the class
    token) get all-zero embeddings.

    Args:
        grid_size: int or `(rows, cols)` of the patch grid.
        hidden_dim: int, the token width; a multiple of 4.
        num_prefix_tokens: int, the number of tokens before the patches.

    Returns:
        float32 NumPy array of shape
        `(1, num_prefix_tokens + rows * cols, hidden_dim)`.

    Example:

    >>> sincos_2d_position_embeddings((2, 3), 8).shape
    (1, 7, 8)
    """
    rows, cols = _pair(grid_size, "grid_size")
    if hidden_dim % 4:
        raise ValueError(
            "sin-cos position embeddings need a hidden_dim divisible by 4. "
            f"Received: hidden_dim={hidden_dim}"
        )
    quarter = hidden_dim // 4
    omega = 1.0 / 10000.0 ** (np.arange(quarter, dtype=np.float64) / quarter)
    y, x = np.meshgrid(np.arange(rows), np.arange(cols), indexing="ij")
    x = x.reshape(-1, 1) * omega
    y = y.reshape(-1, 1) * omega
    table = np.concatenate([np.sin(x), np.cos(x), np.sin(y), np.cos(y)], axis=1)
    prefix = np.zeros((num_prefix_tokens, hidden_dim))
    return np.concatenate([prefix, table])[None].astype("float32")


def _keys_kernel(xp, distance, a):
    """Keys' cubic convolution kernel at `distance` (any sign)."""
    d = xp.abs(distance)
    near = ((a + 2) * d - (a + 3)) * d * d + 1
    far = ((a * d - 5 * a) * d + 8 * a) * d - 4 * a
    return xp.where(d <= 1, near, xp.where(d < 2, far, 0.0))


def _interpolation_matrix(xp, in_size, out_size, method, align_corners, dtype):
    """The `(out_size, in_size)` matrix that resamples one axis.

    Written once for NumPy (`xp=np`, float64, at load time) and for Keras
    ops (`xp=keras.ops`, inside the graph, where `out_size` may be a
    tensor known only when the model sees an image), so that a model
    resampling at run time computes what load-time resampling computes.

    `"bicubic"` is PyTorch's `interpolate(mode="bicubic")`: Keys' cubic
    with `a=-0.75` over 4 taps, border taps clamped to the edge.
    `"bicubic_antialias"` is the same with `antialias=True`: PIL's
    separable filter, Keys' cubic with `a=-0.5` widened by the downscaling
    factor (so shrinking averages instead of aliasing), taps outside the
    input dropped and the weights renormalised (DINOv2 with registers).
    """
    if xp is np:
        size = np.asarray(out_size, dtype)
    else:
        size = ops.cast(out_size, dtype)
    out = xp.arange(out_size, dtype=dtype)
    sources = xp.arange(in_size, dtype=dtype)
    if method == "bicubic_antialias":
        scale = in_size / size
        support = 2.0 * xp.maximum(scale, 1.0)
        stretch = 1.0 / xp.maximum(scale, 1.0)
        center = xp.expand_dims(scale * (out + 0.5), 1)
        inside = xp.logical_and(
            sources >= xp.floor(center - support + 0.5),
            sources < xp.floor(center + support + 0.5),
        )
        weights = _keys_kernel(xp, (sources - center + 0.5) * stretch, a=-0.5)
        weights = xp.where(inside, weights, 0.0)
        return weights / xp.sum(weights, axis=1, keepdims=True)
    if align_corners:
        scale = xp.where(size > 1, (in_size - 1) / xp.maximum(size - 1, 1.0), 0.0)
        source = out * scale
    else:
        source = (out + 0.5) * (in_size / size) - 0.5
    if method == "bilinear":
        source = xp.maximum(source, 0.0)
    low = xp.expand_dims(xp.floor(source), 1)
    t = xp.expand_dims(source, 1) - low
    if method == "bilinear":
        offsets = np.array([0.0, 1.0], dtype)
        weights = xp.concatenate([1.0 - t, t], axis=1)
    else:
        offsets = np.array([-1.0, 0.0, 1.0, 2.0], dtype)
        weights = _keys_kernel(xp, t - offsets, a=-0.75)
    # Border taps are clamped to the edge, as image resizers do.
    taps = xp.clip(low + offsets, 0.0, in_size - 1.0)
    hits = xp.equal(xp.expand_dims(taps, 2), sources)
    return xp.sum(xp.where(hits, xp.expand_dims(weights, 2), 0.0), axis=1)


def _resample_grid(xp, grid, source_grid, target_grid, method, align_corners, dtype):
    """`(rows, cols, dim)` -> `(target_rows, target_cols, dim)`."""
    rows = _interpolation_matrix(xp, source_grid[0], target_grid[0], method, align_corners, dtype)
    cols = _interpolation_matrix(xp, source_grid[1], target_grid[1], method, align_corners, dtype)
    grid = xp.einsum("ri,ijd->rjd", rows, grid)
    return xp.einsum("cj,rjd->rcd", cols, grid)


def resample_position_embeddings(
    embeddings,
    target_grid,
    source_grid=None,
    num_prefix_tokens=1,
    method=DEFAULT_RESAMPLE_METHOD,
    align_corners=False,
):
    """Resamples a position-embedding grid to another grid size.

    This is how a ViT moves to another resolution (paper, section 3.2): the
    patch size stays, the patch grid grows or shrinks, and the learned
    embeddings of the grid are 2-D interpolated. The prefix slots (class
    token) are kept as they are. It serves checkpoint loading and
    `input_shape` changes alike, and runs in NumPy (float64), so the result
    is the same on every backend.

    `method="bicubic"` with `align_corners=False` reproduces PyTorch's
    `F.interpolate(mode="bicubic")` (timm, Hugging Face);
    `method="bicubic_antialias"` reproduces the same with
    `antialias=True` (DINOv2 with registers); `method="bilinear"` with
    `align_corners=True` reproduces `scipy.ndimage.zoom(order=1)` (the
    original JAX ViT code).

    Args:
        embeddings: array of shape `(1, prefix + rows * cols, dim)` or
            `(prefix + rows * cols, dim)`.
        target_grid: int or `(rows, cols)`, the new patch grid.
        source_grid: int or `(rows, cols)` of `embeddings`; `None` infers a
            square grid from the number of tokens.
        num_prefix_tokens: int, the number of leading non-grid tokens.
        method: `"bicubic"`, `"bicubic_antialias"` or `"bilinear"`.
        align_corners: bool, whether the corner samples of both grids are
            aligned (`True`) or their pixel areas are (`False`).

    Returns:
        float32 NumPy array of shape `(1, prefix + new_rows * new_cols, dim)`
        (without the leading 1 when the input had none).

    Example:

    >>> table = np.random.rand(1, 1 + 14 * 14, 8)
    >>> resample_position_embeddings(table, target_grid=24).shape
    (1, 577, 8)
    """
    if method not in RESAMPLE_METHODS:
        raise ValueError(f"`method` must be one of {RESAMPLE_METHODS}. Received: method={method!r}")
    table = np.asarray(keras.ops.convert_to_numpy(embeddings), dtype=np.float64)
    batched = table.ndim == 3
    if batched:
        if table.shape[0] != 1:
            raise ValueError(
                "`embeddings` must have shape (1, tokens, dim) or (tokens, dim). "
                f"Received: embeddings.shape={table.shape}"
            )
        table = table[0]
    if table.ndim != 2:
        raise ValueError(
            "`embeddings` must have shape (1, tokens, dim) or (tokens, dim). "
            f"Received: embeddings.shape={np.shape(embeddings)}"
        )
    prefix, grid = table[:num_prefix_tokens], table[num_prefix_tokens:]
    if source_grid is None:
        side = math.isqrt(len(grid))
        if side * side != len(grid):
            raise ValueError(
                f"{len(grid)} grid tokens do not form a square grid; pass "
                "`source_grid=(rows, cols)`. "
                f"Received: embeddings.shape={np.shape(embeddings)}, "
                f"num_prefix_tokens={num_prefix_tokens}"
            )
        source_grid = side
    source_grid = _pair(source_grid, "source_grid")
    target_grid = _pair(target_grid, "target_grid")
    if source_grid[0] * source_grid[1] != len(grid):
        raise ValueError(
            f"source_grid={source_grid} holds {source_grid[0] * source_grid[1]} "
            f"tokens but the embeddings have {len(grid)} after "
            f"{num_prefix_tokens} prefix token(s)."
        )
    grid = grid.reshape(*source_grid, -1)
    if source_grid != target_grid:
        grid = _resample_grid(np, grid, source_grid, target_grid, method, align_corners, "float64")
    result = np.concatenate([prefix, grid.reshape(-1, grid.shape[-1])])
    result = result.astype("float32")
    return result[None] if batched else result


@keras.saving.register_keras_serializable(package="keras_vit")
class PositionEmbedding(keras.layers.Layer):
    """Adds a position embedding to every token of a patch sequence.

    `kind="learned"` gives the paper's learnable 1-D embeddings, one per
    token (prefix tokens and the `rows × cols` patch grid flattened row by
    row), initialised from a normal distribution with standard deviation
    0.02. `kind="sincos2d"` gives fixed 2-D sin-cos embeddings (not
    trainable). The grid size is kept so that the table can be resampled
    to another resolution with `resample_position_embeddings`.

    Given the patch grid at call time (`grid=`), the layer serves images of
    any size: for a grid other than its own it resamples the table inside
    the graph with `resample_method`, the computation that load-time
    resampling does (as timm's `dynamic_img_size` and Hugging Face's
    `interpolate_pos_encoding`), and for its own grid it adds the table
    as it is.

    Args:
        grid_size: int or `(rows, cols)`, the patch grid of the table.
        num_prefix_tokens: int, the number of tokens before the grid (1 for
            the class token). Defaults to 1.
        kind: `"learned"` or `"sincos2d"`. Defaults to `"learned"`.
        initializer: initializer of learned embeddings. Defaults to
            `RandomNormal(stddev=0.02)`.
        resample_method: how a call with another grid resamples the table:
            `"bicubic"` (PyTorch's, as timm and Hugging Face),
            `"bicubic_antialias"` (DINOv2 with registers) or `"bilinear"`.
            Defaults to `"bicubic"`.
        **kwargs: base layer keyword arguments, e.g. `name` and `dtype`.

    Call arguments:
        inputs: tokens of shape `(batch, num_prefix_tokens + rows * cols,
            hidden_dim)`.
        grid: optional tensor whose axes 1 and 2 are the patch grid
            `(rows, cols)` of `inputs`, e.g. the patch embedding's output
            with `flatten=False`; only its shape is read. Without it the
            tokens must be on the table's grid.

    Returns:
        The tokens plus their position embeddings, same shape.

    Example:

    >>> layer = PositionEmbedding(grid_size=(2, 3))
    >>> tuple(layer(keras.ops.zeros((4, 7, 16))).shape)
    (4, 7, 16)
    >>> grid = keras.ops.zeros((4, 4, 5, 16))  # a 4x5 patch grid
    >>> tuple(layer(keras.ops.zeros((4, 21, 16)), grid=grid).shape)
    (4, 21, 16)
    """

    def __init__(
        self,
        grid_size,
        num_prefix_tokens=1,
        kind="learned",
        initializer=None,
        resample_method=DEFAULT_RESAMPLE_METHOD,
        **kwargs,
    ):
        super().__init__(**kwargs)
        self.grid_size = _pair(grid_size, "grid_size")
        if not isinstance(num_prefix_tokens, int) or num_prefix_tokens < 0:
            raise ValueError(
                "`num_prefix_tokens` must be a non-negative int. "
                f"Received: num_prefix_tokens={num_prefix_tokens!r}"
            )
        if kind not in POSITION_EMBEDDING_KINDS:
            raise ValueError(
                f"`kind` must be one of {POSITION_EMBEDDING_KINDS}. Received: kind={kind!r}"
            )
        if resample_method not in RESAMPLE_METHODS:
            raise ValueError(
                f"`resample_method` must be one of {RESAMPLE_METHODS}. "
                f"Received: resample_method={resample_method!r}"
            )
        self.num_prefix_tokens = num_prefix_tokens
        self.kind = kind
        self.resample_method = resample_method
        self.initializer = keras.initializers.get(
            initializer or keras.initializers.RandomNormal(stddev=0.02)
        )

    @property
    def num_tokens(self):
        return self.num_prefix_tokens + self.grid_size[0] * self.grid_size[1]

    def build(self, input_shape):
        if len(input_shape) != 3 or input_shape[-1] is None:
            raise ValueError(
                "PositionEmbedding expects tokens of shape (batch, tokens, "
                f"hidden_dim). Received: input_shape={tuple(input_shape)}"
            )
        hidden_dim = input_shape[-1]
        if self.kind == "sincos2d":
            table = sincos_2d_position_embeddings(
                self.grid_size, hidden_dim, self.num_prefix_tokens
            )
            initializer = keras.initializers.Constant(table)
        else:
            initializer = self.initializer
        self.embeddings = self.add_weight(
            name="embeddings",
            shape=(1, self.num_tokens, hidden_dim),
            initializer=initializer,
            trainable=self.kind == "learned",
        )

    def call(self, inputs, grid=None):
        table = self.embeddings
        target = self.grid_size if grid is None else tuple(ops.shape(grid)[1:3])
        static = all(isinstance(side, int) for side in target)
        if not static or target != self.grid_size:
            # Another grid (or one known only at run time: a tensor), in float32.
            table = ops.cast(table, "float32")
            prefix = table[:, : self.num_prefix_tokens]
            patches = ops.reshape(table[0, self.num_prefix_tokens :], (*self.grid_size, -1))
            patches = _resample_grid(
                ops,
                patches,
                self.grid_size,
                target,
                self.resample_method,
                align_corners=False,
                dtype="float32",
            )
            patches = ops.reshape(patches, (1, -1, ops.shape(table)[-1]))
            table = ops.concatenate([prefix, patches], axis=1)
        elif inputs.shape[1] is not None and inputs.shape[1] != self.num_tokens:
            raise ValueError(
                f"PositionEmbedding with grid_size={self.grid_size} and "
                f"num_prefix_tokens={self.num_prefix_tokens} expects "
                f"{self.num_tokens} tokens, or the patch grid of the tokens as "
                f"`grid`. Received: inputs.shape={tuple(inputs.shape)}"
            )
        return inputs + ops.cast(table, inputs.dtype)

    def compute_output_shape(self, inputs_shape, grid_shape=None):
        return tuple(inputs_shape)

    def get_config(self):
        config = super().get_config()
        config.update(
            {
                "grid_size": self.grid_size,
                "num_prefix_tokens": self.num_prefix_tokens,
                "kind": self.kind,
                "initializer": keras.initializers.serialize(self.initializer),
                "resample_method": self.resample_method,
            }
        )
        return config
