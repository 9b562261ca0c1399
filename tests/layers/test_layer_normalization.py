"""LayerNorm with a closed-form backward pass."""

import keras
import numpy as np
import pytest
from keras import ops
from keras.src import testing

from keras_vit.layers import LayerNormalization
from keras_vit.ops import layer_norm
from tests import reference
from tests.autodiff import central_differences, gradients

RNG = np.random.default_rng(0)
X = (3.0 * RNG.normal(size=(2, 7, 16)) + 1.0).astype("float32")
GAMMA = RNG.normal(size=16).astype("float32")
BETA = RNG.normal(size=16).astype("float32")
UPSTREAM = RNG.normal(size=X.shape).astype("float32")


def keras_layer_norm(x, gamma, beta):
    return ops.layer_normalization(x, gamma, beta, epsilon=1e-6)


@pytest.mark.parametrize("shape", [(2, 7, 16), (14, 16)])
def test_values_and_gradients_match_keras_layer_normalization(shape):
    x, upstream = X.reshape(shape), UPSTREAM.reshape(shape)
    ours = lambda x, g, b: layer_norm(x, g, b, 1e-6)  # noqa: E731
    values = ops.convert_to_numpy(ours(x, GAMMA, BETA))
    expected = reference.layer_norm(x.astype("float64"), GAMMA, BETA)
    np.testing.assert_allclose(values, expected, atol=2e-6)

    computed = gradients(ours, [x, GAMMA, BETA], upstream)
    autodiff = gradients(keras_layer_norm, [x, GAMMA, BETA], upstream)
    for name, ours_gradient, keras_gradient in zip(("x", "gamma", "beta"), computed, autodiff):
        assert ours_gradient.shape == keras_gradient.shape, name
        np.testing.assert_allclose(ours_gradient, keras_gradient, atol=2e-5, err_msg=name)
    # The x gradient of LayerNorm sums to zero over each row (it is blind to shifts).
    np.testing.assert_allclose(computed[0].sum(-1), 0.0, atol=1e-4)


def test_matches_the_float64_derivative_of_the_reference():
    x, upstream = X[:1, :3].astype("float64"), UPSTREAM[:1, :3].astype("float64")
    numeric = central_differences(lambda x: reference.layer_norm(x, GAMMA, BETA), x, upstream)
    computed = gradients(
        lambda x, g, b: layer_norm(x, g, b, 1e-6),
        [x.astype("float32"), GAMMA, BETA],
        upstream.astype("float32"),
    )[0]
    np.testing.assert_allclose(computed, numeric, atol=1e-4)


class LayerNormalizationTest(testing.TestCase):
    def test_layer_basics(self):
        self.run_layer_test(
            LayerNormalization,
            init_kwargs={"epsilon": 1e-6},
            input_shape=(2, 5, 8),
            expected_output_shape=(2, 5, 8),
            expected_num_trainable_weights=2,
            supports_masking=True,
        )

    def test_registered_under_the_package(self):
        assert (
            keras.saving.get_registered_name(LayerNormalization) == "keras_vit>LayerNormalization"
        )

    def test_same_weights_and_values_as_keras_layer(self):
        ours, theirs = (
            LayerNormalization(epsilon=1e-6),
            keras.layers.LayerNormalization(epsilon=1e-6),
        )
        for layer in (ours, theirs):
            layer.build(X.shape)
            layer.set_weights([GAMMA, BETA])
        assert [w.path.split("/")[-1] for w in ours.weights] == ["gamma", "beta"]
        self.assertAllClose(ours(X), theirs(X), atol=2e-6)

    def test_other_configurations_are_keras_layer(self):
        x = X.transpose(0, 2, 1)
        configurations = [{"center": False}, {"scale": False}, {"axis": [1, 2]}]
        if keras.backend.backend() != "torch":
            # Keras 3.15's own layer fails there: it hands F.layer_norm a
            # non-trailing axis.
            configurations.append({"axis": 1})
        for kwargs in configurations:
            ours, theirs = LayerNormalization(**kwargs), keras.layers.LayerNormalization(**kwargs)
            ours.build(x.shape)
            theirs.build(x.shape)
            weights = [RNG.normal(size=w.shape).astype("float32") for w in theirs.weights]
            ours.set_weights(weights)
            theirs.set_weights(weights)
            self.assertAllClose(ours(x), theirs(x), atol=2e-6, msg=str(kwargs))

    def test_mixed_precision_computes_in_float32(self):
        layer = LayerNormalization(epsilon=1e-6, dtype="mixed_bfloat16")
        layer.build(X.shape)
        layer.set_weights([GAMMA, BETA])
        # Large offsets: a bfloat16 mean or variance would be far off.
        x = X + 1000.0
        outputs = layer(ops.cast(x, "bfloat16"))
        assert keras.backend.standardize_dtype(outputs.dtype) == "bfloat16"
        inputs = ops.convert_to_numpy(ops.cast(ops.cast(x, "bfloat16"), "float32"))
        expected = reference.layer_norm(inputs.astype("float64"), GAMMA, BETA)
        np.testing.assert_allclose(
            ops.convert_to_numpy(ops.cast(outputs, "float32")), expected, atol=0.05
        )


