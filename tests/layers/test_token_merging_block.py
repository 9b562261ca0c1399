import keras
import numpy as np
import pytest
from keras import ops

from keras_vit.layers import TokenMergingBlock, TransformerBlock, bipartite_merge
from tests.layers.test_transformer_block import randomize
from tests.reference import random_tokens


def reference_merge(tokens, sizes, metric, r):
    """ToMe's bipartite soft matching, one example at a time, in loops (NumPy)."""
    merged_tokens, merged_sizes = [], []
    for x, s, m in zip(tokens, sizes, metric):
        m = m / np.linalg.norm(m, axis=-1, keepdims=True)
        a, b = list(range(0, len(x), 2)), list(range(1, len(x), 2))
        similarity = m[a] @ m[b].T
        best = similarity.max(-1)
        order = sorted(range(len(a)), key=lambda i: -best[i])  # stable: ties in A's order
        merged = set(order[:r])
        sums = {j: x[b[j]] * s[b[j]] for j in range(len(b))}
        counts = {j: s[b[j]] for j in range(len(b))}
        for i in merged:
            j = int(similarity[i].argmax())
            sums[j] = sums[j] + x[a[i]] * s[a[i]]
            counts[j] = counts[j] + s[a[i]]
        kept = [i for i in range(len(a)) if i not in merged]
        merged_tokens.append([x[a[i]] for i in kept] + [sums[j] / counts[j] for j in range(len(b))])
        merged_sizes.append([s[a[i]] for i in kept] + [counts[j] for j in range(len(b))])
    return np.asarray(merged_tokens, "float32"), np.asarray(merged_sizes, "float32")


@pytest.mark.parametrize("n, r", [(9, 1), (9, 4), (10, 5), (16, 3)])
def test_bipartite_merge_is_tomes_matching(n, r):
    rng = np.random.default_rng(n + r)
    tokens = rng.normal(size=(3, n, 6)).astype("float32")
    sizes = rng.integers(1, 5, (3, n)).astype("float32")
    metric = rng.normal(size=(3, n, 4)).astype("float32")
    merged, merged_sizes = bipartite_merge(tokens, sizes, metric, r)
    expected, expected_sizes = reference_merge(tokens, sizes, metric, r)
    assert tuple(merged.shape) == (3, n - r, 6)
    np.testing.assert_allclose(ops.convert_to_numpy(merged), expected, rtol=1e-5, atol=1e-5)
    np.testing.assert_array_equal(ops.convert_to_numpy(merged_sizes), expected_sizes)
    # Nothing is lost: the size-weighted sum of the tokens stays.
    np.testing.assert_allclose(
        np.sum(expected * expected_sizes[..., None], 1),
        np.sum(tokens * sizes[..., None], 1),
        rtol=1e-4,
        atol=1e-4,
    )


def plain_and_merging(r, tokens, seed=0):
    """A random `TransformerBlock` and a `TokenMergingBlock` of `r` with its weights."""
    options = dict(num_heads=2, mlp_dim=32, layer_scale_init=0.5, approximate_gelu=False)
    plain = TransformerBlock(**options)
    merging = TokenMergingBlock(r=r, num_prefix_tokens=1, **options)
    plain.build(tokens.shape)
    randomize(plain, seed)
    merging.build(tokens.shape)
    for target, source in zip(merging.weights, plain.weights, strict=True):
        target.assign(source)
    return plain, merging


def numpy(x):
    return ops.convert_to_numpy(x)


def test_merged_identical_tokens_weigh_in_the_next_attention_as_the_two_they_were():
    # Patch tokens in identical pairs (A's token 2j, B's 2j + 1): merged into
    # one of size 2 each, and the next block's attention, which weighs a
    # token by its size (ToMe's proportional attention), gives every token
    # what the unmerged pairs give.
    k = 4
    pairs = random_tokens((2, k, 16), seed=1)
    tokens = np.concatenate([random_tokens((2, 1, 16), seed=2), np.repeat(pairs, 2, axis=1)], 1)
    kept = [0, *range(2, 2 * k + 1, 2)]  # the class token and B's tokens
    plain, merging = plain_and_merging(k, tokens)
    expected = numpy(plain(tokens))
    merged, sizes = merging(tokens)
    assert tuple(merged.shape) == (2, 1 + k, 16)
    np.testing.assert_array_equal(numpy(sizes), np.full((2, k), 2.0))
    np.testing.assert_allclose(numpy(merged), expected[:, kept], atol=2e-5)
    plain, merging = plain_and_merging(0, tokens, seed=1)
    expected = numpy(plain(expected))
    np.testing.assert_allclose(numpy(merging([merged, sizes])[0]), expected[:, kept], atol=2e-5)
    # Weighed as single tokens, the pairs would count half: another class token.
    unweighted = numpy(merging([merged, np.ones((2, k), "float32")])[0])
    assert np.abs(unweighted[:, 0] - expected[:, 0]).max() > 1e-3


def test_a_merging_block_of_r_0_is_its_transformer_block():
    tokens = random_tokens((2, 7, 16))
    plain, merging = plain_and_merging(0, tokens)
    merged, sizes = merging(tokens)
    np.testing.assert_allclose(numpy(merged), numpy(plain(tokens)), atol=1e-5)
    assert tuple(sizes.shape) == (2, 6)


def test_a_merging_block_round_trips_through_its_config_and_refuses_bad_values():
    block = TokenMergingBlock(r=3, num_prefix_tokens=2, num_heads=2, mlp_dim=8)
    clone = TokenMergingBlock.from_config(block.get_config())
    assert (clone.r, clone.num_prefix_tokens, clone.mlp_dim) == (3, 2, 8)
    assert keras.saving.get_registered_object("keras_vit>TokenMergingBlock") is TokenMergingBlock
    for name, value in (("r", -1), ("r", 1.5), ("num_prefix_tokens", True)):
        with pytest.raises(ValueError, match=f"{name}={value!r}"):
            TokenMergingBlock(num_heads=2, mlp_dim=8, **{"r": 1, name: value})
    rotary = TokenMergingBlock(r=1, rope_base=100.0, grid_size=[3, 4], num_heads=2, mlp_dim=8)
    clone = TokenMergingBlock.from_config(rotary.get_config())
    assert (clone.rope_base, clone.grid_size) == (100.0, (3, 4))
    with pytest.raises(ValueError, match=r"rope_base.*above 1.*rope_base=1"):
        TokenMergingBlock(r=1, rope_base=1, grid_size=(3, 4), num_heads=2, mlp_dim=8)
    with pytest.raises(ValueError, match=r"grid_size.*with `rope_base`.*grid_size=None"):
        TokenMergingBlock(r=1, rope_base=100.0, num_heads=2, mlp_dim=8)
