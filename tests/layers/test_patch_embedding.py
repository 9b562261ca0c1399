import keras
import numpy as np
import pytest
from keras import ops
from keras.src import testing

from keras_vit.layers import PatchEmbedding, patch_grid


class PatchEmbeddingTest(testing.TestCase):
    def test_layer_basics(self):
        self.run_layer_test(
            PatchEmbedding,
            init_kwargs={"patch_size": 4, "hidden_dim": 8},
            input_shape=(2, 8, 12, 3),
            expected_output_shape=(2, 6, 8),
            expected_num_trainable_weights=2,
            expected_num_non_trainable_weights=0,
        )

    def test_equals_projection_of_flattened_patches_in_row_order(self):
        # The HWIO kernel reshaped to (P*P*C, D) projects each patch
        # flattened as (row, col, channel): the official checkpoint layout.
        layer = PatchEmbedding(patch_size=(2, 3), hidden_dim=5)
        images = np.random.default_rng(0).normal(size=(2, 4, 6, 3)).astype("float32")
        tokens = ops.convert_to_numpy(layer(images))
        kernel, bias = (ops.convert_to_numpy(w) for w in layer.weights)
        self.assertEqual(kernel.shape, (2, 3, 3, 5))
        patches = images.reshape(2, 2, 2, 2, 3, 3).transpose(0, 1, 3, 2, 4, 5)
        expected = patches.reshape(2, 4, 18) @ kernel.reshape(18, 5) + bias
        self.assertAllClose(tokens, expected, atol=1e-5)

    def test_non_square_images(self):
        layer = PatchEmbedding(patch_size=4, hidden_dim=8)
        self.assertEqual(tuple(layer(np.zeros((1, 8, 20, 1))).shape), (1, 10, 8))

    def test_image_size_not_divisible_is_a_clear_error(self):
        layer = PatchEmbedding(patch_size=16, hidden_dim=8)
        with pytest.raises(ValueError, match="225 is not divisible by patch size 16"):
            layer(np.zeros((1, 225, 224, 3)))

    def test_unflattened_grid(self):
        layer = PatchEmbedding(patch_size=4, hidden_dim=8, flatten=False)
        grid = ops.convert_to_numpy(layer(np.ones((2, 8, 20, 1), "float32")))
        self.assertEqual(grid.shape, (2, 2, 5, 8))
        flat = PatchEmbedding.from_config({**layer.get_config(), "flatten": True})
        flat.build((None, 8, 20, 1))
        flat.set_weights(layer.get_weights())
        self.assertAllClose(
            grid.reshape(2, 10, 8), ops.convert_to_numpy(flat(np.ones((2, 8, 20, 1), "float32")))
        )

    @pytest.mark.skipif(
        keras.backend.backend() != "tensorflow",
        reason="only TensorFlow traces graphs with unknown image sides",
    )
    def test_unknown_sides_are_checked_when_the_images_arrive(self):
        import tensorflow as tf

        layer = PatchEmbedding(patch_size=4, hidden_dim=8)
        layer.build((None, None, None, 3))
        call = tf.function(layer, input_signature=[tf.TensorSpec((None, None, None, 3))])
        self.assertEqual(tuple(call(tf.zeros((1, 8, 12, 3))).shape), (1, 6, 8))
        with pytest.raises(
            tf.errors.InvalidArgumentError,
            match=r"multiples of the patch size \(4, 4\).*\[9\] \[12\]",
        ):
            call(tf.zeros((1, 9, 12, 3)))

    def test_bad_arguments(self):
        with pytest.raises(ValueError, match="patch_size=0"):
            PatchEmbedding(patch_size=0, hidden_dim=8)
        with pytest.raises(ValueError, match="hidden_dim=-1"):
            PatchEmbedding(patch_size=4, hidden_dim=-1)

    def test_patch_grid(self):
        self.assertEqual(patch_grid((224, 384), 16), (14, 24))
        self.assertEqual(patch_grid((None, 32), 16), (None, 2))
