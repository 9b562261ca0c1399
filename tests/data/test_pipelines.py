"""tf.data pipelines: every source feeds model.fit on every backend."""

import logging
import os
import warnings

import keras
import numpy as np
import pytest
import tensorflow as tf

import keras_vit
from keras_vit import data as vit_data
from keras_vit.data.augmentation import batch_augmentation
from keras_vit.training import get_recipe
from tests.conftest import on_one_backend

ARCH = dict(patch_size=4, hidden_dim=16, num_layers=1, num_heads=2, mlp_dim=32)


def fit_a_few_steps(dataset, image_size, channels=3):
    model = keras_vit.ViT(
        **ARCH,
        input_shape=(image_size, image_size, channels),
        classes=dataset.num_classes,
        classifier_activation=None,
    )
    get_recipe("small").compile(model, total_steps=4)
    history = model.fit(dataset.data.take(2), epochs=1, verbose=0)
    assert np.isfinite(history.history["loss"][0])
    return model


def batches(dataset, n=2):
    return [tuple(t.numpy() for t in batch) for batch in dataset.data.take(n)]


@pytest.mark.slow
def test_arrays_pipeline_fits_and_is_deterministic():
    rng = np.random.default_rng(0)
    images = rng.integers(0, 256, (40, 28, 28)).astype("uint8")
    labels = rng.integers(0, 3, 40)
    kwargs = dict(image_size=16, training=True, batch_size=8, seed=3, crop_scale=(0.5, 1.0))
    # Without `deterministic`, the same batches of the same examples, in any order.
    unordered = vit_data.from_arrays(images, labels, **kwargs)
    kwargs["deterministic"] = True
    first = vit_data.from_arrays(images, labels, **kwargs)
    again = vit_data.from_arrays(images, labels, **kwargs)
    other = vit_data.from_arrays(images, labels, **{**kwargs, "seed": 4})
    first_epoch = batches(first)  # each pass over a dataset is a new epoch
    x, y = first_epoch[0]
    assert x.shape == (8, 16, 16, 3) and y.shape == (8, 3)  # grayscale -> RGB
    np.testing.assert_array_equal(x[..., 0], x[..., 2])
    for (a, _), (b, _) in zip(first_epoch, batches(again)):
        np.testing.assert_array_equal(a, b)
    # (Each dataset's first epoch: 5 batches of 8.)
    ordered = vit_data.from_arrays(images, labels, **kwargs)
    every = sorted(x.tobytes() for x, _ in batches(ordered, 5))
    assert sorted(x.tobytes() for x, _ in batches(unordered, 5)) == every
    assert not np.array_equal(batches(other)[0][0], x)
    assert not np.array_equal(batches(first)[0][0], x)  # reshuffled next epoch
    fit_a_few_steps(first, 16)


def test_pipelines_tune_themselves_unless_told_and_evaluation_keeps_its_order():
    images, labels = np.zeros((8, 8, 8), "uint8"), np.arange(8) % 2
    options = dict(image_size=8, batch_size=4)
    tuned = vit_data.from_arrays(images, labels, training=True, **options).data.options()
    assert tuned.autotune.enabled and not tuned.deterministic
    fixed = vit_data.from_arrays(
        images, labels, training=True, autotune=False, deterministic=True, **options
    ).data.options()
    assert not fixed.autotune.enabled and fixed.deterministic
    assert vit_data.from_arrays(images, labels, **options).data.options().deterministic
    # The main job's recipe keeps its pipelines fixed (measured faster on 2 cores).
    from keras_vit.training import RECIPES

    assert not RECIPES["small"].data_autotune and RECIPES["pretrain"].data_autotune


def test_evaluation_pipeline_keeps_order_and_pixels():
    images = np.arange(4 * 8 * 8).reshape(4, 8, 8, 1).astype("uint8")
    ds = vit_data.from_arrays(images, np.arange(4), image_size=8, channels=1, batch_size=4)
    x, y = batches(ds, 1)[0]
    np.testing.assert_array_equal(x, images.astype("float32"))
    np.testing.assert_array_equal(y, np.eye(4))


