"""The quantization-aware copy of a float ViT classifier, for LiteRT's integer modes.

`quantization_aware_copy(model, "int8_full", images)` returns a
`ViT(..., qat="int8_full")` that computes the float model's
function with the rounding of the LiteRT file in its forward pass
(`layers.fake_quantization`). Fine-tuning it (`model.fit`, or `keras-vit
finetune --qat`) teaches the weights to survive that rounding, and its
export (`keras_vit.export.tflite(model, path, quantization="int8_full")`)
carries the ranges it learned into the file.

The copy is made in three exact steps and one estimate:

1. the residual stream rotated (`models.rotation`: the outlier channels of
   real checkpoints spread over all channels), which also folds every
   LayerNorm's scale and offset into the layers that read it and LayerScale
   into the layers that write the stream;
2. the model rebuilt with `qat=mode` and without LayerScale, its norms
   without scale and offset;
3. the rotated weights set into it, each layer's kernel and bias stored at
   the float model's size and the factor apart (`output_scale`: LayerScale's
   folded gains would otherwise train far faster than in the float model);
4. every quantization point's range set to the minimum and maximum of its
   values on the calibration images (training then tracks them).
"""

import keras
import numpy as np

from keras_vit import _compat, _options
from keras_vit.layers import fake_quantization
from keras_vit.models import layouts, lora, rotation
from keras_vit.models.vision_transformer import VisionTransformer

# Fewer images than this set ranges that the first training batches move
# far: a calibration of a few images is refused.
MIN_CALIBRATION_IMAGES = 32


def qat_mode(model):
    """The LiteRT mode that `model` simulates (`"int8"`, `"int8_full"`), or `None`."""
    if isinstance(model, VisionTransformer):
        return model.qat  # (its configuration's)
    # A graph saved in place of a configuration (a frozen or grafted model): its layers'.
    for layer in _compat.all_layers(model):
        mode = getattr(layer, "qat", None)
        if mode is not None:
            return mode
    return None


def quantization_aware_copy(model, mode, calibration_images, batch_size=32):
    """A copy of a float ViT classifier that trains with LiteRT's `mode` in its forward pass.

    Args:
        model: a keras_vit `VisionTransformer` with a head (`include_top`),
            of the plain layout (learned position embeddings or rotary
            positions, registers, class-token,
            average or attention (MAP) pooling, no stem, `pre_logits` or
            distillation token; LayerScale is folded). A LoRA model is
            merged first. `model` itself is left as it is.
        mode: `"int8"` or `"int8_full"`, the `quantization` the copy will
            be exported with.
        calibration_images: at least `MIN_CALIBRATION_IMAGES` images of the
            model's input shape (e.g. the first training batches), that set
            the initial ranges.
        batch_size: int, images per calibration call.

    Returns:
        A `VisionTransformer` with `qat=mode`: close to `model` with its
        rounding, and `model`'s float function (to float32 rounding)
        without it (`float_copy`).

    Raises:
        ValueError: an unknown `mode`, a model without a head or of another
            layout, one that simulates a mode already, or too few or
            mis-shaped calibration images; all before any copy is made.

    Example:

    >>> import keras_vit
    >>> model = keras_vit.ViT(
    ...     patch_size=7, hidden_dim=32, num_layers=1, num_heads=2, mlp_dim=64,
    ...     input_shape=(28, 28, 1), classes=10)
    >>> images = np.random.default_rng(0).uniform(0, 255, (32, 28, 28, 1))
    >>> qat = quantization_aware_copy(model, "int8_full", images)
    >>> qat_mode(qat), qat.output_shape
    ('int8_full', (None, 10))
    """
    if mode is None or mode not in fake_quantization.QAT_MODES:
        raise ValueError(
            f"{_options.name('qat')} must be one of "
            f"{', '.join(map(repr, fake_quantization.QAT_MODES))}. Received: "
            f"{_options.given('qat', mode)}"
        )
    config = model.get_config() if isinstance(model, VisionTransformer) else {"layers": None}
    if "layers" in config:
        raise ValueError(
            "`quantization_aware_copy` takes a keras_vit VisionTransformer as built or loaded "
            f"(its config its arguments). Received: model={getattr(model, 'name', model)!r}"
        )
    trained_for = qat_mode(model)
    if trained_for is not None:
        raise ValueError(
            f"Model {model.name!r} simulates {trained_for!r} already (qat): start from the "
            "float model."
        )
    if not config["include_top"]:
        raise ValueError(
            f"Quantization-aware training needs a classifier with its head; model {model.name!r} "
            "was built with include_top=False. Fine-tune a head first (keras-vit finetune)."
        )
    unsupported = layouts.qat_unsupported(config)
    if unsupported:
        raise ValueError(
            f"Quantization-aware training simulates the plain ViT layout; model {model.name!r} "
            f"has {layouts.described(unsupported)}."
        )
    images = _checked_images(model, calibration_images)
    if lora.lora_settings(model) is not None:
        model = lora.merge_lora(model)
    rotated = rotation.rotated_copy(model)  # (a ValueError names weights of another layout)
    config = {**rotated.get_config(), "qat": mode, "layer_scale_init": None}
    copy = VisionTransformer.from_config(config)
    source = {variable.path: variable for variable in rotated.weights}
    for variable in copy.weights:
        if variable.path in source:
            variable.assign(source.pop(variable.path))
    # Only what the rotation folded is left: LayerScale's gains (ones), the
    # norms' scales and offsets (ones and zeros).
    folded = ("_scale/gamma", "norm/gamma", "norm/beta")
    unused = [path for path in source if not path.endswith(folded)]
    if unused:
        raise ValueError(f"Weights of {model.name!r} without a place in the copy: {unused[:5]}")
    _rescale_folded(copy, {v.path: v for v in model.weights})
    fake_quantization.calibrate(copy, images, batch_size)
    return copy


