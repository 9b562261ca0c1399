"""Token merging (ToMe, Bolya et al., ICLR 2023): fewer tokens in each block, no training."""

import keras
from keras import ops

from keras_vit.layers.rotary_position_embedding import (
    RotaryPositionEmbedding2D,
    check_base,
    rotate,
)
from keras_vit.layers.transformer_block import TransformerBlock


def bipartite_merge(tokens, sizes, metric, r, num_protected=0, positions=None):
    """Merges the `r` most similar pairs of `tokens` (ToMe's bipartite soft matching).

    The first `num_protected` tokens (class, register tokens) are kept as
    they are. The others alternate into two sets, A (even positions) and B
    (odd); each token of A is matched to its most similar token of B
    (cosine similarity of `metric`), and the `r` best-matched tokens of A
    are averaged into their matches, weighted by `sizes` (how many patches
    each token already stands for). Shapes stay static (`r` is a Python
    int): what is merged is gathers, a sort of A's scores and a one-hot
    matmul, which SavedModel, TFLite and ONNX keep.

    Args:
        tokens: `(batch, n, width)`.
        sizes: `(batch, n - num_protected)` float, the patches each
            unprotected token stands for.
        metric: `(batch, n - num_protected, d)`, the similarity features
            (ToMe: the keys, averaged over heads).
        r: int in `[0, (n - num_protected) // 2]`, the pairs to merge.
        num_protected: int, the leading tokens never merged.
        positions: `None`, or `(batch, n - num_protected, k)` float, where
            each unprotected token sits (rotary positions' patch centres):
            merged as the tokens are, into the size-weighted mean.

    Returns:
        `(tokens, sizes)` with `r` fewer tokens: the protected tokens, A's
        unmerged tokens in their order, then B's tokens with what was
        merged into them; `(tokens, sizes, positions)` where `positions`
        is given, in the same order.
    """
    if r == 0:
        return (tokens, sizes) if positions is None else (tokens, sizes, positions)
    tokens, sizes, metric = (ops.convert_to_tensor(t) for t in (tokens, sizes, metric))
    p, m = num_protected, tokens.shape[1] - num_protected
    num_a, num_b = (m + 1) // 2, m // 2
    metric = metric / ops.sqrt(ops.sum(ops.square(metric), axis=-1, keepdims=True) + 1e-12)
    # Gathers, not strided slices or `take_along_axis` (TensorFlow runs
    # those 7 and 14 times slower on tokens than a gather).
    even, odd = ops.arange(0, m, 2), ops.arange(1, m, 2)
    similarity = ops.matmul(
        ops.take(metric, even, axis=1), ops.transpose(ops.take(metric, odd, axis=1), (0, 2, 1))
    )
    # (`top_k`, not `argmax`: Keras' TensorFlow argmax writes a Bitcast, which ONNX lacks.)
    best, best_match = (t[..., 0] for t in ops.top_k(similarity, k=1))
    # A's tokens by their best similarity, highest first: the first `r` merge.
    order = ops.top_k(best, k=num_a, sorted=True)[1]
    merged, kept = order[:, :r], ops.sort(order[:, r:], axis=-1)  # kept: in A's order

    batch = ops.shape(tokens)[0]

    def pick(values, indices):  # values (batch, k, ...) at indices (batch, j): one gather
        if indices.shape[1] == 0:
            return values[:, :0]
        flat = ops.reshape(values, (-1, *values.shape[2:]))
        offsets = ops.arange(batch, dtype=indices.dtype)[:, None] * values.shape[1]
        return ops.reshape(
            ops.take(flat, indices + offsets, axis=0), (-1, indices.shape[1], *values.shape[2:])
        )

    protected = ops.broadcast_to(ops.arange(p, dtype=kept.dtype)[None], (batch, p))
    odd_sizes = ops.take(sizes, odd, axis=1)
    source_sizes, target = pick(sizes, 2 * merged), pick(best_match, merged)
    into = ops.one_hot(target, num_b)  # (batch, r, B)
    new_sizes = odd_sizes + ops.matmul(source_sizes[:, None], ops.cast(into, sizes.dtype))[:, 0]
    share = source_sizes / pick(new_sizes, target)

    def merged_into_b(values, offset):
        # Each merged token moves its match towards it by its share of the
        # match's new size: B's tokens change by a one-hot matmul of r rows.
        odd_values, source = (
            ops.take(values, offset + odd, axis=1),
            pick(values, offset + 2 * merged),
        )
        moves = (source - pick(odd_values, target)) * ops.cast(share, values.dtype)[..., None]
        return odd_values + ops.matmul(
            ops.transpose(ops.cast(into, values.dtype), (0, 2, 1)), moves
        )

    unmerged = pick(tokens, ops.concatenate([protected, p + 2 * kept], axis=1))
    tokens = ops.concatenate([unmerged, merged_into_b(tokens, p)], axis=1)
    sizes = ops.concatenate([pick(sizes, 2 * kept), new_sizes], axis=1)
    if positions is None:
        return tokens, sizes
    positions = ops.convert_to_tensor(positions)
    positions = ops.concatenate([pick(positions, 2 * kept), merged_into_b(positions, 0)], axis=1)
    return tokens, sizes, positions