def jax_residuals(function, x):
    """The token-sized tensors that JAX keeps for `function`'s backward pass."""
    import jax

    _, backward = jax.vjp(function, jax.numpy.asarray(x), GAMMA, BETA)
    leaves = jax.tree_util.tree_leaves(backward)
    return [leaf for leaf in leaves if np.shape(leaf) == x.shape]


@pytest.mark.skipif(keras.backend.backend() != "jax", reason="reads JAX's saved residuals")
def test_backward_pass_keeps_only_the_input():
    kept = jax_residuals(lambda x, g, b: layer_norm(x, g, b, 1e-6), X)
    assert len(kept) == 1
    np.testing.assert_array_equal(np.asarray(kept[0]), X)
    # Autodiff through Keras' composite keeps more: the reason for this module.
    assert len(jax_residuals(keras_layer_norm, X)) >= 2


@pytest.mark.skipif(keras.backend.backend() != "jax", reason="reads JAX's saved residuals")
def test_bfloat16_input_is_kept_in_bfloat16():
    # Computed in float32, but what waits for the backward pass is the bf16
    # input (half the bytes of a float32 x_hat; 5.5% of ViT-B/16's bf16
    # training step on an H100), and the gradients match Keras'.
    import jax
    import jax.numpy as jnp

    x = jnp.asarray(X, dtype="bfloat16")
    outputs = layer_norm(x, GAMMA, BETA, 1e-6)
    assert outputs.dtype == jnp.bfloat16
    kept = jax_residuals(lambda x, g, b: layer_norm(x, g, b, 1e-6), x)
    assert [leaf.dtype for leaf in kept] == [jnp.bfloat16]
    # The layer under mixed precision hands it the bf16 input, not a float32 copy.
    layer = LayerNormalization(epsilon=1e-6, dtype="mixed_bfloat16")
    layer.build(X.shape)
    _, backward = jax.vjp(lambda x: layer.stateless_call(layer.trainable_variables, [], x)[0], x)
    kept = [leaf for leaf in jax.tree_util.tree_leaves(backward) if leaf.shape == X.shape]
    assert [leaf.dtype for leaf in kept] == [jnp.bfloat16]
    wide = lambda x, g, b: keras_layer_norm(ops.cast(x, "float32"), g, b)  # noqa: E731
    upstream = jnp.asarray(UPSTREAM, dtype="bfloat16")
    for ours, expected in zip(
        gradients(lambda x, g, b: layer_norm(x, g, b, 1e-6), [x, GAMMA, BETA], upstream),
        gradients(wide, [x, GAMMA, BETA], upstream),
    ):
        np.testing.assert_allclose(
            np.asarray(ours, "float32"), np.asarray(expected, "float32"), rtol=2e-2, atol=2e-2
        )


@pytest.mark.skipif(keras.backend.backend() != "jax", reason="reads JAX's saved residuals")
@pytest.mark.parametrize("axis", [-1, 2])
def test_layer_runs_the_closed_form_on_the_last_axis(axis):
    import jax

    layer = LayerNormalization(axis=axis, epsilon=1e-6)
    layer.build(X.shape)

    def call(x):
        return layer.stateless_call(layer.trainable_variables, [], x)[0]

    _, backward = jax.vjp(call, jax.numpy.asarray(X))
    kept = [leaf for leaf in jax.tree_util.tree_leaves(backward) if np.shape(leaf) == X.shape]
    assert len(kept) == 1
