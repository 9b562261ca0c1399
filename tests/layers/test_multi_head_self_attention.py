from unittest import mock

import numpy as np
import pytest
from keras import ops
from keras.src import testing

from keras_vit.layers import MultiHeadSelfAttention
from keras_vit.layers import multi_head_self_attention as attention_module
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
            x.astype("float64"), w["qkv_kernel"], w["qkv_bias"], w["out_kernel"],
            w["out_bias"],
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
        with mock.patch.object(attention_module, "fused_attention_kernel_available",
                               return_value=True):
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
        qkv = ops.convert_to_numpy(layer.qkv_kernel)
        q, k, v = (qkv[:, i].reshape(256, 256) for i in range(3))
        self.assertFalse(np.allclose(q, k))
        self.assertFalse(np.allclose(k, v))
        # Xavier uniform of a (256, 256) matrix has variance 1 / 256.
        for matrix in (q, k, v, ops.convert_to_numpy(layer.out_kernel)):
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