def float_copy(model):
    """The float model that a quantization-aware `model` computes without its rounding.

    Its configuration with `qat=None` and its weights, each kernel and bias
    times its `output_scale` (the quantizers' ranges have no place in it;
    its norms, without scale and offset, take their initial ones and zeros):
    what a QAT model exported in another mode than its own computes. A
    LoRA model is merged first.

    Example:

    >>> import keras_vit
    >>> qat = keras_vit.ViT(
    ...     patch_size=7, hidden_dim=32, num_layers=1, num_heads=2, mlp_dim=64,
    ...     input_shape=(28, 28, 1), classes=10, qat="int8")
    >>> qat_mode(float_copy(qat)) is None
    True
    """
    if qat_mode(model) is None or not isinstance(model, VisionTransformer):
        raise ValueError(
            "`float_copy` takes a quantization-aware VisionTransformer (qat set). Received: "
            f"model={getattr(model, 'name', model)!r} with qat={qat_mode(model)!r}"
        )
    if lora.lora_settings(model) is not None:
        model = lora.merge_lora(model)
    copy = VisionTransformer.from_config({**model.get_config(), "qat": None})
    source = {variable.path: variable for variable in model.weights}
    scales = {
        layer.path: keras.ops.convert_to_numpy(layer.output_scale)
        for layer in _compat.all_layers(model)
        if getattr(layer, "output_scale", None) is not None
    }
    for variable in copy.weights:
        if variable.path not in source:
            continue
        value = keras.ops.convert_to_numpy(source[variable.path])
        layer_path, _, name = variable.path.rpartition("/")
        if layer_path in scales and name in ("kernel", "bias"):
            value = value * scales[layer_path]
        variable.assign(value)
    return copy


def _rescale_folded(copy, float_weights):
    """Each kernel and bias stored at its float model's size, the factor in `output_scale`.

    (See `layers.fake_quantization.add_output_scale`: the writers of the
    stream hold LayerScale's gains after folding.)
    """
    weights = {variable.path: variable for variable in copy.weights}
    for layer in _compat.all_layers(copy):
        if getattr(layer, "output_scale", None) is None:
            continue
        kernel = weights[f"{layer.path}/kernel"]
        folded = np.asarray(keras.ops.convert_to_numpy(kernel), "float64")
        original = np.asarray(keras.ops.convert_to_numpy(float_weights[kernel.path]), "float64")
        factor = np.sqrt(np.mean(folded**2)) / max(np.sqrt(np.mean(original**2)), 1e-30)
        if not np.isfinite(factor) or factor <= 0:
            continue
        kernel.assign((folded / factor).astype("float32"))
        bias = weights.get(f"{layer.path}/bias")
        if bias is not None:
            bias.assign((np.asarray(keras.ops.convert_to_numpy(bias)) / factor).astype("float32"))
        layer.output_scale.assign(factor)


def _checked_images(model, calibration_images):
    try:
        images = np.asarray(calibration_images, "float32")
    except (TypeError, ValueError):
        images = None
    expected = tuple(model.input_shape[1:])
    if (
        images is None
        or images.ndim != 4
        or any(want not in (None, have) for want, have in zip(expected, images.shape[1:]))
    ):
        shape = None if images is None else images.shape
        raise ValueError(
            f"`calibration_images` must be images of shape (N, "
            f"{', '.join(map(str, expected))}) like the model's input. Received: an array "
            f"of shape {shape}."
        )
    if len(images) < MIN_CALIBRATION_IMAGES:
        raise ValueError(
            f"Quantization-aware training calibrates its ranges on at least "
            f"{MIN_CALIBRATION_IMAGES} images. Received: {len(images)} calibration images."
        )
    return images
