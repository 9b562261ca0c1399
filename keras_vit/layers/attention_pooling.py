"""Multihead attention pooling (MAP): a learned probe attends over the tokens."""

import keras
from keras import ops

from keras_vit.layers import fake_quantization
from keras_vit.layers.gelu_dense import GeluDense, QuantizationAwareDense
from keras_vit.layers.layer_normalization import LayerNormalization
from keras_vit.layers.multi_head_self_attention import (
    ATTENTION_POINTS,
    _projection_initializer,
    fresh_initializer,
    scaled_dot_product,
)
from keras_vit.layers.projection import Projection

# The projections' variables in the layer's own, as files of the earlier layout
# hold them after the probe: kernels, then biases.
_EARLIER_LAYOUT = ("query", "key_value", "out")


@keras.saving.register_keras_serializable(package="keras_vit")
class AttentionPooling(keras.layers.Layer):
    """Pools a token sequence with a learned query (MAP head).

    The pooling of big_vision's `MAPHead` and timm's `AttentionPoolLatent`
    (SigLIP, and ViTs trained with `global_pool="map"`): one learned probe
    token attends over the tokens with multi-head attention, and a pre-norm
    MLP with a residual connection follows:

        x = Attention(query=probe, keys=values=tokens)
        x = x + MLP(LayerNorm(x))

    Prefix tokens (class, distillation, registers) are left out of the keys,
    as timm does by default.

    The probe is the layer's own weight; its projections are sublayers, as
    the encoder's attention's: `query` (kernel `(D, heads, head_dim)`),
    `key_value` (`(D, 2, heads, head_dim)`, keys and values stacked on
    axis 1) and `out` (`(heads, head_dim, D)`), each a `Projection`, which
    Keras' `quantize` and keras_vit's LoRA (`enable_lora`: the query, the
    value's slot of `key_value`) reach as they reach the encoder's.

    Args:
        num_heads: int, attention heads.
        mlp_dim: int, the hidden width of the MLP.
        num_prefix_tokens: int, leading tokens the probe does not attend
            to. Defaults to 0.
        approximate_gelu: bool, tanh GELU (`True`) or exact (`False`).
            Defaults to `False` (timm's).
        layer_norm_epsilon: float. Defaults to 1e-6.
        kernel_initializer: initializer of the projections and the MLP.
            Defaults to `"glorot_uniform"` (big_vision's `xavier_uniform`).
        qat: `None`, `"int8"` or `"int8_full"`: the LiteRT mode that training
            simulates (`layers.fake_quantization`), as the encoder's blocks
            do: the projections and the MLP, the probabilities and the
            context and, with `"int8_full"`, the scaled query, the logits,
            the norm's steps and the residual addition. The norm then has
            no scale and offset (a quantization-aware copy folds them into
            `mlp_dense_1`).
        **kwargs: base layer keyword arguments, e.g. `name` and `dtype`.

    Call arguments:
        inputs: tokens `(batch, tokens, hidden_dim)`.
        sizes: `None`, or `(batch, tokens - num_prefix_tokens)`: the patches
            each token stands for after token merging
            (`models.merge_tokens`); each key's logit gains `log(size)`, as
            ToMe's proportional attention (a token of size 2 weighs as the
            two tokens it was).

    Returns:
        `(batch, hidden_dim)`.

    Example:

    >>> pool = AttentionPooling(num_heads=2, mlp_dim=32)
    >>> tuple(pool(keras.ops.zeros((3, 5, 8))).shape)
    (3, 8)
    """

    def __init__(
        self,
        num_heads,
        mlp_dim,
        num_prefix_tokens=0,
        approximate_gelu=False,
        layer_norm_epsilon=1e-6,
        kernel_initializer="glorot_uniform",
        qat=None,
        **kwargs,
    ):
        super().__init__(**kwargs)
        self.qat = fake_quantization.check_qat(qat)
        for name, value, least in (
            ("num_heads", num_heads, 1),
            ("mlp_dim", mlp_dim, 1),
            ("num_prefix_tokens", num_prefix_tokens, 0),
        ):
            if not isinstance(value, int) or isinstance(value, bool) or value < least:
                raise ValueError(f"`{name}` must be an int >= {least}. Received: {name}={value!r}")
        self.num_heads = num_heads
        self.mlp_dim = mlp_dim
        self.num_prefix_tokens = num_prefix_tokens
        self.approximate_gelu = approximate_gelu
        self.layer_norm_epsilon = layer_norm_epsilon
        self.kernel_initializer = keras.initializers.get(kernel_initializer)
        common = {"dtype": self.dtype_policy}
        self.norm = LayerNormalization(
            epsilon=layer_norm_epsilon, qat=self.qat, name="norm", **common
        )
        self.mlp_dense_1 = GeluDense(
            mlp_dim,
            approximate=approximate_gelu,
            kernel_initializer=self._initializer(),
            qat=self.qat,
            name="mlp_dense_1",
            **common,
        )
        self.mlp_dense_2 = None  # its width is known in build()

    def _initializer(self):
        return fresh_initializer(self.kernel_initializer)

    def build(self, input_shape):
        hidden_dim = input_shape[-1]
        if len(input_shape) != 3 or hidden_dim is None:
            raise ValueError(
                "AttentionPooling expects tokens of shape (batch, tokens, hidden_dim) "
                f"with a known hidden_dim. Received: input_shape={tuple(input_shape)}"
            )
        if hidden_dim % self.num_heads:
            raise ValueError(
                f"hidden_dim {hidden_dim} is not divisible by num_heads {self.num_heads}."
            )
        self.hidden_dim = hidden_dim
        head_dim = hidden_dim // self.num_heads
        self.probe = self.add_weight(
            name="probe", shape=(1, 1, hidden_dim), initializer=self._initializer()
        )
        heads = (self.num_heads, head_dim)

        def projection(equation, output_shape, bias_axes, kernel_shape, name, **options):
            return Projection(
                equation,
                output_shape,
                bias_axes=bias_axes,
                kernel_initializer=_projection_initializer(
                    self._initializer(), hidden_dim, hidden_dim, kernel_shape
                ),
                qat=self.qat,
                name=name,
                dtype=self.dtype_policy,
                **options,
            )

        # (Its kernel is one projection, `(D, heads, head_dim)`: LoRA's slot 0.)
        self.query = projection(
            "ab,bcd->acd", heads, "cd", (hidden_dim, *heads), "query", slotted=False
        )
        self.query.build((None, hidden_dim))
        # Keys and values are the right operands of LiteRT's int8 batch
        # matmuls, taken at zero point 0 (as the encoder's attention's).
        self.key_value = projection(
            "ab,bcde->acde",
            (2, *heads),
            "cde",
            (hidden_dim, 2, *heads),
            "key_value",
            symmetric_outputs=True,
        )
        self.key_value.build((None, hidden_dim))
        # (Its inputs, the context, are rounded here.)
        self.out = projection(
            "abc,bcd->ad", (hidden_dim,), "d", (*heads, hidden_dim), "out", round_inputs=False
        )
        self.out.build((None, *heads))
        dense = keras.layers.Dense if self.qat is None else QuantizationAwareDense
        self.mlp_dense_2 = dense(
            hidden_dim,
            kernel_initializer=self._initializer(),
            name="mlp_dense_2",
            dtype=self.dtype_policy,
            # (Its inputs, GELU's outputs, are rounded by `mlp_dense_1`.)
            **({} if self.qat is None else {"qat": self.qat, "round_inputs": False}),
        )
        probe_shape = (None, hidden_dim)
        self.norm.build(probe_shape)
        levels = self.out.quantizers.get("outputs")
        if levels is not None:  # (the norm reads `out`'s int8 outputs; their range is not moved)
            self.norm.round_to_input_levels = lambda x: levels(x, training=False)
        self.mlp_dense_1.build(probe_shape)
        self.mlp_dense_2.build((None, self.mlp_dim))
        self.quantizers = fake_quantization.quantizers(
            self.qat, {**ATTENTION_POINTS, "mlp_residual": "steps"}
        )

    def load_own_variables(self, store):
        # Files of the earlier layout hold the projections' variables in this
        # layer's own, after the probe: the three kernels, then their biases.
        count = len(store.keys())
        if count == 1:
            return super().load_own_variables(store)
        if count != 1 + 2 * len(_EARLIER_LAYOUT):
            raise ValueError(
                f"Layer {self.name!r} expected 1 variable (or 7 of the earlier file layout), "
                f"but received {count} variables during loading."
            )
        self.probe.assign(store["0"])
        for index, name in enumerate(_EARLIER_LAYOUT):
            getattr(self, name).assign_loaded(store[str(1 + index)], store[str(4 + index)])

    def call(self, inputs, sizes=None, training=None):
        def point(name, x):
            return fake_quantization.at_point(self.quantizers, name, x, training)

        tokens = inputs[:, self.num_prefix_tokens :]
        head_dim = self.hidden_dim // self.num_heads
        # The probe's query, `(1, 1, heads, head_dim)`: one query for every image.
        query = ops.reshape(self.query(self.probe[0], training=training), (1, 1, -1, head_dim))
        key_value = self.key_value(ops.reshape(tokens, (-1, self.hidden_dim)), training=training)
        key_value = ops.reshape(key_value, (ops.shape(tokens)[0], -1, 2, self.num_heads, head_dim))
        key, value = (ops.squeeze(part, axis=2) for part in ops.split(key_value, 2, axis=2))
        # The encoder's attention arithmetic (and rounding), the query broadcast
        # over the batch; the softmax in float32 under mixed precision.
        key_bias = None if sizes is None else ops.log(ops.cast(sizes, "float32"))
        context, _ = scaled_dot_product(query, key, value, point, key_bias=key_bias)
        x = self.out(ops.reshape(context, (-1, self.num_heads, head_dim)), training=training)
        y = self.mlp_dense_1(self.norm(x, training=training), training=training)
        x = point("mlp_residual", x + self.mlp_dense_2(y, training=training))
        return x

    def compute_output_shape(self, input_shape):
        return (input_shape[0], input_shape[-1])

    def compute_output_spec(self, inputs, sizes=None, training=None):
        return keras.KerasTensor(self.compute_output_shape(inputs.shape), self.compute_dtype)

    def get_config(self):
        config = super().get_config()
        config.update(
            {
                "num_heads": self.num_heads,
                "mlp_dim": self.mlp_dim,
                "num_prefix_tokens": self.num_prefix_tokens,
                "approximate_gelu": self.approximate_gelu,
                "layer_norm_epsilon": self.layer_norm_epsilon,
                "kernel_initializer": keras.initializers.serialize(self.kernel_initializer),
                "qat": self.qat,
            }
        )
        return config
