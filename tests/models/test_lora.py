"""LoRA on a keras_vit model: adapters on the blocks' projections, saved alone or merged."""

import os
import warnings

import keras
import numpy as np
import pytest

import keras_vit
from keras_vit.models import lora
from tests.conftest import TINY, randomize_weights

LOGITS = {**TINY, "classifier_activation": None}


def numpy(tensor):
    return keras.ops.convert_to_numpy(tensor)


def images_and_labels():
    rng = np.random.default_rng(0)
    return rng.uniform(0, 255, (8, 16, 16, 3)).astype("float32"), np.arange(8) % TINY["classes"]


def model_with_weights(seed=0):
    return randomize_weights(keras_vit.ViT(**LOGITS), seed=seed, scale=0.1)


def fit(model, epochs=3):
    images, labels = images_and_labels()
    model.compile(
        optimizer=keras.optimizers.Adam(1e-2),
        loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
    )
    model.fit(images, labels, batch_size=4, epochs=epochs, shuffle=False, verbose=0)


def qkv_kernel(model, block=0):
    return numpy(model.get_layer(f"encoderblock_{block}").attention.qkv.kernel)


def test_query_and_value_adapters_train_and_nothing_else_of_the_encoder_moves():
    model = model_with_weights()
    images, _ = images_and_labels()
    before = numpy(model(images))
    frozen = {v.path: numpy(v) for v in model.weights}
    model.enable_lora(4)
    # B starts at zero: the model computes what it did.
    np.testing.assert_array_equal(numpy(model(images)), before)
    trained = sorted(variable.path for variable in model.trainable_weights)
    per_block = ["attention/qkv/bias", "attention/qkv/lora_kernel_a", "attention/qkv/lora_kernel_b"]
    assert trained == sorted(
        [f"encoderblock_{b}/{name}" for b in range(TINY["num_layers"]) for name in per_block]
        + ["head/bias", "head/kernel"]
    )
    width = TINY["hidden_dim"]
    qkv = model.get_layer("encoderblock_0").attention.qkv
    assert tuple(qkv.lora_kernel_a.shape) == (2, width, 4)  # query, value: (D, rank) each
    assert tuple(qkv.lora_kernel_b.shape) == (2, 4, width)  # (rank, heads * head_dim)
    original_qkv = qkv_kernel(model)
    fit(model)
    assert np.abs(numpy(model(images)) - before).max() > 1e-3
    for variable in model.weights:  # the frozen weights themselves never move
        if variable.path in frozen and variable.path not in trained:
            np.testing.assert_array_equal(numpy(variable), frozen[variable.path])
    merged = qkv_kernel(model)
    np.testing.assert_array_equal(merged[:, 1], original_qkv[:, 1])  # the key: untouched
    for slot in (0, 2):
        update = merged[:, slot] - original_qkv[:, slot]
        assert np.abs(update).max() > 1e-4
        assert np.linalg.matrix_rank(update.reshape(width, -1)) <= 4  # low rank


