"""keras-hub's contract for a built model, and Keras' Model API, on every backend.

The first tests are written from `run_backbone_test`, `run_precision_test`
and `run_quantization_test` in keras-hub's `keras_hub/src/tests/test_case.py`
(the keras-hub wheel), on a tiny `VisionTransformer`. What a ViT must do
differently is adapted, and each adaptation says why:

- keras-hub skips its precision and quantization checks on PyTorch (a CPU
  without float16 kernels; a Keras 3.7 bug); they pass here, so they run.
- The head computes in the variable dtype (float32 under mixed precision):
  Keras' mixed precision guide asks this of a model's last layer, so its
  logits and probabilities are float32 where keras-hub's check expects every
  sublayer in the compute dtype.
- keras-hub's quantization check maps the layers whose type is exactly
  `Dense` or `EinsumDense`; attention's projections (`Projection`) and the
  MLP's first layer (`GeluDense`, GELU inside) are subclasses of them, and
  are mapped too: every projection of the model is quantized.

The others are what a Keras user does next with a model: `model.quantize`
on a model just built and on one loaded from a checkpoint, saved and loaded;
`keras.RematScope`; Keras' own `model.export` formats.
"""

import io
import json
import re
import warnings
import zipfile

import keras
import numpy as np
import pytest

import keras_vit
from keras_vit.weights.keras_archive import read_keras_weights
from tests.conftest import BACKEND, TINY, randomize_weights

LOGITS = {**TINY, "classifier_activation": None}
# Each block's projections, by the name of their layer, and the head.
PROJECTIONS = ("qkv", "out", "mlp_dense_1", "mlp_dense_2")


def image_batch(count=4, seed=0):
    return np.random.default_rng(seed).uniform(0, 255, (count, 16, 16, 3)).astype("float32")


def numpy(tensor):
    return keras.ops.convert_to_numpy(tensor)


def test_backbone_contract():
    model = keras_vit.ViT(**TINY)
    # Serialization, without a full save: the config, and Keras' own round trip.
    config = json.dumps(model.get_config(), sort_keys=True)
    revived = keras_vit.VisionTransformer.from_config(model.get_config())
    assert json.dumps(revived.get_config(), sort_keys=True) == config
    assert set(dir(revived)) == set(dir(model))
    serialized = json.dumps(keras.saving.serialize_keras_object(model), sort_keys=True)
    revived = keras.saving.deserialize_keras_object(json.loads(serialized))
    assert json.dumps(revived.get_config(), sort_keys=True) == config
    # Eager call, compiled predict, a tf.data pipeline.
    images = image_batch()
    randomize_weights(model, scale=0.1)
    eager = numpy(model(images))
    assert eager.shape == (4, TINY["classes"])
    np.testing.assert_allclose(model.predict(images, verbose=0), eager, atol=1e-6)
    import tensorflow as tf

    pipeline = tf.data.Dataset.from_tensor_slices(images).batch(2)
    np.testing.assert_allclose(model.predict(pipeline, verbose=0), eager, atol=1e-6)
    # The default name is the class's.
    assert re.search("vision_transformer", model.name)


@pytest.mark.parametrize("policy", ["mixed_float16", "mixed_bfloat16", "bfloat16"])
def test_a_precision_policy_given_at_construction_reaches_every_sublayer(policy):
    policy = keras.mixed_precision.Policy(policy)
    model = keras_vit.ViT(**TINY, dtype=policy)
    images = image_batch()
    head_dtype = policy.variable_dtype  # (the module's docstring says why)
    assert keras.backend.standardize_dtype(model(images).dtype) == head_dtype
    assert model.compute_output_spec(keras.KerasTensor(images.shape)).dtype == head_dtype
    for weight in model.weights:
        assert weight.dtype == policy.variable_dtype, weight.path
    for layer in model._flatten_layers():
        if isinstance(layer, keras.layers.InputLayer):
            continue
        compute_dtype = head_dtype if layer.name == "head" else policy.compute_dtype
        assert (layer.compute_dtype, layer.variable_dtype) == (
            compute_dtype,
            policy.variable_dtype,
        ), layer.path


