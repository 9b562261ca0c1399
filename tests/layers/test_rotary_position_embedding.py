"""DINOv3's 2-D rotary position embedding: transformers' own functions are the reference."""

import keras
import numpy as np
import pytest

from keras_vit.layers import RotaryPositionEmbedding2D
from keras_vit.layers.rotary_position_embedding import rotate

HEADS, HEAD_DIM, PREFIX = 2, 16, 5  # a class token and 4 registers


def reference(query, key, grid, base=100.0, patch=4):
    """transformers' DINOv3ViTRopePositionEmbedding and apply_rotary_pos_emb, at inference."""
    import torch
    from transformers import DINOv3ViTConfig
    from transformers.models.dinov3_vit import modeling_dinov3_vit as dinov3

    rows, columns = grid
    config = DINOv3ViTConfig(
        hidden_size=HEADS * HEAD_DIM,
        num_attention_heads=HEADS,
        patch_size=patch,
        image_size=rows * patch,
        rope_theta=base,
    )
    rope = dinov3.DINOv3ViTRopePositionEmbedding(config).eval()
    cos, sin = rope(torch.zeros(1, 3, rows * patch, columns * patch))

    def heads_first(x):  # (batch, tokens, heads, dim) -> (batch, heads, tokens, dim)
        return torch.from_numpy(np.ascontiguousarray(x.transpose(0, 2, 1, 3)))

    q, k = dinov3.apply_rotary_pos_emb(heads_first(query), heads_first(key), cos, sin)
    return [x.numpy().transpose(0, 2, 1, 3) for x in (q, k)]


def tokens(grid, seed):
    rng = np.random.default_rng(seed)
    count = PREFIX + grid[0] * grid[1]
    return rng.normal(size=(2, count, HEADS, HEAD_DIM)).astype("float32")


@pytest.mark.parametrize("grid", [(3, 5), (4, 4), (1, 7)])
def test_rotations_are_dinov3s_on_every_grid(grid):
    query, key = tokens(grid, 0), tokens(grid, 1)
    rope = RotaryPositionEmbedding2D(HEAD_DIM, base=100.0, num_prefix_tokens=PREFIX)
    rotation = rope(grid=grid)
    ours = [keras.ops.convert_to_numpy(rotate(x, rotation)) for x in (query, key)]
    for got, expected in zip(ours, reference(query, key, grid)):
        np.testing.assert_allclose(got, expected, atol=2e-6)
    # The patch grid itself gives the same rotation.
    patches = np.zeros((2, *grid, 3), "float32")
    np.testing.assert_array_equal(
        keras.ops.convert_to_numpy(rope(patches)), keras.ops.convert_to_numpy(rotation)
    )
    # The class token and the registers are left as they are; the patches turn
    # (all but one at the grid's centre, where both coordinates are 0).
    np.testing.assert_array_equal(ours[0][:, :PREFIX], query[:, :PREFIX])
    turned = np.abs(ours[0][:, PREFIX:] - query[:, PREFIX:]).max(axis=(0, 2, 3))
    assert (turned > 1e-3).sum() >= grid[0] * grid[1] - 1, turned


def test_a_query_meets_a_key_by_their_offset_alone():
    # The same query and key at every patch: their product after the
    # rotation depends only on how far apart the two patches are.
    grid = (4, 6)
    rng = np.random.default_rng(2)
    q = np.broadcast_to(rng.normal(size=HEAD_DIM), (1, 24, 1, HEAD_DIM)).astype("float32")
    k = np.broadcast_to(rng.normal(size=HEAD_DIM), (1, 24, 1, HEAD_DIM)).astype("float32")
    rope = RotaryPositionEmbedding2D(HEAD_DIM, num_prefix_tokens=0)
    rotation = rope(grid=grid)
    rq, rk = (keras.ops.convert_to_numpy(rotate(x, rotation))[0, :, 0] for x in (q, k))
    logits = (rq @ rk.T).reshape(4, 6, 4, 6)
    right = [logits[r, c, r, c + 1] for r in range(4) for c in range(5)]
    down = [logits[r, c, r + 1, c] for r in range(3) for c in range(6)]
    np.testing.assert_allclose(right, right[0], rtol=1e-4)
    np.testing.assert_allclose(down, down[0], rtol=1e-4)
    assert abs(right[0] - down[0]) > 1e-3  # rows and columns turn by different angles


def test_config_round_trips_and_bad_settings_are_refused():
    rope = RotaryPositionEmbedding2D(8, base=50, num_prefix_tokens=3, name="rope")
    clone = RotaryPositionEmbedding2D.from_config(rope.get_config())
    assert (clone.head_dim, clone.base, clone.num_prefix_tokens, clone.name) == (8, 50.0, 3, "rope")
    with pytest.raises(ValueError, match=r"multiple of 4.*head_dim=6"):
        RotaryPositionEmbedding2D(6)
    with pytest.raises(ValueError, match=r"positive.*head_dim=0"):
        RotaryPositionEmbedding2D(0)
    with pytest.raises(ValueError, match=r"above 1.*base=1"):
        RotaryPositionEmbedding2D(8, base=1)
    with pytest.raises(TypeError, match=r"whole number.*num_prefix_tokens=1.5"):
        RotaryPositionEmbedding2D(8, num_prefix_tokens=1.5)
    with pytest.raises(ValueError, match=r"0 or more.*num_prefix_tokens=-1"):
        RotaryPositionEmbedding2D(8, num_prefix_tokens=-1)
