"""The paper's recipes: schedules, decoupled weight decay, optimizers."""

import keras
import numpy as np
import pytest
from keras import ops

import keras_vit
from keras_vit.training import (
    RECIPES,
    WarmupDecay,
    finetuning_optimizer,
    get_recipe,
    no_weight_decay_variables,
    pretraining_optimizer,
)
from keras_vit.training.recipes import TENSORFLOW_XLA_MIN_STEPS
from tests.conftest import TINY


@pytest.mark.parametrize(
    "decay, expected",
    [
        ("cosine", {0: 0.0, 25: 0.5, 50: 1.0, 75: 0.5, 100: 0.0, 150: 0.0}),
        ("linear", {0: 0.0, 25: 0.5, 50: 1.0, 75: 0.5, 100: 0.0, 150: 0.0}),
    ],
)
def test_schedules_hit_their_values_at_the_stated_steps(decay, expected):
    schedule = WarmupDecay(1.0, total_steps=100, warmup_steps=50, decay=decay)
    for step, value in expected.items():
        assert float(ops.convert_to_numpy(schedule(step))) == pytest.approx(value, abs=1e-6)
    # Cosine and linear differ between the ends.
    assert float(schedule(60)) == pytest.approx(
        0.5 * (1 + np.cos(np.pi * 0.2)) if decay == "cosine" else 0.8, abs=1e-6
    )
    assert WarmupDecay.from_config(schedule.get_config()).get_config() == schedule.get_config()


def test_bad_schedule_arguments_name_the_value():
    with pytest.raises(ValueError, match="decay='step'"):
        WarmupDecay(1.0, 10, decay="step")
    with pytest.raises(ValueError, match="warmup_steps=20"):
        WarmupDecay(1.0, 10, warmup_steps=20)
    with pytest.raises(ValueError, match="recipe='adam'"):
        get_recipe("adam")


def test_weight_decay_skips_biases_layernorm_position_embeddings_and_class_token():
    model = keras_vit.ViT(
        **{**TINY, "patch_size": 1},
        stem_filters=(4,),
        distillation_token=True,
        num_register_tokens=2,
    )
    skipped = {v.path for v in no_weight_decay_variables(model)}
    assert "position_embedding/embeddings" in skipped
    assert "class_token/token" in skipped and "distillation_token/token" in skipped
    assert "register_tokens/tokens" in skipped
    assert "stem/batch_norm_0/gamma" in skipped and "stem/conv_0/kernel" not in skipped
    assert "encoder_norm/gamma" in skipped and "encoderblock_0/attention_norm/beta" in skipped
    assert "encoderblock_1/attention/qkv/bias" in skipped and "head/bias" in skipped
    assert "encoderblock_0/mlp_dense_1/kernel" not in skipped
    assert "patch_embedding/kernel" not in skipped and "head/kernel" not in skipped
    # With zero gradients Adam's step is zero: only the decay moves weights.
    model.set_weights([np.ones(w.shape, "float32") for w in model.get_weights()])
    optimizer = pretraining_optimizer(model, 0.1, weight_decay=0.5)
    variables = model.trainable_variables
    optimizer.apply_gradients([(ops.zeros(v.shape), v) for v in variables])
    for variable in variables:
        value = ops.convert_to_numpy(variable)
        expected = 1.0 if variable.path in skipped else 1.0 - 0.1 * 0.5
        np.testing.assert_allclose(value, expected, rtol=1e-6, err_msg=variable.path)


