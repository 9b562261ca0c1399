"""Export: TF Serving SavedModels and LiteRT files, checked against the Keras model."""

import json
import os
import re

import keras
import numpy as np
import pytest
import tensorflow as tf

import keras_vit
from keras_vit.data.fashion_mnist import CLASS_NAMES, load_fashion_mnist
from keras_vit.export import tf_only
from tests.conftest import (
    BACKEND,
    TINY,
    artifact_maker,
    on_one_backend,
    randomize_weights,
    run_python,
    shared_artifact,
)

# Exports of a model trained on Fashion-MNIST, checked in their runtimes.
pytestmark = pytest.mark.slow

# Quantisation agreement only means something for a model with real decision
# margins: this one reaches about 82% on Fashion-MNIST in its short training.
SMALL = dict(
    patch_size=4,
    hidden_dim=64,
    num_layers=3,
    num_heads=4,
    mlp_dim=128,
    input_shape=(28, 28, 1),
    classes=10,
    classifier_activation=None,
)

TINY_EXPORT = dict(
    patch_size=4,
    hidden_dim=16,
    num_layers=1,
    num_heads=2,
    mlp_dim=32,
    input_shape=(8, 8, 3),
    classes=3,
)


def fashion_training_images():
    images, labels = load_fashion_mnist("train")
    return images[:20000].astype("float32"), labels[:20000]


@pytest.fixture(scope="module")
def fashion():
    test_images, _ = load_fashion_mnist("test")
    return (*fashion_training_images(), test_images[:1000].astype("float32"))


TRAIN_SMALL = """
import keras, keras_vit
from tests.export.test_export import SMALL, fashion_training_images
images, labels = fashion_training_images()
keras.utils.set_random_seed(0)
model = keras_vit.ViT(**SMALL, name="fashion_vit", seed=0)
model.compile(optimizer=keras.optimizers.Adam(2e-3),
              loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
model.fit(images, labels, batch_size=128, epochs=3, verbose=0)
model.save_weights({path!r})
"""


@artifact_maker("export_small_vit", __file__)
def train_small(out):
    run_python(
        TRAIN_SMALL.format(path=os.path.join(out, "model.weights.h5")),
        backend="tensorflow",
        timeout=900,
    )


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    """A small ViT trained for a minute: confident enough to compare top-1.

    Trained once on TensorFlow for every backend's suite (`shared_artifact`);
    each suite builds the model on its own backend and loads the weights.
    """
    folder = shared_artifact("export_small_vit", train_small, tmp_path_factory)
    model = keras_vit.ViT(**SMALL, name="fashion_vit")
    model.load_weights(os.path.join(folder, "model.weights.h5"))
    return model


def encoded_images(test_images):
    """PNG and JPEG bytes of other sizes and channel counts than the model's input."""
    grey = test_images[:3].astype("uint8")  # (3, 28, 28, 1)
    larger = tf.cast(tf.image.resize(grey[2], (40, 36)), tf.uint8)
    return [
        tf.io.encode_png(grey[0]).numpy(),
        tf.io.encode_png(tf.image.grayscale_to_rgb(tf.constant(grey[1]))).numpy(),
        tf.io.encode_jpeg(larger).numpy(),
    ]