@keras.saving.register_keras_serializable(package="keras_vit")
class TokenMergingBlock(TransformerBlock):
    """A `TransformerBlock` that merges `r` pairs of tokens between attention and MLP.

    ToMe (Bolya et al., ICLR 2023): the attention is proportional (each
    key's logit gains `log(size)`: a merged token counts for the patches it
    stands for), then the `r` most similar pairs of patch tokens (by the
    attention's keys, averaged over heads) are merged (`bipartite_merge`),
    and the MLP runs on the fewer tokens. The first `num_prefix_tokens`
    (class, distillation, register tokens) are never merged and stay first.
    The weights are a `TransformerBlock`'s: a trained block's load as they are.

    In a model of rotary positions (DINOv3's, `rope_base`), each patch
    token also carries where it sits: a merged token sits at the
    size-weighted mean of its patches' centres, and the next attention
    turns its query and key by the rotation there
    (`RotaryPositionEmbedding2D.rotation_at`), so the attention's logits
    still depend on how far apart two tokens are.

    Args:
        r: int >= 0, the pairs of patch tokens merged.
        num_prefix_tokens: int, the tokens before the patches.
        rope_base: `None` (the positions are in the tokens: a table), or
            the base of the model's rotary frequencies (DINOv3's 100).
        grid_size: `(rows, columns)` of the patches, with `rope_base`:
            where the patch tokens sit when the block gets no coordinates
            (the first block).
        **kwargs: `TransformerBlock` arguments.

    Call arguments:
        inputs: tokens `(batch, n, width)`, or `[tokens, sizes]` with
            `sizes` `(batch, n - num_prefix_tokens)`, the patches each patch
            token stands for (ones when not given), or, with `rope_base`,
            `[tokens, sizes, coordinates]`, `coordinates` `(batch, n -
            num_prefix_tokens, 2)`, each patch token's place (the centres of
            `grid_size` when not given).
        training: bool, whether dropout and stochastic depth are active.

    Returns:
        `[tokens, sizes]` with `r` fewer tokens; `[tokens, sizes,
        coordinates]` with `rope_base`.

    Example:

    >>> block = TokenMergingBlock(r=2, num_prefix_tokens=1, num_heads=2, mlp_dim=32)
    >>> tokens, sizes = block(keras.ops.ones((1, 9, 16)))
    >>> tuple(tokens.shape), tuple(sizes.shape)
    ((1, 7, 16), (1, 6))
    """

    def __init__(self, r, num_prefix_tokens=1, rope_base=None, grid_size=None, **kwargs):
        super().__init__(**kwargs)
        for name, value in (("r", r), ("num_prefix_tokens", num_prefix_tokens)):
            if isinstance(value, bool) or not isinstance(value, int) or value < 0:
                raise ValueError(f"`{name}` must be an int >= 0. Received: {name}={value!r}")
        if rope_base is not None:
            check_base(rope_base, "rope_base")
            if (
                not isinstance(grid_size, (list, tuple))
                or len(grid_size) != 2
                or not all(
                    isinstance(n, int) and not isinstance(n, bool) and n > 0 for n in grid_size
                )
            ):
                raise ValueError(
                    "`grid_size` must be the (rows, columns) of the patches with `rope_base`. "
                    f"Received: grid_size={grid_size!r}"
                )
            grid_size = tuple(grid_size)
        self.r = r
        self.num_prefix_tokens = num_prefix_tokens
        self.rope_base = rope_base
        self.grid_size = grid_size

    def build(self, input_shape):
        if isinstance(input_shape, (list, tuple)) and isinstance(input_shape[0], (list, tuple)):
            input_shape = input_shape[0]
        super().build(input_shape)
        self.rotary = None
        if self.rope_base is not None:
            self.rotary = RotaryPositionEmbedding2D(
                input_shape[-1] // self.num_heads, self.rope_base, self.num_prefix_tokens
            )

    def call(self, inputs, training=None):
        tokens, sizes, coordinates = (
            (*inputs, None, None)[:3] if isinstance(inputs, (list, tuple)) else (inputs, None, None)
        )
        prefix = self.num_prefix_tokens
        if sizes is None:
            sizes = ops.ones_like(tokens[:, prefix:, 0], dtype="float32")
        x = self.attention_norm(tokens)
        query, key, value = self.attention.project(x)
        if self.rotary is not None:
            if coordinates is None:
                centres = self.rotary.coordinates(self.grid_size)[None]
                coordinates = ops.broadcast_to(centres, (ops.shape(tokens)[0], *centres.shape[1:]))
            rotation = self.rotary.rotation_at(coordinates)
            query, key = rotate(query, rotation), rotate(key, rotation)
        key_bias = ops.concatenate(
            [ops.zeros_like(ops.cast(tokens[:, :prefix, 0], "float32")), ops.log(sizes)], axis=1
        )
        context, _ = self.attention.attend(
            query, key, value, bool(training) and self.attention_dropout_rate > 0, False, key_bias
        )
        x = self.dropout(self.attention.combine(context), training=training)
        x = tokens + self._residual(x, self.attention_scale, training)
        merged = bipartite_merge(
            x, sizes, ops.mean(key[:, prefix:], axis=2), self.r, prefix, positions=coordinates
        )
        x, sizes = merged[:2]
        num_tokens, width = x.shape[1], x.shape[-1]
        y = self.mlp_norm(ops.reshape(x, (-1, width)))
        y = self.dropout(self.mlp_dense_1(y, training=training), training=training)
        y = self.dropout(self.mlp_dense_2(y), training=training)
        y = ops.reshape(y, (-1, num_tokens, width))
        return [x + self._residual(y, self.mlp_scale, training), *merged[1:]]

    def compute_output_spec(self, inputs, training=None):
        tokens = inputs[0] if isinstance(inputs, (list, tuple)) else inputs
        batch, n, width = tokens.shape
        patches = n - self.r - self.num_prefix_tokens
        specs = [
            keras.KerasTensor((batch, n - self.r, width), tokens.dtype),
            keras.KerasTensor((batch, patches), "float32"),
        ]
        if self.rope_base is not None:
            specs.append(keras.KerasTensor((batch, patches, 2), "float32"))
        return specs

    def get_config(self):
        config = super().get_config()
        config.update(
            {
                "r": self.r,
                "num_prefix_tokens": self.num_prefix_tokens,
                "rope_base": self.rope_base,
                "grid_size": self.grid_size,
            }
        )
        return config