def test_a_map_heads_attention_gets_the_adapters_of_the_blocks_and_merges_with_their_scale(
    tmp_path,
):
    # SigLIP's layout: no class token, an attention-pooling head.
    architecture = {**LOGITS, "class_token": False, "pooling": "map"}
    model = randomize_weights(keras_vit.ViT(**architecture), scale=0.1)
    base = {v.path: numpy(v) for v in model.weights}
    model.enable_lora(2, alpha=6)  # a scale of 3
    head = model.get_layer("map_head")
    # The probe's query, one (D, rank) @ (rank, D) update (not one per head);
    # the value's slot of the key-value kernel, the key's left.
    assert head.query.lora_slots == (0,) and head.key_value.lora_slots == (1,)
    width = TINY["hidden_dim"]
    assert tuple(head.query.lora_kernel_a.shape) == (1, width, 2)
    assert tuple(head.query.lora_kernel_b.shape) == (1, 2, width)
    trained = {variable.path for variable in model.trainable_weights}
    for name in ("query", "key_value"):
        assert {f"map_head/{name}/lora_kernel_a", f"map_head/{name}/lora_kernel_b"} <= trained
    assert not {"map_head/probe", "map_head/out/kernel", "map_head/mlp_dense_1/kernel"} & trained
    fit(model, epochs=1)
    images, _ = images_and_labels()
    expected = numpy(model(images))
    # The merge is the frozen kernel plus (alpha / rank) A @ B, in the value's slot only.
    a, b = (numpy(v)[0] for v in (head.key_value.lora_kernel_a, head.key_value.lora_kernel_b))
    assert np.abs(b).max() > 1e-4  # the head's adapters trained
    merged = keras_vit.models.merge_lora(model)
    kernel = numpy(merged.get_layer("map_head").key_value.kernel)
    frozen = base["map_head/key_value/kernel"]
    np.testing.assert_array_equal(kernel[:, 0], frozen[:, 0])
    np.testing.assert_allclose(
        kernel[:, 1], frozen[:, 1] + 3 * (a @ b).reshape(frozen[:, 1].shape), atol=1e-6
    )
    a, b = (numpy(v)[0] for v in (head.query.lora_kernel_a, head.query.lora_kernel_b))
    query = numpy(merged.get_layer("map_head").query.kernel) - base["map_head/query/kernel"]
    np.testing.assert_allclose(query.reshape(width, -1), 3 * a @ b, atol=1e-6)
    np.testing.assert_allclose(numpy(merged(images)), expected, atol=1e-5)
    path = str(tmp_path / "siglip.lora.h5")
    model.save_lora_weights(path)
    again = randomize_weights(keras_vit.ViT(**architecture), scale=0.1)
    again.set_weights([base[v.path] for v in again.weights])
    again.enable_lora(2, alpha=6)
    again.load_lora_weights(path)
    np.testing.assert_array_equal(numpy(again(images)), expected)


def test_every_target_and_the_parameters_a_lora_fine_tune_trains():
    model = model_with_weights()
    total = sum(int(np.prod(v.shape)) for v in model.weights)
    model.enable_lora(2, target=lora.TARGETS, alpha=4)
    assert lora.lora_settings(model) == {"rank": 2, "alpha": 4, "target": list(lora.TARGETS)}
    block = model.get_layer("encoderblock_1")
    for layer in (block.attention.out, block.mlp_dense_1, block.mlp_dense_2):
        assert layer.lora_enabled and layer.lora_rank == 2  # Keras' own LoRA
    assert block.attention.qkv.lora_slots == (0, 1, 2)
    trained = sum(int(np.prod(v.shape)) for v in model.trainable_weights)
    assert trained < 0.25 * total  # a tiny model: the biases and the head weigh
    fit(model, epochs=1)
    # A rank above the head count is within the output projection's (32, 32) matrix.
    wide = model_with_weights().enable_lora(8, target="out")
    assert wide.get_layer("encoderblock_0").attention.out.lora_rank == 8


def test_a_lora_model_saves_merged_and_its_adapters_alone(tmp_path):
    model = model_with_weights()
    model.enable_lora(4, target=("query", "value", "mlp_dense_2"))
    fit(model)
    images, _ = images_and_labels()
    expected = numpy(model(images))
    # The .keras file is the merged model, a VisionTransformer as built, and
    # uncompiled as merge_lora returns it: the optimizer's state is the
    # adapters' (Keras would warn that it does not fit the merged model's).
    model.save(tmp_path / "tuned.keras")
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        loaded = keras.saving.load_model(tmp_path / "tuned.keras")
    assert isinstance(loaded, keras_vit.VisionTransformer)
    assert lora.lora_settings(loaded) is None and not loaded.compiled
    np.testing.assert_allclose(numpy(loaded(images)), expected, atol=1e-5)
    merged = keras_vit.models.merge_lora(model)
    assert not any("lora" in variable.path for variable in merged.weights)
    np.testing.assert_allclose(numpy(merged(images)), expected, atol=1e-5)
    # The adapters and the head alone, read into the same base with the same LoRA.
    path = str(tmp_path / "tuned.lora.h5")
    model.save_lora_weights(path)
    assert os.path.getsize(path) < 0.5 * os.path.getsize(tmp_path / "tuned.keras")
    again = model_with_weights()
    again.enable_lora(4, target=("query", "value", "mlp_dense_2"))
    again.load_lora_weights(path)
    np.testing.assert_array_equal(numpy(again(images)), expected)


