"""TFLite / LiteRT for the edge: the conversion, with quantisation, and the file it writes.

The `.tflite` file takes one float32 image `(1, H, W, C)` of `[0, 255]`
pixels (the model rescales them itself) and returns what the Keras model
returns (logits, or probabilities for a softmax head). A JSON file beside it
(`vit.tflite` -> `vit.tflite.json`) records the input size, channels, class names
and output kind, for `keras-vit predict --model vit.tflite` and for apps.
"""

import contextlib
import contextvars
import json
import os
import tempfile
import warnings

import keras
import numpy as np

from keras_vit import _compat, _options
from keras_vit._native_output import native_stderr_captured
from keras_vit.export import artefacts, checks, graph
from keras_vit.export.litert_runtime import op_counts
from keras_vit.export.tensorflow_worker import rebuild_on_tensorflow
from keras_vit.layers.layer_normalization import variance_from_second_moment
from keras_vit.models import float_copy, qat_mode, rotation

QUANTIZATIONS = (None, "float16", "dynamic", "int8", "int8_full", "int16x8")
# The modes whose activation ranges are calibrated on representative images.
CALIBRATED = ("int8", "int8_full", "int16x8")
# The modes that quantise a ViT with its residual stream rotated (`rotation`):
# per-tensor int8 activation scales, which a real checkpoint's outlier
# channels break.
ROTATED = ("int8", "int8_full")
# Ops that "int8" leaves in float32: XNNPACK has no fast int8 kernels for
# them on CPU (LayerNorm's pieces, GELU, softmax, the attention matmuls and
# the element-wise glue), and int8 there costs the most accuracy. The
# convolution and every Dense layer (~all the FLOPs) run in int8.
FLOAT_OPS = (
    "MEAN",
    "SQUARED_DIFFERENCE",
    "RSQRT",
    "GELU",
    "SOFTMAX",
    "BATCH_MATMUL",
    "MUL",
    "ADD",
    "NEG",
    "SUB",
)


metadata_path = artefacts.metadata_path  # (the `.json` beside a `.tflite` file)


def _check_quantization(quantization):
    if quantization == "none":
        return None
    if quantization not in QUANTIZATIONS:
        raise ValueError(
            f"{_options.name('quantization')} must be one of None ('none'), 'float16', "
            "'dynamic', 'int8', 'int8_full', 'int16x8'. "
            f"Received: {_options.given('quantization', quantization)}"
        )
    return quantization


def calibration_images(representative_data, image_shape, count=128):
    """Up to `count` float32 images `(N, H, W, C)` from arrays or a tf.data pipeline.

    `representative_data`: an array of images, a `.npy` file of them, or an
    iterable (e.g. a `tf.data.Dataset`) of image batches or `(images,
    labels)` batches, such as `keras_vit.data.load(...).data`.
    """
    if isinstance(representative_data, (str, os.PathLike)):
        representative_data = np.load(representative_data)
    if isinstance(representative_data, np.ndarray):
        batches = [representative_data]
    else:
        batches, have = [], 0
        for batch in representative_data:
            images = batch[0] if isinstance(batch, (tuple, list)) else batch
            batches.append(np.asarray(images))
            have += len(batches[-1])
            if have >= count:
                break
    if not batches:
        raise ValueError("`representative_data` yielded no images.")
    images = np.concatenate(batches)[:count].astype("float32")
    if images.shape[1:] != tuple(image_shape):
        raise ValueError(
            f"`representative_data` images must be {tuple(image_shape)} like the "
            f"model's input. Received images of shape {images.shape[1:]}."
        )
    return images


def _int8_debugger(tf, converter):
    """LiteRT's quantisation debugger on `converter`, calibrated, `FLOAT_OPS` left float."""
    return tf.lite.experimental.QuantizationDebugger(
        converter=converter,
        debug_dataset=converter.representative_dataset,
        debug_options=tf.lite.experimental.QuantizationDebugOptions(denylisted_ops=list(FLOAT_OPS)),
    )


# The int8 debuggers that `keeping_int8_debuggers` blocks of this context keep.
_KEPT_DEBUGGERS = contextvars.ContextVar("keras_vit_int8_debuggers", default=None)


