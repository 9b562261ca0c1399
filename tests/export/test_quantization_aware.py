"""Quantization-aware training for LiteRT: the fake-quantized model, its training, its export."""

import json
import warnings

import keras
import numpy as np
import pytest

import keras_vit
from keras_vit import _compat
from keras_vit.export import TFLiteModel
from keras_vit.export.litert_runtime import graph_ops
from keras_vit.layers import fake_quantization
from keras_vit.models import float_copy, qat_mode, quantization_aware_copy
from tests.conftest import BACKEND

TINY = dict(
    patch_size=4,
    hidden_dim=16,
    num_layers=2,
    num_heads=2,
    mlp_dim=32,
    input_shape=(8, 8, 3),
    classes=4,
    classifier_activation=None,
)


def float_model(layer_scale_init=0.1, seed=0, **layout):
    """A tiny float ViT with random weights of a trained model's spread (LayerScale, norms)."""
    model = keras_vit.ViT(**TINY, layer_scale_init=layer_scale_init, **layout)
    rng = np.random.default_rng(seed)
    for variable in model.weights:
        value = rng.normal(size=variable.shape) * (0.4 if len(variable.shape) > 1 else 0.1)
        if variable.path.endswith(("norm/gamma", "scale/gamma")):
            value += 1.0
        variable.assign(value.astype("float32"))
    return model


def images(count, seed=1):
    return np.random.default_rng(seed).uniform(0, 255, (count, 8, 8, 3)).astype("float32")


def outputs(model, x):
    if BACKEND == "jax":
        # (One compiled call: JAX's eager calls compile each op of each shape, 4x slower.)
        return model.predict(x, batch_size=len(x), verbose=0)
    return keras.ops.convert_to_numpy(model(x, training=False))


def test_fake_quantize_is_tensorflows_fake_quant_op():
    import tensorflow as tf

    x = np.random.default_rng(0).normal(size=(4000,)).astype("float32") * 3
    for low, high in ((-1.0, 3.0), (-2.7, 0.4), (-5e-3, 7.1)):
        ours = keras.ops.convert_to_numpy(fake_quantization.fake_quantize(x, low, high))
        theirs = tf.quantization.fake_quant_with_min_max_vars(x, low, high, num_bits=8).numpy()
        np.testing.assert_allclose(ours, theirs, atol=1e-6)
        assert len(np.unique(ours)) <= 256


def test_gradients_pass_straight_through_inside_the_range_and_stop_outside():
    x = keras.ops.convert_to_tensor([-3.0, -0.5, 0.2, 0.9, 4.0])
    gradient = np.asarray(
        keras.ops.convert_to_numpy(
            _gradient(lambda v: keras.ops.sum(fake_quantization.fake_quantize(v, -1.0, 1.0)), x)
        )
    )
    np.testing.assert_array_equal(gradient, [0.0, 1.0, 1.0, 1.0, 0.0])


def _gradient(function, x):
    backend = keras.backend.backend()
    if backend == "tensorflow":
        import tensorflow as tf

        with tf.GradientTape() as tape:
            tape.watch(x)
            y = function(x)
        return tape.gradient(y, x)
    if backend == "jax":
        import jax

        return jax.grad(function)(x)

    x = x.clone().requires_grad_(True)
    function(x).backward()
    return x.grad


def test_a_quantization_aware_copy_is_the_float_function_with_rounding_added():
    model = float_model()
    x = images(40)
    expected = outputs(model, x)
    points = {}
    for mode in fake_quantization.QAT_MODES:
        copy = quantization_aware_copy(model, mode, x)
        assert qat_mode(copy) == mode and qat_mode(model) is None
        # Folded: no LayerScale, norms without scale and offset.
        assert not any("scale/gamma" in v.path or "norm/gamma" in v.path for v in copy.weights)
        np.testing.assert_allclose(outputs(float_copy(copy), x), expected, atol=2e-4)
        error = np.abs(outputs(copy, x) - expected).max()
        assert 1e-3 < error < 0.5 * np.abs(expected).max(), (mode, error)
        points[mode] = [v for v in copy.weights if v.path.endswith("low")]
    # "int8_full" rounds more points than "int8".
    assert len(points["int8_full"]) > len(points["int8"]) > 0