def test_saved_model_serves_floats_and_bytes_from_a_tensorflow_only_process(
    trained, fashion, tmp_path
):
    _, _, test_images = fashion
    path = keras_vit.export.saved_model(
        trained, tmp_path / "serving" / "vit", class_names=CLASS_NAMES, top_k=3
    )
    assert path == str(tmp_path / "serving" / "vit" / "1")
    assert os.path.isfile(os.path.join(path, "saved_model.pb"))
    report = keras_vit.export.check_saved_model(
        path, trained, test_images[:100], encoded_images(test_images)
    )
    assert report["errors"] == {} and report["keras_vit_imported"] is False
    for signature in ("serving_default", "serving_bytes"):
        assert report[signature]["max_abs_error"] < 1e-5, report
        assert report[signature]["top1_agreement"] == 1.0
    assert "image_bytes: string (-1)" in report["signatures"]
    assert "images: float32 (-1, 28, 28, 1)" in report["signatures"]
    assert "top_k_names: string (-1, 3)" in report["signatures"]
    metadata = json.load(open(os.path.join(path, "assets.extra", "keras_vit.json")))
    assert metadata["image_size"] == [28, 28] and metadata["channels"] == 1
    assert metadata["class_names"] == list(CLASS_NAMES)
    # torch has no TensorFlow path: its models are rebuilt on TensorFlow.
    assert metadata["exported_from_backend"] == (BACKEND if BACKEND != "torch" else "tensorflow")


def test_predict_requests_round_trip_and_bad_bytes_are_refused(trained, fashion, tmp_path):
    from tensorflow_serving.apis import predict_pb2, prediction_log_pb2

    _, _, test_images = fashion
    path = keras_vit.export.saved_model(
        trained, tmp_path / "vit", version=7, class_names=CLASS_NAMES
    )
    loaded = tf.saved_model.load(path)
    request = predict_pb2.PredictRequest()
    request.model_spec.signature_name = "serving_bytes"
    request.inputs["image_bytes"].CopyFrom(tf.make_tensor_proto(encoded_images(test_images)))
    request.output_filter.extend(["top_k_names", "probabilities"])
    response = tf_only.predict(loaded, request)
    assert set(response.outputs) == {"top_k_names", "probabilities"}
    names = tf.make_ndarray(response.outputs["top_k_names"])
    probabilities = tf.make_ndarray(response.outputs["probabilities"])
    assert names.shape == (3, 5) and probabilities.shape == (3, 10)
    np.testing.assert_allclose(probabilities.sum(-1), 1.0, atol=1e-5)
    best = [CLASS_NAMES[i].encode() for i in probabilities.argmax(-1)]
    assert list(names[:, 0]) == best

    # Corrupt bytes: an error for that request; the process keeps serving.
    request.inputs["image_bytes"].CopyFrom(tf.make_tensor_proto([b"\x89PNG not really"]))
    with pytest.raises(tf.errors.InvalidArgumentError, match="image"):
        tf_only.predict(loaded, request)
    assert (
        tf_only.predict(
            loaded,
            predict_pb2.PredictRequest(inputs={"images": tf.make_tensor_proto(test_images[:2])}),
        )
        .outputs["top_k_classes"]
        .tensor_shape.dim[0]
        .size
        == 2
    )

    # TF Serving's warm-up log replays against the export.
    warmup = os.path.join(path, "assets.extra", "tf_serving_warmup_requests")
    replayed = 0
    for record in tf.data.TFRecordDataset(warmup):
        log = prediction_log_pb2.PredictionLog.FromString(record.numpy())
        assert tf_only.predict(loaded, log.predict_log.request).outputs["probabilities"]
        replayed += 1
    assert replayed == 2


def test_an_existing_version_is_never_overwritten_by_accident(trained, tmp_path):
    version = tmp_path / "vit" / "1"
    os.makedirs(version)
    (version / "keep.txt").write_text("an earlier export")
    with pytest.raises(ValueError, match="exists and is not empty.*overwrite=True"):
        keras_vit.export.saved_model(trained, version)
    assert (version / "keep.txt").read_text() == "an earlier export"
    # The model directory gets the next version; overwrite replaces version 1.
    # The next version is chosen before a backend's own export path; on torch
    # only `overwrite`, handed to the TensorFlow child, is that path's own.
    expected = ["1"]
    if BACKEND != "torch":
        assert keras_vit.export.saved_model(trained, tmp_path / "vit", warmup=False) == str(
            tmp_path / "vit" / "2"
        )
        expected.append("2")
    keras_vit.export.saved_model(trained, version, overwrite=True, warmup=False)
    assert sorted(os.listdir(tmp_path / "vit")) == expected
    assert not (version / "keep.txt").exists() and (version / "saved_model.pb").exists()