@contextlib.contextmanager
def keeping_int8_debuggers():
    """Within the block, each `"int8"` conversion in this process keeps its debugger.

    Yields a list that receives the calibrated
    `tf.lite.experimental.QuantizationDebugger` of each `tflite(...,
    quantization="int8")` call (TensorFlow backend): its
    `calibrated_model`, and its `options` re-quantising without a second
    calibration, let a study quantise other sets of ops of the same
    calibration (`benchmarks/real_weights.py float-blocks`).

    Example:

    ```python
    with keeping_int8_debuggers() as debuggers:
        keras_vit.export.tflite(model, "vit.tflite", quantization="int8", representative_data=x)
    debuggers[0].calibrated_model
    ```
    """
    kept = []
    token = _KEPT_DEBUGGERS.set(kept)
    try:
        yield kept
    finally:
        _KEPT_DEBUGGERS.reset(token)


def _run_converter(tf, converter, quantization):
    if quantization != "int8":
        return converter.convert()
    # The public way to quantise all but some op types.
    debugger = _int8_debugger(tf, converter)
    kept = _KEPT_DEBUGGERS.get()
    if kept is not None:
        kept.append(debugger)
    return debugger.get_nondebug_quantized_model()


def _convert(model, quantization, calibration, allow_flex, image_size=None, qat=False):
    """The flatbuffer of `model` in `quantization`; `qat`: the ranges its fake-quant ops hold.

    A quantization-aware model's graph holds TensorFlow's fake-quant ops,
    whose ranges the converter takes as the tensors' quantization. In
    `"int8"` the ops without one stay float32 (no calibration, no denylist);
    in `"int8_full"` the few without one (the pixel rescaling) are
    calibrated on `calibration`.
    """
    import tensorflow as tf

    with tempfile.TemporaryDirectory(prefix="keras_vit_tflite_") as directory:
        # A static batch of one: TFLite's kernels and delegates want static shapes.
        with (
            variance_from_second_moment() if quantization == "int16x8" else contextlib.nullcontext()
        ):
            graph.write_archive(model, directory, batch_size=1, image_size=image_size)
        converter = tf.lite.TFLiteConverter.from_saved_model(directory, signature_keys=["serve"])
        ops = [tf.lite.OpsSet.TFLITE_BUILTINS]
        if quantization is not None:
            converter.optimizations = [tf.lite.Optimize.DEFAULT]
        if quantization == "float16":
            converter.target_spec.supported_types = [tf.float16]
        elif quantization in CALIBRATED and not (qat and quantization == "int8"):

            def representative_dataset():
                for image in calibration:
                    yield [image[None]]

            converter.representative_dataset = representative_dataset
        if quantization == "int8_full":
            ops = [tf.lite.OpsSet.TFLITE_BUILTINS_INT8]
        elif quantization == "int16x8":
            ops = [tf.lite.OpsSet.EXPERIMENTAL_TFLITE_BUILTINS_ACTIVATIONS_INT16_WEIGHTS_INT8]
        if allow_flex:
            ops.append(tf.lite.OpsSet.SELECT_TF_OPS)
        converter.target_spec.supported_ops = ops
        try:
            with native_stderr_captured(), warnings.catch_warnings():
                # The quantisation debugger runs TensorFlow's own (deprecated) interpreter.
                warnings.filterwarnings(
                    "ignore", message=r"[\s\S]*tf.lite.Interpreter is deprecated"
                )
                return converter.convert() if qat else _run_converter(tf, converter, quantization)
        except Exception as error:  # the converter raises its own ConverterError
            if "Select TF" in str(error) or "not supported" in str(error):
                raise ValueError(
                    "The model needs TensorFlow ops that TFLite lacks (Flex / Select TF ops), "
                    "which the standard LiteRT runtime cannot run. Build the model with "
                    "`approximate_gelu=True` (tanh GELU), or pass `allow_flex=True` "
                    f"to link the Flex delegate. Converter said: {str(error)[-1500:]}"
                ) from None
            raise


