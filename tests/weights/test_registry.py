"""Registered checkpoint names: lookup, cached hashed download, offline errors.

The download path is the real one (`keras.utils.get_file`), fed `file://`
URLs of official-layout files written here, since this machine is offline.
"""

import hashlib
import os

import numpy as np
import pytest
from keras import ops

import keras_vit
from keras_vit.models.variants import PUBLISHED
from keras_vit.weights import registry
from keras_vit.weights.converters.official import to_official

SIZE = (32, 32, 3)  # ViT-Ti/16 on a 2x2 grid: the smallest published variant


@pytest.fixture
def published_file(tmp_path, monkeypatch):
    """An official-layout Ti/16 .npz registered as 'test-ckpt' (file:// URL)."""
    monkeypatch.setenv("KERAS_HOME", str(tmp_path / "keras_home"))
    source = keras_vit.ViTTi16(input_shape=SIZE, classes=10)
    rng = np.random.default_rng(0)
    source.set_weights([rng.normal(0, 0.02, w.shape) for w in source.get_weights()])
    path = str(tmp_path / "Ti_16-test.npz")
    np.savez(path, **to_official(source))
    with open(path, "rb") as f:
        digest = hashlib.sha256(f.read()).hexdigest()

    def register(sha256=digest, url="file://" + path, **kwargs):
        checkpoint = registry.Checkpoint(
            "Ti/16", url, sha256=sha256, image_size=32, classes=10, **kwargs
        )
        monkeypatch.setitem(registry.CHECKPOINTS, ("Ti/16", "test-ckpt"), checkpoint)
        return checkpoint

    return source, register


def test_registered_name_downloads_once_and_builds_the_checkpoint_model(published_file, tmp_path):
    source, register = published_file
    register(normalization="imagenet")
    model = keras_vit.ViTTi16(weights="test-ckpt", classes=10)
    assert model.input_shape == (None, 32, 32, 3)  # the checkpoint's resolution
    cached = tmp_path / "keras_home" / "keras_vit" / "Ti_16-test.npz"
    assert cached.is_file()
    np.testing.assert_array_equal(
        ops.convert_to_numpy(model.get_layer("encoder_norm").gamma),
        ops.convert_to_numpy(source.get_layer("encoder_norm").gamma),
    )
    # The checkpoint's pixel normalisation comes with it.
    scale = np.asarray(model.get_layer("rescaling").scale)
    np.testing.assert_allclose(scale, 1 / (255 * np.array([0.229, 0.224, 0.225])))
    # Cached: a second build needs no source file at all.
    os.remove(register.__defaults__[1][len("file://") :])
    again = keras_vit.ViTTi16(weights="test-ckpt", classes=10, input_shape=(48, 48, 3))
    assert again.get_layer("position_embedding").grid_size == (3, 3)


def test_hash_mismatch_and_offline_fail_with_where_to_put_the_file(published_file, tmp_path):
    _, register = published_file
    register(sha256="0" * 64)
    with pytest.raises(RuntimeError, match="put it at .*keras_vit.Ti_16-test.npz"):
        keras_vit.ViTTi16(weights="test-ckpt")
    register(url="http://127.0.0.1:9/Ti_16-other.npz")  # nothing listens: offline
    with pytest.raises(
        RuntimeError, match="Could not download .*127.0.0.1.*or pass its local path as `weights`"
    ):
        keras_vit.ViTTi16(weights="test-ckpt")
    # From the command line, the advice names the option the name came through.
    from PIL import Image

    from keras_vit.cli import main

    image = str(tmp_path / "image.png")
    Image.new("RGB", (8, 8)).save(image)
    with pytest.raises(SystemExit, match="Could not download .*local path as --model\\.$"):
        main(["predict", image, "--model", "Ti/16:test-ckpt"])