@pytest.mark.parametrize(
    "arguments, error, message",
    [
        (dict(class_names=["a", "b"]), ValueError, "2 names for a model with 10 classes"),
        (dict(class_names="abc"), TypeError, "class_names='abc'"),
        (dict(top_k=0), ValueError, "top_k=0"),
        (dict(version=0), ValueError, "version=0"),
        (dict(crop_fraction=1.5), ValueError, "crop_fraction=1.5"),
    ],
)
def test_saved_model_rejects_bad_arguments_before_any_work(
    trained, tmp_path, arguments, error, message
):
    with pytest.raises(error, match=message):
        keras_vit.export.saved_model(trained, tmp_path / "vit", **arguments)
    assert not (tmp_path / "vit").exists()


# Top-1 agreement with Keras per quantisation mode (float32: max abs error
# <= 1e-4 instead). "int8_full" (every op int8, for integer-only chips) has
# no target of its own; 0.9 only guards against a broken conversion.
# "int16x8" (integer-only, int16 activations) is held to int8's bar.
TFLITE_BOUNDS = {
    None: None,
    "float16": 0.995,
    "dynamic": 0.99,
    "int8": 0.98,
    "int8_full": 0.9,
    "int16x8": 0.98,
}


@pytest.mark.parametrize("quantization", list(TFLITE_BOUNDS))
def test_tflite_modes_run_in_litert_and_agree_with_keras(trained, fashion, tmp_path, quantization):
    if BACKEND != "tensorflow" and quantization not in (None, "int8"):
        # Off TensorFlow the model goes to a TensorFlow child process
        # (`rebuild_on_tensorflow`), float32 and int8 (calibration images
        # passed along) test that path; the conversion of each mode in the
        # child is the TensorFlow suite's.
        pytest.skip("converted in the same TensorFlow child as float32 and int8")
    if BACKEND == "jax" and quantization is not None:
        pytest.skip("JAX's model takes torch's way to the child: torch's int8 file shows it")
    train_images, _, test_images = fashion
    calibration = keras_vit.data.from_arrays(
        train_images[:512, ..., 0].astype("uint8"),
        np.zeros(512, int),
        image_size=28,
        channels=1,
        batch_size=64,
    ).data
    path = str(tmp_path / "vit.tflite")
    result = keras_vit.export.tflite(
        trained,
        path,
        quantization=quantization,
        representative_data=calibration,
        class_names=CLASS_NAMES,
    )
    assert not any(op.startswith("Flex") for op in result["op_counts"]), result
    report = keras_vit.export.check_tflite(path, trained, test_images, latency_runs=5)
    if quantization is None:
        assert report["max_abs_error"] <= 1e-4, report
        assert result["op_counts"]["GELU"] == SMALL["num_layers"]
    else:
        assert report["top1_agreement"] >= TFLITE_BOUNDS[quantization], report
    if quantization == "int16x8":
        # LayerNorm's variance without SQUARED_DIFFERENCE, which has no int16 kernel.
        assert "SQUARED_DIFFERENCE" not in result["op_counts"], result
    elif quantization != "int8_full":
        # XNNPACK takes the whole graph (what makes it fast): no op splits it.
        assert report["xnnpack_partitions"] == 1, report
    metadata = json.load(open(tmp_path / "vit.tflite.json"))
    assert metadata["quantization"] == (quantization or "none")
    assert metadata["rotated"] == (quantization in ("int8", "int8_full"))
    assert metadata["output"] == "logits" and metadata["class_names"] == list(CLASS_NAMES)


