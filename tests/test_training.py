"""Training with plain model.fit on tf.data, on every backend."""

import keras
import numpy as np
import tensorflow as tf
from keras import ops

import keras_vit
from keras_vit.data import load_fashion_mnist
from tests.conftest import TINY


def fashion_mnist_dataset(count=1024, batch_size=64):
    images, labels = load_fashion_mnist("train")
    return (
        tf.data.Dataset.from_tensor_slices((images[:count], labels[:count]))
        .shuffle(count, seed=0)
        .batch(batch_size)
    )


def small_vit(**kwargs):
    return keras_vit.ViT(
        patch_size=7,
        hidden_dim=32,
        num_layers=2,
        num_heads=2,
        mlp_dim=64,
        input_shape=(28, 28, 1),
        classes=10,
        classifier_activation=None,
        **kwargs,
    )


def test_fit_on_tf_data_lowers_the_loss():
    model = small_vit(dropout_rate=0.1, drop_path_rate=0.1, seed=0)
    model.compile(
        optimizer=keras.optimizers.AdamW(3e-3),
        loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
        metrics=["accuracy"],
    )
    history = model.fit(fashion_mnist_dataset(), epochs=5, verbose=0).history
    assert history["loss"][-1] < 0.7 * history["loss"][0], history["loss"]
    assert history["accuracy"][-1] > 0.5, history["accuracy"]


def test_mixed_bfloat16_trains_and_outputs_float32_logits(images):
    float_model = keras_vit.ViT(**TINY, classifier_activation=None)
    keras.config.set_dtype_policy("mixed_bfloat16")
    model = keras_vit.ViT(**TINY, classifier_activation=None)
    model.set_weights(
        [
            np.random.default_rng(0).normal(0, 0.2, w.shape).astype("float32")
            for w in model.get_weights()
        ]
    )
    float_model.set_weights(model.get_weights())
    assert model.get_layer("encoderblock_0").compute_dtype == "bfloat16"
    assert all(w.dtype == "float32" for w in model.weights)
    logits = model(images)
    assert ops.convert_to_numpy(logits).dtype == np.float32
    np.testing.assert_allclose(
        ops.convert_to_numpy(logits),
        ops.convert_to_numpy(float_model(images)),
        atol=0.1,
        rtol=0.05,
    )
    # The attention softmax is computed in float32 under mixed precision.
    block = model.get_layer("encoderblock_0")
    _, scores = block(ops.ones((1, 17, 32), "bfloat16"), return_attention_scores=True)
    assert ops.convert_to_numpy(scores).dtype == np.float32

    model.compile(
        optimizer="adam",
        loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
    )
    labels = np.arange(len(images)) % 5
    history = model.fit(images, labels, epochs=3, batch_size=4, verbose=0).history
    assert np.isfinite(history["loss"]).all()
    assert history["loss"][-1] < history["loss"][0]