def _rotated_if_the_same(model, images):
    """`(rotated copy, True)` when it gives `model`'s outputs on `images`, else `(model, False)`.

    A guard against a model whose weights have the known names but whose
    function the rewrite does not preserve: its file is quantised as it is,
    with a warning, rather than shipped with other answers.
    """
    rotated = rotation.rotated_copy(model)
    expected = keras.ops.convert_to_numpy(model(images, training=False))
    served = keras.ops.convert_to_numpy(rotated(images, training=False))
    error = float(np.abs(served - expected).max())
    if error <= 1e-3 * (1.0 + float(np.abs(expected).max())):
        return rotated, True
    warnings.warn(
        f"The rotated copy of {model.name!r} differs from it by {error:.3g} on the calibration "
        "images: quantising the model as it is (its residual stream not rotated).",
        stacklevel=3,
    )
    return model, False


def tflite(
    model,
    path,
    *,
    quantization=None,
    representative_data=None,
    calibration_count=128,
    class_names=None,
    overwrite=False,
    allow_flex=False,
    image_size=None,
    rotate=True,
):
    """Converts `model` to a TFLite / LiteRT flatbuffer.

    Args:
        model: a Keras image classifier with one image input. LiteRT runs
            static shapes: a model of any size (`input_shape=(None, None,
            C)`) is converted at `image_size`, which it needs.
        path: the `.tflite` file to write (and its metadata beside it,
            `<path>.json`).
        quantization: `None` (float32), `"float16"` (weights), `"dynamic"`
            (int8 weights, activations quantised on the fly), `"int8"`
            (int8 weights and calibrated int8 activations for the
            convolution and every Dense layer; LayerNorm, GELU, softmax and
            the attention matmuls stay float32, see `FLOAT_OPS`: the fastest
            on CPUs), `"int8_full"` (every op int8, for integer-only
            accelerators; slower on CPUs and less accurate) or `"int16x8"`
            (every op integer with int16 activations and int8 weights,
            LiteRT's 16x8 mode: integer-only and far closer to float on a
            real checkpoint's outlier activations, but run by reference
            kernels, slow on CPUs). The int8 and 16x8 modes need
            `representative_data`. The input and output stay float32 in
            every mode.
        representative_data: images for the int8 calibration: an array,
            a `.npy` path, or a pipeline of batches (e.g.
            `keras_vit.data.load("fashion_mnist", image_size=28).data`).
        calibration_count: how many images calibrate the activation ranges.
        class_names: optional class names for the metadata file.
        overwrite: bool, replace an existing file.
        allow_flex: bool, allow Select-TF (Flex) ops; off by default, so a
            graph the plain LiteRT runtime cannot run fails here, loudly.
        image_size: int or `(height, width)`, the size to convert a model of
            any size at (a multiple of its patch size); a fixed-size
            model's own.
        rotate: bool. For `"int8"` and `"int8_full"`, quantise a copy of a
            keras_vit ViT classifier whose residual stream is rotated
            (`keras_vit.export.rotation.rotated_copy`: the same function,
            without the outlier channels of real checkpoints that per-tensor
            int8 scales cannot hold). Models of another layout are converted
            as they are; the metadata's `rotated` says which happened.

    A quantization-aware model (`keras_vit.models.quantization_aware_copy`,
    `keras-vit finetune --qat`) exported in the mode it trained for keeps
    what it learned: its rounded weights, and its activations' ranges as the
    file's quantization (its `"int8"` needs no `representative_data`; its
    `"int8_full"` calibrates only the pixel rescaling). In another mode it
    is exported as its float function, with a warning.

    Returns:
        dict: `path`, `metadata_path`, `bytes`, `quantization`, `rotated`,
        `op_counts`.

    Example:

    ```python
    keras_vit.export.tflite(model, "vit.tflite", quantization="dynamic")
    ```
    """
    model = graph.exported_model(model)
    quantization = _check_quantization(quantization)
    image_shape, class_names = _checked(model, path, overwrite, image_size, class_names, rotate)
    path = os.fspath(path)
    trained_for = qat_mode(model)
    if trained_for is not None and quantization != trained_for:
        warnings.warn(
            f"{model.name!r} was trained for LiteRT's {trained_for!r} quantization (qat); "
            f"exported with quantization={quantization or 'none'!r} it computes its float "
            "function, without the rounding and the ranges it learned. Export it with "
            f"quantization={trained_for!r} to keep them.",
            stacklevel=2,
        )
    calibration = None
    if quantization in CALIBRATED and not (trained_for == quantization == "int8"):
        if representative_data is None:
            raise ValueError(
                f"{_options.given('quantization', quantization)} needs `representative_data` "
                "(images from the training pipeline) to calibrate the activation ranges."
            )
        calibration = calibration_images(representative_data, image_shape, calibration_count)
    settings = dict(
        quantization=quantization,
        class_names=class_names,
        allow_flex=allow_flex,
        image_size=image_shape[:2],
        rotate=rotate,
    )
    if keras.backend.backend() != "tensorflow":
        # jax2tf graphs hold XLA calls that TFLite cannot convert: rebuild on TF.
        return _tflite_on_tensorflow(model, path, calibration, overwrite=overwrite, **settings)
    return _write_tflite(model, path, calibration, **settings)


