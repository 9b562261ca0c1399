from unittest import mock

import keras
import numpy as np
import pytest
from keras import ops
from keras.src import testing

from keras_vit.layers import MultiHeadSelfAttention
from keras_vit.layers import multi_head_self_attention as attention_module
from keras_vit.ops import attention as fused_attention_module
from tests import reference
from tests.reference import random_tokens


class MultiHeadSelfAttentionTest(testing.TestCase):
    def test_layer_basics(self):
        self.run_layer_test(
            MultiHeadSelfAttention,
            init_kwargs={"num_heads": 2},
            input_shape=(2, 5, 8),
            expected_output_shape=(2, 5, 8),
            expected_num_trainable_weights=4,
            expected_num_seed_generators=1,
        )

    def test_matches_reference_computation(self):
        layer = MultiHeadSelfAttention(num_heads=4, bias_initializer="random_normal")
        x = random_tokens()
        outputs, scores = layer(x, return_attention_scores=True)
        w = reference.weights_by_path(layer)
        expected, probs = reference.self_attention(
            x.astype("float64"),
            w["qkv/kernel"],
            w["qkv/bias"],
            w["out/kernel"],
            w["out/bias"],
        )
        self.assertAllClose(ops.convert_to_numpy(outputs), expected, atol=1e-5)
        self.assertAllClose(ops.convert_to_numpy(scores), probs, atol=1e-6)
        # The default path (fused where it is a kernel, head-major elsewhere).
        self.assertAllClose(ops.convert_to_numpy(layer(x)), expected, atol=1e-5)

    def test_fused_path_equals_explicit_path(self):
        layer = MultiHeadSelfAttention(num_heads=2)
        x = random_tokens()
        # Forced on every backend: the fused op is used only where it is a
        # real kernel (PyTorch, JAX on a GPU).
        with mock.patch.object(
            attention_module, "fused_attention_kernel_available", return_value=True
        ):
            fused = layer(x)
        explicit, _ = layer(x, return_attention_scores=True)
        self.assertAllClose(fused, explicit, atol=1e-5)

    def test_attention_rows_sum_to_one(self):
        layer = MultiHeadSelfAttention(num_heads=4)
        _, scores = layer(random_tokens(), return_attention_scores=True)
        self.assertEqual(tuple(scores.shape), (2, 4, 5, 5))
        self.assertEqual(ops.convert_to_numpy(scores).dtype, np.float32)
        self.assertAllClose(ops.sum(scores, axis=-1), np.ones((2, 4, 5)), atol=1e-6)

    def test_projections_are_drawn_independently_with_dense_fans(self):
        layer = MultiHeadSelfAttention(num_heads=4)
        layer.build((None, 5, 256))
        qkv = ops.convert_to_numpy(layer.qkv.kernel)
        q, k, v = (qkv[:, i].reshape(256, 256) for i in range(3))
        self.assertFalse(np.allclose(q, k))
        self.assertFalse(np.allclose(k, v))
        # Xavier uniform of a (256, 256) matrix has variance 1 / 256.
        for matrix in (q, k, v, ops.convert_to_numpy(layer.out.kernel)):
            assert abs(float(np.std(matrix)) - 1 / 16) < 0.003

    def test_attention_dropout_only_in_training(self):
        layer = MultiHeadSelfAttention(num_heads=2, dropout=0.5, seed=1)
        x = random_tokens()
        self.assertAllClose(layer(x, training=False), layer(x, training=False))
        self.assertNotAllClose(layer(x, training=True), layer(x, training=False))

    def test_bad_arguments(self):
        with pytest.raises(ValueError, match="num_heads=0"):
            MultiHeadSelfAttention(num_heads=0)
        with pytest.raises(ValueError, match="hidden_dim 10 is not divisible by num_heads 4"):
            MultiHeadSelfAttention(num_heads=4)(random_tokens((1, 3, 10)))


def _jax_implementations():
    """`padded_dot_product_attention`'s implementations runnable here."""
    if keras.backend.backend() != "jax":
        return []
    on_cuda = fused_attention_module._jax_on_cuda()
    return [
        "xla",
        pytest.param(
            "cudnn", marks=pytest.mark.skipif(not on_cuda, reason="cuDNN's kernel needs a CUDA GPU")
        ),
    ]


@pytest.mark.parametrize("implementation", _jax_implementations())
@pytest.mark.parametrize("num_tokens", [5, 197])
def test_padded_attention_has_the_values_and_gradients_of_unpadded(implementation, num_tokens):
    # The padded keys must get no weight and the padded queries no gradient.
    import jax
    import jax.numpy as jnp

    dtype = "float32" if implementation == "xla" else "bfloat16"
    rng = np.random.default_rng(1)
    q, k, v, upstream = (
        jnp.asarray(rng.normal(size=(2, num_tokens, 2, 64)), dtype) for _ in range(4)
    )

    def loss(attention):
        return lambda q, k, v: jnp.sum((attention(q, k, v) * upstream).astype("float32"))

    padded = lambda q, k, v: fused_attention_module.padded_dot_product_attention(  # noqa: E731
        q, k, v, 8, implementation=implementation
    )
    unpadded = lambda q, k, v: jax.nn.dot_product_attention(  # noqa: E731
        *(t.astype("float32") for t in (q, k, v))
    )
    tolerance = 1e-5 if dtype == "float32" else 3e-2
    # Compiled, as a training step runs it (op by op, each op compiles alone).
    np.testing.assert_allclose(
        np.asarray(jax.jit(padded)(q, k, v), "float32"),
        np.asarray(jax.jit(unpadded)(q, k, v)),
        atol=tolerance,
    )
    ours = jax.jit(jax.grad(loss(padded), argnums=(0, 1, 2)))(q, k, v)
    expected = jax.jit(jax.grad(loss(unpadded), argnums=(0, 1, 2)))(q, k, v)
    for name, a, b in zip("qkv", ours, expected):
        np.testing.assert_allclose(
            np.asarray(a, "float32"), np.asarray(b, "float32"), atol=tolerance * 4, err_msg=name
        )


@pytest.mark.skipif(
    keras.backend.backend() != "jax" or not fused_attention_module._jax_on_cuda(),
    reason="cuDNN's fused attention: JAX on a CUDA GPU",
)
def test_bfloat16_training_on_the_fused_kernel_with_an_odd_token_count():
    # ViT-B/16's 197 tokens: cuDNN refuses odd lengths for training unless padded.
    import jax

    layer = MultiHeadSelfAttention(num_heads=12, dtype="mixed_bfloat16")
    x = random_tokens((2, 197, 768)).astype("float32")
    layer.build(x.shape)

    def loss(weights, x):
        with keras.StatelessScope(state_mapping=list(zip(layer.trainable_variables, weights))):
            return ops.sum(ops.cast(layer(x), "float32") ** 2)

    weights = [v.value for v in layer.trainable_variables]
    compiled = jax.jit(jax.grad(loss)).lower(weights, x).compile()
    assert "__cudnn$fmha" in compiled.as_text()
    fused = compiled(weights, x)
    with mock.patch.object(
        attention_module, "fused_attention_kernel_available", return_value=False
    ):
        explicit = jax.grad(loss)(weights, x)
    for a, b in zip(fused, explicit):
        a, b = np.asarray(a, "float32"), np.asarray(b, "float32")
        assert np.linalg.norm(a - b) <= 0.02 * np.linalg.norm(b)