def refused_untouched(model, path, message):
    """`load_lora_weights(path)` into `model` with LoRA 4 is refused and moves no weight."""
    model.enable_lora(4)
    before = [numpy(v) for v in model.weights]
    with pytest.raises(ValueError, match=message):
        model.load_lora_weights(path)
    for value, variable in zip(before, model.weights):
        np.testing.assert_array_equal(numpy(variable), value)


def test_lora_files_for_another_model_are_refused_before_any_weight_moves(tmp_path):
    model = model_with_weights()
    model.enable_lora(4)
    path = str(tmp_path / "a.lora.h5")
    model.save_lora_weights(path)
    other_rank = model_with_weights()
    other_rank.enable_lora(2)
    with pytest.raises(ValueError, match="holds LoRA .*'rank': 4.*the model has LoRA .*'rank': 2"):
        other_rank.load_lora_weights(path)
    wider = keras_vit.ViT(**{**LOGITS, "hidden_dim": 64, "mlp_dim": 128})
    refused_untouched(wider, path, "LoRA weights of another architecture")
    refused_untouched(model_with_weights(seed=1), path, "adapters trained on another base model")
    with pytest.raises(ValueError, match="path='a.lora.npz'"):
        model.save_lora_weights("a.lora.npz")
    with pytest.raises(ValueError, match="has no LoRA"):
        model_with_weights().save_lora_weights(path)


@pytest.mark.parametrize(
    "arguments, message",
    [
        (dict(rank=0), "rank=0"),
        (dict(rank=2.0), "rank=2.0"),
        (dict(rank=33), "at most the query projection's smaller side, 32.*rank=33"),
        # The attention output's matrix is (heads * head_dim, D), not its first axis (heads).
        (dict(rank=33, target="out"), "at most the out projection's smaller side, 32.*rank=33"),
        (dict(rank=4, target=("query", "attention")), "target=\\('query', 'attention'\\)"),
        (dict(rank=4, target=()), "target=\\(\\)"),
    ],
)
def test_bad_arguments_are_refused_before_anything_changes(arguments, message):
    model = model_with_weights()
    with pytest.raises(ValueError, match=message):
        model.enable_lora(**arguments)
    assert lora.lora_settings(model) is None
    assert len(model.trainable_weights) == len(model.weights)


def test_lora_twice_or_on_an_int4_model_is_refused_and_a_lora_model_does_not_quantize():
    model = model_with_weights()
    model.enable_lora(4)
    with pytest.raises(ValueError, match="has LoRA already \\(rank 4\\)"):
        model.enable_lora(4)
    with pytest.raises(ValueError, match="merge_lora"):
        model.quantize("int8")
    quantized = model_with_weights()
    quantized.quantize("int4")
    with pytest.raises(ValueError, match="quantized in 'int4' .*'int8' \\(QLoRA\\)"):
        quantized.enable_lora(4)


def int8_kernels(model):
    return {v.path: numpy(v) for v in model.weights if v.dtype == "int8"}


def test_qlora_trains_beside_the_int8_kernels_and_saves_merged_and_alone(tmp_path):
    images, _ = images_and_labels()
    model = model_with_weights()
    model.quantize("int8")
    before, kernels = numpy(model(images)), int8_kernels(model)
    model.enable_lora(2, target=("query", "value", "mlp_dense_1"), alpha=4)
    np.testing.assert_allclose(model.predict(images, verbose=0), before, atol=1e-6)
    fit(model)
    after = numpy(model(images))
    change = np.abs(after - before).max()
    assert change > 1e-2
    assert all(np.array_equal(value, int8_kernels(model)[p]) for p, value in kernels.items())
    qkv = model.get_layer("encoderblock_0").attention.qkv
    assert np.abs(numpy(qkv.lora_kernel_b)).max(axis=(1, 2)).min() > 0  # (each slot trained)
    np.testing.assert_allclose(model.predict(images, verbose=0), after, atol=1e-6)
    # Saved as Keras saves its int8 LoRA layers: each kernel merged and
    # requantized; merge_lora is that model.
    model.save(tmp_path / "qlora.keras")
    reloaded = numpy(keras.saving.load_model(tmp_path / "qlora.keras")(images))
    assert np.abs(reloaded - after).max() < 0.1 * change
    merged = lora.merge_lora(model)
    assert lora.lora_settings(merged) is None and int8_kernels(merged).keys() == kernels.keys()
    np.testing.assert_allclose(numpy(merged(images)), reloaded, atol=1e-5)
    # The adapters alone, into the same int8 base.
    model.save_lora_weights(tmp_path / "a.lora.h5")
    other = model_with_weights()
    other.quantize("int8")
    other.enable_lora(2, target=("query", "value", "mlp_dense_1"), alpha=4)
    other.load_lora_weights(tmp_path / "a.lora.h5")
    np.testing.assert_allclose(numpy(other(images)), after, atol=1e-6)


