"""SavedModel for TF Serving: float or encoded-image signatures, named outputs.

The exported directory is what `tensorflow/serving` loads from
`MODEL_DIR/<version>/`; it needs nothing from this package at serving time.
"""

import json
import os
import shutil
import tempfile

import keras

from keras_vit import _options
from keras_vit.export import artefacts, checks, graph
from keras_vit.export.tensorflow_worker import rebuild_on_tensorflow

WARMUP_FILE = "tf_serving_warmup_requests"
SIGNATURES = ("serving_default", "serving_bytes")


def _bytes_image_size(model, image_size):
    """The size `serving_bytes` resizes to: the model's, or the one asked of a model of any size."""
    from keras_vit.models import default_image_size

    (_, height, width, _), _ = graph.input_spec(
        model, image_size=image_size or default_image_size(model)
    )
    return height, width


def serving_metadata(
    model,
    class_names=None,
    crop_fraction=1.0,
    top_k=5,
    max_image_pixels=None,
    max_image_bytes=None,
    image_size=None,
):
    """What a client needs to prepare inputs and read outputs, as a dict.

    Written into the SavedModel as `assets.extra/keras_vit.json`.
    """
    import keras_vit
    from keras_vit.data import image_limits

    max_image_pixels, max_image_bytes = image_limits.resolve_limits(
        max_image_pixels, max_image_bytes
    )
    any_size = graph.takes_any_size(model)
    classes = model.outputs[0].shape[-1]
    return artefacts.metadata(
        model,
        "saved_model",
        _bytes_image_size(model, image_size),
        class_names,
        keras_vit_version=keras_vit.__version__,
        any_image_size=any_size,
        float_input="serving_default: float32 (batch, height, width, channels), "
        "RGB (or grey) pixels in [0, 255]; the model rescales them itself"
        + (
            "; any height and width that are multiples of the patch size (one size "
            "per request); image_size is the size serving_bytes resizes to"
            if any_size
            else ""
        ),
        bytes_input="serving_bytes: string (batch,) of JPEG/PNG/GIF/BMP/WebP bytes; "
        "decoded, resized (bilinear) and centre-cropped in the graph; images whose "
        "header declares more than max_image_pixels pixels, or longer than "
        "max_image_bytes bytes, are refused before decoding",
        max_image_pixels=max_image_pixels,
        max_image_bytes=max_image_bytes,
        resize_method="bilinear",
        crop_fraction=crop_fraction,
        top_k=min(top_k, classes),
        outputs=["probabilities", "top_k_scores", "top_k_classes"]
        + (["top_k_names"] if class_names else []),
    )


def serving_module(
    model,
    class_names=None,
    crop_fraction=1.0,
    top_k=5,
    max_image_pixels=None,
    max_image_bytes=None,
    image_size=None,
):
    """A `tf.Module` with the two serving signatures around `model`.

    `serving_default(images)` takes float32 pixels `(batch, H, W, C)` in
    `[0, 255]`; `serving_bytes(image_bytes)` takes a string batch of encoded
    images and prepares them like the evaluation pipeline
    (`keras_vit.data.pipeline.decode_for_eval`), refusing (failing the
    request) images above `max_image_pixels` / `max_image_bytes` before
    decoding them (`keras_vit.data.image_limits`). Both return
    `probabilities`, `top_k_scores` and `top_k_classes` (and `top_k_names`
    when class names are given). A model of run-time resolution serves
    `serving_default` at any size, and `serving_bytes` resizes to
    `image_size` (default: the size its position table is laid out for).
    """
    import tensorflow as tf

    from keras_vit.data.pipeline import decode_for_eval

    call = graph.model_function(model, any_size=True)
    height, width = _bytes_image_size(model, image_size)
    (_, model_height, model_width, channels), _ = graph.input_spec(model, any_size=True)
    softmax_inside = checks.outputs_probabilities(model)
    classes = model.outputs[0].shape[-1]
    k = min(top_k, classes)
    module = tf.Module()
    module.model = call.restored_module

    def outputs(images):
        scores = call(images)
        probabilities = scores if softmax_inside else tf.nn.softmax(scores, axis=-1)
        top = tf.math.top_k(probabilities, k=k)
        result = {
            "probabilities": probabilities,
            "top_k_scores": top.values,
            "top_k_classes": top.indices,
        }
        if class_names:
            result["top_k_names"] = tf.gather(tf.constant(class_names), top.indices)
        return result

    @tf.function(
        input_signature=[
            tf.TensorSpec((None, model_height, model_width, channels), tf.float32, name="images")
        ],
        autograph=False,
    )
    def serving_default(images):
        return outputs(images)

    @tf.function(
        input_signature=[tf.TensorSpec((None,), tf.string, name="image_bytes")], autograph=False
    )
    def serving_bytes(image_bytes):
        images = tf.map_fn(
            lambda encoded: decode_for_eval(
                encoded,
                (height, width),
                channels,
                crop_fraction,
                max_pixels=max_image_pixels,
                max_bytes=max_image_bytes,
            ),
            image_bytes,
            fn_output_signature=tf.TensorSpec((height, width, channels), tf.float32),
        )
        return outputs(images)

    module.serving_default = serving_default
    module.serving_bytes = serving_bytes
    return module