def test_unknown_names_list_what_is_registered():
    with pytest.raises(ValueError, match="registered for ViT-B/16 .*imagenet21k\\+imagenet2012"):
        keras_vit.ViTB16(weights="imagenet22k")
    with pytest.raises(ValueError, match="registered for this architecture \\(registered: none\\)"):
        keras_vit.ViT(
            patch_size=4,
            hidden_dim=32,
            num_layers=1,
            num_heads=2,
            mlp_dim=64,
            input_shape=(16, 16, 3),
            weights="imagenet21k",
        )


def test_published_table():
    b16 = registry.lookup("B/16", "imagenet21k")
    assert b16.url == "https://storage.googleapis.com/vit_models/imagenet21k/ViT-B_16.npz"
    assert (b16.classes, b16.representation_size) == (21843, 768)
    assert registry.lookup("L/16", "imagenet21k+imagenet2012").image_size == 384
    augreg = registry.lookup("S/16", "augreg-imagenet21k+imagenet2012")
    assert augreg.file_name == (
        "S_16-i21k-300ep-lr_0.001-aug_light1-wd_0.03-do_0.0-sd_0.0"
        "--imagenet2012-steps_20k-lr_0.03-res_224.npz"
    )
    assert registry.lookup("B/16", "imagenet21k+imagenet2012").file_name == "ViT-B_16.npz"
    assert "augreg-imagenet21k" in registry.names("Ti/16")


def test_imagenet_is_each_variants_imagenet_1k_classifier_as_in_keras_applications():
    for variant in PUBLISHED:
        if variant == "H/14":  # published pre-trained on ImageNet-21k only
            with pytest.raises(
                ValueError,
                match="ImageNet-1k classifier, and ViT-H/14 has none \\(registered: imagenet21k\\)",
            ):
                keras_vit.ViTH14(weights="imagenet")
            continue
        checkpoint = registry.lookup(variant, "imagenet")
        assert (checkpoint.classes, checkpoint.label_set) == (1000, "imagenet-1k"), variant
        expected = (
            "imagenet21k+imagenet2012" if variant == "L/32" else ("augreg-imagenet21k+imagenet2012")
        )
        assert checkpoint is registry.lookup(variant, expected), variant
        assert checkpoint.image_size == (384 if variant == "L/32" else 224), variant


def test_a_builder_given_imagenet_loads_that_file_from_the_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("KERAS_HOME", str(tmp_path))
    source = keras_vit.ViTTi16(input_shape=SIZE)
    rng = np.random.default_rng(1)
    source.set_weights([rng.normal(0, 0.02, w.shape) for w in source.get_weights()])
    cached = tmp_path / "keras_vit" / registry.lookup("Ti/16", "imagenet").file_name
    cached.parent.mkdir()
    np.savez(cached, **to_official(source))
    model = keras_vit.ViTTi16(weights="imagenet", input_shape=SIZE)
    images = rng.uniform(0, 255, (2, *SIZE)).astype("float32")
    np.testing.assert_allclose(
        model.predict(images, verbose=0), source.predict(images, verbose=0), atol=1e-6
    )


def test_unhashed_entries_are_pinned_on_first_use(published_file, tmp_path):
    source, register = published_file
    origin = register.__defaults__[1][len("file://") :]
    checkpoint = register(sha256=None)
    path = registry.fetch(checkpoint)
    with open(path, "rb") as f:
        digest = hashlib.sha256(f.read()).hexdigest()
    with open(path + ".sha256") as f:
        assert f.read().strip() == digest
    # A corrupted cache file is noticed and downloaded again.
    with open(path, "r+b") as f:
        f.seek(200)
        f.write(b"garbage")
    assert registry.fetch(checkpoint) == path
    with open(path, "rb") as f:
        assert hashlib.sha256(f.read()).hexdigest() == digest
    # Upstream replaced (and the cache lost): refused, the pin kept.
    np.savez(origin, **{"embedding/kernel": np.zeros((16, 16, 3, 192), "float32")})
    os.remove(path)
    with pytest.raises(RuntimeError, match="Could not download .*put it at"):
        registry.fetch(checkpoint)
    with open(path + ".sha256") as f:
        assert f.read().strip() == digest