def test_tflite_rejects_bad_arguments(trained, tmp_path):
    path = tmp_path / "vit.tflite"
    with pytest.raises(ValueError, match="quantization='int4'"):
        keras_vit.export.tflite(trained, path, quantization="int4")
    with pytest.raises(ValueError, match="needs `representative_data`"):
        keras_vit.export.tflite(trained, path, quantization="int8")
    with pytest.raises(ValueError, match=r"must end in '.tflite'"):
        keras_vit.export.tflite(trained, tmp_path / "vit.bin")
    path.write_bytes(b"earlier")
    with pytest.raises(ValueError, match="exists; pass `overwrite=True`"):
        keras_vit.export.tflite(trained, path)
    assert path.read_bytes() == b"earlier"
    with pytest.raises(ValueError, match=r"images must be \(28, 28, 1\)"):
        keras_vit.export.tflite(
            trained,
            tmp_path / "q.tflite",
            quantization="int8",
            representative_data=np.zeros((4, 16, 16, 3)),
        )


@pytest.mark.backend_independent  # which files an export writes (TensorFlow's exports)
def test_a_tflite_and_an_onnx_file_in_one_folder_keep_their_own_metadata(tmp_path):
    from keras_vit.export import TFLiteModel

    model = keras_vit.ViT(**TINY_EXPORT, name="both")
    tflite = keras_vit.export.tflite(model, tmp_path / "model.tflite")
    onnx = keras_vit.export.onnx(model, tmp_path / "model.onnx")
    assert tflite["metadata_path"] != onnx["metadata_path"]
    assert json.load(open(tmp_path / "model.tflite.json"))["format"] == "keras_vit.tflite/1"
    assert json.load(open(tmp_path / "model.onnx.json"))["format"] == "keras_vit.onnx/1"
    assert TFLiteModel(tmp_path / "model.tflite").metadata["format"] == "keras_vit.tflite/1"
    # Nothing is replaced unasked: the file, or a metadata file left on its own.
    os.remove(tmp_path / "model.onnx")
    with pytest.raises(ValueError, match=r"model\.onnx\.json' exists; pass `overwrite=True`"):
        keras_vit.export.onnx(model, tmp_path / "model.onnx")
    # An earlier version's `model.json` still describes its `.tflite`.
    os.rename(tmp_path / "model.tflite.json", tmp_path / "model.json")
    assert TFLiteModel(tmp_path / "model.tflite").metadata["format"] == "keras_vit.tflite/1"


@pytest.fixture(scope="module")
def any_size(trained):
    """The trained model rebuilt for images of any size (its table laid out for 28x28)."""
    model = keras_vit.ViT(
        **{**SMALL, "input_shape": (None, None, 1)}, base_image_size=28, name="fashion_vit_any_size"
    )
    model.set_weights(trained.get_weights())
    return model


# Off TensorFlow, a model of any size is rebuilt there for every format
# (jax2tf would need shape polymorphism), as every torch model is.
@on_one_backend("tensorflow", "TensorFlow converts every backend's model")
def test_a_model_of_any_size_serves_every_size_and_converts_at_a_named_one(
    any_size, fashion, tmp_path
):
    _, _, test_images = fashion
    path = keras_vit.export.saved_model(any_size, tmp_path / "vit", warmup=True)
    report = keras_vit.export.check_saved_model(
        path, any_size, test_images[:50], encoded_images(test_images)
    )
    assert report["errors"] == {}, report
    for signature in ("serving_default", "serving_bytes"):
        assert report[signature]["max_abs_error"] < 1e-5, report
    assert "images: float32 (-1, -1, -1, 1)" in report["signatures"]
    metadata = json.load(open(os.path.join(path, "assets.extra", "keras_vit.json")))
    assert metadata["image_size"] == [28, 28] and metadata["any_image_size"] is True
    # Another size through the served graph: the Keras model's numbers.
    loaded = tf.saved_model.load(path)
    larger = tf.image.resize(test_images[:8], (56, 40)).numpy()
    served = loaded.signatures["serving_default"](images=tf.constant(larger))["probabilities"]
    expected = tf.nn.softmax(any_size.predict(larger, verbose=0)).numpy()
    np.testing.assert_allclose(served.numpy(), expected, atol=1e-5)
    with pytest.raises(tf.errors.InvalidArgumentError, match=r"multiples of the patch size"):
        loaded.signatures["serving_default"](images=tf.zeros((1, 30, 28, 1)))
    # LiteRT runs static shapes: a named size, or a message saying how.
    with pytest.raises(ValueError, match=r"name the size.*image_size=\(224, 224\)"):
        keras_vit.export.tflite(any_size, tmp_path / "vit.tflite")
    keras_vit.export.tflite(any_size, tmp_path / "vit.tflite", image_size=(56, 40))
    report = keras_vit.export.check_tflite(
        tmp_path / "vit.tflite", any_size, larger, latency_runs=2
    )
    assert report["max_abs_error"] <= 1e-4, report
    assert json.load(open(tmp_path / "vit.tflite.json"))["image_size"] == [56, 40]


