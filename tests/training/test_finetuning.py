"""Fine-tuning a checkpoint: its new head fitted on the frozen features first (LP-FT)."""

import json
import os

import keras
import numpy as np
import pytest

import keras_vit
from keras_vit.training import RECIPES, train
from keras_vit.training.finetuning import fit_new_heads, new_heads, softmax_regression
from tests.conftest import TINY, on_one_backend


@pytest.mark.backend_independent
def test_softmax_regression_separates_what_a_linear_map_separates():
    rng = np.random.default_rng(0)
    features = rng.normal(size=(300, 8)).astype("float32")
    labels = (features @ rng.normal(size=(8, 3))).argmax(-1)
    kernel, bias = softmax_regression(features, labels, 3, steps=2000, l2=0.0)
    assert kernel.shape == (8, 3) and bias.shape == (3,)
    assert np.mean((features @ kernel + bias).argmax(-1) == labels) >= 0.98
    # Full-batch steps from zero: the same features give the same head.
    again = softmax_regression(features, labels, 3, steps=2000, l2=0.0)
    np.testing.assert_array_equal(again[0], kernel)
    # The penalty shrinks the kernel.
    shrunk, _ = softmax_regression(features, labels, 3, steps=2000, l2=0.1)
    assert np.abs(shrunk).sum() < 0.5 * np.abs(kernel).sum()


def classes_of_the_tokens(model, images, classes):
    """Labels that the frozen model's pooled token separates linearly (random features, argmax)."""
    features = keras.Model(model.inputs, model.get_layer("head").input).predict(images, verbose=0)
    rng = np.random.default_rng(1)
    return (features @ rng.normal(size=(features.shape[-1], classes))).argmax(-1)


def test_a_new_head_is_fitted_on_the_frozen_features_and_nothing_else_moves():
    import tensorflow as tf

    rng = np.random.default_rng(0)
    images = rng.uniform(0, 255, (64, 16, 16, 3)).astype("float32")
    model = keras_vit.ViT(**TINY, classifier_activation=None)
    for layer_weights in model.weights:  # a "pretrained" model: every weight but the head
        if not layer_weights.path.startswith("head/"):
            layer_weights.assign(rng.normal(0, 0.3, layer_weights.shape).astype("float32"))
    assert [head.name for head in new_heads(model)] == ["head"]
    labels = classes_of_the_tokens(model, images, TINY["classes"])
    before = {w.path: keras.ops.convert_to_numpy(w) for w in model.weights}
    data = tf.data.Dataset.from_tensor_slices((images, np.eye(5, dtype="float32")[labels]))
    lines = []
    report = fit_new_heads(model, data.batch(16), log=lines.append)
    assert report["images"] == 64 and report["training_accuracy"] >= 0.9, report
    assert lines == [
        f"head: fitted on the frozen features of 64 training images "
        f"({report['training_accuracy']:.1%} of them right, {report['seconds']:.0f} s)"
    ]
    logits = keras.ops.convert_to_numpy(model(images))
    assert np.mean(logits.argmax(-1) == labels) == report["training_accuracy"]
    for weight in model.weights:
        if not weight.path.startswith("head/"):
            np.testing.assert_array_equal(keras.ops.convert_to_numpy(weight), before[weight.path])
    # A trained head is not new: left as it is.
    assert new_heads(model) == [] and fit_new_heads(model, data.batch(16)) is None
    # At most `max_images` images are read (whole batches).
    fresh = keras_vit.ViT(**TINY, classifier_activation=None)
    assert fit_new_heads(fresh, data.batch(16), max_images=20, log=lines.append)["images"] == 32


@on_one_backend("torch", "the command's own work")
@pytest.mark.slow
def test_finetune_reads_its_checkpoint_once_fits_the_new_head_first_and_a_resumed_run_does_not(
    trained_run, tmp_path, monkeypatch
):
    from keras_vit.weights import readers
    from tests.training.test_train_command import killed_after_first_checkpoint, write_dataset

    checkpoint = os.path.join(trained_run.folder, "model.keras")
    reads, read = [], readers._read_tensors

    def counted(path):
        reads.append(os.path.realpath(path))
        return read(path)

    monkeypatch.setattr(readers, "_read_tensors", counted)

    assert RECIPES["finetune"].head_first and not RECIPES["paper_finetune"].head_first
    # Three classes where the trained run's checkpoint has two: a new head.
    shades = (("dark", 40), ("grey", 120), ("light", 200))
    data = write_dataset(tmp_path / "data", per_class=8, shades=shades)
    out = str(tmp_path / "finetune")
    lines = []

    def finetune():
        return train(
            data,
            weights=checkpoint,
            image_size=16,
            epochs=2,
            batch_size=8,
            output_dir=out,
            verbose=0,
            log=lines.append,
        )

    with killed_after_first_checkpoint():
        finetune()
    # Its architecture, then its weights: one read of the file.
    assert reads.count(os.path.realpath(checkpoint)) == 1, reads
    # train(weights=...)'s defaults are the command's: the `finetune` recipe.
    with open(os.path.join(out, "run.json")) as f:
        assert json.load(f)["recipe"] == "finetune"
    assert any(line.startswith("head: fitted on the frozen features of 24 ") for line in lines)
    # The resumed run has its fitted head in its checkpoint: no second fit.
    del lines[:]
    finetune()
    assert reads.count(os.path.realpath(checkpoint)) == 2, reads  # one more for the resumed run
    assert any("resuming from" in line for line in lines), lines
    assert not any(line.startswith("head:") for line in lines)
