"""Class names: the packaged label sets, decode_predictions and preprocess_input."""

import hashlib

import keras
import numpy as np
import pytest

import keras_vit
from keras_vit.labels import LABEL_SETS, label_set
from keras_vit.weights import registry
from keras_vit.weights.converters.official import to_official
from tests.conftest import randomize_weights


@pytest.mark.backend_independent
def test_the_label_sets_hold_every_class_once_in_the_checkpoints_order():
    imagenet, imagenet21k = label_set("imagenet-1k"), label_set("imagenet-21k")
    for name, pairs in (("imagenet-1k", imagenet), ("imagenet-21k", imagenet21k)):
        ids = [wordnet_id for wordnet_id, _ in pairs]
        assert len(ids) == len(set(ids)) == LABEL_SETS[name]
        assert ids == sorted(ids)  # both releases order their classes by WordNet id
        assert all(len(w) == 9 and w[0] == "n" and w[1:].isdigit() for w in ids)
        assert all(class_name and " " not in class_name for _, class_name in pairs)
    # Facts every ImageNet-1k classifier agrees on (keras.applications' names).
    assert imagenet[0] == ("n01440764", "tench")
    assert imagenet[386] == ("n02504458", "African_elephant")
    assert imagenet[999] == ("n15075141", "toilet_tissue")
    # ImageNet-1k's classes are among 21k's, but for the teddy bear, which the
    # 21k release files under another synset.
    missing = set(imagenet) - set(imagenet21k)
    assert missing == {("n04399382", "teddy")}
    assert imagenet21k[0] == ("n00004475", "organism")


@pytest.mark.backend_independent
def test_every_registered_checkpoint_names_its_classes():
    for (variant, name), checkpoint in registry.CHECKPOINTS.items():
        assert LABEL_SETS[checkpoint.label_set] == checkpoint.classes, (variant, name)


@pytest.mark.backend_independent
def test_decode_predictions_returns_the_top_classes_as_keras_applications_does():
    preds = np.zeros((2, 1000), "float32")
    preds[0, [386, 101, 7]] = [0.7, 0.2, 0.1]
    preds[1, 999] = 1.0
    decoded = keras_vit.decode_predictions(preds, top=3)
    assert decoded[0] == [
        ("n02504458", "African_elephant", pytest.approx(0.7, rel=1e-6)),
        ("n01871265", "tusker", pytest.approx(0.2, rel=1e-6)),
        ("n01514668", "cock", pytest.approx(0.1, rel=1e-6)),
    ]
    assert decoded[1][0][1] == "toilet_tissue" and len(decoded[1]) == 3
    assert len(keras_vit.decode_predictions(preds)[0]) == 5  # keras' default top
    big = np.zeros((1, 21843), "float32")
    big[0, 0] = 1.0
    assert keras_vit.decode_predictions(big, top=1) == [[("n00004475", "organism", 1.0)]]
    own = keras_vit.decode_predictions([[0.1, 0.9]], labels=["cat", "dog"])
    assert own == [[("1", "dog", 0.9), ("0", "cat", 0.1)]]


@pytest.mark.backend_independent
def test_decode_predictions_refuses_what_it_cannot_name():
    with pytest.raises(ValueError, match="10 classes match no label set"):
        keras_vit.decode_predictions(np.zeros((1, 10)))
    with pytest.raises(ValueError, match="1000 classes, the labels 21843"):
        keras_vit.decode_predictions(np.zeros((1, 1000)), labels="imagenet-21k")
    with pytest.raises(ValueError, match="preds.shape=\\(1000,\\)"):
        keras_vit.decode_predictions(np.zeros(1000))
    with pytest.raises(ValueError, match="top=0"):
        keras_vit.decode_predictions(np.zeros((1, 1000)), top=0)
    with pytest.raises(ValueError, match="label_set='imagenet-22k'"):
        keras_vit.decode_predictions(np.zeros((1, 1000)), labels="imagenet-22k")


