import os

import keras
import numpy as np
import pytest
from keras import ops

import keras_vit
from keras_vit.models import BUILDERS, decode_variant, parameter_count
from tests.conftest import TINY, randomize_weights

# The parameter counts of the paper's code at 224 px with 1000 classes.
PAPER_PARAMETER_COUNTS = {
    "Ti/16": 5_717_416,
    "S/16": 22_050_664,
    "B/16": 86_567_656,
    "B/32": 88_224_232,
    "L/16": 304_326_632,
    "L/32": 306_535_400,
    "H/14": 632_045_800,
}


@pytest.mark.backend_independent
@pytest.mark.parametrize("variant", sorted(PAPER_PARAMETER_COUNTS))
def test_parameter_counts_equal_the_papers_code(variant):
    assert parameter_count(variant) == PAPER_PARAMETER_COUNTS[variant]


@pytest.mark.parametrize("variant", sorted(PAPER_PARAMETER_COUNTS))
def test_each_width_and_patch_size_at_one_block_has_the_counted_parameters(variant):
    # The count above is analytic; here it meets real models. Every block of
    # a variant is the same layer, so the variant at depth 1 ties the count
    # to the layers for each width and patch size (ViT-H/14 whole would be
    # 632M weights to initialise on every backend).
    # (The builders pass decode_variant's architecture: the test below; and
    # tests/test_library_floor.py builds ViT-B/16 whole against the paper.)
    arch = {**decode_variant(variant), "num_layers": 1}
    # 224 px, 1000 classes. The count needs the variables' shapes, not their
    # values: a stateless scope leaves them uninitialised (on JAX, each new
    # shape's random initializer is a compilation, 2 s a model).
    with keras.StatelessScope(initialize_variables=False):
        model = keras_vit.ViT(**arch)
    assert model.count_params() == parameter_count(arch)


def test_every_published_builder_is_exported_with_its_architecture():
    for variant, builder in BUILDERS.items():
        name = "ViT" + variant.replace("/", "")
        assert getattr(keras_vit, name) is builder
        assert builder.__name__ == name
        assert f"ViT-{variant}" in builder.__doc__
    model = keras_vit.ViTS32(input_shape=(64, 64, 3), classes=3)
    arch = decode_variant("S/32")
    assert model.name == "vit_s32"
    assert model.get_layer("patch_embedding").kernel.shape == (32, 32, 3, 384)
    assert len([la for la in model.layers if la.name.startswith("encoderblock_")]) == 12
    assert model.get_layer("encoderblock_0").attention.num_heads == arch["num_heads"]
    assert model.count_params() == parameter_count("S/32", image_size=64, classes=3)


def test_classifier_outputs_probabilities(images):
    model = randomize_weights(keras_vit.ViT(**TINY))
    probabilities = ops.convert_to_numpy(model(images))
    assert probabilities.shape == (4, 5)
    np.testing.assert_allclose(probabilities.sum(-1), 1.0, atol=1e-5)


def test_head_starts_at_zero():
    model = keras_vit.ViT(**TINY, classifier_activation=None)
    head = model.get_layer("head")
    assert not np.any(ops.convert_to_numpy(head.kernel))


def test_feature_outputs_without_top(images):
    features = keras_vit.ViT(**TINY, include_top=False)
    assert features.output_shape == (None, 32)
    tokens = keras_vit.ViT(**TINY, include_top=False, pooling=None)
    assert tokens.output_shape == (None, 1 + 16, 32)
    pre_logits = keras_vit.ViT(**TINY, include_top=False, representation_size=24)
    out = ops.convert_to_numpy(pre_logits(images))
    assert out.shape == (4, 24)
    assert np.all(np.abs(out) <= 1.0)  # tanh
    assert pre_logits.get_layer("pre_logits").activation.__name__ == "tanh"


def test_gap_pooling_without_class_token(images):
    model = keras_vit.ViT(**TINY, pooling="gap", class_token=False, classifier_activation=None)
    assert model.get_layer("position_embedding").num_tokens == 16
    assert "class_token" not in [layer.name for layer in model.layers]
    assert model(images).shape[-1] == 5


def test_sincos_position_embeddings_are_not_trained():
    model = keras_vit.ViT(**TINY, position_embedding="sincos2d")
    embedding = model.get_layer("position_embedding").embeddings
    assert not embedding.trainable
    assert embedding.path not in [w.path for w in model.trainable_weights]


