"""StochasticDepth, LayerScale, TokenPooling and ConvStem."""

import numpy as np
import pytest
from keras import ops
from keras.src import testing

from keras_vit.layers import ConvStem, LayerScale, StochasticDepth, TokenPooling


class StochasticDepthTest(testing.TestCase):
    def test_layer_basics(self):
        self.run_layer_test(
            StochasticDepth,
            init_kwargs={"rate": 0.3, "seed": 1},
            input_shape=(4, 3, 2),
            expected_output_shape=(4, 3, 2),
            expected_num_seed_generators=1,
        )

    def test_drops_whole_samples_and_rescales_the_rest(self):
        layer = StochasticDepth(rate=0.25, seed=0)
        x = np.ones((4000, 3, 2), "float32")
        out = ops.convert_to_numpy(layer(x, training=True))
        per_sample = out.reshape(4000, -1)
        self.assertTrue(np.all(per_sample == per_sample[:, :1]))
        self.assertAllClose(np.unique(per_sample), [0.0, 1 / 0.75])
        assert abs((per_sample[:, 0] == 0).mean() - 0.25) < 0.03

    def test_identity_at_inference(self):
        x = np.random.default_rng(0).normal(size=(8, 3)).astype("float32")
        self.assertAllClose(StochasticDepth(rate=0.9)(x, training=False), x)

    def test_bad_rate(self):
        with pytest.raises(ValueError, match="rate=1"):
            StochasticDepth(rate=1)


class LayerScaleTest(testing.TestCase):
    def test_layer_basics(self):
        self.run_layer_test(
            LayerScale,
            init_kwargs={"init_value": 0.1},
            input_shape=(2, 3, 4),
            expected_output_shape=(2, 3, 4),
            expected_num_trainable_weights=1,
        )

    def test_scales_each_channel(self):
        layer = LayerScale(init_value=1.0)
        layer.build((None, 3))
        layer.gamma.assign(np.array([1.0, 2.0, 3.0], "float32"))
        self.assertAllClose(layer(np.ones((2, 3), "float32")), [[1, 2, 3], [1, 2, 3]])


class TokenPoolingTest(testing.TestCase):
    def test_layer_basics(self):
        for mode in ("token", "gap"):
            self.run_layer_test(
                TokenPooling,
                init_kwargs={"mode": mode},
                input_shape=(2, 5, 4),
                expected_output_shape=(2, 4),
            )

    def test_token_takes_the_first_and_gap_averages_the_patches(self):
        x = np.random.default_rng(0).normal(size=(2, 5, 4)).astype("float32")
        self.assertAllClose(TokenPooling("token")(x), x[:, 0])
        self.assertAllClose(TokenPooling("gap")(x), x[:, 1:].mean(1), atol=1e-6)
        self.assertAllClose(TokenPooling("gap", num_prefix_tokens=0)(x), x.mean(1), atol=1e-6)

    def test_token_index_and_token_gap(self):
        x = np.random.default_rng(0).normal(size=(2, 6, 4)).astype("float32")
        self.assertAllClose(TokenPooling("token", num_prefix_tokens=2, token_index=1)(x), x[:, 1])
        pooled = TokenPooling("token_gap", num_prefix_tokens=3)(x)
        self.assertAllClose(pooled, np.concatenate([x[:, 0], x[:, 3:].mean(1)], -1), atol=1e-6)
        self.assertEqual(TokenPooling("token_gap").compute_output_shape((None, 6, 4)), (None, 8))

    def test_bad_mode(self):
        with pytest.raises(ValueError, match="mode='min'"):
            TokenPooling("min")
        with pytest.raises(ValueError, match="num_prefix_tokens=0"):
            TokenPooling("token", num_prefix_tokens=0)
        with pytest.raises(ValueError, match="token_index=1"):
            TokenPooling("token", num_prefix_tokens=1, token_index=1)


class ConvStemTest(testing.TestCase):
    def test_layer_basics(self):
        self.run_layer_test(
            ConvStem,
            init_kwargs={"filters": (4, 8)},
            input_shape=(2, 16, 16, 3),
            expected_output_shape=(2, 4, 4, 8),
            expected_num_trainable_weights=6,  # 2 kernels, 2 BN gammas and betas
            expected_num_non_trainable_weights=4,  # BN moving means and variances
        )

    def test_each_convolution_halves_the_map(self):
        stem = ConvStem(filters=(4, 8, 16))
        self.assertEqual(stem.stride, 8)
        out = stem(np.random.default_rng(0).normal(size=(2, 24, 24, 1)).astype("float32"))
        self.assertEqual(tuple(out.shape), (2, 3, 3, 16))
        self.assertTrue(np.all(ops.convert_to_numpy(out) >= 0))  # ReLU

    def test_stride_one_convolutions_keep_the_size(self):
        stem = ConvStem(filters=(4, 8), strides=(1, 2))
        self.assertEqual(stem.stride, 2)
        self.assertEqual(tuple(stem(np.zeros((1, 12, 12, 3), "float32")).shape), (1, 6, 6, 8))
        self.assertEqual(ConvStem.from_config(stem.get_config()).strides, (1, 2))

    def test_bad_filters(self):
        for filters in ((), (8, 0), "8"):
            with pytest.raises(ValueError, match="filters="):
                ConvStem(filters=filters)
        with pytest.raises(ValueError, match=r"strides=\(3, 2\)"):
            ConvStem(filters=(4, 8), strides=(3, 2))