def _version_directory(export_dir, version):
    """`(model_dir, version_dir)`: the version is the last path part or the next free one."""
    export_dir = os.fspath(export_dir)
    if version is not None:
        if not isinstance(version, int) or isinstance(version, bool) or version < 1:
            raise ValueError(f"`version` must be a positive int. Received: version={version!r}")
        return export_dir, os.path.join(export_dir, str(version))
    head, tail = os.path.split(os.path.normpath(export_dir))
    if tail.isdigit():
        return head, export_dir
    existing = [
        int(name)
        for name in (os.listdir(export_dir) if os.path.isdir(export_dir) else [])
        if name.isdigit()
    ]
    return export_dir, os.path.join(export_dir, str(max(existing, default=0) + 1))


def _write_warmup(path, height, width, channels):
    """TF Serving's warm-up log: one Predict request per signature, batch of 1."""
    import numpy as np
    import tensorflow as tf
    from tensorflow_serving.apis import model_pb2, predict_pb2, prediction_log_pb2

    grey = np.full((1, height, width, channels), 128, np.uint8)
    encoded = tf.io.encode_png(tf.constant(grey[0])).numpy()
    requests = {
        "serving_default": ("images", tf.make_tensor_proto(grey.astype(np.float32))),
        "serving_bytes": ("image_bytes", tf.make_tensor_proto([encoded])),
    }
    with tf.io.TFRecordWriter(path) as writer:
        for signature, (name, tensor) in requests.items():
            request = predict_pb2.PredictRequest(
                model_spec=model_pb2.ModelSpec(signature_name=signature)
            )
            request.inputs[name].CopyFrom(tensor)
            log = prediction_log_pb2.PredictionLog(
                predict_log=prediction_log_pb2.PredictLog(request=request)
            )
            writer.write(log.SerializeToString())


