"""BatchNorm statistics recomputed after training: what inference sees, after any run length."""

import keras
import numpy as np
import pytest

import keras_vit
from keras_vit.training.batch_norm_statistics import (
    PreciseBatchNorm,
    recompute_batch_norm_statistics,
)


def stem_model():
    """A tiny hybrid ViT: three BatchNorms nested in its `ConvStem`, Transformer blocks after."""
    return keras_vit.ViT(
        input_shape=(16, 16, 3),
        patch_size=1,
        hidden_dim=16,
        num_layers=1,
        num_heads=2,
        mlp_dim=32,
        stem_filters=(4, 8, 8),
        stem_downsampling=("max_pool", "convolution", "convolution"),
        classes=3,
        pooling="gap",
        class_token=False,
    )


def stem_inputs_at_inference(model, images):
    """The inputs of each of the stem's BatchNorms in inference mode, by its own layers."""
    from keras_vit.layers.conv_stem import max_pool_2x2

    stem = model.get_layer("stem")
    x = keras.Model(model.inputs, stem.input)(images)  # the images, rescaled
    inputs = []
    for convolution, norm, stage in zip(stem.convolutions, stem.norms, stem.stage_downsampling):
        x = convolution(x)
        inputs.append(keras.ops.convert_to_numpy(x).astype("float64"))
        x = keras.ops.relu(norm(x, training=False))
        if stage == "max_pool":
            x = max_pool_2x2(x)
    return inputs


def test_each_layer_gets_the_mean_and_variance_of_its_inputs_at_inference():
    model = stem_model()
    rng = np.random.default_rng(0)
    images = rng.uniform(0, 255, (40, 16, 16, 3)).astype("float32")
    stem = model.get_layer("stem")
    # Weights that move each stage's statistics far from Keras' start (0, 1).
    for convolution in stem.convolutions:
        kernel = convolution.kernel
        convolution.kernel.assign(rng.normal(0.5, 1.0, kernel.shape).astype("float32"))
    weights_before = [np.array(w) for w in model.weights if "moving" not in w.path]

    count = recompute_batch_norm_statistics(
        model, lambda: np.split(images[:32], 4) + [images[32:]], max_images=32
    )

    assert count == 32
    # Each layer in turn, over the first 32 images only, with the layers
    # before it already using their new statistics.
    for norm, inputs in zip(stem.norms, stem_inputs_at_inference(model, images[:32])):
        np.testing.assert_allclose(norm.moving_mean, inputs.mean(axis=(0, 1, 2)), rtol=1e-5)
        np.testing.assert_allclose(
            norm.moving_variance, inputs.var(axis=(0, 1, 2)), rtol=1e-4, atol=1e-6
        )
        assert np.asarray(norm.moving_variance).max() > 2.0  # far from the start
    others = [np.array(w) for w in model.weights if "moving" not in w.path]
    for before, after in zip(weights_before, others):
        np.testing.assert_array_equal(before, after)
    # Each pass stops at its layer: the block after the stem never runs.
    block, calls = model.get_layer("encoderblock_0"), []
    block.call = lambda tokens, *args, **kwargs: calls.append(1) or tokens
    try:
        recompute_batch_norm_statistics(model, lambda: [images[:8]])
    finally:
        del block.call
    assert calls == []


def test_a_model_without_batch_norm_is_left_alone():
    model = keras_vit.ViT(
        input_shape=(8, 8, 3), patch_size=4, hidden_dim=8, num_layers=1, num_heads=2, mlp_dim=8
    )
    weights = model.get_weights()
    assert recompute_batch_norm_statistics(model, lambda: [np.ones((2, 8, 8, 3))]) == 0
    for before, after in zip(weights, model.get_weights()):
        np.testing.assert_array_equal(before, after)
    with pytest.raises(ValueError, match="max_images=0"):
        recompute_batch_norm_statistics(model, lambda: [], max_images=0)


def test_fit_validates_and_checkpoints_the_weights_with_their_own_statistics():
    """After a short fit the moving averages lag; the callback's statistics do not."""
    keras.utils.set_random_seed(0)
    model = stem_model()
    model.compile(optimizer=keras.optimizers.Adam(1e-2), loss="mse")
    rng = np.random.default_rng(1)
    images = rng.uniform(0, 255, (64, 16, 16, 3)).astype("float32")
    targets = rng.normal(size=(64, 3)).astype("float32")
    seen = {}

    class Checkpoint(keras.callbacks.Callback):  # what a checkpoint at the epoch's end holds
        def on_epoch_end(self, epoch, logs=None):
            seen[epoch] = [np.array(n.moving_mean) for n in model.get_layer("stem").norms]

    statistics = PreciseBatchNorm(lambda: [images[:32], images[32:]])
    history = model.fit(
        images,
        targets,
        batch_size=16,
        epochs=2,
        validation_data=(images, targets),
        callbacks=[statistics, Checkpoint()],
        verbose=0,
    )
    statistics.finish()  # nothing to do: the last validation recomputed them
    expected = stem_inputs_at_inference(model, images)
    for norm, inputs, checkpointed in zip(model.get_layer("stem").norms, expected, seen[1]):
        np.testing.assert_allclose(norm.moving_mean, inputs.mean(axis=(0, 1, 2)), rtol=1e-5)
        np.testing.assert_array_equal(checkpointed, norm.moving_mean)
    # The last validation saw the statistics the model keeps.
    assert history.history["val_loss"][-1] == pytest.approx(
        model.evaluate(images, targets, batch_size=16, verbose=0), rel=1e-5
    )