def test_non_square_images_and_input_tensor(images):
    model = keras_vit.ViT(**{**TINY, "input_shape": (8, 24, 3)})
    assert model.get_layer("position_embedding").grid_size == (2, 6)
    inputs = keras.Input((16, 16, 3))
    model = keras_vit.ViT(**{**TINY, "input_shape": None}, input_tensor=inputs)
    assert model.inputs[0] is inputs
    assert tuple(model(images).shape) == (4, 5)


def test_rescaling_maps_pixels_to_minus_one_one(images):
    with_rescaling = randomize_weights(keras_vit.ViT(**TINY))
    without = keras_vit.ViT(**TINY, include_rescaling=False)
    without.set_weights(with_rescaling.get_weights())
    np.testing.assert_allclose(
        ops.convert_to_numpy(with_rescaling(images)),
        ops.convert_to_numpy(without(images / 127.5 - 1.0)),
        atol=1e-5,
    )


@pytest.mark.parametrize(
    "normalization, mean, std",
    [
        ("imagenet", [0.485, 0.456, 0.406], [0.229, 0.224, 0.225]),
        (([0.1, 0.2, 0.3], [0.5, 0.4, 0.3]), [0.1, 0.2, 0.3], [0.5, 0.4, 0.3]),
    ],
)
def test_normalization_maps_pixels_to_the_checkpoints_statistics(images, normalization, mean, std):
    model = randomize_weights(keras_vit.ViT(**TINY, normalization=normalization))
    without = keras_vit.ViT(**TINY, include_rescaling=False)
    without.set_weights(model.get_weights())
    expected = (images / 255.0 - np.array(mean)) / np.array(std)
    np.testing.assert_allclose(
        ops.convert_to_numpy(model(images)),
        ops.convert_to_numpy(without(expected.astype("float32"))),
        atol=1e-5,
    )
    rebuilt = keras_vit.VisionTransformer.from_config(model.get_config())
    np.testing.assert_allclose(
        np.asarray(rebuilt.get_layer("rescaling").scale),
        np.asarray(model.get_layer("rescaling").scale),
    )


def test_bad_normalization_names_the_value():
    with pytest.raises(ValueError, match="normalization='clip'"):
        keras_vit.ViT(**TINY, normalization="clip")
    with pytest.raises(ValueError, match="needs 1 means and 1 positive stds"):
        keras_vit.ViT(**{**TINY, "input_shape": (16, 16, 1)}, normalization="imagenet")


def test_drop_path_rises_linearly_with_depth():
    model = keras_vit.ViT(**{**TINY, "num_layers": 5}, drop_path_rate=0.2)
    rates = [model.get_layer(f"encoderblock_{i}").drop_path_rate for i in range(5)]
    np.testing.assert_allclose(rates, [0.0, 0.05, 0.1, 0.15, 0.2])


def test_feature_extractor_returns_every_block(images):
    model = randomize_weights(keras_vit.ViT(**{**TINY, "num_layers": 3}))
    features = keras_vit.feature_extractor(model)
    outputs = {k: ops.convert_to_numpy(v) for k, v in features(images).items()}
    assert sorted(outputs) == ["encoder_norm", "encoderblock_0", "encoderblock_1", "encoderblock_2"]
    last = model.get_layer("encoderblock_2")
    assert features.get_layer("encoderblock_2") is last  # shares the layers
    norm = ops.convert_to_numpy(model.get_layer("encoder_norm")(outputs["encoderblock_2"]))
    np.testing.assert_allclose(outputs["encoder_norm"], norm, atol=1e-5)
    with pytest.raises(ValueError, match="Block index 3 is out of range"):
        keras_vit.feature_extractor(model, blocks=[3])


def test_weights_argument_loads_a_weights_file(tmp_path, images):
    source = randomize_weights(keras_vit.ViT(**TINY))
    path = os.path.join(tmp_path, "tiny.weights.h5")
    source.save_weights(path)
    loaded = keras_vit.ViT(**TINY, weights=path)
    np.testing.assert_allclose(
        ops.convert_to_numpy(loaded(images)),
        ops.convert_to_numpy(source(images)),
        atol=1e-6,
    )


