"""Position embeddings: learned 1-D, fixed 2-D sin-cos, and grid resampling."""

import math

import keras
import numpy as np
from keras import ops

from keras_vit.layers.patch_embedding import _pair

POSITION_EMBEDDING_KINDS = ("learned", "sincos2d")
RESAMPLE_METHODS = ("bicubic", "bicubic_antialias", "bilinear")


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


def _keys_kernel(distance, a):
    """Keys' cubic convolution kernel at `distance` (any sign)."""
    d = np.abs(distance)
    near = ((a + 2) * d - (a + 3)) * d * d + 1
    far = ((a * d - 5 * a) * d + 8 * a) * d - 4 * a
    return np.where(d <= 1, near, np.where(d < 2, far, 0.0))


def _cubic_weights(t, a=-0.75):
    """The 4 cubic taps around a sample point at fraction `t` past a pixel.

    `a=-0.75` is the constant PyTorch's bicubic uses (timm, Hugging Face).
    """
    offsets = np.array([-1.0, 0.0, 1.0, 2.0])
    return _keys_kernel(t[..., None] - offsets, a)


def _antialias_matrix(in_size, out_size):
    """PyTorch's `interpolate(mode="bicubic", antialias=True)` for one axis.

    The separable filter of PIL: Keys' cubic with `a=-0.5`, widened by the
    downscaling factor (so shrinking averages instead of aliasing), taps
    outside the input dropped and the weights renormalised. DINOv2 with
    registers moves its position grid this way.
    """
    scale = in_size / out_size
    support = 2.0 * max(scale, 1.0)
    stretch = 1.0 / max(scale, 1.0)
    matrix = np.zeros((out_size, in_size))
    for i in range(out_size):
        center = scale * (i + 0.5)
        low = max(int(center - support + 0.5), 0)
        high = min(int(center + support + 0.5), in_size)
        weights = _keys_kernel((np.arange(low, high) - center + 0.5) * stretch, a=-0.5)
        matrix[i, low:high] = weights / weights.sum()
    return matrix


def _interpolation_matrix(in_size, out_size, method, align_corners):
    """The `(out_size, in_size)` matrix that resamples one axis."""
    if method == "bicubic_antialias":
        return _antialias_matrix(in_size, out_size)
    out = np.arange(out_size, dtype=np.float64)
    if align_corners:
        scale = (in_size - 1) / (out_size - 1) if out_size > 1 else 0.0
        source = out * scale
    else:
        source = (out + 0.5) * (in_size / out_size) - 0.5
    matrix = np.zeros((out_size, in_size))
    rows = np.arange(out_size)[:, None]
    if method == "bilinear":
        source = np.maximum(source, 0.0)
        low = np.floor(source)
        t = (source - low)[:, None]
        taps = low[:, None] + np.arange(2)
        weights = np.concatenate([1 - t, t], axis=1)
    else:
        low = np.floor(source)
        taps = low[:, None] + np.arange(-1, 3)
        weights = _cubic_weights(source - low)
    # Border taps are clamped to the edge, as image resizers do.
    taps = np.clip(taps, 0, in_size - 1).astype(int)
    np.add.at(matrix, (np.broadcast_to(rows, taps.shape), taps), weights)
    return matrix


def resample_position_embeddings(
    embeddings,
    target_grid,
    source_grid=None,
    num_prefix_tokens=1,
    method="bicubic",
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
        raise ValueError(
            f"`method` must be one of {RESAMPLE_METHODS}. Received: method={method!r}"
        )
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
        rows = _interpolation_matrix(
            source_grid[0], target_grid[0], method, align_corners
        )
        cols = _interpolation_matrix(
            source_grid[1], target_grid[1], method, align_corners
        )
        grid = np.einsum("ri,cj,ijd->rcd", rows, cols, grid)
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

    Args:
        grid_size: int or `(rows, cols)`, the patch grid.
        num_prefix_tokens: int, the number of tokens before the grid (1 for
            the class token). Defaults to 1.
        kind: `"learned"` or `"sincos2d"`. Defaults to `"learned"`.
        initializer: initializer of learned embeddings. Defaults to
            `RandomNormal(stddev=0.02)`.
        **kwargs: base layer keyword arguments, e.g. `name` and `dtype`.

    Call arguments:
        inputs: tokens of shape
            `(batch, num_prefix_tokens + rows * cols, hidden_dim)`.

    Returns:
        The tokens plus their position embeddings, same shape.

    Example:

    >>> layer = PositionEmbedding(grid_size=(2, 3))
    >>> tuple(layer(keras.ops.zeros((4, 7, 16))).shape)
    (4, 7, 16)
    """

    def __init__(
        self,
        grid_size,
        num_prefix_tokens=1,
        kind="learned",
        initializer=None,
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
                f"`kind` must be one of {POSITION_EMBEDDING_KINDS}. "
                f"Received: kind={kind!r}"
            )
        self.num_prefix_tokens = num_prefix_tokens
        self.kind = kind
        self.initializer = keras.initializers.get(
            initializer or keras.initializers.RandomNormal(stddev=0.02)
        )

    @property
    def num_tokens(self):
        return self.num_prefix_tokens + self.grid_size[0] * self.grid_size[1]

    def build(self, input_shape):
        if len(input_shape) != 3 or input_shape[1] != self.num_tokens:
            raise ValueError(
                f"PositionEmbedding with grid_size={self.grid_size} and "
                f"num_prefix_tokens={self.num_prefix_tokens} expects "
                f"{self.num_tokens} tokens. Received: input_shape="
                f"{tuple(input_shape)}"
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

    def call(self, inputs):
        return inputs + ops.cast(self.embeddings, inputs.dtype)

    def compute_output_shape(self, input_shape):
        return tuple(input_shape)

    def get_config(self):
        config = super().get_config()
        config.update(
            {
                "grid_size": self.grid_size,
                "num_prefix_tokens": self.num_prefix_tokens,
                "kind": self.kind,
                "initializer": keras.initializers.serialize(self.initializer),
            }
        )
        return config
