"""Element-wise chains compiled into one pass on TensorFlow (XLA).

TensorFlow without XLA runs every element-wise op of a graph as its own
pass over memory: the written-out backward passes of GELU (about fifteen
ops over the MLP's `4 * hidden_dim`-wide activations) and LayerNorm (about
ten). Compiled with XLA they are one or two loops (the time this saves:
docs/performance.md). Only backward passes and training-time
forward passes go through here: inference forward passes stay plain
TensorFlow ops, which SavedModel, TFLite and TensorFlow's own op fusion
(GELU into the preceding matmul) need. JAX compiles everything anyway and
PyTorch keeps its own kernels, so elsewhere, and with the fast kernels
switched off (`disable_fast_kernels`), the function runs as written.
"""

import functools
import platform

import keras

from keras_vit._compat import op_determinism_enabled
from keras_vit.ops.switch import fast_kernels_enabled


def _xla_usable_on_tensorflow():
    import tensorflow as tf

    # The conditions under which Keras itself keeps XLA off on TensorFlow
    # (`keras.src.trainers.trainer.model_supports_jit`).
    if op_determinism_enabled():
        return False
    apple_silicon = platform.system() == "Darwin" and "arm" in platform.processor().lower()
    return not (apple_silicon and tf.config.list_physical_devices("GPU"))


def compiled_on_tensorflow(function):
    """Decorates `function` to run XLA-compiled when Keras runs on TensorFlow.

    `function` takes tensors (and Python constants, which become part of
    the compiled signature) and uses `keras.ops`. On TensorFlow it runs as
    `tf.function(jit_compile=True)`, so that its element-wise ops fuse, also
    inside a graph that is not compiled as a whole; on other backends, or
    where Keras would not use XLA on TensorFlow (op determinism enabled,
    Apple GPUs), or with the fast kernels switched off, it is called as it
    is.

    Example:

    >>> @compiled_on_tensorflow
    ... def scaled_sum(x, y):
    ...     return 2.0 * x + y
    >>> float(scaled_sum(keras.ops.ones(()), keras.ops.ones(())))
    3.0
    """
    compiled = None

    @functools.wraps(function)
    def run(*args):
        nonlocal compiled
        if (
            not fast_kernels_enabled()
            or keras.backend.backend() != "tensorflow"
            or not _xla_usable_on_tensorflow()
        ):
            return function(*args)
        if compiled is None:
            import tensorflow as tf

            compiled = tf.function(
                function, jit_compile=True, reduce_retracing=True, autograph=False
            )
        return compiled(*args)

    return run
