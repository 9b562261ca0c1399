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