@pytest.mark.parametrize("normalization", ["inception", "imagenet"])
def test_preprocess_input_normalises_as_the_models_own_rescaling(normalization):
    options = dict(patch_size=4, hidden_dim=16, num_layers=1, num_heads=2, mlp_dim=32, classes=3)
    rescaling = keras_vit.ViT(**options, input_shape=(8, 8, 3), normalization=normalization)
    randomize_weights(rescaling)
    plain = keras_vit.ViT(**options, input_shape=(8, 8, 3), include_rescaling=False)
    plain.set_weights(rescaling.get_weights())
    images = np.random.default_rng(0).uniform(0, 255, (2, 8, 8, 3)).astype("float32")
    np.testing.assert_array_equal(keras_vit.preprocess_input(images), images)  # models rescale
    prepared = keras_vit.preprocess_input(images, normalization=normalization)
    expected = keras.ops.convert_to_numpy(rescaling(images))
    np.testing.assert_allclose(keras.ops.convert_to_numpy(plain(prepared)), expected, atol=1e-5)
    # A tensor in, a tensor out; channels first normalises the channel axis.
    first = keras_vit.preprocess_input(
        keras.ops.convert_to_tensor(images.transpose(0, 3, 1, 2)),
        data_format="channels_first",
        normalization=normalization,
    )
    np.testing.assert_allclose(
        keras.ops.convert_to_numpy(first), prepared.transpose(0, 3, 1, 2), atol=1e-6
    )
    with pytest.raises(ValueError, match="data_format='NHWC'"):
        keras_vit.preprocess_input(images, data_format="NHWC")


@pytest.fixture
def elephant_checkpoint(tmp_path, monkeypatch):
    """An ImageNet-1k ViT-Ti/16 in the official layout, registered as "elephants" (file://)."""
    monkeypatch.setenv("KERAS_HOME", str(tmp_path / "keras_home"))
    source = keras_vit.ViTTi16(input_shape=(32, 32, 3), classifier_activation=None)
    randomize_weights(source)
    bias = np.zeros(1000, "float32")
    bias[386] = 50.0  # the head of a model that sees elephants everywhere
    source.get_layer("head").bias.assign(bias)
    path = tmp_path / "Ti_16-elephants.npz"
    np.savez(path, **to_official(source))
    checkpoint = registry.Checkpoint(
        "Ti/16",
        f"file://{path}",
        sha256=hashlib.sha256(path.read_bytes()).hexdigest(),
        image_size=32,
    )
    monkeypatch.setitem(registry.CHECKPOINTS, ("Ti/16", "elephants"), checkpoint)
    return path


def test_a_registered_imagenet_checkpoint_names_its_predictions(elephant_checkpoint):
    # keras.applications' `test_application_base`, offline: a registered
    # ImageNet-1k checkpoint (the official layout, from a file:// URL) built
    # by name, fed through preprocess_input, decoded to names, serialised.
    model = keras_vit.ViTTi16(weights="elephants")
    images = np.random.default_rng(1).uniform(0, 255, (1, 32, 32, 3)).astype("float32")
    preds = keras.ops.convert_to_numpy(model(keras_vit.preprocess_input(images)))
    names = [name for _, name, _ in keras_vit.decode_predictions(preds)[0]]
    assert names[0] == "African_elephant"
    config = keras.saving.serialize_keras_object(model)
    reconstructed = keras.saving.deserialize_keras_object(config)
    assert len(model.weights) == len(reconstructed.weights)


@pytest.mark.slow
def test_predict_names_the_classes_of_a_registered_checkpoint_and_of_a_file(
    elephant_checkpoint, tmp_path, capsys
):
    from PIL import Image

    from keras_vit.cli import main

    photo = tmp_path / "photo.png"
    Image.fromarray(np.full((40, 50, 3), 90, "uint8")).save(photo)
    for model in ("Ti/16:elephants", str(elephant_checkpoint)):
        assert main(["predict", str(photo), "--model", model, "--top-k", "1"]) == 0
        lines = capsys.readouterr().out.splitlines()
        assert lines[-2:][0] == str(photo) and lines[-1].split()[0] == "African_elephant", lines
    # A Hugging Face config.json beside a file names its classes.
    assert keras_vit.weights.class_names(elephant_checkpoint, classes=1000)[386] == (
        "African_elephant"
    )
    (tmp_path / "config.json").write_text('{"id2label": {"0": "zero", "1": "one"}}')
    assert keras_vit.weights.class_names(elephant_checkpoint, classes=2) == ["zero", "one"]
    with pytest.raises(SystemExit, match="neither a model file nor a registered checkpoint"):
        main(["predict", str(photo), "--model", "Q/16:elephants"])
    with pytest.raises(
        SystemExit, match="nor a checkpoint registered for ViT-Ti/16 \\(registered: .*elephants"
    ):
        main(["predict", str(photo), "--model", "Ti/16:giraffes"])