@pytest.mark.parametrize(
    "kwargs, message",
    [
        ({"input_shape": (225, 224, 3)}, "225 is not divisible by patch size 16"),
        ({"input_shape": (224, 224)}, r"input_shape=\(224, 224\)"),
        ({"input_shape": (224, 224, 0)}, r"input_shape=\(224, 224, 0\)"),
        ({"weights": "no/such/file.weights.h5"}, "no/such/file.weights.h5"),
        ({"weights": "imagenet1k"}, "weights='imagenet1k'.*registered for ViT-B/16"),
        ({"pooling": "min"}, "pooling='min'"),
        ({"pooling": None}, "pooling=None"),
        ({"classes": 0}, "classes=0"),
        ({"class_token": False}, "class_token=False"),
        ({"distillation_token": True, "pooling": "gap"}, "pooling='gap'"),
        ({"distillation_token": True, "representation_size": 8}, "representation_size=8"),
        ({"num_register_tokens": -1}, "num_register_tokens=-1"),
        ({"pooling": "token_gap", "class_token": False}, "class_token=False"),
        ({"input_shape": (None, None, None)}, r"input_shape=\(None, None, None\)"),
        (
            {"input_shape": (None, None, 3), "base_image_size": 100},
            "100 is not divisible by patch size 16",
        ),
        (
            {"input_shape": (None, None, 3), "base_image_size": (224, 0)},
            r"base_image_size=\(224, 0\)",
        ),
        ({"base_image_size": 384}, r"base_image_size=384, input_shape=\(224, 224, 3\)"),
        ({"resample_method": "nearest"}, "resample_method='nearest'"),
    ],
)
def test_bad_arguments_fail_before_building(kwargs, message):
    with pytest.raises(ValueError, match=message):
        keras_vit.ViTB16(**kwargs)


def test_unknown_variant_and_wrong_patch_size():
    with pytest.raises(ValueError, match="Unknown ViT variant 'X/16'"):
        decode_variant("X/16")
    with pytest.raises(ValueError, match="Unknown ViT variant 'B/15'"):
        decode_variant("B/15")
    with pytest.raises(ValueError, match="patch_size=-4"):
        keras_vit.ViT(**{**TINY, "patch_size": -4})
    with pytest.raises(ValueError, match="16 is not divisible by patch size 5"):
        keras_vit.ViT(**{**TINY, "patch_size": 5})


def test_wrong_channels_at_call_time_name_the_values():
    model = keras_vit.ViT(**TINY)
    with pytest.raises(
        ValueError,
        match=r"expected axis -1 of input shape to have value 3, "
        r"but received input with shape \(2, 16, 16, 1\)",
    ):
        model(np.zeros((2, 16, 16, 1), "float32"))


def test_model_config_round_trips(images):
    model = randomize_weights(keras_vit.ViT(**TINY, drop_path_rate=0.1))
    clone = keras_vit.VisionTransformer.from_config(model.get_config())
    assert clone.get_config() == model.get_config()
    # Keras' own cloning copies its graph (as a plain functional model).
    cloned = keras.models.clone_model(model)
    assert [layer.name for layer in cloned.layers] == [layer.name for layer in model.layers]
    assert cloned.count_params() == model.count_params()
    clone.set_weights(model.get_weights())
    np.testing.assert_allclose(
        ops.convert_to_numpy(clone(images)),
        ops.convert_to_numpy(model(images)),
        atol=1e-6,
    )


def test_a_remat_model_trains_to_the_plain_models_weights_and_keeps_the_setting(tmp_path):
    rng = np.random.default_rng(0)
    x = rng.uniform(0, 255, (8, 16, 16, 3)).astype("float32")
    y = np.arange(8) % TINY["classes"]
    trained = []
    for remat in (False, True):
        keras.utils.set_random_seed(0)
        model = keras_vit.ViT(**TINY, dropout_rate=0.1, drop_path_rate=0.2, seed=3, remat=remat)
        model.compile(keras.optimizers.SGD(0.5), "sparse_categorical_crossentropy")
        model.fit(x, y, batch_size=4, epochs=2, shuffle=False, verbose=0)
        trained.append(model)
    for plain, recomputed in zip(*(m.get_weights() for m in trained)):
        np.testing.assert_allclose(recomputed, plain, rtol=1e-4, atol=1e-5)
    path = str(tmp_path / "remat.keras")
    trained[1].save(path)
    loaded = keras.saving.load_model(path)
    assert loaded.get_config()["remat"] is True
    assert loaded.get_layer("encoderblock_1").remat is True
    with pytest.raises(TypeError, match="remat='no'"):
        keras_vit.ViTB16(remat="no")


