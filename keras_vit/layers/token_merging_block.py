"""Token merging (ToMe, Bolya et al., ICLR 2023): fewer tokens in each block, no training."""

import keras
from keras import ops

from keras_vit.layers.transformer_block import TransformerBlock


def bipartite_merge(tokens, sizes, metric, r, num_protected=0):
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

    Returns:
        `(tokens, sizes)` with `r` fewer tokens: the protected tokens, A's
        unmerged tokens in their order, then B's tokens with what was
        merged into them.
    """
    if r == 0:
        return tokens, sizes
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
    unmerged = pick(tokens, ops.concatenate([protected, p + 2 * kept], axis=1))
    odd_tokens, odd_sizes = ops.take(tokens, p + odd, axis=1), ops.take(sizes, odd, axis=1)
    # Each merged token moves its match towards it by its share of the
    # match's new size: B's tokens change by a one-hot matmul of r rows.
    source, source_sizes = pick(tokens, p + 2 * merged), pick(sizes, 2 * merged)
    target = pick(best_match, merged)
    into = ops.cast(ops.one_hot(target, num_b), tokens.dtype)  # (batch, r, B)
    new_sizes = odd_sizes + ops.matmul(source_sizes[:, None], into)[:, 0]
    share = source_sizes / pick(new_sizes, target)
    moves = (source - pick(odd_tokens, target)) * share[..., None]
    odd_tokens = odd_tokens + ops.matmul(ops.transpose(into, (0, 2, 1)), moves)
    sizes = ops.concatenate([pick(sizes, 2 * kept), new_sizes], axis=1)
    return ops.concatenate([unmerged, odd_tokens], axis=1), sizes


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

    Args:
        r: int >= 0, the pairs of patch tokens merged.
        num_prefix_tokens: int, the tokens before the patches.
        **kwargs: `TransformerBlock` arguments.

    Call arguments:
        inputs: tokens `(batch, n, width)`, or `[tokens, sizes]` with
            `sizes` `(batch, n - num_prefix_tokens)`, the patches each patch
            token stands for (ones when not given).
        training: bool, whether dropout and stochastic depth are active.

    Returns:
        `[tokens, sizes]` with `r` fewer tokens.

    Example:

    >>> block = TokenMergingBlock(r=2, num_prefix_tokens=1, num_heads=2, mlp_dim=32)
    >>> tokens, sizes = block(keras.ops.ones((1, 9, 16)))
    >>> tuple(tokens.shape), tuple(sizes.shape)
    ((1, 7, 16), (1, 6))
    """

    def __init__(self, r, num_prefix_tokens=1, **kwargs):
        super().__init__(**kwargs)
        for name, value in (("r", r), ("num_prefix_tokens", num_prefix_tokens)):
            if isinstance(value, bool) or not isinstance(value, int) or value < 0:
                raise ValueError(f"`{name}` must be an int >= 0. Received: {name}={value!r}")
        self.r = r
        self.num_prefix_tokens = num_prefix_tokens

    def build(self, input_shape):
        if isinstance(input_shape, (list, tuple)) and isinstance(input_shape[0], (list, tuple)):
            input_shape = input_shape[0]
        super().build(input_shape)

    def call(self, inputs, training=None):
        tokens, sizes = inputs if isinstance(inputs, (list, tuple)) else (inputs, None)
        prefix = self.num_prefix_tokens
        if sizes is None:
            sizes = ops.ones_like(tokens[:, prefix:, 0])
        x = self.attention_norm(tokens)
        query, key, value = self.attention.project(x)
        key_bias = ops.concatenate(
            [ops.zeros_like(ops.cast(tokens[:, :prefix, 0], "float32")), ops.log(sizes)], axis=1
        )
        context, _ = self.attention.attend(
            query, key, value, bool(training) and self.attention_dropout_rate > 0, False, key_bias
        )
        x = self.dropout(self.attention.combine(context), training=training)
        x = tokens + self._residual(x, self.attention_scale, training)
        x, sizes = bipartite_merge(x, sizes, ops.mean(key[:, prefix:], axis=2), self.r, prefix)
        num_tokens, width = x.shape[1], x.shape[-1]
        y = self.mlp_norm(ops.reshape(x, (-1, width)))
        y = self.dropout(self.mlp_dense_1(y, training=training), training=training)
        y = self.dropout(self.mlp_dense_2(y), training=training)
        y = ops.reshape(y, (-1, num_tokens, width))
        return [x + self._residual(y, self.mlp_scale, training), sizes]

    def compute_output_spec(self, inputs, training=None):
        tokens = inputs[0] if isinstance(inputs, (list, tuple)) else inputs
        batch, n, width = tokens.shape
        return [
            keras.KerasTensor((batch, n - self.r, width), tokens.dtype),
            keras.KerasTensor((batch, n - self.r - self.num_prefix_tokens), "float32"),
        ]

    def get_config(self):
        config = super().get_config()
        config.update({"r": self.r, "num_prefix_tokens": self.num_prefix_tokens})
        return config
