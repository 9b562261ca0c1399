"""What the pipeline computes: corruption plans, MAE plans, targets."""

import numpy as np
import pytest
import tensorflow as tf

from keras_vit.pretraining import masking


def test_corruption_rate_and_80_10_10_hold_over_many_samples():
    chosen, mask, source = (
        t.numpy() for t in masking.corruption_plan(tf.constant([7, 1], tf.int64), 4000, 49)
    )
    own = np.arange(49)[None]
    # Exactly round(0.5 * 49) = 24 patches per image, each patch equally often.
    assert (chosen.sum(axis=1) == 24).all()
    np.testing.assert_allclose(chosen.mean(axis=0), 24 / 49, atol=0.03)
    replaced = source != own
    corrupted = chosen.astype(bool)
    total = corrupted.sum()  # 96,000 corrupted patches
    assert not (mask.astype(bool) & ~corrupted).any() and not (replaced & ~corrupted).any()
    assert not (mask.astype(bool) & replaced).any()
    masked_share = mask.sum() / total
    replaced_share = replaced.sum() / total
    assert abs(masked_share - 0.8) < 0.006, masked_share  # 5 sigma of 96,000 draws
    assert abs(replaced_share - 0.1) < 0.005, replaced_share
    assert abs(1 - masked_share - replaced_share - 0.1) < 0.005
    # A replaced patch gets another patch of its image, uniformly.
    offsets = ((source - own) % 49)[replaced]
    assert offsets.min() >= 1 and offsets.max() <= 48
    assert np.bincount(offsets, minlength=49)[1:].min() > 0.5 * len(offsets) / 48


def test_the_corruption_rate_option():
    chosen, _, _ = masking.corruption_plan(tf.constant([0, 0], tf.int64), 10, 16, rate=0.25)
    assert (chosen.numpy().sum(axis=1) == 4).all()


def test_keep_plan_keeps_a_quarter_and_restores_the_order():
    kept, restore, masked = (
        t.numpy() for t in masking.keep_plan(tf.constant([1, 2], tf.int64), 500, 16, 0.75)
    )
    assert kept.shape == (500, 4) and (masked.sum(axis=1) == 12).all()
    for b in range(500):
        assert sorted(np.flatnonzero(masked[b] == 0)) == sorted(kept[b])
        order = np.concatenate(
            [kept[b], np.flatnonzero(masked[b])[np.argsort(restore[b][masked[b] == 1])]]
        )
        np.testing.assert_array_equal(order[restore[b]], np.arange(16))
    np.testing.assert_allclose(masked.mean(axis=0), 0.75, atol=0.07)


def _solid_patches(colours, patch=4):
    """A 1 x len(colours) row of solid patches."""
    return np.concatenate(
        [np.broadcast_to(np.asarray(c, "float32"), (patch, patch, len(c))) for c in colours], axis=1
    )[None]


def test_3_bit_mean_colours_of_known_patches():
    colours = [(0, 0, 0), (255, 255, 255), (0, 100, 255), (31.9, 32, 224), (128, 64, 96)]
    classes = masking.quantized_colors(tf.constant(_solid_patches(colours)), (4, 4)).numpy()
    # Levels floor(v / 32): (0,0,0) (7,7,7) (0,3,7) (0,1,7) (4,2,3), red most significant.
    np.testing.assert_array_equal(
        classes, [[0, 511, 0 * 64 + 3 * 8 + 7, 0 + 8 + 7, 4 * 64 + 2 * 8 + 3]]
    )
    grey = masking.quantized_colors(tf.constant(_solid_patches([(130,), (255,)])), (4, 4)).numpy()
    np.testing.assert_array_equal(grey, [[4, 7]])


def test_the_mean_is_over_the_whole_patch():
    image = np.zeros((1, 4, 8, 3), "float32")
    image[0, :2, :4] = 255  # half of patch 0 white: mean 127.5 -> level 3
    classes = masking.quantized_colors(tf.constant(image), (4, 4)).numpy()
    np.testing.assert_array_equal(classes, [[3 * 64 + 3 * 8 + 3, 0]])


def test_colour_grid_targets_match_a_numpy_reference():
    images = np.random.default_rng(0).uniform(0, 255, (2, 8, 12, 3)).astype("float32")
    cells = masking.quantized_colors(tf.constant(images), (4, 4), bits=3, grid=2).numpy()
    assert cells.shape == (2, 6, 4)
    for b in range(2):
        for patch in range(6):
            row, col = divmod(patch, 3)
            for cell in range(4):
                r, c = divmod(cell, 2)
                y, x = 4 * row + 2 * r, 4 * col + 2 * c
                levels = np.floor(images[b, y : y + 2, x : x + 2].mean(axis=(0, 1)) / 32)
                assert cells[b, patch, cell] == int(levels @ [64, 8, 1])


def test_patchify_orders_patches_row_by_row_and_pixels_row_column_channel():
    images = np.arange(2 * 4 * 6 * 2, dtype="float32").reshape(2, 4, 6, 2)
    patches = masking.patchify(tf.constant(images), (2, 3)).numpy()
    assert patches.shape == (2, 4, 12)
    np.testing.assert_array_equal(patches[1, 3], images[1, 2:4, 3:6].reshape(-1))


def test_mae_targets_are_normalised_per_patch():
    images = np.random.default_rng(1).uniform(0, 255, (2, 8, 8, 3)).astype("float32")
    targets = masking.normalized_patch_pixels(tf.constant(images), (4, 4)).numpy()
    np.testing.assert_allclose(targets.mean(axis=-1), 0, atol=1e-5)
    np.testing.assert_allclose(targets.std(axis=-1, ddof=1), 1, atol=1e-4)
    patch = images[1, 4:8, 0:4].reshape(-1) / 255
    expected = (patch - patch.mean()) / np.sqrt(patch.var(ddof=1) + 1e-6)
    np.testing.assert_allclose(targets[1, 2], expected, atol=1e-5)


@pytest.mark.parametrize("rate", [0.0, 1.0, 1.5])
def test_rejects_corruption_rates_outside_zero_one(rate):
    from keras_vit.pretraining import MaskedPatchPrediction

    with pytest.raises(ValueError, match=f"corruption_rate={rate}"):
        MaskedPatchPrediction(corruption_rate=rate)