def test_training_tracks_the_ranges_and_a_saved_model_resumes_them(trained_qat, tmp_path):
    model, x = trained_qat["int8_full"], images(64)
    calibrated = trained_qat.calibrated["int8_full"]
    tracked = {v.path: np.asarray(v) for v in model.weights if v.path.endswith("high")}
    moved = [path for path in calibrated if not np.isclose(calibrated[path], tracked[path])]
    assert len(moved) > len(calibrated) // 2
    # The softmax's range is LiteRT's fixed one.
    probabilities = [path for path in tracked if "probabilities" in path]
    assert probabilities and all(tracked[path] == 255 / 256 for path in probabilities)
    model.save(tmp_path / "qat.keras")
    loaded = keras.saving.load_model(tmp_path / "qat.keras")
    assert qat_mode(loaded) == "int8_full"
    np.testing.assert_array_equal(outputs(loaded, x), outputs(model, x))
    for saved, restored in zip(model.weights, loaded.weights):
        np.testing.assert_array_equal(np.asarray(saved), np.asarray(restored))


def test_a_fresh_models_int8_full_copy_trains_with_finite_ranges_and_outputs():
    # A fresh model's class token is zero: after the position embedding its
    # row is near constant, and at int8_full its variance rounds to level 0
    # of a range that spread-out rows set (once all-NaN rows and ranges).
    keras.utils.set_random_seed(0)
    model = keras_vit.ViT(**{**TINY, "num_layers": 1})
    x, y = images(32), np.random.default_rng(2).integers(0, 4, 32)
    copy = quantization_aware_copy(model, "int8_full", x)
    in_training = keras.ops.convert_to_numpy(copy(x, training=True))
    assert np.isfinite(in_training).all()
    copy.compile(
        optimizer=keras.optimizers.Adam(1e-3),
        loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
    )
    history = copy.fit(x, y, batch_size=32, epochs=1, verbose=0).history
    assert np.isfinite(history["loss"]).all(), history
    bad = [v.path for v in copy.weights if not np.isfinite(keras.ops.convert_to_numpy(v)).all()]
    assert not bad, bad
    assert np.isfinite(outputs(copy, x)).all()


def test_bad_requests_are_refused_before_any_copy():
    model = float_model()
    with pytest.raises(ValueError, match="qat.*'int8', 'int8_full'.*qat='int4'"):
        quantization_aware_copy(model, "int4", images(40))
    with pytest.raises(ValueError, match="at least 32 images. Received: 8"):
        quantization_aware_copy(model, "int8", images(8))
    with pytest.raises(ValueError, match=r"shape \(N, 8, 8, 3\).*\(40, 8, 8\)"):
        quantization_aware_copy(model, "int8", images(40)[..., 0])
    headless = keras_vit.ViT(**{**TINY, "classifier_activation": "softmax"}, include_top=False)
    with pytest.raises(ValueError, match="needs a classifier with its head"):
        quantization_aware_copy(headless, "int8", images(40))
    qat = quantization_aware_copy(model, "int8", images(40))
    with pytest.raises(ValueError, match="simulates 'int8' already"):
        quantization_aware_copy(qat, "int8_full", images(40))
    with pytest.raises(ValueError, match="simulates LiteRT's 'int8'.*mode='int4'"):
        qat.quantize("int4")
    qkv = [layer for layer in _compat.all_layers(qat) if layer.name == "qkv"][0]
    with pytest.raises(ValueError, match="Layer 'qkv' simulates LiteRT's 'int8'"):
        qkv.quantize("int8")
    with pytest.raises(ValueError, match="qat='int8' simulates the plain ViT layout"):
        keras_vit.ViT(**TINY, stem_filters=(8,), qat="int8")
    with pytest.raises(ValueError, match="`qat` must be None or one of"):
        keras_vit.ViT(**TINY, qat="int16x8")