def _checked(model, path, overwrite, image_size, class_names, rotate):
    """`(image shape, class names)` of a TFLite export, its arguments checked first."""
    if not isinstance(rotate, bool):
        raise TypeError(f"`rotate` must be True or False. Received: rotate={rotate!r}")
    path = os.fspath(path)
    if not path.endswith(".tflite"):
        raise ValueError(f"`path` must end in '.tflite'. Received: path={path!r}")
    artefacts.refuse_to_replace(path, overwrite)
    quantized = [layer for layer in _compat.all_layers(model) if layer.quantization_mode]
    if quantized:
        raise ValueError(
            f"LiteRT cannot convert Keras' {quantized[0].quantization_mode!r} layers (model "
            f"{model.name!r} was quantized with Keras' `quantize`; {quantized[0].path}, ...): "
            "export the float model with LiteRT's own quantization (int8, int8_full), or this "
            "one as a SavedModel."
        )
    (_, *image_shape), _ = graph.input_spec(model, image_size=image_size)
    if class_names is not None:
        class_names = artefacts.check_class_names(class_names, model.outputs[0].shape[-1])
    return tuple(image_shape), class_names


def _tflite_on_tensorflow(model, path, calibration, **settings):
    """`tflite` in the TensorFlow child process, its calibration images passed as a file."""
    with tempfile.TemporaryDirectory(prefix="keras_vit_calibration_") as directory:
        if calibration is not None:
            settings["representative_data"] = os.path.join(directory, "images.npy")
            np.save(settings["representative_data"], calibration)
            settings["calibration_count"] = len(calibration)
        return rebuild_on_tensorflow(model, "tflite", path=path, **settings)


def _write_tflite(
    model, path, calibration, *, quantization, class_names, allow_flex, image_size, rotate
):
    """Converts (the rotated copy, for the int8 modes) and writes the file and its metadata."""
    trained_for = qat_mode(model)
    rotated = (
        rotate and trained_for is None and quantization in ROTATED and rotation.rotatable(model)
    )
    if rotated:
        model, rotated = _rotated_if_the_same(model, calibration[:2])
    simulated = trained_for is not None and trained_for == quantization
    if trained_for is not None and not simulated:
        model = float_copy(model)
    content = _convert(model, quantization, calibration, allow_flex, image_size, simulated)
    counts = op_counts(content)
    flex = sorted(name for name in counts if name.startswith("Flex") or name == "CUSTOM")
    if flex and not allow_flex:
        raise ValueError(f"The converted graph holds Flex/custom ops {flex}; not written.")
    described = artefacts.metadata(
        model,
        "tflite",
        image_size,
        class_names,
        output="probabilities" if checks.outputs_probabilities(model) else "logits",
        input="float32 (1, height, width, channels), pixels in [0, 255]",
        quantization=quantization or "none",
        rotated=rotated,
        quantization_aware=trained_for if simulated else None,
    )
    artefacts.write_aside({path: content, metadata_path(path): json.dumps(described, indent=2)})
    return {
        "path": path,
        "metadata_path": metadata_path(path),
        "bytes": len(content),
        "quantization": quantization or "none",
        "rotated": rotated,
        "op_counts": counts,
    }
