"""The pre-training models: loss, training, transfer, saving (every backend)."""

import keras
import numpy as np
import pytest

import keras_vit
from keras_vit import data as vit_data
from keras_vit.pretraining import (
    MaskedAutoencoder,
    MaskedPatchPrediction,
    transfer_encoder,
)
from tests.conftest import TINY

ENCODER = {k: v for k, v in TINY.items() if k != "classes"}
OBJECTIVES = {
    "mpp": MaskedPatchPrediction(),
    "mpp_grid": MaskedPatchPrediction(target="color_grid", grid=2),
    "mpp_pixels": MaskedPatchPrediction(target="pixels"),
    "mae": MaskedAutoencoder(decoder_dim=16, decoder_depth=1, decoder_heads=2),
}


def encoder(**overrides):
    return keras_vit.ViT(**{**ENCODER, **overrides}, include_top=False, pooling=None)


def image_batches(count=32, batch_size=16):
    # 2x2 blocks of 2x2 patches of one colour each: a masked patch's
    # neighbours tell its colour, so there is something to learn.
    rng = np.random.default_rng(0)
    blocks = rng.integers(0, 256, (count, 2, 2, 3))
    images = np.repeat(np.repeat(blocks, 8, axis=1), 8, axis=2).astype("uint8")
    return vit_data.from_arrays(
        images,
        np.zeros(count, int),
        image_size=16,
        training=True,
        crop_scale=None,
        flip=False,
        batch_size=batch_size,
    ).data


def built(name):
    objective = OBJECTIVES[name]
    model = objective.build(encoder())
    model.compile(optimizer=keras.optimizers.Adam(3e-3), **objective.compile_arguments())
    return objective, model


def first_batch(objective, model):
    inputs, targets, weights = next(iter(objective.batches(image_batches(), model)))
    return {k: v.numpy() for k, v in inputs.items()}, targets.numpy(), weights.numpy()


def test_the_mpp_loss_counts_corrupted_patches_only():
    objective, model = built("mpp")
    inputs, targets, weights = first_batch(objective, model)
    assert set(np.unique(weights)) == {0.0, 1.0} and (weights.sum(axis=1) == 8).all()
    logits = keras.ops.convert_to_numpy(model(inputs)).astype("float64")
    log_probs = logits - np.log(np.exp(logits).sum(-1, keepdims=True))
    per_patch = -np.take_along_axis(log_probs, targets[..., None], -1)[..., 0]
    expected = (per_patch * weights).sum() / weights.sum()
    loss = model.evaluate(inputs, targets, sample_weight=weights, verbose=0, return_dict=True)[
        "loss"
    ]
    assert loss == pytest.approx(expected, rel=1e-5)
    # Other targets on the uncorrupted patches change nothing; on one corrupted patch they do.
    changed = np.where(weights == 0, (targets + 1) % 512, targets)
    again = model.evaluate(inputs, changed, sample_weight=weights, verbose=0, return_dict=True)[
        "loss"
    ]
    assert again == pytest.approx(loss, rel=1e-6)
    b, i = np.argwhere(weights == 1)[0]
    changed[b, i] = (changed[b, i] + 1) % 512
    assert model.evaluate(inputs, changed, sample_weight=weights, verbose=0, return_dict=True)[
        "loss"
    ] != pytest.approx(loss, rel=1e-6)


def test_the_mae_loss_is_the_squared_error_on_dropped_patches():
    objective, model = built("mae")
    inputs, targets, weights = first_batch(objective, model)
    assert inputs["kept_patches"].shape == (16, 4) and (weights.sum(axis=1) == 12).all()
    predictions = keras.ops.convert_to_numpy(model(inputs)).astype("float64")
    per_patch = ((predictions - targets) ** 2).mean(-1)
    expected = (per_patch * weights).sum() / weights.sum()
    loss = model.evaluate(inputs, targets, sample_weight=weights, verbose=0, return_dict=True)[
        "loss"
    ]
    assert loss == pytest.approx(expected, rel=1e-5)


