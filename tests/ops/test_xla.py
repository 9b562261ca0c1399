"""Element-wise chains XLA-compiled on TensorFlow, as written elsewhere."""

import keras
import numpy as np
import pytest
from keras import ops

from keras_vit.layers import TransformerBlock
from keras_vit.ops import compiled_on_tensorflow
from keras_vit.ops import xla as fusion
from tests.reference import random_tokens

on_tensorflow = pytest.mark.skipif(
    keras.backend.backend() != "tensorflow", reason="XLA-compiles on TensorFlow only"
)


@compiled_on_tensorflow
def scaled_difference(x, y, scale):
    return scale * (x - y) * (x + y)


def compiled_calls(graph):
    """Function calls in a TensorFlow graph that XLA must compile."""
    return [
        op
        for op in graph.get_operations()
        if "PartitionedCall" in op.type and op.node_def.attr["_XlaMustCompile"].b
    ]


def test_values_are_those_of_the_function_as_written():
    x, y = np.arange(6.0, dtype="float32").reshape(2, 3), np.ones((2, 3), "float32")
    computed = ops.convert_to_numpy(scaled_difference(x, y, 0.5))
    np.testing.assert_allclose(computed, 0.5 * (x - y) * (x + y), rtol=1e-6)
    assert scaled_difference.__name__ == "scaled_difference"


@on_tensorflow
def test_runs_as_one_compiled_call_inside_a_tensorflow_graph():
    import tensorflow as tf

    traced = tf.function(lambda x: scaled_difference(x, x + 1.0, 2.0), autograph=False)
    graph = traced.get_concrete_function(tf.TensorSpec((None, 3))).graph
    assert len(compiled_calls(graph)) == 1
    # Its shape is generalised: another batch size runs the same trace.
    assert traced(tf.ones((5, 3))).shape == (5, 3)


@on_tensorflow
@pytest.mark.parametrize("setting", ["op determinism", "Apple GPU"])
def test_runs_as_written_where_keras_would_not_use_xla(monkeypatch, setting):
    import tensorflow as tf
    from tensorflow.python.framework import config

    if setting == "op determinism":
        monkeypatch.setattr(config, "is_op_determinism_enabled", lambda: True)
    else:
        monkeypatch.setattr(fusion.platform, "system", lambda: "Darwin")
        monkeypatch.setattr(fusion.platform, "processor", lambda: "arm")
        monkeypatch.setattr(tf.config, "list_physical_devices", lambda kind=None: ["GPU:0"])
    traced = tf.function(lambda x: scaled_difference(x, x, 2.0), autograph=False)
    assert compiled_calls(traced.get_concrete_function(tf.TensorSpec((None, 3))).graph) == []


@on_tensorflow
def test_a_training_step_compiles_the_backward_passes_but_not_inference():
    import tensorflow as tf

    block = TransformerBlock(num_heads=2, mlp_dim=32)
    x = tf.constant(random_tokens())
    block(x)

    def loss(x, training):
        with tf.GradientTape() as tape:
            tape.watch(x)
            y = tf.reduce_sum(block(x, training=training) ** 2)
        return tape.gradient(y, [x, *block.trainable_weights])

    training_graph = tf.function(lambda x: loss(x, True)).get_concrete_function(x).graph
    # Both LayerNorms' backward passes, GELU's forward and backward passes.
    assert len(compiled_calls(training_graph)) == 4
    inference_graph = tf.function(lambda x: block(x)).get_concrete_function(x).graph
    assert compiled_calls(inference_graph) == []
    # GELU's forward pass compiled (training) or as TensorFlow's ops: the
    # same gradients (the block has no dropout).
    for a, b in zip(loss(x, True), loss(x, False)):
        np.testing.assert_allclose(a.numpy(), b.numpy(), rtol=1e-4, atol=1e-5)


@on_tensorflow
def test_nothing_is_compiled_with_the_fast_kernels_off():
    import tensorflow as tf

    import keras_vit

    block = TransformerBlock(num_heads=2, mlp_dim=32)
    x = tf.constant(random_tokens())
    block(x)

    def step(x):
        with tf.GradientTape() as tape:
            tape.watch(x)
            y = tf.reduce_sum(block(x, training=True) ** 2)
        return tape.gradient(y, [x, *block.trainable_weights])

    keras_vit.ops.disable_fast_kernels()
    try:
        graph = tf.function(step).get_concrete_function(x).graph
    finally:
        keras_vit.ops.enable_fast_kernels()
    assert compiled_calls(graph) == []
    assert compiled_calls(tf.function(step).get_concrete_function(x).graph) != []