def learned_ranges(model):
    """`{point: (scale, zero point)}` that the QAT model's ranges make of its int8 tensors."""
    return {
        layer.path: layer.int8_parameters()
        for layer in _compat.all_layers(model)
        if isinstance(layer, fake_quantization.ActivationQuantizer)
    }


def ranges_in_file(model, path):
    """The QAT model's points whose int8 parameters some tensor of the `.tflite` file has."""
    held = {
        (tensor["quantization"][0], tensor["quantization"][1])
        for op in graph_ops(path)
        for tensor in op["outputs"]
        if tensor is not None and tensor["quantization"][0]
    }
    return [
        point
        for point, (scale, zero_point) in learned_ranges(model).items()
        if any(abs(s - scale) <= 1e-6 * scale and z == zero_point for s, z in held)
    ]


def distance_to_simulation(model, served, x):
    """How far a file's outputs are from the QAT model's, over how far its float function's are.

    Mean absolute differences. The float function (`float_copy`) is the same
    model without the rounding: a file that rounded elsewhere than the model
    (its own ranges) sits about as far as it, or farther.
    """
    simulated = outputs(model, x)
    return (
        np.abs(served - simulated).mean() / np.abs(outputs(float_copy(model), x) - simulated).mean()
    )


# The bound of `distance_to_simulation` for each mode's file. `int8`'s file
# computes the simulation (0.09 on the tiny model here; 0.94 for a file of
# the same model that ignored its ranges). `int8_full`'s integer softmax,
# GELU and LayerNorm round apart from the simulation, and a level's
# difference grows through the blocks: 0.94, where the file that ignored
# the ranges sits at 1.41.
CLOSER_THAN_FLOAT = {"int8": 0.3, "int8_full": 1.2}


class TrainedQAT(dict):
    """A QAT model of each mode after a short fit, so its ranges are the tracked ones.

    Each is trained when a test first asks for it; `calibrated[mode]` holds
    its ranges' high ends as calibration left them, before the fit.
    """

    def __init__(self):
        super().__init__()
        self.calibrated = {}

    def __missing__(self, mode):
        keras.utils.set_random_seed(0)
        x, y = images(96), np.random.default_rng(2).integers(0, 4, 96)
        model = quantization_aware_copy(float_model(), mode, x)
        self.calibrated[mode] = {
            v.path: np.asarray(v) for v in model.weights if v.path.endswith("high")
        }
        model.compile(
            optimizer=keras.optimizers.Adam(1e-3),
            loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
        )
        model.fit(x, y, batch_size=32, epochs=2, verbose=0)
        self[mode] = model
        return model


@pytest.fixture(scope="module")
def trained_qat():
    return TrainedQAT()


class QATFiles(dict):
    """The LiteRT file of each mode's trained QAT model, converted when first asked for."""

    def __init__(self, trained, folder):
        super().__init__()
        self.trained, self.folder = trained, folder

    def __missing__(self, mode):
        path = self.folder / f"{mode}.tflite"
        keras_vit.export.tflite(
            self.trained[mode], path, quantization=mode, representative_data=images(64, seed=5)
        )
        self[mode] = path
        return path


@pytest.fixture(scope="module")
def qat_files(trained_qat, tmp_path_factory):
    return QATFiles(trained_qat, tmp_path_factory.mktemp("qat_files"))


@pytest.mark.slow
@pytest.mark.parametrize("mode", fake_quantization.QAT_MODES)
def test_the_litert_file_of_a_qat_model_computes_its_simulated_outputs(
    trained_qat, qat_files, mode
):
    if BACKEND == "jax" or (BACKEND == "torch" and mode != "int8_full"):
        # From the other backends the model travels to TensorFlow as its
        # .keras file, ranges and all, whatever the mode and the backend:
        # one mode from one of them shows it.
        pytest.skip("one mode from one other backend is enough: the conversion is TensorFlow's")
    model, x, path = trained_qat[mode], images(64, seed=5), qat_files[mode]
    # Every range it learned is a tensor's quantization in the file.
    assert sorted(ranges_in_file(model, path)) == sorted(learned_ranges(model))
    # And the file computes what the model simulated, to LiteRT's integer
    # arithmetic: a level here and there (each op's rounding of inputs that
    # differ by a level), not another quantization.
    served = TFLiteModel(path)(x)
    assert distance_to_simulation(model, served, x) <= CLOSER_THAN_FLOAT[mode]
    assert np.mean(served.argmax(-1) == outputs(model, x).argmax(-1)) >= 0.9
    metadata = json.load(open(f"{path}.json"))
    assert metadata["quantization"] == mode and metadata["quantization_aware"] == mode
    assert metadata["rotated"] is False  # (the copy is rotated; the export does not again)