def quantizable(model):
    return [
        layer
        for layer in model._flatten_layers()
        if isinstance(layer, (keras.layers.Dense, keras.layers.EinsumDense))
    ]


@pytest.mark.parametrize("mode", ["int8", "float8", "int4"])
def test_a_dtype_policy_map_given_at_construction_quantizes_those_layers(mode, tmp_path):
    instance = keras_vit.ViT(**TINY)
    policy_map = keras.dtype_policies.DTypePolicyMap("float32")
    for layer in quantizable(instance):
        policy_map[layer.path] = keras.dtype_policies.get(f"{mode}_from_float32")
    assert len(policy_map) == 4 * TINY["num_layers"] + 1  # every projection and the head
    model = keras_vit.ViT(**LOGITS, dtype=policy_map)
    for layer in quantizable(model):
        assert layer.quantization_mode == mode, layer.path
    config = model.get_config()
    assert keras_vit.VisionTransformer.from_config(config).get_config() == config
    # Built from the map of a float model quantized after building (Keras'
    # `quantize("int4")` is grouped, "int4/128"), with that model's values, it
    # computes that model's outputs, within the mode's error of the float ones.
    reference = randomize_weights(keras_vit.ViT(**LOGITS), scale=0.1)
    quantized = keras_vit.VisionTransformer.from_config(reference.get_config())
    quantized.set_weights(reference.get_weights())
    quantized.quantize(mode)
    config = quantized.get_config()
    assert isinstance(config["dtype"], dict)  # (a DTypePolicyMap, serialized)
    revived = keras_vit.VisionTransformer.from_config(config)
    values = {variable.path: variable for variable in quantized.weights}
    assert {variable.path for variable in revived.weights} == set(values)
    for variable in revived.weights:
        variable.assign(values[variable.path])
    images = image_batch()
    np.testing.assert_array_equal(numpy(revived(images)), numpy(quantized(images)))
    # (Each layer holds its own policy: Keras' save reads it there.)
    revived.save(tmp_path / "revived.keras")
    reloaded = keras.saving.load_model(tmp_path / "revived.keras")
    np.testing.assert_array_equal(numpy(reloaded(images)), numpy(quantized(images)))
    low, high = ERROR_BOUNDS[mode]
    assert low < quantization_error(revived, reference, images) < high


def quantization_error(model, reference, images):
    """The largest difference from the float model's logits, as a share of their range."""
    expected = numpy(reference(images))
    return np.abs(numpy(model(images)) - expected).max() / np.abs(expected).max()


# A bound on each mode's error on a tiny random model (measured, the same on
# every backend: int8 1.1%, float8 5.2%, int4 20% of the logits' range; with
# other seeds 0.5%, 2%, 2-7%) and proof that it quantized at all.
ERROR_BOUNDS = {"int8": (1e-4, 0.03), "float8": (1e-4, 0.1), "int4": (1e-3, 0.4)}


@pytest.mark.parametrize("mode", ["int8", "float8", "int4"])
def test_quantize_right_after_building_reaches_every_projection_and_saves(mode, tmp_path):
    reference = randomize_weights(keras_vit.ViT(**LOGITS), scale=0.1)
    model = keras_vit.ViT(**LOGITS)
    model.set_weights(reference.get_weights())
    model.quantize(mode)
    quantized = {layer.path for layer in model._flatten_layers() if layer.quantization_mode}
    expected = {
        f"encoderblock_{block}/{'attention/' if name in ('qkv', 'out') else ''}{name}"
        for block in range(TINY["num_layers"])
        for name in PROJECTIONS
    } | {"head"}
    assert quantized == expected
    images = image_batch()
    low, high = ERROR_BOUNDS[mode]
    assert low < quantization_error(model, reference, images) < high
    model.save(tmp_path / "quantized.keras")
    loaded = keras.saving.load_model(tmp_path / "quantized.keras")
    assert isinstance(loaded, keras_vit.VisionTransformer)
    np.testing.assert_array_equal(numpy(loaded(images)), numpy(model(images)))
    assert {layer.path for layer in loaded._flatten_layers() if layer.quantization_mode} == (
        expected
    )
    # Read as a checkpoint's weights, a quantized file is refused, naming its mode
    # and what to start from instead.
    with pytest.raises(ValueError, match=f"quantized with Keras' `quantize` \\({mode}"):
        read_keras_weights(tmp_path / "quantized.keras")


