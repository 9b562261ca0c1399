"""PatchDropout: the layer, and a ViT that trains on a subset of its tokens."""

import keras
import numpy as np
import pytest
from keras import ops
from keras.src import testing

import keras_vit
from keras_vit.layers import PatchDropout


class PatchDropoutTest(testing.TestCase):
    def test_layer_basics(self):
        self.run_layer_test(
            PatchDropout,
            init_kwargs={"rate": 0.5, "num_prefix_tokens": 1, "seed": 1},
            input_shape=(2, 9, 4),
            expected_output_shape=(2, 9, 4),
            expected_num_seed_generators=1,
        )

    def test_keeps_the_prefix_and_a_random_ordered_subset_of_each_images_patches(self):
        batch, prefix, patches, dim = 64, 2, 49, 3
        # Each token carries its own index, so the output says which were kept.
        index = np.arange(prefix + patches, dtype="float32")
        tokens = np.broadcast_to(index[None, :, None], (batch, prefix + patches, dim))
        out = ops.convert_to_numpy(
            PatchDropout(0.5, num_prefix_tokens=prefix, seed=0)(tokens, training=True)
        )
        self.assertEqual(out.shape, (batch, prefix + 25, dim))  # ceil(0.5 * 49) kept
        kept = out[:, :, 0]
        np.testing.assert_array_equal(kept[:, :prefix], np.broadcast_to([0, 1], (batch, 2)))
        patch_ids = kept[:, prefix:]
        assert np.all(np.diff(patch_ids, axis=1) > 0)  # distinct, in token order
        assert patch_ids.min() >= prefix
        assert len({tuple(row) for row in patch_ids}) > batch // 2  # drawn per image
        # Every patch is as likely to be kept: about half the time each.
        counts = np.bincount(patch_ids.astype(int).ravel(), minlength=prefix + patches)
        assert 0.25 < counts[prefix:].min() / batch and counts[prefix:].max() / batch < 0.75

    def test_identity_at_inference_and_at_rate_zero(self):
        x = np.random.default_rng(0).normal(size=(2, 10, 4)).astype("float32")
        self.assertAllClose(PatchDropout(0.75)(x), x)
        self.assertAllClose(PatchDropout(0.0)(x, training=True), x)

    def test_seeded_draws_repeat(self):
        x = np.random.default_rng(0).normal(size=(4, 17, 4)).astype("float32")
        first = PatchDropout(0.5, seed=3)(x, training=True)
        second = PatchDropout(0.5, seed=3)(x, training=True)
        self.assertAllClose(first, second)

    def test_bad_arguments(self):
        with pytest.raises(ValueError, match="rate=1"):
            PatchDropout(rate=1)
        with pytest.raises(ValueError, match="rate='half'"):
            PatchDropout(rate="half")
        with pytest.raises(ValueError, match="num_prefix_tokens=-1"):
            PatchDropout(0.5, num_prefix_tokens=-1)


TINY = dict(
    patch_size=4,
    hidden_dim=16,
    num_layers=1,
    num_heads=2,
    mlp_dim=32,
    input_shape=(16, 16, 1),
    classes=3,
    classifier_activation=None,
    seed=0,
)


def test_a_vit_with_patch_dropout_trains_on_fewer_tokens_and_predicts_on_all():
    model = keras_vit.ViT(**TINY, patch_dropout_rate=0.5)
    plain = keras_vit.ViT(**TINY)
    # The same weights: the layer adds none, and inference is unchanged.
    assert [w.shape for w in model.weights] == [w.shape for w in plain.weights]
    plain.set_weights(model.get_weights())
    images = np.random.default_rng(0).uniform(0, 255, (4, 16, 16, 1)).astype("float32")
    np.testing.assert_allclose(
        ops.convert_to_numpy(model(images)), ops.convert_to_numpy(plain(images)), atol=1e-6
    )
    block_inputs = keras.Model(model.input, model.get_layer("dropout").output)
    # 1 class token + ceil(0.5 * 16) of the 16 patches in training; all 17 otherwise.
    assert tuple(block_inputs(images, training=True).shape) == (4, 9, 16)
    assert tuple(block_inputs(images).shape) == (4, 17, 16)
    model.compile(optimizer="adam", loss=keras.losses.SparseCategoricalCrossentropy(True))
    history = model.fit(images, np.array([0, 1, 2, 0]), epochs=2, verbose=0)
    assert np.all(np.isfinite(history.history["loss"]))


def test_a_saved_vit_keeps_its_patch_dropout(tmp_path):
    model = keras_vit.ViT(**TINY, patch_dropout_rate=0.25)
    model.save(tmp_path / "m.keras")
    loaded = keras.saving.load_model(tmp_path / "m.keras")
    assert loaded.get_layer("patch_dropout").rate == 0.25
    images = np.ones((2, 16, 16, 1), "float32")
    np.testing.assert_allclose(
        ops.convert_to_numpy(loaded(images)), ops.convert_to_numpy(model(images)), atol=1e-6
    )


@pytest.mark.parametrize("rate", [1.0, -0.1, True, "0.5"])
def test_vit_refuses_a_bad_patch_dropout_rate(rate):
    with pytest.raises(ValueError, match="patch_dropout_rate"):
        keras_vit.ViT(**TINY, patch_dropout_rate=rate)


def test_vit_refuses_patch_dropout_at_run_time_resolution():
    with pytest.raises(ValueError, match="fixed input size"):
        keras_vit.ViT(
            **{**TINY, "input_shape": (None, None, 1)},
            base_image_size=16,
            patch_dropout_rate=0.5,
        )
