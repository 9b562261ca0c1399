"""Token merging (ToMe, Bolya et al., ICLR 2023): fewer tokens in each block, no training."""

import keras
from keras import ops

from keras_vit.layers.transformer_block import TransformerBlock


def bipartite_merge(tokens, sizes, metric, r):
    """Merges the `r` most similar pairs of `tokens` (ToMe's bipartite soft matching).

    The tokens alternate into two sets, A (even positions) and B (odd); each
    token of A is matched to its most similar token of B (cosine similarity
    of `metric`), and the `r` best-matched tokens of A are averaged into
    their matches, weighted by `sizes` (how many patches each token already
    stands for). Shapes stay static (`r` is a Python int): what is merged
    is a gather and a one-hot matmul, so SavedModel, TFLite and ONNX keep
    it.

    Args:
        tokens: `(batch, n, width)`.
        sizes: `(batch, n)` float, the patches each token stands for.
        metric: `(batch, n, d)`, the similarity features (ToMe: the keys,
            averaged over heads).
        r: int in `[0, n // 2]`, the pairs to merge.

    Returns:
        `(tokens, sizes)` of `n - r` tokens: A's unmerged tokens in their
        order, then B's tokens with what was merged into them.
    """
    n = tokens.shape[1]
    if r == 0:
        return tokens, sizes
    metric = metric / ops.sqrt(ops.sum(ops.square(metric), axis=-1, keepdims=True) + 1e-12)
    even, odd = ops.arange(0, n, 2), ops.arange(1, n, 2)
    similarity = ops.matmul(
        ops.take(metric, even, axis=1), ops.transpose(ops.take(metric, odd, axis=1), (0, 2, 1))
    )
    # (`top_k`, not `argmax`: Keras' TensorFlow argmax writes a Bitcast, which ONNX lacks.)
    best, best_match = (t[..., 0] for t in ops.top_k(similarity, k=1))
    # A's tokens by their best similarity, highest first: the first `r` merge.
    order = ops.top_k(best, k=len(range(0, n, 2)), sorted=True)[1]
    merged, kept = order[:, :r], order[:, r:]
    kept = ops.sort(kept, axis=-1)  # back in A's order
    weighted = tokens * sizes[..., None]

    def pick(values, indices):  # values (batch, m, ...) at indices (batch, k)
        return ops.take_along_axis(values, indices[..., None], axis=1)

    halves = [
        (ops.take(weighted, part, axis=1), ops.take(sizes, part, axis=1)[..., None])
        for part in (even, odd)
    ]
    (even_tokens, even_sizes), (odd_tokens, odd_sizes) = halves
    into = ops.one_hot(pick(best_match[..., None], merged)[..., 0], len(range(1, n, 2)))
    into = ops.transpose(ops.cast(into, tokens.dtype), (0, 2, 1))  # (batch, B, r)
    odd_tokens = odd_tokens + ops.matmul(into, pick(even_tokens, merged))
    odd_sizes = odd_sizes + ops.matmul(into, pick(even_sizes, merged))
    sums = ops.concatenate([pick(even_tokens, kept), odd_tokens], axis=1)
    sizes = ops.concatenate([pick(even_sizes, kept), odd_sizes], axis=1)
    return sums / sizes, sizes[..., 0]


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
        context, _ = self.attention._explicit_attention(
            query, key, value, bool(training) and self.attention_dropout_rate > 0, False, key_bias
        )
        x = self.dropout(self.attention.combine(context), training=training)
        x = tokens + self._residual(x, self.attention_scale, training)
        patches, sizes = bipartite_merge(
            x[:, prefix:], sizes, ops.mean(key[:, prefix:], axis=2), self.r
        )
        x = ops.concatenate([x[:, :prefix], patches], axis=1)
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