def test_distillation_token_model_averages_its_two_heads(images):
    model = randomize_weights(
        keras_vit.ViT(**TINY, distillation_token=True, classifier_activation=None)
    )
    tokens = keras.Model(model.input, model.get_layer("encoder_norm").output)(images)
    tokens = ops.convert_to_numpy(tokens)
    assert tokens.shape[1] == 2 + 16  # class, distillation, 4x4 patches

    def head(name, features):
        layer = model.get_layer(name)
        return features @ ops.convert_to_numpy(layer.kernel) + ops.convert_to_numpy(layer.bias)

    expected = (head("head", tokens[:, 0]) + head("head_dist", tokens[:, 1])) / 2
    np.testing.assert_allclose(ops.convert_to_numpy(model(images)), expected, atol=1e-5)
    probabilities = keras_vit.ViT(**TINY, distillation_token=True)
    assert probabilities.get_layer("predictions").activation.__name__ == "softmax"


def test_register_tokens_sit_between_the_class_token_and_the_patches(images):
    model = randomize_weights(keras_vit.ViT(**TINY, num_register_tokens=3, pooling="gap"))
    registers = ops.convert_to_numpy(model.get_layer("register_tokens").tokens)
    embedded = keras.Model(model.input, model.get_layer("register_tokens").output)(images)
    embedded = ops.convert_to_numpy(embedded)
    assert embedded.shape[1] == 1 + 3 + 16
    # Registers carry no position embedding: the same for every image.
    np.testing.assert_allclose(embedded[:, 1:4], np.broadcast_to(registers, (len(images), 3, 32)))
    assert model.get_layer("pooling").num_prefix_tokens == 4  # the mean skips them
    # The position table still covers only the class token and the patches.
    assert model.get_layer("position_embedding").embeddings.shape == (1, 17, 32)


def test_token_gap_pooling_concatenates_class_token_and_mean(images):
    model = keras_vit.ViT(**TINY, pooling="token_gap", include_top=False)
    assert model.output_shape == (None, 64)
    tokens = keras.Model(model.input, model.get_layer("encoder_norm").output)(images)
    tokens = ops.convert_to_numpy(tokens)
    expected = np.concatenate([tokens[:, 0], tokens[:, 1:].mean(1)], axis=-1)
    np.testing.assert_allclose(ops.convert_to_numpy(model(images)), expected, atol=1e-5)


def test_keras_applications_poolings_avg_and_max_pool_the_patch_tokens(images):
    # keras.applications' `pooling="avg"` / `"max"` with `include_top=False`:
    # one vector of the model's width per image, over the patch tokens only
    # (a ViT's prefix tokens are not positions of the image).
    model = randomize_weights(keras_vit.ViT(**TINY, pooling="max", include_top=False))
    assert model.output_shape == (None, 32)
    tokens = keras.Model(model.input, model.get_layer("encoder_norm").output)(images)
    patches = ops.convert_to_numpy(tokens)[:, 1:]
    np.testing.assert_allclose(ops.convert_to_numpy(model(images)), patches.max(1), atol=1e-6)
    average = keras_vit.ViT(**TINY, pooling="avg", include_top=False)
    average.set_weights(model.get_weights())
    np.testing.assert_allclose(ops.convert_to_numpy(average(images)), patches.mean(1), atol=1e-5)
    # With a head, too; and the configuration keeps the name it was given.
    classifier = keras_vit.ViTTi16(input_shape=(32, 32, 3), classes=7, pooling="avg")
    assert classifier.output_shape == (None, 7)
    assert classifier.get_config()["pooling"] == "avg"
    with pytest.raises(ValueError, match="pooling='min'"):
        keras_vit.ViT(**TINY, pooling="min")


def test_token_options_round_trip_through_config(images):
    model = randomize_weights(keras_vit.ViT(**TINY, distillation_token=True, num_register_tokens=2))
    clone = keras_vit.VisionTransformer.from_config(model.get_config())
    clone.set_weights(model.get_weights())
    np.testing.assert_allclose(
        ops.convert_to_numpy(clone(images)), ops.convert_to_numpy(model(images)), atol=1e-6
    )


