"""Multi-head self-attention with a fused q/k/v projection."""

import keras
from keras import ops

from keras_vit.layers import fake_quantization
from keras_vit.layers.projection import Projection
from keras_vit.layers.rotary_position_embedding import ROTATION_POINTS, rotate
from keras_vit.ops.attention import fused_attention, fused_attention_kernel_available
from keras_vit.ops.switch import fast_kernels_enabled


def fresh_initializer(initializer):
    """A new copy of a Keras initializer, so that unseeded copies draw independently."""
    return initializer.__class__.from_config(initializer.get_config())


def _projection_initializer(initializer, fan_in, fan_out, shape):
    """Initialises a kernel of `shape` as stacked `(fan_in, fan_out)` matrices.

    Keras derives fans from a kernel's last two axes, which is wrong for the
    `(D, 3, heads, head_dim)` and `(heads, head_dim, D)` layouts here. Like
    Flax's `DenseGeneral` (the reference implementation), each projection is
    drawn as a plain `(D, D)` matrix and reshaped. Each projection gets its
    own copy of the initializer, as `keras.layers.MultiHeadAttention` does,
    so unseeded draws are independent.
    """
    count = 1
    for size in shape:
        count *= size
    count //= fan_in * fan_out

    def initialize(shape, dtype=None):
        draws = [
            initializer.__class__.from_config(initializer.get_config())(
                (fan_in, fan_out), dtype=dtype
            )
            for _ in range(count)
        ]
        return ops.reshape(ops.stack(draws, axis=1), shape)

    return initialize


def attention_output_spec(layer, inputs, return_attention_scores):
    """Symbolic outputs of a layer that can also return attention scores.

    Tokens keep the input's shape; scores are float32
    `(batch, layer.num_heads, num_tokens, num_tokens)`.
    """
    outputs = keras.KerasTensor(inputs.shape, dtype=layer.compute_dtype)
    if not return_attention_scores:
        return outputs
    batch, num_tokens = inputs.shape[0], inputs.shape[1]
    scores = keras.KerasTensor((batch, layer.num_heads, num_tokens, num_tokens), dtype="float32")
    return outputs, scores


# The quantization points of an attention's scaled dot product and their
# kinds (`fake_quantization`): LiteRT's "int8" computes the
# probabilities-value product in int8 too, its operands and its consumer are.
ATTENTION_POINTS = {
    "scaled_query": "steps",
    "logits": "steps",
    "probabilities": "activations",
    "context": "activations",
}


def scaled_dot_product(query, key, value, point, key_bias=None, full_precision=False, drop=None):
    """Attention as two batched matmuls over head-major tensors; also the probabilities.

    Takes `(batch, tokens, heads, head_dim)` queries, keys and values (a
    batch or token axis of 1 broadcasts: a MAP head's one probe) and returns
    the context of the queries' shape and the probabilities `(batch, heads,
    queries, keys)` in float32. The query is scaled before the product, as
    in the reference (Flax). With `full_precision`, the logits are computed
    in float32 even under mixed precision (for returned scores); otherwise
    in the compute dtype and the softmax in float32, as the fused op does.
    `key_bias` (`(batch, keys)`, float32) is added to the logits of every
    query. `point(name, x)` rounds at each of `ATTENTION_POINTS` (a
    quantization-aware layer's; the identity elsewhere); `drop` is the
    probabilities' dropout, if any. The keys and values are the matmuls'
    right operands, as LiteRT's int8 BATCH_MATMUL takes them.
    """
    head_dim = query.shape[-1]
    if full_precision:
        query, key = ops.cast(query, "float32"), ops.cast(key, "float32")
    query = ops.transpose(point("scaled_query", query * head_dim**-0.5), (0, 2, 1, 3))
    logits = ops.cast(ops.matmul(query, ops.transpose(key, (0, 2, 3, 1))), "float32")
    if key_bias is not None:  # (batch, keys): added to every head's and query's logits
        logits = logits + key_bias[:, None, None, :]
    scores = point("probabilities", ops.softmax(point("logits", logits), axis=-1))
    probabilities = scores if drop is None else drop(scores)
    context = ops.matmul(ops.cast(probabilities, value.dtype), ops.transpose(value, (0, 2, 1, 3)))
    return ops.transpose(point("context", context), (0, 2, 1, 3)), scores