def test_onnx_runs_in_onnx_runtime_without_keras_and_agrees_with_keras(trained, fashion, tmp_path):
    _, _, test_images = fashion
    path = tmp_path / "onnx" / "vit.onnx"
    result = keras_vit.export.onnx(trained, path, class_names=CLASS_NAMES)
    assert result["path"] == str(path) and result["bytes"] == os.path.getsize(path)
    report = keras_vit.export.check_onnx(path, trained, test_images[:256], latency_runs=5)
    assert report["keras_imported"] is False
    assert report["input"] == {"name": "images", "shape": [-1, 28, 28, 1]}  # dynamic batch
    assert report["max_abs_error"] <= 1e-4, report
    assert report["top1_agreement"] == 1.0, report
    assert report["latency_ms"] > 0
    metadata = json.load(open(tmp_path / "onnx" / "vit.onnx.json"))
    assert metadata["output"] == "logits" and metadata["class_names"] == list(CLASS_NAMES)
    assert metadata["image_size"] == [28, 28] and metadata["opset"] >= 13


def test_onnx_rejects_bad_arguments_and_keeps_what_exists(trained, any_size, tmp_path):
    path = tmp_path / "vit.onnx"
    with pytest.raises(ValueError, match=r"must end in '.onnx'"):
        keras_vit.export.onnx(trained, tmp_path / "vit.pb")
    with pytest.raises(ValueError, match="opset=7"):
        keras_vit.export.onnx(trained, path, opset=7)
    with pytest.raises(ValueError, match=r"takes 28x28 images only. Received: image_size=32"):
        keras_vit.export.onnx(trained, path, image_size=32)
    # A model of any size: ONNX Runtime would crop a wrong size silently, so a named size.
    with pytest.raises(ValueError, match=r"name the size.*image_size=\(224, 224\)"):
        keras_vit.export.onnx(any_size, path)
    path.write_bytes(b"earlier")
    with pytest.raises(ValueError, match="exists; pass `overwrite=True`"):
        keras_vit.export.onnx(trained, path)
    assert path.read_bytes() == b"earlier"
    assert sorted(os.listdir(tmp_path)) == ["vit.onnx"]  # nothing half-written beside it


@pytest.mark.skipif(BACKEND != "tensorflow", reason="one full-size conversion is enough")
def test_onnx_of_vit_ti16_agrees_with_keras(tmp_path):
    model = keras_vit.ViTTi16(classes=10, classifier_activation=None)
    head = model.get_layer("head").kernel  # random, not zero: the logits must differ
    head.assign(np.random.default_rng(0).normal(0, 0.05, head.shape).astype("float32"))
    images = np.random.default_rng(1).uniform(0, 255, (16, 224, 224, 3)).astype("float32")
    keras_vit.export.onnx(model, tmp_path / "ti16.onnx")
    report = keras_vit.export.check_onnx(tmp_path / "ti16.onnx", model, images, latency_runs=3)
    assert report["max_abs_error"] <= 1e-4 and report["top1_agreement"] == 1.0, report