def test_conv_stem_feeds_the_patch_embedding(images):
    model = keras_vit.ViT(
        **{**TINY, "patch_size": 1}, stem_filters=(8, 16), include_top=False, pooling=None
    )
    # 16 px -> 4x4 feature map -> 16 one-pixel patches, plus the class token.
    assert model.output_shape == (None, 17, 32)
    assert model.get_layer("position_embedding").grid_size == (4, 4)
    assert model.get_layer("patch_embedding").kernel.shape == (1, 1, 16, 32)
    # Each halving rounds up ("same" padding): 20 px -> 10 -> 5 -> 3.
    odd = keras_vit.ViT(
        **{**TINY, "patch_size": 1, "input_shape": (20, 20, 3)}, stem_filters=(8, 8, 8)
    )
    assert odd.get_layer("position_embedding").grid_size == (3, 3)
    with pytest.raises(ValueError, match="height 5 is not divisible by patch size 2"):
        keras_vit.ViT(**{**TINY, "patch_size": 2, "input_shape": (20, 20, 3)}, stem_filters=(8, 8))


def test_max_pool_stem_is_a_cnn_stage_per_halving(images):
    model = keras_vit.ViT(
        **{**TINY, "patch_size": 1, "input_shape": (28, 28, 3)},
        stem_filters=(4, 8, 16),
        stem_downsampling="max_pool",
        include_top=False,
        pooling=None,
    )
    stem = model.get_layer("stem")
    # 28 px -> 14 -> 7 -> 4 (the odd side padded, as "same" pooling).
    assert model.get_layer("position_embedding").grid_size == (4, 4)
    assert [c.strides for c in stem.convolutions] == [(1, 1)] * 3
    x = keras.random.uniform((2, 28, 28, 3), seed=1)
    expected = x
    for convolution, norm in zip(stem.convolutions, stem.norms):
        expected = ops.relu(norm(convolution(expected), training=False))
        expected = ops.max_pool(expected, 2, 2, padding="same")
    np.testing.assert_allclose(
        ops.convert_to_numpy(stem(x)), ops.convert_to_numpy(expected), atol=1e-6
    )
    clone = keras_vit.VisionTransformer.from_config(model.get_config())
    assert clone.get_layer("stem").downsampling == "max_pool"
    with pytest.raises(ValueError, match="downsampling.*Received: downsampling='avg'"):
        keras_vit.ViT(**TINY, stem_filters=(8,), stem_downsampling="avg")


def test_stem_downsampling_per_stage_mixes_strided_and_pooled_stages():
    stages = ("convolution", "max_pool", "max_pool")
    model = keras_vit.ViT(
        **{**TINY, "patch_size": 1, "input_shape": (28, 28, 3)},
        stem_filters=(4, 8, 16),
        stem_downsampling=stages,
        include_top=False,
        pooling=None,
    )
    stem = model.get_layer("stem")
    assert model.get_layer("position_embedding").grid_size == (4, 4)  # 28 -> 14 -> 7 -> 4
    assert [c.strides for c in stem.convolutions] == [(2, 2), (1, 1), (1, 1)]
    x = keras.random.uniform((2, 28, 28, 3), seed=1)
    expected = x
    for convolution, norm, stage in zip(stem.convolutions, stem.norms, stages):
        expected = ops.relu(norm(convolution(expected), training=False))
        if stage == "max_pool":
            expected = ops.max_pool(expected, 2, 2, padding="same")
    np.testing.assert_allclose(
        ops.convert_to_numpy(stem(x)), ops.convert_to_numpy(expected), atol=1e-6
    )
    clone = keras_vit.VisionTransformer.from_config(model.get_config())
    assert clone.get_layer("stem").downsampling == stages
    np.testing.assert_allclose(
        ops.convert_to_numpy(clone.get_layer("stem")(x)).shape, (2, 4, 4, 16)
    )
    with pytest.raises(
        ValueError,
        match="one of them for each of the 3 convolutions.*"
        r"Received: downsampling=\('max_pool', 'max_pool'\)",
    ):
        keras_vit.ViT(**TINY, stem_filters=(8, 8, 8), stem_downsampling=("max_pool", "max_pool"))


DYNAMIC = {**TINY, "input_shape": (None, None, 3), "base_image_size": 16}