def int8_products(path, x):
    """`[(op, file's levels, levels of the exact product of its int8 inputs)]`, per product op.

    The file runs as `TFLiteModel` runs it (XNNPACK on a CPU) on image `x`;
    each int8 `FULLY_CONNECTED` and `BATCH_MATMUL` is recomputed in float64
    from the int8 tensors it read and rounded to its output's int8 levels:
    what the QAT model's simulation computes of the same inputs.
    """
    from ai_edge_litert.interpreter import Interpreter

    interpreter = Interpreter(str(path), experimental_preserve_all_tensors=True)
    interpreter.allocate_tensors()
    interpreter.set_tensor(interpreter.get_input_details()[0]["index"], x[None])
    interpreter.invoke()
    details = {tensor["index"]: tensor for tensor in interpreter.get_tensor_details()}

    def real(index):
        scale, zero_point = details[index]["quantization"]
        return (interpreter.get_tensor(index).astype("float64") - zero_point) * scale

    products = []
    for op in interpreter._get_ops_details():
        inputs, output = [i for i in op["inputs"] if i >= 0], op["outputs"][0]
        if details[output]["dtype"] != np.int8:
            continue
        if op["op_name"] == "BATCH_MATMUL":
            exact = real(inputs[0]) @ real(inputs[1])
        elif op["op_name"] == "FULLY_CONNECTED":
            kernel = interpreter.get_tensor(inputs[1]).astype("float64")
            kernel_scales = details[inputs[1]]["quantization_parameters"]["scales"]
            bias_scales = details[inputs[0]]["quantization"][0] * kernel_scales
            bias = interpreter.get_tensor(inputs[2]) * bias_scales if len(inputs) > 2 else 0.0
            flat = real(inputs[0]).reshape(-1, kernel.shape[1])
            exact = flat @ (kernel * kernel_scales[:, None]).T + bias
        else:
            continue
        scale, zero_point = details[output]["quantization"]
        levels = np.clip(np.floor(exact / scale + 0.5) + zero_point, -128, 127)
        products.append((op["op_name"], interpreter.get_tensor(output), levels.reshape(-1)))
    return products


@pytest.mark.slow
@pytest.mark.skipif(BACKEND != "tensorflow", reason="the file's arithmetic, on one backend")
@pytest.mark.parametrize("mode", fake_quantization.QAT_MODES)
def test_each_int8_product_of_the_file_is_the_simulated_rounding_of_its_inputs(qat_files, mode):
    # Op by op, the file computes what the simulation does of the same
    # int8 inputs. (XNNPACK's int8 batch matmul takes its right operand at
    # zero point 0: an asymmetric range for the keys and values would offset
    # every product. A requantization between two ranges, 8-bit multiplier
    # there, would round apart.)
    path = qat_files[mode]
    products = int8_products(path, images(1, seed=5)[0])
    kinds = {kind for kind, _, _ in products}
    assert kinds == {"FULLY_CONNECTED", "BATCH_MATMUL"}
    for kind, served, simulated in products:
        assert np.mean(served.reshape(-1) != simulated) <= 1e-3, kind
    # (Where XNNPACK does not ignore the zero point, it leaves such products
    # to TFLite's kernel, which rounds apart on a real model.)
    right_operands = [
        op["inputs"][1]
        for op in graph_ops(path)
        if op["op_name"] == "BATCH_MATMUL" and op["inputs"][1]["dtype"] == np.int8
    ]
    assert right_operands and all(tensor["quantization"][1] == 0 for tensor in right_operands)
    requantizations = [
        op
        for op in graph_ops(path)
        if op["op_name"] == "QUANTIZE" and op["inputs"][0]["dtype"] == np.int8
    ]
    assert requantizations == []


