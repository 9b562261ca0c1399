"""BatchNorm with a closed-form backward pass in the training step."""

import keras
import numpy as np
import pytest
from keras import ops
from keras.src import testing

import keras_vit
from keras_vit.layers import BatchNormalization, ConvStem
from keras_vit.ops import batch_norm, closed_form_batch_norm_preferred
from tests.autodiff import central_differences, gradients

RNG = np.random.default_rng(0)
X = (3.0 * RNG.normal(size=(4, 5, 5, 6)) + 1.0).astype("float32")
GAMMA = RNG.normal(size=6).astype("float32")
BETA = RNG.normal(size=6).astype("float32")
UPSTREAM = RNG.normal(size=X.shape).astype("float32")
EPSILON = 1e-3


def reference_batch_norm(x, gamma, beta, epsilon=EPSILON):
    axes = tuple(range(x.ndim - 1))
    mean, variance = x.mean(axes), x.var(axes)
    return (x - mean) / np.sqrt(variance + epsilon) * gamma + beta, mean, variance


def keras_batch_norm(x, gamma, beta):
    mean, variance = ops.moments(x, tuple(range(len(x.shape) - 1)))
    return ops.batch_normalization(
        x, mean, variance, axis=-1, offset=beta, scale=gamma, epsilon=EPSILON
    )


def ours(x, gamma, beta):
    return batch_norm(x, gamma, beta, EPSILON)[0]


@pytest.mark.parametrize("shape", [(4, 5, 5, 6), (100, 6)])
def test_values_statistics_and_gradients_match_keras(shape):
    x, upstream = X.reshape(shape), UPSTREAM.reshape(shape)
    outputs, mean, variance = (ops.convert_to_numpy(t) for t in batch_norm(x, GAMMA, BETA, EPSILON))
    expected = reference_batch_norm(x.astype("float64"), GAMMA, BETA)
    for name, value, reference in zip(
        ("outputs", "mean", "variance"), (outputs, mean, variance), expected
    ):
        np.testing.assert_allclose(value, reference, rtol=1e-5, atol=2e-5, err_msg=name)

    computed = gradients(ours, [x, GAMMA, BETA], upstream)
    autodiff = gradients(keras_batch_norm, [x, GAMMA, BETA], upstream)
    for name, our_gradient, keras_gradient in zip(("x", "gamma", "beta"), computed, autodiff):
        assert our_gradient.shape == keras_gradient.shape, name
        np.testing.assert_allclose(our_gradient, keras_gradient, atol=3e-5, err_msg=name)
    # Blind to a shift of a channel: its x gradient sums to zero over the batch.
    np.testing.assert_allclose(computed[0].reshape(-1, 6).sum(0), 0.0, atol=1e-4)


def test_matches_the_float64_derivative_of_the_reference():
    x, upstream = X[:2, :2, :2].astype("float64"), UPSTREAM[:2, :2, :2].astype("float64")
    numeric = central_differences(lambda x: reference_batch_norm(x, GAMMA, BETA)[0], x, upstream)
    computed = gradients(ours, [x.astype("float32"), GAMMA, BETA], upstream.astype("float32"))[0]
    np.testing.assert_allclose(computed, numeric, atol=2e-4)


def test_preferred_on_jax_only_and_not_with_the_fast_kernels_off():
    assert closed_form_batch_norm_preferred() == (keras.backend.backend() == "jax")
    keras_vit.ops.disable_fast_kernels()
    try:
        assert not closed_form_batch_norm_preferred()
    finally:
        keras_vit.ops.enable_fast_kernels()


def training_step(layer, x, upstream):
    """Outputs, d sum(upstream * outputs) / d (x, gamma, beta), and the moving statistics after."""
    moving = [v.value for v in layer.non_trainable_variables]

    def outputs(x, gamma, beta):
        return layer.stateless_call([gamma, beta], moving, x, training=True)[0]

    _, updated = layer.stateless_call(
        [layer.gamma.value, layer.beta.value], moving, x, training=True
    )
    weights = [ops.convert_to_numpy(layer.gamma), ops.convert_to_numpy(layer.beta)]
    return (
        ops.convert_to_numpy(outputs(x, *weights)),
        gradients(outputs, [x, *weights], upstream),
        [ops.convert_to_numpy(v) for v in updated],
    )