@pytest.mark.skipif(
    BACKEND != "tensorflow",
    reason="the graph is written on TensorFlow; "
    "JAX and torch models reach it through a TensorFlow child (tested above)",
)
def test_onnx_of_an_exact_gelu_model_loads_in_onnx_runtime_and_agrees_with_keras(tmp_path):
    # Every pretrained checkpoint (Hugging Face, timm, DINOv2) uses exact GELU.
    import onnx as onnx_format

    architecture = dict(TINY, layer_scale_init=0.1, classifier_activation=None)
    model = randomize_weights(keras_vit.ViT(**architecture, approximate_gelu=False), scale=1.0)
    path = tmp_path / "exact.onnx"
    keras_vit.export.onnx(model, path)
    ops_written = {node.op_type for node in onnx_format.load(path).graph.node}
    assert "Erf" in ops_written and "Erfc" not in ops_written, ops_written
    images = np.random.default_rng(1).uniform(0, 255, (8, 16, 16, 3)).astype("float32")
    report = keras_vit.export.check_onnx(path, model, images, latency_runs=1)
    assert report["max_abs_error"] <= 1e-5, report
    # Agreeing within 1e-5 tells exact from tanh GELU: the same weights differ by more.
    tanh = keras_vit.ViT(**architecture, approximate_gelu=True)
    tanh.set_weights(model.get_weights())
    difference = np.abs(tanh.predict(images, verbose=0) - model.predict(images, verbose=0)).max()
    assert difference > 1e-4, difference


# Every function the builders make, as users bring them (pretrained files use
# exact GELU and LayerScale; DeiT a distillation token; DINOv2 registers; SigLIP
# a MAP head).
ONNX_FUNCTIONS = {
    "exact GELU, LayerScale, register and distillation tokens": dict(
        approximate_gelu=False,
        layer_scale_init=0.1,
        num_register_tokens=2,
        distillation_token=True,
    ),
    "tanh GELU, convolutional stem, MAP head": dict(stem_filters=(8,), patch_size=2, pooling="map"),
    "any size, exported at 16": dict(input_shape=(None, None, 3), base_image_size=16),
}


@on_one_backend("tensorflow", "TensorFlow converts every backend's model")
def test_onnx_of_every_function_runs_in_onnx_runtime_and_agrees_with_keras(tmp_path):
    import onnxruntime

    images = np.random.default_rng(1).uniform(0, 255, (4, 16, 16, 3)).astype("float32")
    for index, (function, options) in enumerate(ONNX_FUNCTIONS.items()):
        model = randomize_weights(
            keras_vit.ViT(**{**TINY, "classifier_activation": None, **options}),
            seed=index,
            scale=0.5,
        )
        for weight in model.weights:  # a BatchNorm's variance stays positive
            if weight.path.endswith("moving_variance"):
                weight.assign(np.abs(keras.ops.convert_to_numpy(weight)) + 0.5)
        path = tmp_path / f"{index}.onnx"
        keras_vit.export.onnx(model, path, image_size=16 if "any size" in function else None)
        session = onnxruntime.InferenceSession(str(path), providers=["CPUExecutionProvider"])
        served = session.run(None, {session.get_inputs()[0].name: images})[0]
        expected = keras.ops.convert_to_numpy(model(images))
        # Images far apart in the outputs: a graph that loses the input shows.
        assert np.ptp(expected, axis=0).max() > 0.1, function
        np.testing.assert_allclose(served, expected, atol=1e-4, rtol=0, err_msg=function)


