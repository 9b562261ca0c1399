import numpy as np
import pytest
from keras import ops
from keras.src import testing

from keras_vit.layers import ClassToken, RegisterTokens


class ClassTokenTest(testing.TestCase):
    def test_layer_basics(self):
        self.run_layer_test(
            ClassToken,
            init_kwargs={},
            input_shape=(2, 6, 8),
            expected_output_shape=(2, 7, 8),
            expected_num_trainable_weights=1,
        )

    def test_prepends_the_token_and_keeps_the_sequence(self):
        layer = ClassToken(initializer="ones")
        tokens = np.random.default_rng(0).normal(size=(3, 4, 5)).astype("float32")
        out = ops.convert_to_numpy(layer(tokens))
        self.assertAllClose(out[:, 0], np.ones((3, 5)))
        self.assertAllClose(out[:, 1:], tokens)

    def test_starts_at_zero(self):
        layer = ClassToken()
        layer.build((None, 4, 5))
        self.assertAllClose(ops.convert_to_numpy(layer.token), np.zeros((1, 1, 5)))


class RegisterTokensTest(testing.TestCase):
    def test_layer_basics(self):
        self.run_layer_test(
            RegisterTokens,
            init_kwargs={"num_tokens": 3, "index": 1},
            input_shape=(2, 6, 8),
            expected_output_shape=(2, 9, 8),
            expected_num_trainable_weights=1,
        )

    def test_inserts_after_the_leading_tokens(self):
        layer = RegisterTokens(2, index=1, initializer="ones")
        tokens = np.random.default_rng(0).normal(size=(3, 4, 5)).astype("float32")
        out = ops.convert_to_numpy(layer(tokens))
        self.assertAllClose(out[:, 0], tokens[:, 0])
        self.assertAllClose(out[:, 1:3], np.ones((3, 2, 5)))
        self.assertAllClose(out[:, 3:], tokens[:, 1:])

    def test_bad_arguments(self):
        with pytest.raises(ValueError, match="num_tokens=0"):
            RegisterTokens(0)
        with pytest.raises(ValueError, match="index=-1"):
            RegisterTokens(2, index=-1)
