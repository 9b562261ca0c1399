import numpy as np
from keras import ops
from keras.src import testing

from keras_vit.layers import PatchCorruption, RestoreMaskedTokens, SelectTokens


def _tokens(batch=2, count=6, dim=4, seed=0):
    return np.random.default_rng(seed).normal(size=(batch, count, dim)).astype("float32")


class PatchCorruptionTest(testing.TestCase):
    def test_layer_basics(self):
        self.run_layer_test(
            PatchCorruption,
            init_kwargs={},
            input_shape=[(2, 6, 8), (2, 6), (2, 6)],
            input_dtype=["float32", "int32", "int32"],
            expected_output_shape=(2, 6, 8),
            expected_num_trainable_weights=1,
            run_training_check=False,
        )

    def test_masks_replaces_and_keeps_as_told(self):
        layer = PatchCorruption()
        tokens = _tokens()
        mask = np.array([[1, 0, 0, 0, 0, 1], [0, 0, 0, 0, 0, 0]], "int32")
        source = np.tile(np.arange(6, dtype="int32"), (2, 1))
        source[0, 2] = 4  # patch 2 receives patch 4's embedding
        source[1, 5] = 0
        out = ops.convert_to_numpy(layer([tokens, mask, source]))
        mask_token = ops.convert_to_numpy(layer.mask_token)
        self.assertAllClose(out[0, 0], mask_token)
        self.assertAllClose(out[0, 5], mask_token)
        self.assertAllEqual(out[0, 2], tokens[0, 4])
        self.assertAllEqual(out[1, 5], tokens[1, 0])
        untouched = [(0, 1), (0, 3), (0, 4), (1, 0), (1, 1), (1, 2), (1, 3), (1, 4)]
        for b, i in untouched:
            self.assertAllEqual(out[b, i], tokens[b, i])

    def test_rejects_a_mask_of_the_wrong_length(self):
        with self.assertRaisesRegex(ValueError, "one entry per patch"):
            PatchCorruption()([_tokens(), np.zeros((2, 5), "int32"), np.zeros((2, 6), "int32")])


class SelectTokensTest(testing.TestCase):
    def test_layer_basics(self):
        self.run_layer_test(
            SelectTokens,
            init_kwargs={"num_prefix_tokens": 1, "keep_prefix": False},
            input_shape=(2, 7, 8),
            expected_output_shape=(2, 6, 8),
            expected_num_trainable_weights=0,
        )

    def test_keeps_the_prefix_and_gathers_patches(self):
        tokens = _tokens(count=7)
        indices = np.array([[5, 0, 2], [1, 1, 3]], "int32")
        out = ops.convert_to_numpy(SelectTokens(1)([tokens, indices]))
        self.assertEqual(out.shape, (2, 4, 4))
        self.assertAllEqual(out[:, 0], tokens[:, 0])
        for b in range(2):
            self.assertAllEqual(out[b, 1:], tokens[b, 1 + indices[b]])

    def test_rejects_a_negative_prefix(self):
        with self.assertRaisesRegex(ValueError, "num_prefix_tokens=-1"):
            SelectTokens(-1)


class RestoreMaskedTokensTest(testing.TestCase):
    def test_layer_basics(self):
        self.run_layer_test(
            RestoreMaskedTokens,
            init_kwargs={"num_prefix_tokens": 1},
            input_shape=[(2, 3, 8), (2, 6)],
            input_dtype=["float32", "int32"],
            expected_output_shape=(2, 7, 8),
            expected_num_trainable_weights=1,
            run_training_check=False,
        )

    def test_undoes_select_tokens(self):
        # MAE's round trip: keep a random half, put it back, masks elsewhere.
        rng = np.random.default_rng(3)
        tokens = _tokens(count=9)  # 1 prefix + 8 patches
        shuffle = np.stack([rng.permutation(8) for _ in range(2)]).astype("int32")
        restore = np.argsort(shuffle, axis=1).astype("int32")
        kept = SelectTokens(1)([tokens, shuffle[:, :4]])
        layer = RestoreMaskedTokens(1)
        out = ops.convert_to_numpy(layer([kept, restore]))
        mask_token = ops.convert_to_numpy(layer.mask_token)
        self.assertAllEqual(out[:, 0], tokens[:, 0])
        for b in range(2):
            for patch in range(8):
                expected = tokens[b, 1 + patch] if patch in shuffle[b, :4] else mask_token
                self.assertAllClose(out[b, 1 + patch], expected, atol=0, rtol=0)