# torch's and JAX's exports (rebuilt on TensorFlow, or jax2tf's SavedModel) are the tests above.
@on_one_backend("tensorflow", "the command's own work")
def test_export_command_writes_checks_and_predict_reads_tflite(trained, fashion, tmp_path, capsys):
    from keras_vit.cli import main

    _, _, test_images = fashion
    run = tmp_path / "run"
    os.makedirs(run)
    trained.save(run / "model.keras")
    (run / "class_names.json").write_text(json.dumps(list(CLASS_NAMES)))
    model = str(run / "model.keras")

    assert main(["export", model, "--check-images", "32"]) == 0
    printed = capsys.readouterr().out
    assert f"exported saved_model to {run / 'serving' / 'fashion_vit' / '1'}" in printed
    assert "serving_bytes: max abs error" in printed and "top-1 agreement 100.00%" in printed
    # Piped: the command's own lines, no Keras progress line ("2/2 - 2s - 884ms/step").
    assert not re.search(r"^\d+/\d+ - ", printed, re.MULTILINE), printed

    assert (
        main(
            ["export", model, "--format", "tflite", "--quantize", "dynamic", "--check-images", "32"]
        )
        == 0
    )
    printed, warned = capsys.readouterr()
    assert f"exported tflite to {run / 'model_dynamic.tflite'}" in printed
    assert re.search(r"LiteRT: [0-9.]+ MB, max abs error .* ms/image", printed)
    assert not re.search(r"^\d+/\d+ - ", printed, re.MULTILINE), printed
    assert "warning" not in warned  # it keeps the model's answers

    image = tmp_path / "boot.png"
    image.write_bytes(tf.io.encode_png(test_images[0].astype("uint8")).numpy())
    assert main(["predict", str(image), "--model", str(run / "model_dynamic.tflite")]) == 0
    lines = capsys.readouterr().out.splitlines()
    expected = CLASS_NAMES[int(np.argmax(trained.predict(test_images[:1], verbose=0)))]
    assert lines[0] == str(image) and lines[1].split()[0] == expected.split()[0]

    assert main(["export", model, "--format", "onnx", "--check-images", "32"]) == 0
    printed = capsys.readouterr().out
    assert f"exported onnx to {run / 'model.onnx'}" in printed
    assert re.search(
        r"ONNX Runtime: [0-9.]+ MB, max abs error .* top-1 agreement 100.00%", printed
    ), printed

    # Every file the command wrote is evaluated and predicts from the command line, in its
    # own runtime: the float ones give the .keras file's report, the dynamic-range one the
    # accuracy of its own outputs.
    _, labels = load_fashion_mnist("test")
    folder = tmp_path / "labelled"
    for index, pixels in enumerate(test_images[:60]):
        os.makedirs(folder / str(labels[index]), exist_ok=True)
        (folder / str(labels[index]) / f"{index}.png").write_bytes(
            tf.io.encode_png(pixels.astype("uint8")).numpy()
        )
    present = sorted(int(name) for name in os.listdir(folder))
    assert len(present) == 10  # (a class missing would shift the folder's label indices)

    def evaluated(path):
        assert main(["evaluate", "--model", str(path), "--dataset", str(folder)]) == 0
        line = capsys.readouterr().out.strip().splitlines()[-1]
        found = re.search(r"accuracy ([0-9.]+), cross-entropy ([0-9.]+) \(60 images\)", line)
        assert found, line
        return float(found[1]), float(found[2])

    keras_accuracy, keras_cross_entropy = evaluated(model)
    assert 0.5 < keras_accuracy < 1.0 and keras_cross_entropy > 0.1  # a model that errs
    for served in (run / "serving" / "fashion_vit", run / "model.onnx"):
        accuracy, cross_entropy = evaluated(served)
        assert accuracy == keras_accuracy, served
        assert abs(cross_entropy - keras_cross_entropy) <= 2e-4, served
        assert main(["predict", str(image), "--model", str(served)]) == 0
        assert capsys.readouterr().out.splitlines()[1].split()[0] == expected.split()[0], served
    dynamic = run / "model_dynamic.tflite"
    scores = keras_vit.export.TFLiteModel(dynamic)(test_images[:60])
    # (The report rounds to 4 decimals: 46 of 60 reads 0.7667.)
    assert evaluated(dynamic)[0] == round(float(np.mean(scores.argmax(-1) == labels[:60])), 4)

    for arguments, message in (
        (["--quantize", "int8"], "--quantize applies to --format tflite only"),
        (["--format", "onnx", "--quantize", "dynamic"], "--quantize applies to --format tflite"),
        (["--format", "tflite", "--quantize", "dynamic"], "exists; pass --overwrite"),
    ):
        with pytest.raises(SystemExit, match=message):
            main(["export", model, "--check-images", "0"] + arguments)