def test_limit_keeps_the_first_examples_and_counts_them(tmp_path):
    images = np.arange(10 * 8 * 8).reshape(10, 8, 8, 1).astype("uint8")
    ds = vit_data.from_arrays(
        images, np.arange(10) % 3, image_size=8, channels=1, batch_size=4, limit=6
    )
    assert ds.size == 6
    x = np.concatenate([x for x, _ in batches(ds, 2)])
    np.testing.assert_array_equal(x, images[:6].astype("float32"))
    write_folder(tmp_path)
    folder = vit_data.load(str(tmp_path), "train", image_size=16, batch_size=4, limit=5)
    assert folder.size == 5
    assert sum(len(y) for _, y in folder.data) == 5
    # Above the size: all of it, counted as it is.
    assert vit_data.from_arrays(images, np.arange(10) % 3, image_size=8, limit=50).size == 10
    with pytest.raises(ValueError, match="limit=0"):
        vit_data.from_arrays(images, np.arange(10) % 3, image_size=8, limit=0)


def test_shards_are_disjoint_equal_and_cover_the_data():
    # Each of 3 workers reads every 3rd example; all run as many steps.
    images = np.arange(11 * 2 * 2).reshape(11, 2, 2, 1).astype("uint8")
    seen = []
    for index in range(3):
        ds = vit_data.from_arrays(
            images,
            np.arange(11) % 2,
            image_size=2,
            channels=1,
            batch_size=3,
            shard=(3, index),
            training=True,
            crop_scale=None,
            flip=False,
        )
        firsts = [int(x[i, 0, 0, 0]) // 4 for x, _ in batches(ds, 10) for i in range(len(x))]
        assert len(firsts) == 3  # 11 // 3 = 3 examples each, one batch of 3
        assert all(f % 3 == index for f in firsts)
        seen += firsts
    assert len(set(seen)) == 9
    with pytest.raises(ValueError, match="shard"):
        vit_data.from_arrays(images, np.arange(11) % 2, image_size=2, channels=1, shard=(2, 2))


def write_folder(root):
    for name, color in (("cats", (200, 30, 30)), ("dogs", (30, 30, 200))):
        os.makedirs(root / "train" / name)
        for i in range(6):
            image = np.full((20, 24, 3), color, "uint8") + i
            encoded = tf.io.encode_png(image) if i % 2 else tf.io.encode_jpeg(image)
            (root / "train" / name / f"{i}.img").write_bytes(encoded.numpy())
    (root / "train" / "cats" / "notes.txt").write_text("not an image")
    # A PNG cut short after its header: found when the folder is listed.
    png = tf.io.encode_png(np.zeros((20, 24, 3), "uint8")).numpy()
    (root / "train" / "dogs" / "broken.png").write_bytes(png[:30])
    # A whole PNG whose image data is corrupt: only decoding finds it.
    corrupt = bytearray(png)
    start = corrupt.find(b"IDAT") + 8
    corrupt[start : start + 6] = b"\x00\xff\x13\x37\x00\xff"
    (root / "train" / "dogs" / "corrupt.png").write_bytes(bytes(corrupt))


@pytest.mark.slow
def test_image_folder_skips_bad_files_with_a_count_and_names_the_undecodable(tmp_path, caplog):
    write_folder(tmp_path)

    def warnings_about(text):
        return [r.getMessage() for r in caplog.records if text in r.getMessage()]

    undecodable = f"{tmp_path / 'train'}: skipped 1 image(s) that could not be decoded " + (
        f"(corrupt data): {os.path.join('dogs', 'corrupt.png')}."
    )
    with caplog.at_level(logging.WARNING, logger="keras_vit"):
        ds = vit_data.load(str(tmp_path), "train", image_size=16, batch_size=4, training=True)
        assert "skipped 1 file(s) that are not JPEG/PNG/GIF/BMP/WebP images and 1 truncated" in (
            caplog.text
        )
        assert not warnings_about("could not be decoded")  # not known before decoding
        assert ds.class_names == ("cats", "dogs")
        evaluation = vit_data.load(str(tmp_path), "train", image_size=16, batch_size=4)
        for _ in range(2):
            seen = sum(len(y) for _, y in evaluation.data)
            assert seen == 12  # the corrupt PNG is dropped, not a crash
        assert warnings_about("could not be decoded") == [undecodable]  # once, at its pass's end
        fit_a_few_steps(ds, 16)
        # A training pipeline's length stays known (13 listed: 3 batches of 4),
        # so that Keras does not report running out of data at each epoch's end.
        assert int(ds.data.cardinality()) == 3
        assert sum(len(y) for _, y in ds.data) == 12
        model = keras.Sequential(
            [keras.Input((16, 16, 3)), keras.layers.Flatten(), keras.layers.Dense(2)]
        )
        model.compile("sgd", keras.losses.CategoricalCrossentropy(from_logits=True))
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            model.fit(ds.data, epochs=2, verbose=0, shuffle=False)
        assert not [w for w in caught if "ran out of data" in str(w.message)]
    # Said once in the process, whatever the pipelines and passes over the folder.
    assert warnings_about("could not be decoded") == [undecodable]
    assert len(warnings_about("that are not JPEG/PNG/GIF/BMP/WebP images")) == 1


@pytest.mark.backend_independent  # tf.data alone
def test_webp_images_are_read_like_the_others(tmp_path):
    from keras_vit.cli.images import read_images
    from tests.reliability.test_decompression_bombs import webp

    pixels = np.random.default_rng(0).integers(0, 256, (12, 12, 3)).astype("uint8")
    for kind, data in (
        ("png", tf.io.encode_png(pixels).numpy()),
        ("webp", webp(pixels, lossless=True)),
    ):
        os.makedirs(tmp_path / kind / "class")
        (tmp_path / kind / "class" / f"a.{kind}").write_bytes(data)
    png, webp = (
        next(iter(vit_data.from_folder(str(tmp_path / kind), image_size=8, batch_size=1).data))[
            0
        ].numpy()
        for kind in ("png", "webp")
    )
    np.testing.assert_array_equal(webp, png)  # lossless: the same pixels
    # `keras-vit predict` and `inspect` read it too.
    paths, images = read_images("predict", [str(tmp_path / "webp" / "class" / "a.webp")], 8, 8, 3)
    assert len(paths) == 1
    np.testing.assert_array_equal(images[0], png[0])


@pytest.mark.parametrize(
    "call, message",
    [
        (lambda p: vit_data.from_folder(str(p / "missing")), "missing"),
        (lambda p: vit_data.from_folder(str(p)), "no class sub-folders"),
        (
            lambda p: vit_data.load("no_such_dataset_xyz", image_size=8),
            "Unknown dataset 'no_such_dataset_xyz'",
        ),
    ],
)
def test_bad_sources_fail_clearly(tmp_path, call, message):
    with pytest.raises(ValueError, match=message):
        call(tmp_path)


def test_empty_class_folders_fail_clearly(tmp_path):
    os.makedirs(tmp_path / "a")
    (tmp_path / "a" / "x.txt").write_text("x")
    with pytest.raises(ValueError, match=r"no images to use .* 1 file\(s\) that are not"):
        vit_data.from_folder(str(tmp_path), image_size=8)


@pytest.mark.slow
def test_tfds_pipeline_reads_a_prepared_dataset_and_fails_offline(tmp_path):
    import tensorflow_datasets as tfds

    # A real TFDS dataset prepared on disk (built from its fake data, as
    # tfds' own tests do): the loader reads it without any download.
    with tfds.testing.mock_data(num_examples=12):
        ds = vit_data.from_tfds("mnist", "train", image_size=16, batch_size=4)
        assert ds.class_names[:2] == ("0", "1")
        fit_a_few_steps(ds, 16)
    with pytest.raises(RuntimeError, match="tfds build cifar10"):
        vit_data.from_tfds(
            "cifar10", "train", data_dir=str(tmp_path), download=False, image_size=16
        )


@on_one_backend(
    "tensorflow", "the augmentation runs in tf.data, on TensorFlow, under every backend"
)
def test_augmentations_change_images_and_mix_labels():
    rng = np.random.default_rng(0)
    images = rng.uniform(0, 255, (8, 16, 16, 3)).astype("float32")
    labels = np.eye(2, dtype="float32")[np.arange(8) % 2]
    augmented, same_labels = batch_augmentation("light", seed=1)(images, labels)
    assert not np.allclose(np.asarray(augmented), images)
    np.testing.assert_array_equal(np.asarray(same_labels), labels)
    for config in ({"mixup_alpha": 1.0}, {"cutmix_alpha": 1.0}):
        mixed_images, mixed = batch_augmentation(config, seed=2)(images, labels)
        mixed = np.asarray(mixed)
        np.testing.assert_allclose(mixed.sum(-1), 1.0, atol=1e-5)
        assert np.any((mixed > 0.01) & (mixed < 0.99))  # soft labels
        assert not np.allclose(np.asarray(mixed_images), images)
    assert batch_augmentation("none") is None
    with pytest.raises(ValueError, match="augmentation='extreme'"):
        batch_augmentation("extreme")


def test_random_resized_crops_cover_the_scale_and_aspect_ranges():
    from keras_vit.data.pipeline import _random_crop_boxes

    boxes = _random_crop_boxes(
        20_000, 28, 28, (0.08, 1.0), (3 / 4, 4 / 3), tf.constant([1, 2], tf.int64)
    ).numpy()
    height, width = boxes[:, 2] - boxes[:, 0], boxes[:, 3] - boxes[:, 1]
    assert boxes.min() >= 0.0 and boxes.max() <= 1.0 + 1e-6
    area = height * width
    assert 0.08 - 1e-6 <= area.min() and area.max() <= 1.0 + 1e-6
    unclipped = (height < 1) & (width < 1)
    ratio = width[unclipped] / height[unclipped]
    assert ratio.min() >= 3 / 4 - 1e-4 and ratio.max() <= 4 / 3 + 1e-4
    assert abs(np.median(area[unclipped]) - 0.5) < 0.1  # uniform in area


@pytest.mark.parametrize("training", [True, False])
def test_fixed_and_varying_size_images_give_the_same_kind_of_batches(training):
    rng = np.random.default_rng(0)
    images = rng.integers(0, 256, (12, 20, 20, 1)).astype("uint8")
    labels = rng.integers(0, 3, 12)
    fixed = tf.data.Dataset.from_tensor_slices((images, labels))
    # The same images with an unknown static size: the per-example path.
    varying = tf.data.Dataset.from_generator(
        lambda: iter(zip(images, labels)),
        output_signature=(tf.TensorSpec((None, None, 1), tf.uint8), tf.TensorSpec((), tf.int64)),
    )
    # One order of training batches (parallel steps may otherwise hand over out of order).
    kwargs = dict(
        image_size=16,
        training=training,
        batch_size=4,
        seed=1,
        crop_fraction=0.875,
        deterministic=True,
    )
    a = vit_data.make_pipeline(fixed, 3, **kwargs)
    b = vit_data.make_pipeline(varying, 3, **kwargs)
    for (xa, ya), (xb, yb) in zip(a, b):
        assert xa.shape == xb.shape == (4, 16, 16, 3)
        np.testing.assert_array_equal(ya.numpy(), yb.numpy())
        if not training:  # the same deterministic view either way
            np.testing.assert_allclose(xa.numpy(), xb.numpy(), atol=1e-3)


@pytest.mark.parametrize("channels", [1, 3])
def test_decoding_bytes_for_serving_matches_the_evaluation_pipeline(tmp_path, channels):
    """The exported bytes signature and `predict` see what evaluation saw."""
    from keras_vit.data.folders import list_image_folder
    from keras_vit.data.pipeline import decode_for_eval

    rng = np.random.default_rng(0)
    for name, shape in (("grey", (20, 24, 1)), ("rgb", (16, 16, 3)), ("rgba", (30, 18, 4))):
        os.makedirs(tmp_path / name)
        pixels = rng.integers(0, 256, shape, dtype=np.uint8)
        (tmp_path / name / "0.png").write_bytes(tf.io.encode_png(pixels).numpy())
    evaluation = vit_data.from_folder(
        str(tmp_path), image_size=12, channels=channels, crop_fraction=0.875, batch_size=3
    )
    batch = next(iter(evaluation.data))[0].numpy()
    paths = list_image_folder(str(tmp_path))[0]
    decoded = np.stack(
        [
            decode_for_eval(tf.io.read_file(path), 12, channels, crop_fraction=0.875)
            for path in paths
        ]
    )
    assert decoded.shape == (3, 12, 12, channels)
    np.testing.assert_allclose(decoded, batch, atol=1e-4)
