import importlib.util

import numpy as np
import pytest
import scipy.ndimage
from keras import ops
from keras.src import testing

from keras_vit.layers import (
    PositionEmbedding,
    resample_position_embeddings,
    sincos_2d_position_embeddings,
)


def mae_sincos_reference(embed_dim, grid_size):
    """MAE's get_2d_sincos_pos_embed (facebookresearch/mae, util/pos_embed.py)."""

    def one_d(dim, pos):
        omega = np.arange(dim // 2, dtype=np.float64) / (dim / 2.0)
        omega = 1.0 / 10000**omega
        out = np.einsum("m,d->md", pos.reshape(-1), omega)
        return np.concatenate([np.sin(out), np.cos(out)], axis=1)

    grid_h = np.arange(grid_size, dtype=np.float32)
    grid_w = np.arange(grid_size, dtype=np.float32)
    grid = np.stack(np.meshgrid(grid_w, grid_h), axis=0)
    emb = np.concatenate([one_d(embed_dim // 2, grid[0]), one_d(embed_dim // 2, grid[1])], axis=1)
    return np.concatenate([np.zeros([1, embed_dim]), emb], axis=0)


class PositionEmbeddingTest(testing.TestCase):
    def test_layer_basics(self):
        self.run_layer_test(
            PositionEmbedding,
            init_kwargs={"grid_size": (2, 3)},
            input_shape=(2, 7, 8),
            expected_output_shape=(2, 7, 8),
            expected_num_trainable_weights=1,
        )

    def test_sincos_layer_is_fixed(self):
        self.run_layer_test(
            PositionEmbedding,
            init_kwargs={"grid_size": 3, "kind": "sincos2d"},
            input_shape=(2, 10, 8),
            expected_output_shape=(2, 10, 8),
            expected_num_trainable_weights=0,
            expected_num_non_trainable_weights=1,
            run_training_check=False,
        )

    def test_adds_its_table(self):
        layer = PositionEmbedding(grid_size=(2, 2), num_prefix_tokens=1)
        tokens = np.random.default_rng(0).normal(size=(3, 5, 4)).astype("float32")
        out = ops.convert_to_numpy(layer(tokens))
        table = ops.convert_to_numpy(layer.embeddings)
        self.assertAllClose(out, tokens + table, atol=1e-6)

    def test_learned_initialisation_has_std_0_02(self):
        layer = PositionEmbedding(grid_size=16)
        layer.build((None, 257, 256))
        std = float(np.std(ops.convert_to_numpy(layer.embeddings)))
        assert abs(std - 0.02) < 0.001

    def test_sincos_matches_mae(self):
        ours = sincos_2d_position_embeddings(7, 64)[0]
        self.assertAllClose(ours, mae_sincos_reference(64, 7), atol=1e-6)

    def test_wrong_token_count_is_a_clear_error(self):
        layer = PositionEmbedding(grid_size=(2, 2))
        with pytest.raises(ValueError, match="expects 5 tokens"):
            layer(np.zeros((1, 6, 4)))

    def test_bad_kind(self):
        with pytest.raises(ValueError, match="kind='fourier'"):
            PositionEmbedding(grid_size=2, kind="fourier")
        with pytest.raises(ValueError, match="resample_method='nearest'"):
            PositionEmbedding(grid_size=2, resample_method="nearest")


class RunTimeGridTest(testing.TestCase):
    """With `grid=`, the table follows the tokens' grid inside the graph."""

    def test_another_grid_adds_the_table_resampled_as_at_load_time(self):
        rng = np.random.default_rng(0)
        for method in ("bicubic", "bicubic_antialias", "bilinear"):
            layer = PositionEmbedding(grid_size=(4, 5), num_prefix_tokens=2, resample_method=method)
            layer.build((None, 22, 6))
            layer.embeddings.assign(rng.normal(size=(1, 22, 6)).astype("float32"))
            table = ops.convert_to_numpy(layer.embeddings)
            for grid in ((7, 3), (4, 5), (2, 9)):
                tokens = rng.normal(size=(3, 2 + grid[0] * grid[1], 6)).astype("float32")
                out = layer(tokens, grid=np.zeros((3, *grid, 1), "float32"))
                expected = tokens + resample_position_embeddings(
                    table, grid, source_grid=(4, 5), num_prefix_tokens=2, method=method
                )
                self.assertAllClose(ops.convert_to_numpy(out), expected, atol=2e-6)

    def test_config_round_trip_keeps_the_method(self):
        layer = PositionEmbedding(grid_size=(2, 3), resample_method="bicubic_antialias")
        again = PositionEmbedding.from_config(layer.get_config())
        self.assertEqual(again.resample_method, "bicubic_antialias")
        self.assertEqual(again.grid_size, (2, 3))

    def test_its_own_grid_without_grid_is_still_checked(self):
        layer = PositionEmbedding(grid_size=(2, 2))
        with pytest.raises(ValueError, match="or the patch grid of the tokens as `grid`"):
            layer(np.zeros((1, 10, 4)))


class ResampleTest(testing.TestCase):
    table = np.random.default_rng(0).normal(size=(1, 1 + 4 * 5, 6)).astype("float32")

    def test_same_grid_is_identity(self):
        out = resample_position_embeddings(self.table, (4, 5), source_grid=(4, 5))
        self.assertAllClose(out, self.table)

    def test_class_slot_is_kept(self):
        out = resample_position_embeddings(self.table, (7, 3), source_grid=(4, 5))
        self.assertEqual(out.shape, (1, 1 + 21, 6))
        self.assertAllClose(out[:, 0], self.table[:, 0])

    def test_constant_grid_stays_constant(self):
        table = np.ones((1 + 9, 2), "float32")
        for method in ("bicubic", "bilinear"):
            out = resample_position_embeddings(table, 5, method=method)
            self.assertAllClose(out, np.ones((1 + 25, 2)), atol=1e-6)

    def test_bilinear_align_corners_matches_scipy_zoom(self):
        # The original JAX ViT code resizes with scipy.ndimage.zoom(order=1).
        grid = self.table[0, 1:].reshape(4, 5, 6)
        expected = scipy.ndimage.zoom(grid, (8 / 4, 10 / 5, 1), order=1)
        out = resample_position_embeddings(
            self.table,
            (8, 10),
            source_grid=(4, 5),
            method="bilinear",
            align_corners=True,
        )
        self.assertAllClose(out[0, 1:].reshape(8, 10, 6), expected, atol=1e-5)

    @pytest.mark.skipif(importlib.util.find_spec("torch") is None, reason="torch not installed")
    def test_bicubic_matches_torch_interpolate(self):
        import torch

        grid = torch.from_numpy(self.table[0, 1:].reshape(1, 4, 5, 6)).permute(0, 3, 1, 2)
        for size in ((8, 9), (3, 2)):
            expected = torch.nn.functional.interpolate(
                grid, size=size, mode="bicubic", align_corners=False
            )
            expected = expected.permute(0, 2, 3, 1).reshape(-1, 6).numpy()
            out = resample_position_embeddings(self.table, size, source_grid=(4, 5))
            self.assertAllClose(out[0, 1:], expected, atol=1e-5)

    def test_errors_name_the_values(self):
        with pytest.raises(ValueError, match="do not form a square grid"):
            resample_position_embeddings(self.table, 3)
        with pytest.raises(ValueError, match="method='lanczos'"):
            resample_position_embeddings(self.table, 3, (4, 5), method="lanczos")
