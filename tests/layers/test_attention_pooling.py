"""MAP pooling against timm's AttentionPoolLatent, written in NumPy from its definition."""

import numpy as np
import pytest
from keras import ops
from keras.src import testing

from keras_vit.layers import AttentionPooling
from keras_vit.weights.converters import timm
from tests.reference import timm_attention_pool


def timm_pool_tensors(dim, heads, mlp, seed=0):
    """Random tensors named and shaped as timm's `attn_pool.*`."""
    rng = np.random.default_rng(seed)
    shapes = {
        "latent": (1, 1, dim),
        "q.weight": (dim, dim),
        "q.bias": (dim,),
        "kv.weight": (2 * dim, dim),
        "kv.bias": (2 * dim,),
        "proj.weight": (dim, dim),
        "proj.bias": (dim,),
        "norm.weight": (dim,),
        "norm.bias": (dim,),
        "mlp.fc1.weight": (mlp, dim),
        "mlp.fc1.bias": (mlp,),
        "mlp.fc2.weight": (dim, mlp),
        "mlp.fc2.bias": (dim,),
    }
    return {
        "attn_pool." + name: rng.normal(0, 0.3, shape).astype("float32")
        for name, shape in shapes.items()
    }


class AttentionPoolingTest(testing.TestCase):
    def test_layer_basics(self):
        self.run_layer_test(
            AttentionPooling,
            init_kwargs={"num_heads": 2, "mlp_dim": 16, "num_prefix_tokens": 1},
            input_shape=(2, 5, 8),
            expected_output_shape=(2, 8),
            expected_num_trainable_weights=13,  # the 13 tensors of timm's attn_pool
        )

    def test_matches_timm_attention_pool_loaded_from_its_tensors(self):
        tensors = timm_pool_tensors(dim=16, heads=4, mlp=24)
        canonical = timm.to_canonical(tensors, num_heads=4)
        layer = AttentionPooling(num_heads=4, mlp_dim=24, num_prefix_tokens=1)
        layer.build((None, 7, 16))
        for weight in layer.weights:
            weight.assign(canonical["map_head/" + weight.path.split("/", 1)[1]])
        tokens = np.random.default_rng(1).normal(size=(3, 7, 16)).astype("float32")
        expected = timm_attention_pool(
            tokens[:, 1:].astype("float64"),
            {k: v.astype("float64") for k, v in tensors.items()},
            heads=4,
        )
        self.assertAllClose(ops.convert_to_numpy(layer(tokens)), expected, atol=1e-5)

    def test_bad_arguments_name_the_value(self):
        with pytest.raises(ValueError, match="num_heads=0"):
            AttentionPooling(num_heads=0, mlp_dim=8)
        with pytest.raises(ValueError, match="num_prefix_tokens=-1"):
            AttentionPooling(num_heads=2, mlp_dim=8, num_prefix_tokens=-1)
        with pytest.raises(ValueError, match="not divisible by num_heads 3"):
            AttentionPooling(num_heads=3, mlp_dim=8)(np.zeros((1, 4, 8), "float32"))
