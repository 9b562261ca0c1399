"""Build a small ViT, train it with model.fit on a tf.data pipeline, take it apart.

Runs on any backend:

    KERAS_BACKEND=jax .venv/bin/python examples/quickstart.py

Uses the real Fashion-MNIST from Debian's `dataset-fashion-mnist` package
(installed by `make demo` / `make test`).
"""

import keras
import numpy as np
import tensorflow as tf

import keras_vit
from keras_vit.data import CLASS_NAMES, load_fashion_mnist

keras.utils.set_random_seed(0)
images, labels = load_fashion_mnist("train")
test_images, test_labels = load_fashion_mnist("test")

# Any architecture; the paper's variants are keras_vit.ViTB16() etc.
model = keras_vit.ViT(
    patch_size=7,
    hidden_dim=64,
    num_layers=4,
    num_heads=4,
    mlp_dim=128,
    input_shape=(28, 28, 1),
    classes=len(CLASS_NAMES),
    classifier_activation=None,
    dropout_rate=0.1,
    drop_path_rate=0.1,
)
model.compile(
    optimizer=keras.optimizers.AdamW(1e-3, weight_decay=0.05, global_clipnorm=1.0),
    loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
    metrics=["accuracy"],
)
train = (
    tf.data.Dataset.from_tensor_slices((images[:10000], labels[:10000]))
    .shuffle(10000, seed=0)
    .batch(128)
    .prefetch(2)
)
model.fit(train, epochs=2, verbose=2)
_, accuracy = model.evaluate(test_images, test_labels, batch_size=512, verbose=0)
print(f"test accuracy: {accuracy:.3f}")

# Every block's tokens, and one block's attention probabilities.
features = keras_vit.feature_extractor(model, blocks=[0, -1])
outputs = features(test_images[:2])
for name, tokens in outputs.items():
    print(f"{name}: {tuple(tokens.shape)}")
block = model.get_layer("encoderblock_0")
_, attention = block(outputs["encoderblock_0"], return_attention_scores=True)
row_sum = float(np.sum(keras.ops.convert_to_numpy(attention)[0, 0, 0]))
print(f"attention of block 1: {tuple(attention.shape)} rows sum to {row_sum:.5f}")
