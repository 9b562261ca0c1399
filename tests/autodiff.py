"""Gradients by the backend's own autodiff, for checking hand-written ones."""

import keras
import numpy as np


def gradients(function, arrays, upstream):
    """d sum(upstream * function(*arrays)) / d arrays, one NumPy array each."""
    backend = keras.backend.backend()
    if backend == "tensorflow":
        import tensorflow as tf

        tensors = [tf.constant(a) for a in arrays]
        with tf.GradientTape() as tape:
            tape.watch(tensors)
            loss = tf.reduce_sum(upstream * function(*tensors))
        return [g.numpy() for g in tape.gradient(loss, tensors)]
    if backend == "jax":
        import jax

        loss = lambda *a: (upstream * function(*a)).sum()  # noqa: E731
        argnums = tuple(range(len(arrays)))
        # Compiled, as a training step runs it: op by op, each op compiles alone.
        return [np.asarray(g) for g in jax.jit(jax.grad(loss, argnums=argnums))(*arrays)]
    import torch

    tensors = [torch.tensor(a, requires_grad=True) for a in arrays]
    (torch.tensor(upstream) * function(*tensors)).sum().backward()
    return [t.grad.numpy() for t in tensors]


def central_differences(function, x, upstream, step=1e-6):
    """d sum(upstream * function(x)) / d x by central differences, in float64 NumPy."""
    numeric = np.zeros_like(x)
    for index in np.ndindex(x.shape):
        shifted = [x.copy(), x.copy()]
        shifted[0][index] += step
        shifted[1][index] -= step
        up, down = (np.sum(upstream * function(s)) for s in shifted)
        numeric[index] = (up - down) / (2 * step)
    return numeric
