"""Two-dimensional rotary position embedding (RoPE), as DINOv3 computes it."""

import math

import keras
from keras import ops


def check_base(base, argument="base"):
    """Refuses a base of the rotary frequencies that is not a number above 1."""
    if isinstance(base, bool) or not isinstance(base, (int, float)) or not base > 1:
        raise ValueError(f"`{argument}` must be a number above 1. Received: {argument}={base!r}")


@keras.saving.register_keras_serializable(package="keras_vit")
class RotaryPositionEmbedding2D(keras.layers.Layer):
    """Rotates the patch tokens' queries and keys by their place on the patch grid.

    DINOv3's position scheme (Siméoni et al., 2025): no table is added to
    the tokens; inside each attention, every patch token's query and key
    are rotated by angles that grow with the token's row and column, so
    their product depends on how far apart two patches are. The grid is
    read at each call, so one model takes any resolution with nothing to
    resample. A patch's centre is placed in [-1, 1] along each axis
    (`(i + 0.5) / rows * 2 - 1`). A head's channels turn in pairs half a
    head apart (`rotate_half` in the reference): those of its first and
    third quarters with the row, those of its second and fourth with the
    column, at frequencies `base ** -(4 k / head_dim)`, `k < head_dim / 4`.
    The tokens before the patches (class token, registers) are left as
    they are.

    The rotation is the trained model's alone: DINOv3 jitters the
    coordinates while it trains (`pos_embed_shift`, `_jitter`, `_rescale`)
    and a checkpoint does not need them to run.

    The layer makes the rotation once per image size (`call(grid)`: the
    cosines and sines of every token's angles, a prefix token's being 0);
    every attention of the model applies it to its queries and keys
    (`rotate`), as DINOv3's model computes its `position_embeddings` once
    and hands them to each layer.

    Args:
        head_dim: the width of one attention head; a multiple of 4.
        base: the base of the frequencies (DINOv3's `rope_theta`: 100).
        num_prefix_tokens: the tokens before the patches, not rotated.
        **kwargs: base layer keyword arguments, e.g. `name` and `dtype`.

    Call arguments:
        grid: the patch grid (`(batch, rows, columns, channels)`, as
            `PositionEmbedding` takes it: its size may be known only at
            run time), or its `(rows, columns)`.

    Returns:
        The rotation, `(2, num_prefix_tokens + rows * columns, head_dim)`
        float32: the cosines, then the sines, for tokens laid out as the
        prefix tokens, then the patches row by row.

    Example:

    >>> rope = RotaryPositionEmbedding2D(head_dim=8, num_prefix_tokens=1)
    >>> rotation = rope(grid=(3, 4))
    >>> tuple(rotation.shape)
    (2, 13, 8)
    >>> query = keras.ops.ones((2, 13, 2, 8))  # (batch, tokens, heads, head_dim)
    >>> tuple(rotate(query, rotation).shape)
    (2, 13, 2, 8)
    """

    def __init__(self, head_dim, base=100.0, num_prefix_tokens=1, **kwargs):
        super().__init__(**kwargs)
        if (
            isinstance(head_dim, bool)
            or not isinstance(head_dim, int)
            or head_dim <= 0
            or head_dim % 4
        ):
            raise ValueError(
                f"`head_dim` must be a positive multiple of 4 (a quarter of a head's "
                f"channels turns with each axis' sine and cosine). Received: head_dim={head_dim!r}"
            )
        check_base(base)
        if isinstance(num_prefix_tokens, bool) or not isinstance(num_prefix_tokens, int):
            raise TypeError(
                "`num_prefix_tokens` must be a whole number. "
                f"Received: num_prefix_tokens={num_prefix_tokens!r}"
            )
        if num_prefix_tokens < 0:
            raise ValueError(
                "`num_prefix_tokens` must be 0 or more. "
                f"Received: num_prefix_tokens={num_prefix_tokens!r}"
            )
        self.head_dim = head_dim
        self.base = float(base)
        self.num_prefix_tokens = num_prefix_tokens

    def coordinates(self, grid):
        """The `(rows * columns, 2)` centres of the patches of `grid`, row by row, float32.

        Each in [-1, 1] along each axis (`(i + 0.5) / rows * 2 - 1`).
        """
        rows, columns = ops.shape(grid)[1:3] if len(getattr(grid, "shape", ())) == 4 else grid

        def centres(count):  # (count: an int, or a tensor where the grid is known at run time)
            places = ops.cast(ops.arange(count), "float32") + 0.5
            return 2.0 * (places / ops.cast(count, "float32")) - 1.0

        row_of = ops.repeat(centres(rows), columns)  # row by row, as the patches
        column_of = ops.tile(centres(columns), [rows])
        return ops.stack([row_of, column_of], axis=-1)

    def rotation_at(self, coordinates):
        """The rotation of tokens whose patches sit at `coordinates`.

        `coordinates`: `(patches, 2)` (`coordinates(grid)`), or
        `(batch, patches, 2)` float32 where each image's tokens sit
        elsewhere: token merging's merged tokens, each at the size-weighted
        mean of its patches' centres. Returns `(2, num_prefix_tokens +
        patches, head_dim)` or `(2, batch, num_prefix_tokens + patches,
        head_dim)`: what `rotate` takes.
        """
        coordinates = ops.cast(coordinates, "float32")
        # The reference's `base ** arange(0, 1, 4 / head_dim)`, in float32.
        exponents = ops.arange(self.head_dim // 4, dtype="float32") * (4.0 / self.head_dim)
        frequencies = 1.0 / ops.power(ops.cast(self.base, "float32"), exponents)
        turns = (
            2 * math.pi * coordinates[..., None] * frequencies
        )  # (..., patches, 2, head_dim / 4)
        leading = (-1,) if len(coordinates.shape) == 2 else (-1, coordinates.shape[1])
        half = ops.reshape(turns, (*leading, self.head_dim // 2))
        angles = ops.concatenate([half, half], axis=-1)
        before = [[0, 0]] * (len(coordinates.shape) - 2)
        angles = ops.pad(angles, [*before, [self.num_prefix_tokens, 0], [0, 0]])  # 0: unturned
        return ops.stack([ops.cos(angles), ops.sin(angles)])

    def call(self, grid):
        return self.rotation_at(self.coordinates(grid))

    def compute_output_shape(self, grid_shape):
        rows, columns = grid_shape[1:3] if len(grid_shape) == 4 else (None, None)
        tokens = None if None in (rows, columns) else self.num_prefix_tokens + rows * columns
        return (2, tokens, self.head_dim)

    def get_config(self):
        return {
            **super().get_config(),
            "head_dim": self.head_dim,
            "base": self.base,
            "num_prefix_tokens": self.num_prefix_tokens,
        }


# The quantization points of a rotation in LiteRT's integer-only mode
# (`{name: kind}` for a query's or key's `name`; see `layers.fake_quantization`):
# the two products and their sum. The cosines and sines are constants of
# the file, which the converter rounds on its own.
ROTATION_POINTS = {
    f"{name}_{step}": "steps" for name in ("query", "key") for step in ("cos", "sin", "rotated")
}


def rotate(x, rotation, point=None, name=None):
    """`x` (`(batch, tokens, heads, head_dim)`) turned by a `RotaryPositionEmbedding2D` rotation.

    The rotation is one for every image (`(2, tokens, head_dim)`) or each
    image's own (`(2, batch, tokens, head_dim)`).

    Each pair of channels half a head apart turns by its token's angle
    (transformers' `x * cos + rotate_half(x) * sin`); a prefix token's
    angle is 0, which leaves it exactly as it is. `rotate_half`'s sign
    sits in the sines (`[-sin, sin]` times the swapped halves): the same
    float values, and no negation of `x` for LiteRT to run in float.
    `point(step, x)` rounds at each of `ROTATION_POINTS` (a quantization-
    aware attention's, for `x` its `name`: `"query"` or `"key"`).
    """
    x = ops.convert_to_tensor(x)
    point = point or _unrounded
    # (tokens, 1 head axis, head_dim), or (batch, tokens, 1, head_dim): each image's own.
    cos = ops.expand_dims(ops.cast(rotation[0], x.dtype), -2)
    sin = ops.expand_dims(ops.cast(rotation[1], x.dtype), -2)
    sin_first, sin_second = ops.split(sin, 2, axis=-1)
    signed_sin = ops.concatenate([-sin_first, sin_second], axis=-1)
    first, second = ops.split(x, 2, axis=-1)
    turned = point(f"{name}_cos", x * cos) + point(
        f"{name}_sin", ops.concatenate([second, first], axis=-1) * signed_sin
    )
    return point(f"{name}_rotated", turned)


def _unrounded(step, value):
    return value
