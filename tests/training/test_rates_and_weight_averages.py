"""Layer-wise learning-rate decay and weight averages: what fine-tuning can turn on."""

import keras
import numpy as np
import pytest

import keras_vit
from keras_vit.optimizers import ScaledAdamW, ScaledSGD, WarmupDecay
from keras_vit.training import RECIPES, layer_decay_scales
from tests.conftest import TINY


def tiny_classifier():
    """The suite's tiny ViT, with logits out."""
    return keras_vit.ViT(**TINY, classifier_activation=None)


def test_each_block_gets_its_power_of_the_decay_and_the_embedding_the_lowest():
    model = keras_vit.ViT(
        input_shape=(16, 16, 3),
        patch_size=2,
        hidden_dim=8,
        num_layers=3,
        num_heads=2,
        mlp_dim=8,
        classes=2,
        stem_filters=(4,),
        num_register_tokens=1,
        representation_size=8,
    )
    scales = layer_decay_scales(model, 0.5)
    assert set(scales) == {v.path for v in model.trainable_variables}
    by_part = {path.rsplit("/", 1)[0]: scale for path, scale in scales.items()}
    for part in ("stem/conv_0", "patch_embedding", "class_token", "register_tokens"):
        assert by_part[part] == 0.5**4, part
    assert by_part["position_embedding"] == 0.5**4
    for block in range(3):  # block i of L = 3: decay ** (L - i)
        assert by_part[f"encoderblock_{block}/mlp_dense_1"] == 0.5 ** (3 - block)
    for part in ("encoder_norm", "pre_logits", "head"):
        assert by_part[part] == 1.0, part
    assert set(layer_decay_scales(model, 1.0).values()) == {1.0}
    with pytest.raises(ValueError, match="Received: layer_decay=0"):
        layer_decay_scales(model, 0)


def steps(optimizer, variables, gradients):
    for step_gradients in gradients:
        optimizer.apply([keras.ops.convert_to_tensor(g) for g in step_gradients], variables)
    return [np.array(v) for v in variables]


@pytest.mark.parametrize("kind", ["adamw", "sgd"])
def test_a_scaled_variable_steps_exactly_as_an_optimizer_of_that_rate(kind):
    """Not a scaled gradient: Adam would divide that scale away."""
    rng = np.random.default_rng(0)
    start = [rng.normal(size=(3, 2)).astype("float32") for _ in range(2)]
    gradients = [[rng.normal(size=(3, 2)).astype("float32") for _ in range(2)] for _ in range(6)]

    def optimizer(scale=1.0, **options):
        schedule = WarmupDecay(0.1 * scale, total_steps=6, warmup_steps=2)
        if kind == "adamw":
            return (ScaledAdamW if options else keras.optimizers.AdamW)(
                schedule, weight_decay=0.3, **options
            )
        return (ScaledSGD if options else keras.optimizers.SGD)(schedule, momentum=0.9, **options)

    variables = [keras.Variable(value, name=f"v{i}") for i, value in enumerate(start)]
    scaled = steps(optimizer(learning_rate_scales={variables[0].path: 0.25}), variables, gradients)
    # Each variable alone, with an optimizer of its own rate.
    for index, scale in ((0, 0.25), (1, 1.0)):
        alone = keras.Variable(start[index], name=f"alone{index}")
        (expected,) = steps(optimizer(scale), [alone], [[g[index]] for g in gradients])
        np.testing.assert_allclose(scaled[index], expected, rtol=1e-6, atol=1e-7)
    # ... which a scaled gradient would not have given Adam.
    if kind == "adamw":
        alone = keras.Variable(start[0], name="scaled_gradient")
        (shrunk,) = steps(optimizer(), [alone], [[0.25 * g[0]] for g in gradients])
        assert np.abs(shrunk - scaled[0]).max() > 1e-3


def test_a_recipe_with_layer_decay_compiles_trains_and_saves_its_rates(tmp_path):
    import dataclasses

    model = tiny_classifier()
    recipe = dataclasses.replace(RECIPES["finetune"], layer_decay=0.5)
    assert "layer-wise rate decay 0.5" in str(recipe)
    recipe.compile(model, total_steps=4, jit_compile=False)
    assert isinstance(model.optimizer, ScaledAdamW)
    embedding = np.array(model.get_layer("patch_embedding").kernel)
    images = np.random.default_rng(0).uniform(0, 255, (8, 16, 16, 3)).astype("float32")
    model.fit(images, np.eye(5)[np.arange(8) % 5], batch_size=4, epochs=1, verbose=0)
    assert not np.array_equal(embedding, model.get_layer("patch_embedding").kernel)
    model.save(tmp_path / "model.keras")
    loaded = keras.saving.load_model(tmp_path / "model.keras")
    assert loaded.optimizer.learning_rate_scales == layer_decay_scales(model, 0.5)
    with pytest.raises(ValueError, match="Received: layer_decay=2"):
        dataclasses.replace(recipe, layer_decay=2)


def test_the_commands_take_layer_decay_in_0_to_1(capsys):
    from keras_vit.cli import main

    with pytest.raises(SystemExit):
        main(["finetune", "model.keras", "--layer-decay", "0"])
    assert "--layer-decay: must be a number in (0, 1], not '0'" in capsys.readouterr().err


def test_a_run_with_ema_validates_reports_and_saves_the_averaged_weights(tmp_path):
    """Keras' `use_ema` in a run's fit: the model validated is the model kept."""
    import dataclasses

    import tensorflow as tf

    from keras_vit.training import train
    from keras_vit.training.fitting import fit_with_checkpoints

    model = tiny_classifier()
    recipe = dataclasses.replace(RECIPES["small"], learning_rate=0.05, ema_momentum=0.9)
    assert "weight average (EMA) 0.9" in str(recipe)
    recipe.compile(model, total_steps=8, jit_compile=False)
    assert model.optimizer.use_ema and model.optimizer.ema_momentum == 0.9
    rng = np.random.default_rng(0)
    images = rng.uniform(0, 255, (16, 16, 16, 3)).astype("float32")
    data = tf.data.Dataset.from_tensor_slices((images, np.eye(5)[np.arange(16) % 5])).batch(4)
    history, _ = fit_with_checkpoints(
        model, data, epochs=2, output_dir=str(tmp_path), validation_data=data, verbose=0
    )
    # The averaged weights, not the last step's: the optimizer holds both.
    for variable, average in zip(
        model.optimizer._trainable_variables, model.optimizer._model_variables_moving_average
    ):
        np.testing.assert_allclose(variable, average, atol=1e-6)
    evaluated = model.evaluate(data, verbose=0, return_dict=True)
    for name in ("accuracy", "cross_entropy"):
        assert history.history[f"val_{name}"][-1] == pytest.approx(evaluated[name], rel=1e-5)
    with pytest.raises(ValueError, match="Received: ema_momentum=1"):
        train("/no/such/folder", ema_momentum=1, output_dir=str(tmp_path / "bad"))