def _fixed_copy(model, size, **kwargs):
    """The model rebuilt at `size` with its table resampled once, at load time."""
    from keras_vit.layers import resample_position_embeddings

    fixed = keras_vit.ViT(**{**TINY, "input_shape": (*size, 3), **kwargs})
    values = {w.path: ops.convert_to_numpy(w) for w in model.weights}
    grid = (size[0] // 4, size[1] // 4)
    for weight in fixed.weights:
        value = values[weight.path]
        if weight.path == "position_embedding/embeddings":
            value = resample_position_embeddings(value, grid, source_grid=(4, 4))
        weight.assign(value)
    return fixed


def test_one_model_takes_every_size_as_a_fixed_model_at_that_size(tmp_path):
    model = randomize_weights(keras_vit.ViT(**DYNAMIC))
    assert model.input_shape == (None, None, None, 3)
    assert keras_vit.models.default_image_size(model) == (16, 16)
    rng = np.random.default_rng(0)
    for size in ((16, 16), (24, 24), (32, 20), (8, 8)):
        images = rng.uniform(0, 255, (2, *size, 3)).astype("float32")
        fixed = _fixed_copy(model, size)
        np.testing.assert_allclose(
            model.predict(images, verbose=0), fixed.predict(images, verbose=0), atol=1e-5
        )
    # A size that does not cut into patches: the error names it, in the
    # exception's own message on every backend, and the model keeps working.
    with pytest.raises(ValueError, match=r"height 18 is not divisible by patch size 4"):
        model.predict(np.zeros((1, 18, 16, 3), "float32"), verbose=0)
    np.testing.assert_allclose(
        model.predict(images, verbose=0), fixed.predict(images, verbose=0), atol=1e-5
    )
    model.save(tmp_path / "after_an_error.keras")


def test_run_time_resolution_trains_saves_and_loads(tmp_path):
    model = keras_vit.ViT(**DYNAMIC, classifier_activation=None)
    model.compile(
        optimizer=keras.optimizers.SGD(0.05),
        loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
    )
    rng = np.random.default_rng(0)

    def batches():  # one size per batch, three sizes
        for size in (16, 24, 12, 16, 24, 12):
            yield (rng.uniform(0, 255, (4, size, size, 3)).astype("float32"), rng.integers(0, 5, 4))

    before = ops.convert_to_numpy(model.get_layer("position_embedding").embeddings).copy()
    history = model.fit(batches(), epochs=1, steps_per_epoch=6, verbose=0)
    assert np.isfinite(history.history["loss"][0])
    after = ops.convert_to_numpy(model.get_layer("position_embedding").embeddings)
    assert np.abs(after - before).max() > 0  # gradients flow through the resampling
    path = os.path.join(tmp_path, "dynamic.keras")
    model.save(path)
    loaded = keras.saving.load_model(path)
    assert loaded.input_shape == (None, None, None, 3)
    for size in ((16, 16), (28, 20)):
        images = rng.uniform(0, 255, (2, *size, 3)).astype("float32")
        np.testing.assert_allclose(
            loaded.predict(images, verbose=0), model.predict(images, verbose=0), atol=1e-6
        )


def test_run_time_resolution_features_attention_and_checkpoint_loading(tmp_path):
    from keras_vit import inspect as vit_inspect

    model = randomize_weights(
        keras_vit.ViT(**DYNAMIC, num_register_tokens=2, resample_method="bicubic_antialias")
    )
    images = np.random.default_rng(0).uniform(0, 255, (2, 24, 20, 3)).astype("float32")
    features = keras_vit.models.feature_extractor(model, blocks=[-1])(images)
    assert tuple(features["encoder_norm"].shape) == (2, 1 + 2 + 6 * 5, 32)
    prefix, grid, patch = vit_inspect.token_layout(model, images.shape[1:3])
    assert (prefix, grid, patch) == (3, (6, 5), (4, 4))
    attention = vit_inspect.attention_maps(model, images)
    assert attention.shape == (2, 2, 4, 33, 33)
    assert vit_inspect.attention_rollout(attention, prefix, grid).shape == (2, 6, 5)
    # A .keras file of it builds the same model at run-time resolution.
    path = os.path.join(tmp_path, "dynamic.keras")
    model.save(path)
    # Left unset, the file's table size.
    unset = {k: v for k, v in DYNAMIC.items() if k != "base_image_size"}
    again = keras_vit.ViT(**unset, num_register_tokens=2, weights=path)
    positions = again.get_layer("position_embedding")
    assert positions.grid_size == (4, 4) and positions.resample_method == "bicubic_antialias"
    np.testing.assert_allclose(
        again.predict(images, verbose=0), model.predict(images, verbose=0), atol=1e-6
    )