@pytest.mark.slow
def test_an_export_that_loses_the_models_answers_is_kept_and_flagged(tmp_path, capsys):
    from keras_vit.cli import main
    from tests.training.test_train_command import write_dataset

    # One channel of the MLP's hidden layer a thousand times the others, unused
    # by the layer after it: the float model does not see it, an int8 file's
    # single activation scale for the tensor leaves the other channels nothing
    # (as real checkpoints' outlier channels do to naive int8; the rotated
    # residual stream of the int8 modes does not reach inside the MLP).
    # In every block, its MLP scaled up to decide the answers.
    model = randomize_weights(keras_vit.ViT(**TINY, classifier_activation=None))
    for index in range(TINY["num_layers"]):
        block = model.get_layer(f"encoderblock_{index}")
        kernel, bias = block.mlp_dense_1.get_weights()
        bias[0] = 1000.0
        block.mlp_dense_1.set_weights([kernel, bias])
        kernel, bias = block.mlp_dense_2.get_weights()
        kernel *= 10.0
        kernel[0] = 0.0
        block.mlp_dense_2.set_weights([kernel, bias])
    os.makedirs(tmp_path / "run")
    model.save(tmp_path / "run" / "model.keras")
    data = write_dataset(tmp_path / "data", per_class=8)

    assert (
        main(
            [
                "export",
                str(tmp_path / "run" / "model.keras"),
                "--format",
                "tflite",
                "--quantize",
                "int8",
                "--dataset",
                data,
                "--calibration-images",
                "16",
                "--check-images",
                "16",
            ]
        )
        == 0
    )
    printed, warned = capsys.readouterr()
    agreement = float(re.search(r"top-1 agreement ([0-9.]+)%", printed)[1])
    assert agreement < 99, printed
    path = tmp_path / "run" / "model_int8.tflite"
    assert warned.strip() == (
        f"keras-vit export: warning: {path} gives the Keras model's top-1 class for "
        f"{agreement:.2f}% of 16 images, below 99%: measure its accuracy before shipping it "
        "(keras-vit evaluate --model FILE)"
    )
    assert path.is_file()  # kept: the user's to judge


def test_patch_dropout_leaves_the_exported_graph_unchanged(tmp_path):
    if BACKEND != "tensorflow":
        pytest.skip(
            "off TensorFlow both models are rebuilt on TensorFlow: the TensorFlow suite's graphs"
        )
    # Training drops tokens; inference, and so every export, sees them all:
    # the same ops as the model without the layer, and the same outputs.
    tiny = dict(SMALL, hidden_dim=16, num_layers=1, num_heads=2, mlp_dim=32, seed=0)
    model = keras_vit.ViT(**tiny, patch_dropout_rate=0.5)
    plain = keras_vit.ViT(**tiny)
    plain.set_weights(model.get_weights())
    counts = [
        keras_vit.export.tflite(m, str(tmp_path / f"{m.name}_{i}.tflite"))["op_counts"]
        for i, m in enumerate((model, plain))
    ]
    assert counts[0] == counts[1], counts
    images = np.random.default_rng(0).uniform(0, 255, (8, 28, 28, 1)).astype("float32")
    report = keras_vit.export.check_tflite(
        str(tmp_path / f"{model.name}_0.tflite"), model, images, latency_runs=1
    )
    assert report["max_abs_error"] <= 1e-4, report
