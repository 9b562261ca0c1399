"""GELU with a backward pass that keeps only its input."""

import keras
import numpy as np
import pytest
from keras import ops
from keras.src import testing

from keras_vit.layers.gelu_dense import GeluDense, SwiGLUDense, gelu_approximate, gelu_exact
from keras_vit.ops import gelu
from tests import reference
from tests.autodiff import gradients

X = np.linspace(-6.0, 6.0, 241, dtype="float32").reshape(1, -1)
UPSTREAM = np.random.default_rng(0).normal(size=X.shape).astype("float32")


def numpy_gelu(x, approximate):
    return reference.gelu(x.astype("float64"), approximate)


def numpy_gelu_derivative(x, approximate):
    """Central differences in float64."""
    x, step = x.astype("float64"), 1e-5
    return (numpy_gelu(x + step, approximate) - numpy_gelu(x - step, approximate)) / (2 * step)


def input_gradient(function, x, upstream):
    """d sum(upstream * function(x)) / dx with the backend's own autodiff."""
    return gradients(function, [x], upstream)[0]


@pytest.mark.parametrize("approximate", [True, False])
def test_values_and_gradients_match_gelu(approximate):
    values = ops.convert_to_numpy(gelu(X, approximate=approximate))
    np.testing.assert_allclose(values, numpy_gelu(X, approximate), atol=1e-6)

    gradient = input_gradient(lambda x: gelu(x, approximate), X, UPSTREAM)
    np.testing.assert_allclose(
        gradient, UPSTREAM * numpy_gelu_derivative(X, approximate), atol=1e-5
    )
    autodiff = input_gradient(lambda x: ops.gelu(x, approximate=approximate), X, UPSTREAM)
    np.testing.assert_allclose(gradient, autodiff, atol=5e-6)


@pytest.mark.parametrize("approximate", [True, False])
def test_training_runs_other_kernels_for_the_same_values_and_gradients(approximate):
    training = lambda x: gelu(x, approximate, training=True)  # noqa: E731
    inference = lambda x: gelu(x, approximate, training=False)  # noqa: E731
    np.testing.assert_allclose(
        ops.convert_to_numpy(training(X)), ops.convert_to_numpy(inference(X)), atol=1e-6
    )
    np.testing.assert_allclose(
        input_gradient(training, X, UPSTREAM), input_gradient(inference, X, UPSTREAM), atol=1e-6
    )


def test_registered_activations_pick_their_form():
    np.testing.assert_allclose(
        ops.convert_to_numpy(gelu_approximate(X)), numpy_gelu(X, True), atol=1e-6
    )
    np.testing.assert_allclose(ops.convert_to_numpy(gelu_exact(X)), numpy_gelu(X, False), atol=1e-6)
    # The two forms differ by up to ~5e-4: the check above tells them apart.
    assert np.abs(numpy_gelu(X, True) - numpy_gelu(X, False)).max() > 1e-4
    for activation in (gelu_approximate, gelu_exact):
        name = keras.saving.get_registered_name(activation)
        assert keras.saving.get_registered_object(name) is activation


@pytest.mark.skipif(keras.backend.backend() != "jax", reason="reads JAX's saved residuals")
@pytest.mark.parametrize("approximate", [True, False])
def test_backward_pass_keeps_only_the_input(approximate):
    import jax

    def residuals(function):
        _, backward = jax.vjp(function, jax.numpy.asarray(X))
        return [leaf for leaf in jax.tree_util.tree_leaves(backward) if np.shape(leaf) == X.shape]

    kept = residuals(lambda x: gelu(x, approximate))
    assert len(kept) == 1
    np.testing.assert_array_equal(np.asarray(kept[0]), X)
    # Autodiff through the composite keeps more: the reason for this module.
    assert len(residuals(lambda x: ops.gelu(x, approximate=approximate))) >= 3


class GeluDenseTest(testing.TestCase):
    def test_layer_basics(self):
        self.run_layer_test(
            GeluDense,
            init_kwargs={"units": 6, "approximate": False},
            input_shape=(2, 4),
            expected_output_shape=(2, 6),
            expected_num_trainable_weights=2,
        )

    def test_is_dense_then_gelu_in_training_and_inference(self):
        for approximate in (True, False):
            layer = GeluDense(7, approximate=approximate, bias_initializer="ones")
            x = X.reshape(-1, 1)[::10]
            layer.build(x.shape)
            linear = x @ ops.convert_to_numpy(layer.kernel) + ops.convert_to_numpy(layer.bias)
            for training in (False, True):
                self.assertAllClose(
                    layer(x, training=training), numpy_gelu(linear, approximate), atol=1e-5
                )

    def test_activation_is_not_an_argument(self):
        with self.assertRaisesRegex(TypeError, "activation='relu'"):
            GeluDense(4, activation="relu")

    def test_int8_quantized_layer_still_applies_gelu(self):
        inputs = keras.Input((32,))
        model = keras.Model(inputs, GeluDense(16)(inputs))
        x = np.random.default_rng(1).normal(size=(8, 32)).astype("float32")
        expected = ops.convert_to_numpy(model(x))
        model.quantize("int8")
        assert model.layers[-1].quantization_mode == "int8"
        quantized = ops.convert_to_numpy(model(x))
        # GELU is non-negative but for a small dip to -0.17: without it, half
        # the outputs would be well below that.
        assert quantized.min() > -0.2
        np.testing.assert_allclose(quantized, expected, atol=0.05)


def test_swiglu_dense_is_the_gate_times_the_up_projection_and_saves_and_quantizes():
    rng = np.random.default_rng(3)
    x = rng.normal(size=(4, 6)).astype("float32")
    layer = SwiGLUDense(5, name="mlp_dense_1")
    layer.build((None, 6))
    kernel, bias = rng.normal(size=(6, 10)), rng.normal(size=10)
    layer.set_weights([kernel.astype("float32"), bias.astype("float32")])
    gate, up = x @ kernel[:, :5] + bias[:5], x @ kernel[:, 5:] + bias[5:]
    expected = gate / (1 + np.exp(-gate)) * up  # silu(gate) * up (DINOv3ViTGatedMLP)
    got = ops.convert_to_numpy(layer(x))
    np.testing.assert_allclose(got, expected, rtol=1e-5, atol=1e-5)
    clone = SwiGLUDense.from_config(layer.get_config())
    assert clone.get_config()["units"] == 5 and layer.compute_output_shape((None, 6)) == (None, 5)
    layer.quantize("int8")
    quantized = ops.convert_to_numpy(layer(x))
    assert 0 < np.abs(quantized - expected).max() < 0.05 * np.abs(expected).max()
    with pytest.raises(TypeError, match="no `activation`"):
        SwiGLUDense(5, activation="relu")
    with pytest.raises(ValueError, match="units=0"):
        SwiGLUDense(0)