@keras.saving.register_keras_serializable(package="keras_vit")
class MultiHeadSelfAttention(keras.layers.Layer):
    """Multi-head scaled dot-product self-attention (MSA) of ViT.

    Queries, keys and values come from one fused projection, the sublayer
    `qkv`, whose kernel has shape `(hidden_dim, 3, num_heads, head_dim)`
    (q, k, v stacked on axis 1, heads on their own axis so that they can be
    sharded); the output projection `out` has a kernel of shape
    `(num_heads, head_dim, hidden_dim)`. Both are `Projection`s, Keras
    `EinsumDense` layers: `model.quantize(...)`, `enable_lora` and a
    `DTypePolicyMap` reach them as any Keras projection.
    Where `keras.ops.dot_product_attention` is a fused kernel (PyTorch's
    SDPA, JAX on a GPU) attention runs on it (`keras_vit.ops.attention`).
    Elsewhere, with the fast kernels switched off
    (`keras_vit.ops.disable_fast_kernels`), and on any backend when the
    attention probabilities are asked for (logits then in float32) or
    attention dropout is active, it runs as two batched matmuls over
    head-major tensors with the softmax in float32.

    Args:
        num_heads: int, the number of attention heads; must divide the
            width of the inputs.
        dropout: float, dropout rate on the attention probabilities.
            Defaults to 0.
        use_bias: bool, whether the projections have biases.
        kernel_initializer: initializer of each projection, drawn per
            `(hidden_dim, hidden_dim)` matrix. Defaults to
            `"glorot_uniform"` (Xavier uniform, as in the reference).
        bias_initializer: initializer of the biases. Defaults to `"zeros"`.
        seed: int, seed of the attention dropout.
        qat: `None`, `"int8"` or `"int8_full"`: the LiteRT mode that training
            simulates (`layers.fake_quantization`), in the projections, the
            probabilities and the context and, with `"int8_full"`, in the
            scaled query and the logits.
        **kwargs: base layer keyword arguments, e.g. `name` and `dtype`.

    Call arguments:
        inputs: tokens of shape `(batch, num_tokens, hidden_dim)`.
        training: bool, whether attention dropout is active.
        return_attention_scores: bool, whether to also return the attention
            probabilities.
        rotation: `None`, or the rotation of a `RotaryPositionEmbedding2D`
            (`(2, num_tokens, head_dim)`) that turns the queries and keys
            by their tokens' positions (DINOv3).

    Returns:
        Tokens of the shape of `inputs`; with `return_attention_scores=True`,
        the tuple `(tokens, probabilities)`, the probabilities of shape
        `(batch, num_heads, num_tokens, num_tokens)` in float32.

    Example:

    >>> layer = MultiHeadSelfAttention(num_heads=4)
    >>> tokens, scores = layer(
    ...     keras.ops.ones((2, 5, 32)), return_attention_scores=True
    ... )
    >>> tuple(tokens.shape), tuple(scores.shape)
    ((2, 5, 32), (2, 4, 5, 5))
    """

    def __init__(
        self,
        num_heads,
        dropout=0.0,
        use_bias=True,
        kernel_initializer="glorot_uniform",
        bias_initializer="zeros",
        seed=None,
        qat=None,
        **kwargs,
    ):
        super().__init__(**kwargs)
        self.qat = fake_quantization.check_qat(qat)
        if not isinstance(num_heads, int) or num_heads < 1:
            raise ValueError(
                f"`num_heads` must be a positive int. Received: num_heads={num_heads!r}"
            )
        if not 0 <= dropout < 1:
            raise ValueError(f"`dropout` must be in [0, 1). Received: dropout={dropout!r}")
        self.num_heads = num_heads
        self.dropout = dropout
        self.use_bias = use_bias
        self.kernel_initializer = keras.initializers.get(kernel_initializer)
        self.bias_initializer = keras.initializers.get(bias_initializer)
        self.seed = seed
        self.seed_generator = keras.random.SeedGenerator(seed)

    def build(self, inputs_shape, rotation_shape=None):
        hidden_dim = inputs_shape[-1]
        if len(inputs_shape) != 3 or hidden_dim is None:
            raise ValueError(
                "MultiHeadSelfAttention expects tokens of shape "
                "(batch, num_tokens, hidden_dim) with a known hidden_dim. "
                f"Received: input_shape={tuple(inputs_shape)}"
            )
        if hidden_dim % self.num_heads:
            raise ValueError(
                f"hidden_dim {hidden_dim} is not divisible by num_heads {self.num_heads}."
            )
        self.hidden_dim = hidden_dim
        self.head_dim = hidden_dim // self.num_heads
        heads = (self.num_heads, self.head_dim)

        def projection(equation, output_shape, bias_axes, kernel_shape, name, **options):
            return Projection(
                equation,
                output_shape,
                bias_axes=bias_axes if self.use_bias else None,
                kernel_initializer=_projection_initializer(
                    self.kernel_initializer, hidden_dim, hidden_dim, kernel_shape
                ),
                bias_initializer=fresh_initializer(self.bias_initializer),
                qat=self.qat,
                name=name,
                dtype=self.dtype_policy,
                **options,
            )

        # (D, 3, heads, head_dim): q, k and v stacked on axis 1.
        # Keys and values are the right operands of LiteRT's int8 batch
        # matmuls, whose XNNPACK kernel takes them at zero point 0.
        self.qkv = projection(
            "ab,bcde->acde",
            (3, *heads),
            "cde",
            (hidden_dim, 3, *heads),
            "qkv",
            symmetric_outputs=True,
        )
        self.qkv.build((None, hidden_dim))
        # (heads, head_dim, D).
        # (Its inputs, the context, are rounded by the attention.)
        self.out = projection(
            "abc,bcd->ad", (hidden_dim,), "d", (*heads, hidden_dim), "out", round_inputs=False
        )
        self.out.build((None, *heads))
        # A rotary attention (one called with a rotation) rounds its turns too;
        # the rotated keys are the batch matmul's right operand.
        points = {**ATTENTION_POINTS, **(ROTATION_POINTS if rotation_shape is not None else {})}
        self.quantizers = fake_quantization.quantizers(self.qat, points, symmetric=("key_rotated",))

    def load_own_variables(self, store):
        # Files of the earlier layout hold the projections' variables in this
        # layer's own: the qkv and out kernels, then their biases.
        count = len(store.keys())
        if not count:
            return
        if count != 2 + 2 * self.use_bias:
            raise ValueError(
                f"Layer {self.name!r} expected {2 + 2 * self.use_bias} variables of the "
                f"earlier file layout, but received {count} variables during loading."
            )
        biases = (store["2"], store["3"]) if self.use_bias else (None, None)
        self.qkv.assign_loaded(store["0"], biases[0])
        self.out.assign_loaded(store["1"], biases[1])

    def call(self, inputs, training=None, return_attention_scores=False, rotation=None):
        query, key, value = self.project(inputs)
        if rotation is not None:

            def point(name, x):
                return fake_quantization.at_point(self.quantizers, name, x, training)

            query, key = (
                rotate(query, rotation, point, "query"),
                rotate(key, rotation, point, "key"),
            )
        use_dropout = bool(training) and self.dropout > 0
        explicit = return_attention_scores or use_dropout or self.qat is not None
        if explicit or not (fast_kernels_enabled() and fused_attention_kernel_available()):
            context, scores = self.attend(
                query,
                key,
                value,
                use_dropout,
                full_precision=return_attention_scores,
                training=training,
            )
        else:
            context = fused_attention(query, key, value)
        outputs = self.combine(context)
        if return_attention_scores:
            return outputs, scores
        return outputs

    def project(self, inputs):
        """The query, key and value of `inputs`, each `(batch, tokens, heads, head_dim)`."""
        num_tokens = ops.shape(inputs)[1]
        # Projections run on (batch * tokens, width) matrices: TensorFlow
        # then runs a oneDNN inner product with the bias fused in; on 3-D
        # tokens it ran a plain GEMM and a separate bias add.
        qkv = self.qkv(ops.reshape(inputs, (-1, self.hidden_dim)))
        qkv = ops.reshape(qkv, (-1, 3 * self.hidden_dim))
        # An even split of the last axis (not indexing a 5-D tensor) keeps
        # the graph inside one XNNPACK partition when converted to TFLite.
        return tuple(
            ops.reshape(part, (-1, num_tokens, self.num_heads, self.head_dim))
            for part in ops.split(qkv, 3, axis=-1)
        )

    def combine(self, context):
        """The output projection of the heads' `context`, `(batch, tokens, heads, head_dim)`."""
        num_tokens = ops.shape(context)[1]
        outputs = self.out(ops.reshape(context, (-1, self.num_heads, self.head_dim)))
        return ops.reshape(outputs, (-1, num_tokens, self.hidden_dim))

    def attend(
        self,
        query,
        key,
        value,
        use_dropout=False,
        full_precision=False,
        key_bias=None,
        training=None,
    ):
        """`scaled_dot_product` of this layer: its quantization points, its dropout.

        A quantization-aware layer (`qat="int8_full"`) rounds the scaled
        query, the logits, the probabilities and the context (`training`
        moves their ranges).
        """

        def point(name, x):
            return fake_quantization.at_point(self.quantizers, name, x, training)

        def drop(scores):
            return keras.random.dropout(scores, self.dropout, seed=self.seed_generator)

        return scaled_dot_product(
            query,
            key,
            value,
            point,
            key_bias=key_bias,
            full_precision=full_precision,
            drop=drop if use_dropout else None,
        )

    def compute_output_shape(self, input_shape):
        return tuple(input_shape)

    def compute_output_spec(
        self, inputs, training=None, return_attention_scores=False, rotation=None
    ):
        return attention_output_spec(self, inputs, return_attention_scores)

    def get_config(self):
        config = super().get_config()
        config.update(
            {
                "num_heads": self.num_heads,
                "dropout": self.dropout,
                "use_bias": self.use_bias,
                "kernel_initializer": keras.initializers.serialize(self.kernel_initializer),
                "bias_initializer": keras.initializers.serialize(self.bias_initializer),
                "seed": self.seed,
                "qat": self.qat,
            }
        )
        return config