# The bound of `distance_to_simulation` for a MAP head's file. In "int8" its
# norm's MEAN is int8 (its inputs are), at its inputs' scale, which the
# simulation rounds the mean to as well: 0.34 on the tiny model here, 0.46
# without that rounding, 0.95 for the file that ignored the learned ranges.
# In "int8_full" (the encoder's bound) such a file sits at 1.10 and the
# right one at 1.02: what guards its ranges is the structural check.
MAP_HEAD_CLOSER_THAN_FLOAT = {"int8": 0.4, "int8_full": CLOSER_THAN_FLOAT["int8_full"]}


# The layouts of today's backbones, each with its own quantization points
# (`{part of their paths: {mode: at least so many}}`): SigLIP's (no class
# token; a MAP head's probe attends over the tokens) and DINOv3's larger
# sizes' (rotary positions: each attention rounds its turns of the query
# and key; registers; the gated MLP: the gate's sigmoid and silu).
LAYOUTS = {
    "map": (
        {"pooling": "map", "class_token": False},
        {"map_head": {"int8": 8, "int8_full": 15}},
    ),
    "rope": (
        {"position_embedding": "rope", "num_register_tokens": 2, "mlp": "swiglu"},
        {
            "attention/query_": {"int8": 0, "int8_full": 6},
            "mlp_dense_1/gate": {"int8": 2, "int8_full": 4},
        },
    ),
}
# The bound for the rotary layout's file. In "int8" its first norm reads
# the class token's int8 outputs and rounds its mean to their levels as
# LiteRT does, and the gate's LOGISTIC is int8 as its input is: 0.07 on the
# tiny model here, 0.55 without the mean's rounding, 0.27 without the
# sigmoid's. In "int8_full", 0.56 (the encoder's bound).
ROPE_CLOSER_THAN_FLOAT = {"int8": 0.2, "int8_full": CLOSER_THAN_FLOAT["int8_full"]}


@pytest.mark.slow
@pytest.mark.parametrize("mode", fake_quantization.QAT_MODES)
@pytest.mark.parametrize("layout", sorted(LAYOUTS))
def test_qat_copies_of_todays_layouts_train_and_their_litert_files_compute_the_simulation(
    layout, mode, tmp_path
):
    if BACKEND != "tensorflow" and mode == "int8":
        # (On the other backends the rounding trains in the mode with the most points.)
        pytest.skip("the int8 file is TensorFlow's; int8_full trains on every backend")
    arguments, num_points = LAYOUTS[layout]
    model, x = float_model(**arguments), images(64)
    copy = quantization_aware_copy(model, mode, x)
    np.testing.assert_allclose(outputs(float_copy(copy), x), outputs(model, x), atol=2e-4)
    points = [
        layer.path
        for layer in _compat.all_layers(copy)
        if isinstance(layer, fake_quantization.ActivationQuantizer)
    ]
    for part, counts in num_points.items():
        assert len([path for path in points if part in path]) >= counts[mode], (part, points)
    keras.utils.set_random_seed(0)
    copy.compile(
        optimizer=keras.optimizers.Adam(1e-3),
        loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
    )
    copy.fit(x, np.random.default_rng(2).integers(0, 4, 64), batch_size=32, epochs=2, verbose=0)
    simulated = outputs(copy, x)
    assert np.isfinite(simulated).all()
    if BACKEND != "tensorflow":
        return  # (the conversion is TensorFlow's: the file once)
    path = tmp_path / f"{layout}.tflite"
    keras_vit.export.tflite(copy, path, quantization=mode, representative_data=x)
    # Every learned range is a tensor's quantization in the file, but the
    # MAP probe's: its query is a constant of the file, computed with its
    # rounding (one of its points folded into it).
    folded = set(learned_ranges(copy)) - set(ranges_in_file(copy, path))
    if layout == "map":
        assert len(folded) == 1 and folded <= {
            "map_head/query/inputs_quantizer",
            "map_head/query/outputs_quantizer",
        }, folded
    else:
        assert folded == set()
    if mode == "int8_full":  # integer-only: float only where the logits leave the file
        floats = [op["op_name"] for op in graph_ops(path) if op["outputs"][0]["dtype"] != np.int8]
        assert floats == ["DEQUANTIZE"], floats
    served = TFLiteModel(path)(x)
    bound = MAP_HEAD_CLOSER_THAN_FLOAT if layout == "map" else ROPE_CLOSER_THAN_FLOAT
    assert distance_to_simulation(copy, served, x) <= bound[mode]
    assert np.mean(served.argmax(-1) == simulated.argmax(-1)) >= 0.9
    for kind, levels, expected in int8_products(path, x[0]):
        assert np.mean(levels.reshape(-1) != expected) <= 1e-3, kind