class Pretrained(dict):
    """Each objective's model after a few fit steps, and its loss before and after them.

    Fitted when a test first asks for it: the tests of what a trained
    pretraining model does (its loss went down, its encoder transfers, its
    file round-trips) share one run per objective.
    """

    def __missing__(self, name):
        objective, model = built(name)
        data = objective.batches(image_batches(), model).take(1).cache().repeat(12)
        history = model.fit(data, epochs=1, verbose=0)
        before = model.evaluate(data.take(1), verbose=0, return_dict=True)["loss"]
        model.fit(data, epochs=2, verbose=0)
        after = model.evaluate(data.take(1), verbose=0, return_dict=True)["loss"]
        self[name] = objective, model, history.history["loss"], before, after
        return self[name]


@pytest.fixture(scope="module")
def pretrained():
    return Pretrained()


@pytest.mark.parametrize("name", sorted(OBJECTIVES))
@pytest.mark.slow
def test_a_few_fit_steps_lower_the_loss(pretrained, name):
    _, _, first_epoch, before, after = pretrained[name]
    assert np.isfinite(first_epoch).all()
    assert after < 0.9 * before, (before, after)


@pytest.mark.parametrize("name", ["mpp", "mae"])
@pytest.mark.slow
def test_the_transferred_encoder_weights_are_exactly_the_pretrained_ones(
    pretrained, name, tmp_path
):
    _, model, *_ = pretrained[name]
    pretrained = {w.path: keras.ops.convert_to_numpy(w) for w in model.weights}
    path = str(tmp_path / "pretrained.keras")
    model.save(path)
    classifiers = {
        "transfer_encoder(model)": keras_vit.ViT(**TINY),
        "transfer_encoder(path)": keras_vit.ViT(**TINY),
        "ViT(weights=path)": keras_vit.ViT(**TINY, weights=path),
        "from_checkpoint(path)": keras_vit.from_checkpoint(
            path, include_top=True, pooling="token", classes=5
        ),
    }
    report = transfer_encoder(model, classifiers["transfer_encoder(model)"])
    transfer_encoder(path, classifiers["transfer_encoder(path)"])
    assert sorted(report["kept"]) == ["head/bias", "head/kernel"]
    assert any("mask_token" in name for name in report["dropped"])
    for how, classifier in classifiers.items():
        for weight in classifier.weights:
            if weight.path.startswith("head/"):
                assert not keras.ops.convert_to_numpy(weight).any(), how  # a new zero head
                continue
            np.testing.assert_array_equal(
                keras.ops.convert_to_numpy(weight),
                pretrained[weight.path],
                err_msg=f"{how}: {weight.path}",
            )


@pytest.mark.parametrize("name", ["mpp_grid", "mae"])
@pytest.mark.slow
def test_the_pretraining_model_round_trips_through_a_keras_file(pretrained, name, tmp_path):
    objective, model, *_ = pretrained[name]
    batches = objective.batches(image_batches(), model)
    inputs, targets, weights = next(iter(batches))
    path = str(tmp_path / "model.keras")
    model.save(path)
    loaded = keras.saving.load_model(path)
    for a, b in zip(model.weights, loaded.weights):
        assert a.path == b.path
        np.testing.assert_array_equal(keras.ops.convert_to_numpy(a), keras.ops.convert_to_numpy(b))
    np.testing.assert_allclose(
        keras.ops.convert_to_numpy(loaded(inputs)),
        keras.ops.convert_to_numpy(model(inputs)),
        atol=1e-6,
    )
    # The compiled loss comes back too: the same (weighted) loss, and it trains on.
    assert loaded.evaluate(inputs, targets, sample_weight=weights, verbose=0) == pytest.approx(
        model.evaluate(inputs, targets, sample_weight=weights, verbose=0), rel=1e-5
    )
    loaded.fit(batches, epochs=1, verbose=0)


def test_refuses_encoders_it_cannot_pre_train():
    with pytest.raises(ValueError, match="convolutional stem"):
        MaskedPatchPrediction().build(encoder(stem_filters=(8,), patch_size=2))
    pooled = keras_vit.ViT(**ENCODER, include_top=False)
    with pytest.raises(ValueError, match="pooling=None"):
        MaskedAutoencoder().build(pooled)
    with pytest.raises(ValueError, match="divisible by 3"):
        MaskedPatchPrediction(target="color_grid", grid=3).build(encoder())
    with pytest.raises(ValueError, match="keeps 0 of the model's 16 patches"):
        MaskedAutoencoder(mask_ratio=0.95, decoder_dim=16, decoder_heads=2).build(encoder())
    with pytest.raises(ValueError, match="target='colour'"):
        MaskedPatchPrediction(target="colour")