@pytest.mark.slow
def test_recipes_compile_and_train(images):
    labels = np.eye(5, dtype="float32")[np.arange(4) % 5]
    for name in ("pretrain", "paper_finetune", "small"):
        model = keras_vit.ViT(**TINY, classifier_activation=None)
        # One of them trains through XLA on TensorFlow, as long runs do.
        tensorflow = keras.backend.backend() == "tensorflow"
        xla = {"jit_compile": True} if tensorflow and name == "pretrain" else {}
        RECIPES[name].compile(model, total_steps=4, gradient_accumulation_steps=2, **xla)
        before = model.get_layer("head").get_weights()[0].copy()
        traces = []
        if keras.backend.backend() == "tensorflow":

            def counted_train_step(data, train_step=model.train_step, traces=traces):
                traces.append(1)  # Python: runs once per trace of the compiled step
                return train_step(data)

            model.train_step = counted_train_step
        model.fit(images, labels, batch_size=2, epochs=2, verbose=0)
        assert (
            int(ops.convert_to_numpy(model.optimizer.iterations)) == 2
        )  # 4 batches, accumulated by 2
        if keras.backend.backend() == "tensorflow":
            # One trace: the optimizer's slots exist before the first step
            # (made inside it, TensorFlow traces the step twice).
            assert len(traces) == 1, (name, len(traces))
        assert not np.allclose(model.get_layer("head").get_weights()[0], before)
    assert isinstance(RECIPES["paper_finetune"].make_optimizer(model, 10), keras.optimizers.SGD)
    # XLA on TensorFlow too (Keras leaves it off without an accelerator),
    # from the run length where it pays for its compile time; always on JAX.
    for steps in (TENSORFLOW_XLA_MIN_STEPS - 1, TENSORFLOW_XLA_MIN_STEPS):
        RECIPES["small"].compile(model, total_steps=steps)
        expected = {"jax": True, "tensorflow": steps >= TENSORFLOW_XLA_MIN_STEPS, "torch": False}
        assert bool(model.jit_compile) is expected[keras.backend.backend()], steps


def test_gradient_accumulation_equals_one_step_on_the_whole_batch():
    # Two batches of 4 accumulated: the same update as one batch of 8.
    rng = np.random.default_rng(0)
    x = rng.uniform(0, 255, (8, 16, 16, 3)).astype("float32")
    y = np.eye(5, dtype="float32")[rng.integers(0, 5, 8)]
    results, start = [], None
    for batch_size, accumulate in ((4, 2), (8, None)):
        model = keras_vit.ViT(**TINY, classifier_activation=None)
        if start is None:
            start = model.get_weights()
        model.set_weights(start)
        model.compile(
            optimizer=finetuning_optimizer(
                0.5, clipnorm=None, gradient_accumulation_steps=accumulate
            ),
            loss=keras.losses.CategoricalCrossentropy(from_logits=True),
        )
        model.fit(x, y, batch_size=batch_size, epochs=1, shuffle=False, verbose=0)
        results.append(model.get_weights())
    moved = max(np.abs(a - b).max() for a, b in zip(results[1], start))
    assert moved > 1e-3
    for a, b in zip(*results):
        np.testing.assert_allclose(a, b, atol=1e-5)


@pytest.mark.backend_independent
@pytest.mark.parametrize(
    "changes, peak",
    [(dict(lora=2), 3e-3), (dict(qat="int8"), 1e-6), (dict(), None)],
    ids=["lora", "qat", "whole"],
)
def test_a_lora_or_qat_runs_optimizer_peaks_at_the_recipes_own_rate(changes, peak):
    import types

    from keras_vit.training import train_job

    recipe = keras_vit.training.get_recipe("finetune")
    assert (recipe.lora_learning_rate, recipe.qat_learning_rate) == (3e-3, 1e-6)
    settings = types.SimpleNamespace(
        patch_dropout_rate=None, layer_decay=None, ema_momentum=None, lora=None, qat=None
    )
    vars(settings).update(changes)
    optimizer = train_job._recipe(settings, recipe).make_optimizer(
        keras_vit.ViT(**TINY), total_steps=100
    )
    schedule = keras.optimizers.schedules.deserialize(optimizer.get_config()["learning_rate"])
    rates = [float(keras.ops.convert_to_numpy(schedule(step))) for step in range(100)]
    assert max(rates) == pytest.approx(peak or recipe.learning_rate, rel=1e-6)
