"""The Keras model as a TensorFlow function, whatever the backend.

Everything that writes TensorFlow artefacts starts here: on the TensorFlow
backend the model is traced directly; on JAX it goes through `jax2tf`
(Keras' `ExportArchive`), so the model's own JAX computation is what gets
served. The torch backend has no TensorFlow path in Keras; its models are
rebuilt on TensorFlow from a `.keras` file (`tensorflow_worker`).
"""

import tempfile

import keras

from keras_vit import _options


def exported_model(model):
    """The model every export writes: LoRA adapters merged, channels-last images in.

    A LoRA model's export is its merged model's (`models.merge_lora`): the
    same function without the adapters' matmuls, and kernels that the
    int8 modes' rotation and quantizers see whole.
    """
    from keras_vit.models import lora

    if lora.lora_settings(model) is not None:
        model = lora.merge_lora(model)
    return channels_last_input(model)


def channels_last_input(model):
    """`model`, or for a channels-first ViT a model of it that takes channels-last images.

    Every export serves `(batch, height, width, channels)` images, as its
    signature says: TF Serving's decoders, LiteRT's and ONNX's image tools
    make them. The wrapper moves the channels first again (layer
    `channels_first`) before the model, which moves them last (its
    `channels_last` layer): converters fold the two transposes.
    """
    from keras_vit.models import image_shape, takes_channels_first

    if len(getattr(model, "inputs", None) or ()) != 1 or not takes_channels_first(model):
        return model
    images = keras.Input(image_shape(model), name="images")
    outputs = model(keras.layers.Permute((3, 1, 2), name="channels_first")(images))
    return keras.Model(images, outputs, name=model.name)


def input_spec(model, batch_size=None, image_size=None, any_size=False):
    """`(shape, dtype)` of the model's image input, with the given batch.

    A model of run-time resolution (`input_shape=(None, None, C)`) keeps
    height and width unknown with `any_size=True` (a SavedModel serves
    every size), and is otherwise exported at `image_size`, which it then
    needs. A fixed-size model takes only its own size.
    """
    if len(model.inputs) != 1:
        raise ValueError(
            f"`model` must have one image input; {model.name!r} has {len(model.inputs)}."
        )
    shape = tuple(model.inputs[0].shape[1:])
    if len(shape) != 3 or shape[-1] is None:
        raise ValueError(
            "`model` must take images of shape `(height, width, channels)`. "
            f"Received input shape {model.inputs[0].shape}."
        )
    if image_size is not None:
        size = (image_size, image_size) if isinstance(image_size, int) else tuple(image_size)
        if len(size) != 2 or not all(isinstance(s, int) and s > 0 for s in size):
            raise ValueError(
                f"{_options.name('image_size')} must be a positive int or (height, width). "
                f"Received: {_options.given('image_size', image_size)}"
            )
        if None not in shape[:2] and size != shape[:2]:
            raise ValueError(
                f"The model takes {shape[0]}x{shape[1]} images only. Received: "
                f"{_options.given('image_size', image_size)} (a model built with "
                f"input_shape=(None, None, {shape[-1]}) takes any size)."
            )
        shape = (*size, shape[-1])
    if None in shape[:2] and not any_size:
        raise ValueError(
            f"The model takes images of any size (input shape {model.inputs[0].shape}); "
            "this export needs static shapes: name the size to export it at, e.g. "
            f"{_options.code('image_size', (224, 224), typed=224)}."
        )
    return (batch_size, *shape), "float32"


def takes_any_size(model):
    """Whether the model was built for images of any size (`(None, None, C)`)."""
    return None in tuple(model.inputs[0].shape[1:3])


def model_function(model, batch_size=None, image_size=None, any_size=False):
    """A TensorFlow-callable `images -> model outputs` (inference mode).

    Args:
        model: a built single-input Keras model.
        batch_size: `None` for a dynamic batch, or a fixed int.
        image_size, any_size: see `input_spec`.

    Returns:
        A restored SavedModel function (see `write_archive`) taking float32 images
        `(batch, H, W, C)`; its `restored_module` holds the variables.
    """
    import tensorflow as tf

    with tempfile.TemporaryDirectory(prefix="keras_vit_export_") as directory:
        write_archive(model, directory, batch_size, image_size, any_size)
        restored = tf.saved_model.load(directory)
    serve = restored.serve
    serve.restored_module = restored  # keeps the variables alive
    return serve


def write_archive(model, directory, batch_size=None, image_size=None, any_size=False):
    """Writes the model's inference call as a SavedModel with one `serve` endpoint.

    One path for both backends: Keras' `ExportArchive` (through `jax2tf` on
    JAX), so what is exported is exactly what a SavedModel of the model
    computes. (`image_size`, `any_size`: see `input_spec`.)
    """
    shape, dtype = input_spec(model, batch_size, image_size, any_size)
    backend = keras.backend.backend()
    if backend not in ("tensorflow", "jax"):
        raise ValueError(
            f"A TensorFlow graph of the model needs the tensorflow or jax backend, "
            f"not {backend!r}; `tensorflow_worker.rebuild_on_tensorflow` moves the model there."
        )
    archive = keras.export.ExportArchive()
    archive.track(model)
    archive.add_endpoint(
        "serve",
        lambda images: model(images, training=False),
        input_signature=[keras.InputSpec(shape=shape, dtype=dtype)],
    )
    archive.write_out(directory, verbose=False)