def test_a_model_loaded_from_a_checkpoint_quantizes(tmp_path):
    reference = randomize_weights(keras_vit.ViT(**LOGITS), scale=0.1)
    reference.save(tmp_path / "float.keras")
    model = keras_vit.ViT(**LOGITS, weights=str(tmp_path / "float.keras"))
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        model.quantize("int8")
    # (Keras warns of each layer without weights; the model's quantize says nothing.)
    assert not [w for w in caught if "quantize" in str(w.message)], caught
    images = image_batch()
    assert 1e-4 < quantization_error(model, reference, images) < ERROR_BOUNDS["int8"][1]
    model.save(tmp_path / "int8.keras")
    loaded = keras.saving.load_model(tmp_path / "int8.keras")
    np.testing.assert_array_equal(numpy(loaded(images)), numpy(model(images)))


# Layers whose projections were once variables of their own: their
# sublayers' variables in the order the layer held them (kernels, then biases).
EARLIER_LAYOUTS = {
    "attention": [("qkv", "0"), ("out", "0"), ("qkv", "1"), ("out", "1")],
    "map_head": [
        *[(projection, "0") for projection in ("query", "key_value", "out")],
        *[(projection, "1") for projection in ("query", "key_value", "out")],
    ],
}


def earlier_layout(path):
    """Rewrites a `.keras` file as keras_vit wrote it before attention's projections were layers.

    Each attention layer then held four variables of its own: the qkv
    kernel, the out kernel, the qkv bias, the out bias; a MAP head seven:
    its probe, then the query, key-value and out kernels, then their biases.
    """
    import h5py

    with zipfile.ZipFile(path) as archive:
        entries = {name: archive.read(name) for name in archive.namelist()}
    buffer = io.BytesIO(entries["model.weights.h5"])
    with h5py.File(buffer, "r+") as weights:
        groups = []

        def find(name, item):
            if isinstance(item, h5py.Group) and "vars" in item:
                layer = item["vars"].attrs.get("name")
                if layer in EARLIER_LAYOUTS:
                    groups.append((name, layer))

        weights.visititems(find)
        for name, layer in groups:
            group = weights[name]
            first = len(group["vars"])  # the MAP head's probe stays variable 0
            for index, (projection, key) in enumerate(EARLIER_LAYOUTS[layer]):
                group["vars"][str(first + index)] = np.asarray(group[projection]["vars"][key])
            for projection in {projection for projection, _ in EARLIER_LAYOUTS[layer]}:
                del group[projection]
    entries["model.weights.h5"] = buffer.getvalue()
    with zipfile.ZipFile(path, "w") as archive:
        for name, data in entries.items():
            archive.writestr(name, data)


@pytest.mark.parametrize("pooling", ["token", "map"])
def test_files_of_the_earlier_attention_layout_load_every_way(tmp_path, pooling):
    architecture = {**LOGITS, "pooling": pooling}
    if pooling == "map":
        architecture["class_token"] = False
    model = randomize_weights(keras_vit.ViT(**architecture))
    path = str(tmp_path / "earlier.keras")
    model.save(path)
    earlier_layout(path)
    images = image_batch()
    expected = numpy(model(images))
    loaded = keras.saving.load_model(path)
    np.testing.assert_allclose(numpy(loaded(images)), expected, atol=1e-6)
    from_file = keras_vit.ViT(**architecture, weights=path)
    np.testing.assert_allclose(numpy(from_file(images)), expected, atol=1e-6)
    tensors = read_keras_weights(path)
    assert sorted(tensors) == sorted(weight.path for weight in model.weights)