def test_a_symmetric_point_keeps_zero_point_zero_through_calibration_and_training():
    quantizer = fake_quantization.ActivationQuantizer(symmetric=True, momentum=0.5)
    quantizer.calibrating = True
    quantizer(keras.ops.convert_to_tensor([[-0.5, 3.0]]))
    quantizer.calibrating = False
    scale, zero_point = quantizer.int8_parameters()
    assert zero_point == 0 and scale == pytest.approx(3.0 / 127)
    quantizer(keras.ops.convert_to_tensor([[-9.0, 1.0]]), training=True)
    scale, zero_point = quantizer.int8_parameters()
    # The moving average of the minimum (the range's low end was -128 s)
    # sets the wider side now.
    low = 0.5 * (-3.0 / 127 * 128) + 0.5 * -9.0
    assert zero_point == 0 and scale == pytest.approx(-low / 128)
    levels = keras.ops.convert_to_numpy(quantizer(keras.ops.convert_to_tensor([0.0, 1.0])))
    assert levels[0] == 0.0 and levels[1] == pytest.approx(round(1 / scale) * scale)


@pytest.mark.slow
@pytest.mark.skipif(BACKEND != "tensorflow", reason="a probe of the test, on one backend")
@pytest.mark.parametrize("mode", fake_quantization.QAT_MODES)
def test_an_export_that_ignored_the_learned_ranges_would_fail_that_test(
    trained_qat, mode, tmp_path, monkeypatch
):
    # The graph without the fake-quant ops: LiteRT calibrates the int8_full
    # ranges itself and leaves int8's activations float.
    traced = fake_quantization.ActivationQuantizer.call

    def unrounded(self, inputs, training=None):
        if not training:
            return inputs
        return traced(self, inputs, training)

    model, x = trained_qat[mode], images(64, seed=5)
    monkeypatch.setattr(fake_quantization.ActivationQuantizer, "call", unrounded)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        keras_vit.export.tflite(
            model, tmp_path / "q.tflite", quantization=mode, representative_data=x
        )
    # None of the learned ranges is in the file (at most the softmax's fixed one).
    fixed = {point for point in learned_ranges(model) if "probabilities" in point}
    assert set(ranges_in_file(model, tmp_path / "q.tflite")) <= fixed
    # And its outputs are not the simulation's.
    monkeypatch.undo()
    served = TFLiteModel(tmp_path / "q.tflite")(x)
    assert distance_to_simulation(model, served, x) > CLOSER_THAN_FLOAT[mode]


@pytest.mark.slow
@pytest.mark.skipif(BACKEND != "tensorflow", reason="the conversion runs on TensorFlow")
def test_another_mode_exports_the_float_function_with_a_warning(trained_qat, tmp_path):
    model, x = trained_qat["int8_full"], images(32, seed=5)
    with pytest.warns(UserWarning, match="trained for LiteRT's 'int8_full'.*quantization='none'"):
        keras_vit.export.tflite(model, tmp_path / "f.tflite")
    unrounded = outputs(float_copy(model), x)
    np.testing.assert_allclose(TFLiteModel(tmp_path / "f.tflite")(x), unrounded, atol=1e-4)
