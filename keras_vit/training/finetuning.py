"""Fine-tuning that keeps what a checkpoint knows: the new head is fitted before the rest.

A pretrained model given a new zero head and trained end to end at once
sends the head's first, uninformed gradients through every block, and
with few images the features are damaged before the head has learnt to
use them. Linear probing then fine-tuning (LP-FT; Kumar et al., "Fine-
Tuning can Distort Pretrained Features and Underperform
Out-of-Distribution", ICLR 2022) fits the head on the frozen model's
features first, so that fine-tuning starts from the probe's accuracy.
"""

import math
import time

import numpy as np


def new_heads(network):
    """The classification heads of `network` that are new: present and all zero.

    A model built with another class count than its checkpoint's (or from
    an encoder) has a zero-initialised `head` (and DeiT's `head_dist`);
    a checkpoint's own trained head is not new.
    """
    heads = []
    for name in ("head", "head_dist"):
        try:
            layer = network.get_layer(name)
        except ValueError:
            continue
        if layer.weights and not any(np.any(np.asarray(w)) for w in layer.get_weights()):
            heads.append(layer)
    return heads


def softmax_regression(features, labels, classes, *, steps=500, learning_rate=0.01, l2=0.01):
    """Multinomial logistic regression by full-batch Adam: `(kernel, bias)`.

    Deterministic (zero start, every example in every step), in NumPy, so
    that the same features give the same head on every backend.

    Args:
        features: `(N, D)` array.
        labels: `(N,)` integer labels in `[0, classes)`.
        classes: int, the number of classes.
        steps: int, full-batch steps.
        learning_rate: float, Adam's step size.
        l2: float, the weight penalty on the kernel (not the bias).

    Example:

    >>> x = np.array([[1.0, 0.0], [0.0, 1.0]] * 4)
    >>> kernel, bias = softmax_regression(x, np.array([0, 1] * 4), 2)
    >>> ((x @ kernel + bias).argmax(-1) == [0, 1] * 4).all()
    np.True_
    """
    features = np.asarray(features, "float32")
    one_hot = np.eye(classes, dtype="float32")[np.asarray(labels)]
    count, width = features.shape
    parameters = [np.zeros((width, classes), "float32"), np.zeros(classes, "float32")]
    moments = [[np.zeros_like(p), np.zeros_like(p)] for p in parameters]
    beta_1, beta_2, epsilon = 0.9, 0.999, 1e-8
    for step in range(1, steps + 1):
        kernel, bias = parameters
        logits = features @ kernel + bias
        logits -= logits.max(-1, keepdims=True)
        probabilities = np.exp(logits)
        probabilities /= probabilities.sum(-1, keepdims=True)
        error = (probabilities - one_hot) / count
        gradients = (features.T @ error + l2 * kernel, error.sum(0))
        for parameter, gradient, (first, second) in zip(parameters, gradients, moments):
            first *= beta_1
            first += (1 - beta_1) * gradient
            second *= beta_2
            second += (1 - beta_2) * gradient**2
            corrected = learning_rate * math.sqrt(1 - beta_2**step) / (1 - beta_1**step)
            parameter -= corrected * first / (np.sqrt(second) + epsilon)
    return parameters


def fit_new_heads(network, data, *, max_images=10_000, log=print):
    """Fits the new heads of `network` on its frozen features of `data` (the LP of LP-FT).

    Every other weight is left as it is. Does nothing for a model without a
    new head (see `new_heads`).

    Args:
        network: a keras_vit classifier (its head logits, any activation).
        data: `tf.data.Dataset` of `(images, one_hot_labels)` batches,
            without augmentation (an evaluation pipeline of the training
            images).
        max_images: int, the most images whose features are computed (one
            forward pass each: a third of a training step).
        log: function that prints a line.

    Returns:
        `None` without a new head, else a dict: `images`, the fitted
        heads' `training_accuracy`, and `seconds`.

    Example:

    ```python
    model = keras_vit.from_checkpoint("model.safetensors", classes=10)
    fit_new_heads(model, keras_vit.data.load(folder, "train", image_size=224).data)
    ```
    """
    import keras

    heads = new_heads(network)
    if not heads:
        return None
    start = time.perf_counter()
    features_of = keras.Model(network.inputs, [head.input for head in heads])
    features, labels, seen = [[] for _ in heads], [], 0
    for images, one_hot in data.as_numpy_iterator():
        batch = features_of.predict_on_batch(images)
        batch = batch if isinstance(batch, (list, tuple)) else [batch]
        for kept, values in zip(features, batch):
            kept.append(keras.ops.convert_to_numpy(values).reshape(len(values), -1))
        labels.append(np.asarray(one_hot).argmax(-1))
        seen += len(labels[-1])
        if seen >= max_images:
            break
    labels = np.concatenate(labels)
    logits = 0.0
    for head, kept in zip(heads, features):
        kept = np.concatenate(kept)
        kernel, bias = softmax_regression(kept, labels, head.units)
        head.set_weights([kernel.reshape(head.kernel.shape), bias])
        logits = logits + kept @ kernel + bias
    report = {
        "images": int(len(labels)),
        "training_accuracy": float(np.mean(np.argmax(logits, -1) == labels)),
        "seconds": round(time.perf_counter() - start, 1),
    }
    log(
        f"head: fitted on the frozen features of {report['images']} training images "
        f"({report['training_accuracy']:.1%} of them right, {report['seconds']:.0f} s)"
    )
    return report