def saved_model(
    model,
    export_dir,
    *,
    version=None,
    class_names=None,
    crop_fraction=1.0,
    top_k=5,
    overwrite=False,
    warmup=True,
    max_image_pixels=None,
    max_image_bytes=None,
    image_size=None,
):
    """Exports `model` for TF Serving into `MODEL_DIR/<version>/`.

    Works from the TensorFlow and the JAX backend (through `jax2tf`); on
    torch the model is rebuilt on TensorFlow in a child process. The
    version directory is written next to its final place and renamed in
    when complete, so a server watching `MODEL_DIR` never sees half a model,
    and an existing version is never touched unless `overwrite=True`.

    Signatures (see `serving_module`): `serving_default` (float pixels) and
    `serving_bytes` (encoded images), both returning `probabilities`,
    `top_k_scores`, `top_k_classes` (and `top_k_names`). The preprocessing
    a client needs is in `assets.extra/keras_vit.json`; TF Serving's
    warm-up requests in `assets.extra/tf_serving_warmup_requests`.

    Args:
        model: a Keras image classifier with one image input: of a fixed
            size, or of any size (`input_shape=(None, None, C)`), whose
            `serving_default` then takes `(-1, -1, -1, C)` images.
        export_dir: the model directory (`serving/vit`, the next version is
            used), or a version directory (`serving/vit/3`).
        version: int, the version, when `export_dir` is the model directory.
        class_names: optional names of the classes, served as `top_k_names`.
        crop_fraction: the evaluation centre crop applied to encoded images.
        top_k: int, how many classes `top_k_*` hold (at most `classes`).
        overwrite: bool, replace an existing non-empty version directory.
        warmup: bool, write TF Serving warm-up requests.
        max_image_pixels, max_image_bytes: `serving_bytes` refuses images
            whose header declares more pixels, or with more bytes, before
            decoding them (default: `keras_vit.data.image_limits`'s).
        image_size: int or `(height, width)`, the size `serving_bytes`
            resizes images to, for a model of any size (default: the size
            its position table is laid out for); a fixed-size model's own.

    Returns:
        The version directory written, as a str.

    Example:

    ```python
    model = keras_vit.ViT(...)
    path = keras_vit.export.saved_model(model, "serving/vit", class_names=names)
    # docker run -p 8501:8501 -v $PWD/serving/vit:/models/vit \\
    #     -e MODEL_NAME=vit tensorflow/serving
    ```
    """
    classes = model.outputs[0].shape[-1] if getattr(model, "outputs", None) else None
    if not isinstance(model, keras.Model) or classes is None:
        raise TypeError(f"`model` must be a built Keras model. Received: model={model!r}")
    model = graph.exported_model(model)
    graph.input_spec(model, image_size=image_size, any_size=True)
    served = dict(
        class_names=artefacts.check_class_names(class_names, classes),
        crop_fraction=crop_fraction,
        top_k=top_k,
        **_checked_limits(
            model, top_k, crop_fraction, image_size, max_image_pixels, max_image_bytes
        ),
    )
    model_dir, version_dir = _version_directory(export_dir, version)
    if os.path.isdir(version_dir) and os.listdir(version_dir) and not overwrite:
        raise ValueError(
            f"The version directory {version_dir!r} exists and is not empty; "
            f"pass {_options.code('overwrite', True)} to replace it, or another "
            f"{_options.name('version')}."
        )
    if os.path.exists(version_dir) and not os.path.isdir(version_dir):
        raise ValueError(f"{version_dir!r} exists and is not a directory.")
    backend = keras.backend.backend()
    # jax2tf would need shape polymorphism for a model of any size: rebuilt on TF.
    if backend != "tensorflow" and (backend != "jax" or graph.takes_any_size(model)):
        return rebuild_on_tensorflow(
            model,
            "saved_model",
            export_dir=version_dir,
            overwrite=overwrite,
            warmup=warmup,
            **served,
        )
    _write_version(model, model_dir, version_dir, served, warmup)
    return version_dir


def _checked_limits(model, top_k, crop_fraction, image_size, max_image_pixels, max_image_bytes):
    """The encoded images' limits and size (`serving_bytes`), its other arguments checked."""
    from keras_vit.data import image_limits

    if not isinstance(top_k, int) or isinstance(top_k, bool) or top_k < 1:
        raise ValueError(
            f"{_options.name('top_k')} must be a positive int. "
            f"Received: {_options.given('top_k', top_k)}"
        )
    if not 0.0 < crop_fraction <= 1.0:
        raise ValueError(
            f"`crop_fraction` must be in (0, 1]. Received: crop_fraction={crop_fraction!r}"
        )
    max_image_pixels, max_image_bytes = image_limits.resolve_limits(
        max_image_pixels, max_image_bytes
    )
    return {
        "max_image_pixels": max_image_pixels,
        "max_image_bytes": max_image_bytes,
        "image_size": list(_bytes_image_size(model, image_size)),
    }


def _write_version(model, model_dir, version_dir, served, warmup):
    """Writes the version folder aside (its signatures, metadata, warm-up), then renames it in."""
    import tensorflow as tf

    module = serving_module(model, **served)
    metadata = serving_metadata(model, **served)
    os.makedirs(model_dir, exist_ok=True)
    # Dot-prefixed: TF Serving ignores non-numeric names while it is written.
    staging = tempfile.mkdtemp(prefix=".keras_vit_partial_", dir=model_dir)
    artefacts.apply_umask(staging)
    try:
        tf.saved_model.save(
            module,
            staging,
            signatures={name: getattr(module, name) for name in SIGNATURES},
            # Serving needs no gradients, and jax2tf's cannot be saved again.
            options=tf.saved_model.SaveOptions(experimental_custom_gradients=False),
        )
        extra = os.path.join(staging, "assets.extra")
        os.makedirs(extra, exist_ok=True)
        with open(artefacts.metadata_path(staging), "w") as f:
            json.dump(metadata, f, indent=2)
        if warmup:
            height, width = served["image_size"]
            channels = model.inputs[0].shape[-1]
            _write_warmup(os.path.join(extra, WARMUP_FILE), height, width, channels)
        if os.path.isdir(version_dir):
            replaced = version_dir + ".replaced"
            os.rename(version_dir, replaced)
            os.rename(staging, version_dir)
            shutil.rmtree(replaced)
        else:
            os.rename(staging, version_dir)
    finally:
        if os.path.isdir(staging):
            shutil.rmtree(staging)