class BatchNormalizationTest(testing.TestCase):
    def test_layer_basics(self):
        self.run_layer_test(
            BatchNormalization,
            init_kwargs={"momentum": 0.9},
            input_shape=(2, 3, 3, 4),
            expected_output_shape=(2, 3, 3, 4),
            expected_num_trainable_weights=2,
            expected_num_non_trainable_weights=2,
            supports_masking=True,
        )

    def test_registered_under_the_package(self):
        assert (
            keras.saving.get_registered_name(BatchNormalization) == "keras_vit>BatchNormalization"
        )

    def test_same_weights_values_gradients_and_moving_statistics_as_keras_layer(self):
        ours, theirs = (
            BatchNormalization(momentum=0.9),
            keras.layers.BatchNormalization(momentum=0.9),
        )
        for layer in (ours, theirs):
            layer.build(X.shape)
            layer.set_weights([GAMMA, BETA, np.full(6, 0.5, "float32"), np.full(6, 2.0, "float32")])
        assert [w.path.split("/")[-1] for w in ours.weights] == [
            "gamma",
            "beta",
            "moving_mean",
            "moving_variance",
        ]
        our_step, their_step = training_step(ours, X, UPSTREAM), training_step(theirs, X, UPSTREAM)
        self.assertAllClose(our_step[0], their_step[0], atol=2e-5)
        for name, a, b in zip(("x", "gamma", "beta"), our_step[1], their_step[1]):
            self.assertAllClose(a, b, atol=3e-5, msg=name)
        for name, a, b in zip(("moving_mean", "moving_variance"), our_step[2], their_step[2]):
            self.assertAllClose(a, b, atol=1e-5, msg=name)
        # Inference uses the moving statistics, as Keras' layer does.
        self.assertAllClose(ours(X, training=False), theirs(X, training=False), atol=1e-5)

    def test_other_configurations_are_keras_layer(self):
        x = X.transpose(0, 3, 1, 2)
        for kwargs in ({"axis": 1}, {"center": False}, {"scale": False}):
            ours, theirs = BatchNormalization(**kwargs), keras.layers.BatchNormalization(**kwargs)
            ours.build(x.shape)
            theirs.build(x.shape)
            weights = [np.abs(RNG.normal(size=w.shape)).astype("float32") for w in theirs.weights]
            ours.set_weights(weights)
            theirs.set_weights(weights)
            self.assertAllClose(
                ours(x, training=True), theirs(x, training=True), atol=2e-5, msg=str(kwargs)
            )
            self.assertAllClose(ours.moving_mean, theirs.moving_mean, atol=1e-6, msg=str(kwargs))

    def test_mixed_precision_computes_in_float32(self):
        layer = BatchNormalization(dtype="mixed_bfloat16")
        layer.build(X.shape)
        # A large offset: bfloat16 statistics would be far off.
        x = ops.cast(X + 1000.0, "bfloat16")
        outputs = layer(x, training=True)
        assert keras.backend.standardize_dtype(outputs.dtype) == "bfloat16"
        inputs = ops.convert_to_numpy(ops.cast(x, "float32")).astype("float64")
        expected = reference_batch_norm(inputs, 1.0, 0.0)[0]
        np.testing.assert_allclose(
            ops.convert_to_numpy(ops.cast(outputs, "float32")), expected, atol=0.05
        )


def test_conv_stem_normalises_with_it():
    stem = ConvStem(filters=(4, 8))
    assert all(type(norm) is BatchNormalization for norm in stem.norms)


@pytest.mark.skipif(keras.backend.backend() != "jax", reason="reads JAX's saved residuals")
def test_layer_trains_on_the_closed_form_on_jax():
    import jax

    layer = BatchNormalization()
    layer.build(X.shape)

    def kept_by(layer):
        def call(x):
            return layer.stateless_call(
                layer.trainable_variables,
                [v.value for v in layer.non_trainable_variables],
                x,
                training=True,
            )[0]

        _, backward = jax.vjp(call, jax.numpy.asarray(X))
        return [leaf for leaf in jax.tree_util.tree_leaves(backward) if np.shape(leaf) == X.shape]

    # Only the input waits for the closed form's backward pass; autodiff
    # through Keras' layer keeps more of its size.
    kept = kept_by(layer)
    assert len(kept) == 1
    np.testing.assert_array_equal(np.asarray(kept[0]), X)
    theirs = keras.layers.BatchNormalization()
    theirs.build(X.shape)
    assert len(kept_by(theirs)) >= 2