@pytest.mark.skipif(keras.backend.backend() != "tensorflow", reason="the TensorFlow graph's export")
def test_every_export_of_a_lora_model_is_its_merged_models(tmp_path):
    model = model_with_weights()
    model.enable_lora(4)
    fit(model, epochs=2)
    images, _ = images_and_labels()
    merged = keras_vit.models.merge_lora(model)
    path = tmp_path / "tuned.tflite"
    keras_vit.export.tflite(model, path)
    assert keras_vit.export.check_tflite(path, merged, images)["max_abs_error"] < 1e-4
    # The int8 modes rotate the residual stream of the model's weights: the
    # merged ones (adapters are outside the layout the rotation rewrites).
    tables = []
    for source, name in ((model, "tuned_int8.tflite"), (merged, "merged_int8.tflite")):
        written = keras_vit.export.tflite(
            source, tmp_path / name, quantization="int8", representative_data=images
        )
        assert written["rotated"] is True, name
        tables.append(keras_vit.export.check_tflite(tmp_path / name, merged, images))
    assert tables[0]["max_abs_error"] == tables[1]["max_abs_error"]


def test_predict_after_enable_lora_and_merge_sees_the_adapters():
    # A model that predicted before keeps no traced function that ignores them.
    model = model_with_weights()
    images, _ = images_and_labels()
    before = model.predict(images, verbose=0)
    model.enable_lora(2, alpha=4)  # (a scale of 2: alpha != rank)
    for variable in model.trainable_weights:
        if "lora_kernel" in variable.path:
            variable.assign(np.full(variable.shape, 0.05, "float32"))
    adapted = model.predict(images, verbose=0)
    merged = lora.merge_lora(model)
    np.testing.assert_allclose(adapted, merged.predict(images, verbose=0), atol=1e-5)
    assert np.abs(adapted - before).max() > 1e-3
    # The merged kernel is the frozen one plus (alpha / rank) A @ B per slot.
    qkv = model.get_layer("encoderblock_0").attention.qkv
    a, b = numpy(qkv.lora_kernel_a), numpy(qkv.lora_kernel_b)
    frozen = numpy(keras_vit._compat.lora_frozen_kernel(qkv))
    expected = frozen.copy()
    for index, slot in enumerate(qkv.lora_slots):
        expected[:, slot] += (2.0 * a[index] @ b[index]).reshape(expected[:, slot].shape)
    np.testing.assert_allclose(qkv_kernel(merged), expected, atol=1e-6)


def test_lora_on_a_quantization_aware_copy_trains_under_its_rounding():
    model = model_with_weights()
    images = np.random.default_rng(1).uniform(0, 255, (32, 16, 16, 3)).astype("float32")
    copy = keras_vit.models.quantization_aware_copy(model, "int8", images)
    plain = copy.predict(images, verbose=0)
    copy.enable_lora(2, target=("query", "value", "out"))
    # Adapters at zero: the same rounded function, to the last bit.
    np.testing.assert_array_equal(copy.predict(images, verbose=0), plain)
    for variable in copy.trainable_weights:
        if "lora_kernel" in variable.path:
            variable.assign(np.full(variable.shape, 0.05, "float32"))
    # Trained adapters: the merged QAT model (what the export writes) computes the same.
    merged = lora.merge_lora(copy)
    assert keras_vit.models.qat_mode(merged) == "int8"
    np.testing.assert_allclose(
        copy.predict(images, verbose=0), merged.predict(images, verbose=0), atol=1e-5
    )
