"""One switch turns every fast kernel off, and the outputs stay the same."""

from unittest import mock

import keras
import numpy as np
import pytest

import keras_vit
from keras_vit.layers import TransformerBlock
from keras_vit.layers import multi_head_self_attention as attention_layer_module
from keras_vit.ops import switch
from tests.autodiff import gradients
from tests.conftest import TINY, randomize_weights
from tests.reference import random_tokens


@pytest.fixture
def fast_kernels_off():
    keras_vit.ops.disable_fast_kernels()
    yield
    keras_vit.ops.enable_fast_kernels()


def loss_and_gradients(model, images, upstream):
    """The logits and d sum(upstream * logits) / d (images, every weight)."""
    non_trainable = [v.value for v in model.non_trainable_variables]

    def logits(images, *weights):
        outputs, _ = model.stateless_call(list(weights), non_trainable, images, training=True)
        return outputs

    weights = [keras.ops.convert_to_numpy(v.value) for v in model.trainable_variables]
    values = keras.ops.convert_to_numpy(logits(images, *weights))
    return values, gradients(logits, [images, *weights], upstream)


def test_values_and_gradients_are_the_same_with_the_fast_kernels_off():
    model = randomize_weights(keras_vit.ViT(**TINY, classifier_activation=None))
    rng = np.random.default_rng(0)
    images = rng.uniform(0, 1, (2, 16, 16, 3)).astype("float32")
    upstream = rng.normal(size=(2, TINY["classes"])).astype("float32")
    fast = loss_and_gradients(model, images, upstream)
    keras_vit.ops.disable_fast_kernels()
    try:
        plain = loss_and_gradients(model, images, upstream)
    finally:
        keras_vit.ops.enable_fast_kernels()
    np.testing.assert_allclose(fast[0], plain[0], rtol=1e-5, atol=1e-5)
    assert len(fast[1]) == len(model.trainable_variables) + 1
    for weight, a, b in zip(
        ["images"] + [v.path for v in model.trainable_variables], fast[1], plain[1]
    ):
        np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-5, err_msg=weight)


def run_block_counting_kernels():
    """Runs a block forward and backward; how often each fast kernel was entered."""
    block = TransformerBlock(num_heads=2, mlp_dim=32)
    block.build((2, 5, 16))
    upstream = np.ones((2, 5, 16), "float32")
    with (
        mock.patch.object(
            keras.ops, "custom_gradient", wraps=keras.ops.custom_gradient
        ) as custom_gradient,
        mock.patch.object(
            attention_layer_module, "fused_attention", wraps=attention_layer_module.fused_attention
        ) as fused,
    ):
        gradients(lambda x: block(x, training=True), [random_tokens()], upstream)
    return custom_gradient.call_count, fused.call_count


def test_switched_off_layers_run_plain_keras_ops(fast_kernels_off):
    assert run_block_counting_kernels() == (0, 0)


def test_switched_on_each_backend_runs_a_fast_kernel():
    custom_gradients, fused_attentions = run_block_counting_kernels()
    if keras.backend.backend() == "torch":
        # PyTorch keeps its own GELU and LayerNorm kernels; attention on SDPA.
        assert (custom_gradients, fused_attentions) == (0, 1)
    else:
        # Two LayerNorms and one GELU with written-out backward passes.
        assert custom_gradients == 3


def test_the_environment_sets_the_starting_value(monkeypatch):
    monkeypatch.setenv("KERAS_VIT_FAST_KERNELS", "0")
    assert switch._from_environment() is False
    monkeypatch.setenv("KERAS_VIT_FAST_KERNELS", "1")
    assert switch._from_environment() is True
    monkeypatch.setenv("KERAS_VIT_FAST_KERNELS", "fast")
    with pytest.raises(ValueError, match="KERAS_VIT_FAST_KERNELS='fast'"):
        switch._from_environment()
