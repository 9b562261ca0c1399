"""The pre-norm Transformer encoder block of ViT."""

import contextlib

import keras
from keras import ops

from keras_vit.layers import fake_quantization
from keras_vit.layers.gelu_dense import GeluDense, QuantizationAwareDense, SwiGLUDense
from keras_vit.layers.layer_normalization import LayerNormalization
from keras_vit.layers.layer_scale import LayerScale
from keras_vit.layers.multi_head_self_attention import (
    MultiHeadSelfAttention,
    attention_output_spec,
    fresh_initializer,
)
from keras_vit.layers.stochastic_depth import StochasticDepth

# The MLPs a block builds: the paper's, and the gated one.
MLPS = ("gelu", "swiglu")


def check_mlp(mlp):
    """Refuses an MLP kind that a block does not build."""
    if mlp not in MLPS:
        raise ValueError(f"`mlp` must be one of {MLPS}. Received: mlp={mlp!r}")


@keras.saving.register_keras_serializable(package="keras_vit")
class TransformerBlock(keras.layers.Layer):
    """One pre-norm encoder block: `x + MSA(LN(x))`, then `x + MLP(LN(x))`.

    The MLP is `Dense(mlp_dim)`, GELU, dropout, `Dense(hidden_dim)`, dropout
    (paper, eq. 2-3). Each residual branch can carry LayerScale and
    stochastic depth. LayerNorm epsilon defaults to 1e-6 and GELU to its
    tanh approximation, as in the original checkpoints (the tanh form also
    keeps `Erf` out of TFLite graphs). Under mixed precision LayerNorm and
    the attention softmax compute in float32.

    Args:
        num_heads: int, the number of attention heads.
        mlp_dim: int, the hidden width of the MLP.
        dropout_rate: float, dropout after the attention and in the MLP.
        attention_dropout_rate: float, dropout on the attention
            probabilities.
        drop_path_rate: float, the stochastic depth rate of both branches.
        layer_scale_init: float or `None`; when set, both branches are
            scaled by LayerScale factors starting at this value.
        approximate_gelu: bool, `True` for tanh-approximated GELU (original
            ViT), `False` for the exact erf form (Hugging Face ViT, DINOv2).
        mlp: `"gelu"` (the paper's `Dense`, GELU, `Dense`) or `"swiglu"`
            (a gated MLP, `SwiGLUDense` then `Dense`: DINOv3's larger models).
        layer_norm_epsilon: float, the LayerNorm epsilon.
        use_qkv_bias: bool, whether the q/k/v projection has a bias.
        kernel_initializer: initializer of the projection and MLP kernels.
            Defaults to `"glorot_uniform"`.
        mlp_bias_initializer: initializer of the MLP biases. Defaults to
            `RandomNormal(stddev=1e-6)`, as in the reference.
        seed: int, seed of the dropout and stochastic depth draws.
        remat: bool, whether training recomputes the block's activations in
            the backward pass instead of keeping them (gradient
            checkpointing, `keras.remat`: less memory for about a third
            more compute). The gradients are the same: the random draws of
            dropout and stochastic depth are made once per step, outside
            the recomputed function, and replayed in it.
        qat: `None`, `"int8"` or `"int8_full"`: the LiteRT mode that training
            simulates (`layers.fake_quantization`), in every sublayer and,
            with `"int8_full"`, in the two residual additions.
        **kwargs: base layer keyword arguments, e.g. `name` and `dtype`.

    Call arguments:
        inputs: tokens of shape `(batch, num_tokens, hidden_dim)`.
        training: bool, whether dropout and stochastic depth are active.
        return_attention_scores: bool, whether to also return the attention
            probabilities `(batch, num_heads, num_tokens, num_tokens)`.
        rotation: `None`, or a `RotaryPositionEmbedding2D`'s rotation of
            the queries and keys (`MultiHeadSelfAttention`).

    Returns:
        Tokens of the shape of `inputs`, or `(tokens, probabilities)`.

    Example:

    >>> block = TransformerBlock(num_heads=2, mlp_dim=64)
    >>> tuple(block(keras.ops.ones((2, 5, 16))).shape)
    (2, 5, 16)
    """

    def __init__(
        self,
        num_heads,
        mlp_dim,
        dropout_rate=0.0,
        attention_dropout_rate=0.0,
        drop_path_rate=0.0,
        layer_scale_init=None,
        approximate_gelu=True,
        layer_norm_epsilon=1e-6,
        mlp="gelu",
        use_qkv_bias=True,
        kernel_initializer="glorot_uniform",
        mlp_bias_initializer=None,
        seed=None,
        remat=False,
        qat=None,
        **kwargs,
    ):
        super().__init__(**kwargs)
        self.qat = fake_quantization.check_qat(qat)
        if not isinstance(mlp_dim, int) or mlp_dim < 1:
            raise ValueError(f"`mlp_dim` must be a positive int. Received: mlp_dim={mlp_dim!r}")
        for name, rate in (
            ("dropout_rate", dropout_rate),
            ("drop_path_rate", drop_path_rate),
        ):
            if not 0 <= rate < 1:
                raise ValueError(f"`{name}` must be in [0, 1). Received: {name}={rate!r}")
        check_mlp(mlp)
        self.num_heads = num_heads
        self.mlp_dim = mlp_dim
        self.mlp = mlp
        self.dropout_rate = dropout_rate
        self.attention_dropout_rate = attention_dropout_rate
        self.drop_path_rate = drop_path_rate
        self.layer_scale_init = layer_scale_init
        self.approximate_gelu = approximate_gelu
        self.layer_norm_epsilon = layer_norm_epsilon
        self.use_qkv_bias = use_qkv_bias
        self.kernel_initializer = keras.initializers.get(kernel_initializer)
        self.mlp_bias_initializer = keras.initializers.get(
            mlp_bias_initializer or keras.initializers.RandomNormal(stddev=1e-6)
        )
        self.seed = seed
        if not isinstance(remat, bool):
            raise TypeError(f"`remat` must be a bool. Received: remat={remat!r}")
        self.remat = remat

        def sublayer_seed(offset):
            return None if seed is None else seed + offset

        common = {"dtype": self.dtype_policy}
        simulated = {"qat": self.qat}
        self.attention_norm = LayerNormalization(
            epsilon=layer_norm_epsilon, name="attention_norm", **simulated, **common
        )
        self.attention = MultiHeadSelfAttention(
            num_heads,
            dropout=attention_dropout_rate,
            use_bias=use_qkv_bias,
            kernel_initializer=kernel_initializer,
            seed=sublayer_seed(1),
            name="attention",
            **simulated,
            **common,
        )
        self.mlp_norm = LayerNormalization(
            epsilon=layer_norm_epsilon, name="mlp_norm", **simulated, **common
        )
        # GELU inside the Dense: TensorFlow then fuses it into the matmul at
        # inference; its backward pass keeps only the pre-activation and is
        # XLA-compiled on TensorFlow (see `layers/gelu.py`).
        first = dict(
            kernel_initializer=fresh_initializer(self.kernel_initializer),
            bias_initializer=fresh_initializer(self.mlp_bias_initializer),
            name="mlp_dense_1",
            **common,
        )
        if mlp == "swiglu":
            self.mlp_dense_1 = SwiGLUDense(mlp_dim, **first, **simulated)
        else:
            self.mlp_dense_1 = GeluDense(
                mlp_dim, approximate=approximate_gelu, **first, **simulated
            )
        self.mlp_dense_2 = None  # its width is known in build()
        self.dropout = keras.layers.Dropout(
            dropout_rate, seed=sublayer_seed(2), name="dropout", **common
        )
        self.drop_path = StochasticDepth(
            drop_path_rate, seed=sublayer_seed(3), name="drop_path", **common
        )
        if layer_scale_init is None:
            self.attention_scale = self.mlp_scale = None
        else:
            self.attention_scale = LayerScale(layer_scale_init, name="attention_scale", **common)
            self.mlp_scale = LayerScale(layer_scale_init, name="mlp_scale", **common)

    def build(self, inputs_shape, rotation_shape=None):
        hidden_dim = inputs_shape[-1]
        if len(inputs_shape) != 3 or hidden_dim is None:
            raise ValueError(
                "TransformerBlock expects tokens of shape "
                "(batch, num_tokens, hidden_dim) with a known hidden_dim. "
                f"Received: input_shape={tuple(inputs_shape)}"
            )
        # (A quantization-aware block's rounds; the plain one is Keras' own.)
        dense = keras.layers.Dense if self.qat is None else QuantizationAwareDense
        self.mlp_dense_2 = dense(
            hidden_dim,
            kernel_initializer=fresh_initializer(self.kernel_initializer),
            bias_initializer=fresh_initializer(self.mlp_bias_initializer),
            name="mlp_dense_2",
            dtype=self.dtype_policy,
            # (Its inputs, GELU's outputs, are rounded by `mlp_dense_1`.)
            **({} if self.qat is None else {"qat": self.qat, "round_inputs": False}),
        )
        self.attention_norm.build(inputs_shape)
        self.attention.build(inputs_shape, rotation_shape)
        self.mlp_norm.build(inputs_shape)
        self.mlp_dense_1.build(inputs_shape)
        self.mlp_dense_2.build((*inputs_shape[:-1], self.mlp_dim))
        for scale in (self.attention_scale, self.mlp_scale):
            if scale is not None:
                scale.build(inputs_shape)
        self.quantizers = fake_quantization.quantizers(
            self.qat, {"attention_residual": "steps", "mlp_residual": "steps"}
        )

    def _residual(self, branch, scale, training):
        if scale is not None:
            branch = scale(branch)
        return self.drop_path(branch, training=training)

    def _random_draws(self):
        """`(seed generator, draws)` of one training call, as `_forward` makes them."""
        uses = (  # (Keras' Dropout has a seed generator only when its rate is not 0.)
            (self.attention, self.attention_dropout_rate, 1),
            (self.dropout, self.dropout_rate, 3),
            (self.drop_path, self.drop_path_rate, 2),
        )
        return [(layer.seed_generator, count) for layer, rate, count in uses if rate]

    def call(self, inputs, training=None, return_attention_scores=False, rotation=None):
        if not (self.remat and training) or return_attention_scores:
            return self._forward(inputs, training, return_attention_scores, rotation)
        # The seeds are drawn here, once: a recomputation that drew its own
        # would drop other units than the forward pass did (TensorFlow and
        # PyTorch run the function again), or leak the seeds' new state out
        # of the recomputed function (JAX traces it once).
        drawn = [(g, [g.next() for _ in range(count)]) for g, count in self._random_draws()]

        def forward(tokens):
            with _replaying(drawn):
                return self._forward(tokens, True, False, rotation)

        return keras.remat(forward)(inputs)

    def _forward(self, inputs, training, return_attention_scores, rotation=None):
        x = self.attention_norm(inputs)
        x = self.attention(
            x,
            training=training,
            return_attention_scores=return_attention_scores,
            rotation=rotation,
        )
        if return_attention_scores:
            x, scores = x
        x = self.dropout(x, training=training)
        x = inputs + self._residual(x, self.attention_scale, training)
        x = fake_quantization.at_point(self.quantizers, "attention_residual", x, training)

        # The MLP sees (batch * tokens, width) matrices: on TensorFlow a
        # plain MatMul takes the bias and GELU into one oneDNN kernel, where a
        # batched one leaves them as separate passes over the activations.
        num_tokens, width = ops.shape(x)[1], x.shape[-1]
        y = self.mlp_norm(ops.reshape(x, (-1, width)))
        y = self.mlp_dense_1(y, training=training)
        y = self.dropout(y, training=training)
        y = self.mlp_dense_2(y, training=training)
        y = self.dropout(y, training=training)
        y = ops.reshape(y, (-1, num_tokens, width))
        outputs = x + self._residual(y, self.mlp_scale, training)
        outputs = fake_quantization.at_point(self.quantizers, "mlp_residual", outputs, training)
        if return_attention_scores:
            return outputs, scores
        return outputs

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
                "mlp_dim": self.mlp_dim,
                "dropout_rate": self.dropout_rate,
                "attention_dropout_rate": self.attention_dropout_rate,
                "drop_path_rate": self.drop_path_rate,
                "layer_scale_init": self.layer_scale_init,
                "approximate_gelu": self.approximate_gelu,
                "layer_norm_epsilon": self.layer_norm_epsilon,
                "mlp": self.mlp,
                "use_qkv_bias": self.use_qkv_bias,
                "kernel_initializer": keras.initializers.serialize(self.kernel_initializer),
                "mlp_bias_initializer": keras.initializers.serialize(self.mlp_bias_initializer),
                "seed": self.seed,
                "remat": self.remat,
                "qat": self.qat,
            }
        )
        return config


@contextlib.contextmanager
def _replaying(drawn):
    """Each seed generator of `drawn` gives its drawn seeds, in order, instead of new ones."""
    for generator, seeds in drawn:
        queue = list(seeds)
        generator.next = lambda ordered=True, queue=queue: queue.pop(0)
    try:
        yield
    finally:
        for generator, _ in drawn:
            del generator.next
