import keras
import numpy as np
import pytest
from keras import ops
from keras.src import testing

from keras_vit.layers import TransformerBlock
from tests import reference
from tests.reference import random_tokens


def randomize(layer, seed=0):
    rng = np.random.default_rng(seed)
    for weight in layer.weights:
        weight.assign(rng.normal(0, 0.3, weight.shape).astype("float32"))


class TransformerBlockTest(testing.TestCase):
    def test_layer_basics(self):
        self.run_layer_test(
            TransformerBlock,
            init_kwargs={"num_heads": 2, "mlp_dim": 16, "dropout_rate": 0.1},
            input_shape=(2, 5, 8),
            expected_output_shape=(2, 5, 8),
            expected_num_trainable_weights=12,
        )

    def test_layer_scale_and_drop_path_variant(self):
        self.run_layer_test(
            TransformerBlock,
            init_kwargs={
                "num_heads": 2,
                "mlp_dim": 16,
                "drop_path_rate": 0.2,
                "layer_scale_init": 1e-5,
                "approximate_gelu": False,
            },
            input_shape=(2, 5, 8),
            expected_output_shape=(2, 5, 8),
            expected_num_trainable_weights=14,
        )

    def test_matches_pre_norm_reference(self):
        for approximate in (True, False):
            block = TransformerBlock(num_heads=4, mlp_dim=32, approximate_gelu=approximate)
            x = random_tokens()
            block(x)
            randomize(block)
            expected = reference.transformer_block(
                x.astype("float64"), reference.weights_by_path(block), approximate
            )
            self.assertAllClose(ops.convert_to_numpy(block(x)), expected, atol=1e-4)
            # Without dropout, a training call differs only in its kernels.
            self.assertAllClose(ops.convert_to_numpy(block(x, training=True)), expected, atol=1e-4)

    def test_layer_norm_epsilon_is_1e_6(self):
        block = TransformerBlock(num_heads=2, mlp_dim=8)
        self.assertEqual(block.attention_norm.epsilon, 1e-6)
        self.assertEqual(block.mlp_norm.epsilon, 1e-6)

    def test_zero_layer_scale_makes_the_block_an_identity(self):
        block = TransformerBlock(num_heads=2, mlp_dim=16, layer_scale_init=0.0)
        x = random_tokens()
        self.assertAllClose(block(x), x)

    def test_drop_path_skips_whole_samples_in_training(self):
        block = TransformerBlock(num_heads=2, mlp_dim=16, drop_path_rate=0.5, seed=3)
        x = random_tokens((64, 5, 16))
        out = ops.convert_to_numpy(block(x, training=True))
        identity = np.all(np.isclose(out, x, atol=1e-6), axis=(1, 2))
        # Both branches dropped with probability 0.25.
        assert 4 <= identity.sum() <= 30, identity.sum()
        self.assertAllClose(block(x, training=False), block(x, training=False))

    def test_returns_attention_scores(self):
        block = TransformerBlock(num_heads=4, mlp_dim=16)
        x = random_tokens()
        out, scores = block(x, return_attention_scores=True)
        self.assertAllClose(out, block(x), atol=1e-5)
        self.assertEqual(tuple(scores.shape), (2, 4, 5, 5))

    def test_bad_arguments(self):
        with pytest.raises(ValueError, match="mlp_dim=0"):
            TransformerBlock(num_heads=2, mlp_dim=0)
        with pytest.raises(ValueError, match="drop_path_rate=1.5"):
            TransformerBlock(num_heads=2, mlp_dim=8, drop_path_rate=1.5)
        with pytest.raises(TypeError, match="remat='yes'"):
            TransformerBlock(num_heads=2, mlp_dim=8, remat="yes")


RANDOM_LAYERS = dict(dropout_rate=0.2, attention_dropout_rate=0.2, drop_path_rate=0.3)


def training_gradients(block, x, upstream):
    """`block(x, training=True)` and d sum(upstream * it) / d (x, trainable weights).

    As each backend's trainer takes them: TensorFlow and PyTorch from the
    variables themselves, JAX from a stateless call of their values.
    """
    block.build(x.shape)
    randomize(block)
    backend = keras.backend.backend()
    if backend == "jax":
        import jax

        non_trainable = [v.value for v in block.non_trainable_variables]

        def loss(tokens, weights):
            outputs = block.stateless_call(weights, non_trainable, tokens, training=True)[0]
            return (upstream * outputs).sum(), outputs

        weights = [v.value for v in block.trainable_variables]
        grads, outputs = jax.jit(jax.grad(loss, argnums=(0, 1), has_aux=True))(x, weights)
        return np.asarray(outputs), [np.asarray(grads[0])] + [np.asarray(g) for g in grads[1]]
    if backend == "tensorflow":
        import tensorflow as tf

        tokens = tf.constant(x)
        with tf.GradientTape() as tape:
            tape.watch(tokens)
            outputs = block(tokens, training=True)
            loss = tf.reduce_sum(upstream * outputs)
        grads = tape.gradient(loss, [tokens] + [v.value for v in block.trainable_variables])
        return outputs.numpy(), [g.numpy() for g in grads]
    import torch

    tokens = torch.tensor(x, requires_grad=True)
    outputs = block(tokens, training=True)
    (torch.tensor(upstream) * outputs).sum().backward()
    grads = [tokens.grad] + [v.value.grad for v in block.trainable_variables]
    return outputs.detach().numpy(), [g.numpy() for g in grads]


@pytest.mark.parametrize("rates", [RANDOM_LAYERS, {"drop_path_rate": 0.3}])
def test_a_rematerialized_block_has_the_plain_values_and_gradients_with_every_draw(rates):
    x = random_tokens((6, 5, 16))
    upstream = np.random.default_rng(1).normal(size=x.shape).astype("float32")
    results = []
    for remat in (False, True):
        block = TransformerBlock(num_heads=2, mlp_dim=32, seed=5, remat=remat, **rates)
        results.append(training_gradients(block, x, upstream))
        inference = ops.convert_to_numpy(block(x, training=False))
        assert np.abs(results[-1][0] - inference).max() > 0.1  # the draws dropped units
    (plain, plain_gradients), (recomputed, recomputed_gradients) = results
    assert len(recomputed_gradients) == 1 + 12
    np.testing.assert_allclose(recomputed, plain, atol=1e-5)
    for expected, actual in zip(plain_gradients, recomputed_gradients):
        np.testing.assert_allclose(actual, expected, rtol=1e-4, atol=1e-5)


def test_a_rematerialized_block_is_recomputed_in_the_backward_pass():
    x = random_tokens((2, 5, 16))
    for remat in (False, True):
        block = TransformerBlock(num_heads=2, mlp_dim=32, seed=5, remat=remat, **RANDOM_LAYERS)
        if keras.backend.backend() == "jax":
            import jax

            # Traced once; the recomputation is a `remat` (checkpoint) of the jaxpr.
            block.build(x.shape)
            trainable = [v.value for v in block.trainable_variables]
            non_trainable = [v.value for v in block.non_trainable_variables]
            traced = jax.make_jaxpr(
                lambda t, b=block, w=trainable, n=non_trainable: b.stateless_call(
                    w, n, t, training=True
                )[0]
            )(x)
            names = {equation.primitive.name for equation in traced.jaxpr.eqns}
            assert any(n.startswith(("remat", "checkpoint")) for n in names) == remat, names
            continue
        forward, runs = block._forward, []

        def counted(*args, forward=forward, runs=runs):
            runs.append(1)
            return forward(*args)

        block._forward = counted
        training_gradients(block, x, np.ones_like(x))
        assert len(runs) == (2 if remat else 1)