@pytest.mark.parametrize(
    "scope, recomputed",
    [
        (dict(mode="full"), [True, True]),
        (dict(mode="list_of_layers", layer_names=["encoderblock_1"]), [False, True]),
        # A block's output is 17 tokens x 32 = 544 values (the batch counted once).
        (dict(mode="larger_than", output_size_threshold=500), [True, True]),
        (dict(mode="larger_than", output_size_threshold=600), [False, False]),
    ],
)
def test_a_remat_scope_makes_its_blocks_recompute_and_trains_to_the_same_weights(scope, recomputed):
    plain = randomize_weights(keras_vit.ViT(**TINY), scale=0.05)
    with keras.RematScope(**scope):
        model = keras_vit.ViT(**TINY)
    model.set_weights(plain.get_weights())
    blocks = [model.get_layer(f"encoderblock_{index}") for index in range(TINY["num_layers"])]
    assert [block.remat for block in blocks] == recomputed
    images, labels = image_batch(8), np.arange(8) % TINY["classes"]
    for each in (plain, model):
        each.compile(optimizer=keras.optimizers.SGD(0.1), loss="sparse_categorical_crossentropy")
        each.fit(images, labels, batch_size=4, epochs=1, shuffle=False, verbose=0)
    for trained, expected in zip(model.get_weights(), plain.get_weights()):
        np.testing.assert_allclose(trained, expected, atol=1e-5)


# Keras' own exports, where Keras offers them on this backend: on PyTorch a
# functional model's `tf_saved_model` export fails inside Keras (a structure
# mismatch in torch.export, a plain `keras.Model` too) and LiteRT needs the
# `litert-torch` package; on JAX, LiteRT needs TensorFlow's backend and ONNX
# the `jax2onnx` package. (keras_vit.export's own exports run on every backend.)
KERAS_EXPORTS = {
    "tensorflow": ("tf_saved_model", "litert", "onnx"),
    "jax": ("tf_saved_model",),
    "torch": ("onnx",),
}


@pytest.mark.slow
@pytest.mark.parametrize("export_format", ["tf_saved_model", "litert", "onnx"])
def test_keras_own_export_formats_compute_the_model(export_format, tmp_path):
    if export_format not in KERAS_EXPORTS[BACKEND]:
        pytest.skip(f"Keras offers no {export_format} export of a functional model on {BACKEND}")
    model = randomize_weights(keras_vit.ViT(**LOGITS), scale=0.1)
    images = image_batch()
    expected = numpy(model(images))  # (ONNX exports a model that has been called)
    name = {"tf_saved_model": "saved_model", "litert": "vit.tflite", "onnx": "vit.onnx"}
    path = str(tmp_path / name[export_format])
    options = {}
    if BACKEND == "torch":
        # A batch of any size sends Keras to PyTorch's TorchScript exporter,
        # whose trace fails on Keras' own `ops.layer_norm` (its shape becomes
        # a traced tensor); a fixed one to the TorchDynamo exporter.
        options["input_signature"] = [keras.InputSpec(shape=images.shape, dtype="float32")]
    model.export(path, format=export_format, verbose=False, **options)
    if export_format == "tf_saved_model":
        import tensorflow as tf

        loaded = tf.saved_model.load(path)  # (held: its function needs its variables)
        outputs = loaded.serve(images).numpy()
    elif export_format == "litert":
        from ai_edge_litert.interpreter import Interpreter

        interpreter = Interpreter(model_path=path)
        interpreter.resize_tensor_input(interpreter.get_input_details()[0]["index"], images.shape)
        interpreter.allocate_tensors()
        interpreter.set_tensor(interpreter.get_input_details()[0]["index"], images)
        interpreter.invoke()
        outputs = interpreter.get_tensor(interpreter.get_output_details()[0]["index"])
    else:
        import onnxruntime

        session = onnxruntime.InferenceSession(path, providers=["CPUExecutionProvider"])
        outputs = session.run(None, {session.get_inputs()[0].name: images})[0]
    np.testing.assert_allclose(outputs, expected, atol=1e-4)
