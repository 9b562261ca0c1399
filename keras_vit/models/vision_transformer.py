"""The Vision Transformer as a functional Keras model, and its builders."""

import contextlib
import inspect
import os
import typing

import keras
import numpy as np

from keras_vit import layers as vit_layers
from keras_vit import weights as checkpoints
from keras_vit.layers.patch_embedding import _pair
from keras_vit.models.variants import (
    PUBLISHED,
    decode_variant,
    parameter_count,
    variant_name,
)
from keras_vit.weights import encoder_blocks

# keras.applications' "avg" is the paper's "gap" (the mean of the patch tokens).
POOLINGS = ("token", "gap", "avg", "max", "token_gap", "map")
DEFAULT_INPUT_SHAPE = (224, 224, 3)
DATA_FORMATS = ("channels_last", "channels_first")


def resolve_data_format(data_format):
    """`data_format`, `None` as `keras.config.image_data_format()`, or a clear error."""
    resolved = data_format or keras.config.image_data_format()
    if resolved not in DATA_FORMATS:
        raise ValueError(
            f"`data_format` must be one of {DATA_FORMATS} or None. "
            f"Received: data_format={data_format!r}"
        )
    return resolved


def channels_last(shape, data_format):
    """An image shape in the layout of `data_format` as `(height, width, channels)`."""
    return (*shape[1:], shape[0]) if data_format == "channels_first" else tuple(shape)


def in_data_format(shape, data_format):
    """An image shape `(height, width, channels)` in the layout of `data_format`."""
    return (shape[-1], *shape[:-1]) if data_format == "channels_first" else tuple(shape)


# Pixel statistics (in [0, 1] units) that checkpoints were trained with.
NORMALIZATIONS = {
    "inception": ((0.5, 0.5, 0.5), (0.5, 0.5, 0.5)),  # [-1, 1], the paper's
    "imagenet": ((0.485, 0.456, 0.406), (0.229, 0.224, 0.225)),  # DeiT, DINO, MAE
}


def _pixel_rescaling(normalization, channels):
    """`Rescaling` arguments mapping `[0, 255]` pixels to `(x/255 - mean) / std`."""
    if isinstance(normalization, str):
        if normalization not in NORMALIZATIONS:
            raise ValueError(
                f"`normalization` must be one of {tuple(NORMALIZATIONS)} or a "
                f"(mean, std) pair. Received: normalization={normalization!r}"
            )
        if normalization == "inception":  # one scalar scale for any channel count
            return {"scale": 1.0 / 127.5, "offset": -1.0}
        normalization = NORMALIZATIONS[normalization]
    try:
        mean, std = (np.asarray(v, dtype="float64").reshape(-1) for v in normalization)
    except (TypeError, ValueError):
        raise ValueError(
            "`normalization` must be a name or a (mean, std) pair of per-channel "
            f"values in [0, 1] units. Received: normalization={normalization!r}"
        ) from None
    if len(mean) != channels or len(std) != channels or np.any(std <= 0):
        raise ValueError(
            f"`normalization` needs {channels} means and {channels} positive "
            f"stds for {channels}-channel images. Received: "
            f"normalization={normalization!r}"
        )
    return {
        "scale": [float(v) for v in 1.0 / (255.0 * std)],
        "offset": [float(v) for v in -mean / std],
    }


def _validate_input_shape(input_shape, input_tensor, data_format):
    """The input shape, in `data_format`'s layout, of the user's arguments, or a clear error."""
    if input_tensor is not None:
        if not keras.backend.is_keras_tensor(input_tensor):
            raise TypeError(
                "`input_tensor` must be a Keras tensor (from `keras.Input`). "
                f"Received: input_tensor={input_tensor!r}"
            )
        tensor_shape = tuple(input_tensor.shape[1:])
        if input_shape is not None and tuple(input_shape) != tensor_shape:
            raise ValueError(
                f"input_shape={tuple(input_shape)} does not match the shape "
                f"{tensor_shape} of input_tensor."
            )
        input_shape = tensor_shape
    if input_shape is None:
        return in_data_format(DEFAULT_INPUT_SHAPE, data_format)
    input_shape = tuple(input_shape) if isinstance(input_shape, (list, tuple)) else input_shape
    if (
        not isinstance(input_shape, tuple)
        or len(input_shape) != 3
        or not all(s is None or (isinstance(s, int) and s > 0) for s in input_shape)
        or channels_last(input_shape, data_format)[-1] is None
    ):
        layout = "(height, width, channels)"
        if data_format == "channels_first":
            layout = "(channels, height, width)"
        raise ValueError(
            f"`input_shape` must be {layout} ({data_format}) with positive "
            "ints, height and width `None` for images of any size. "
            f"Received: input_shape={input_shape!r}"
        )
    return input_shape


class _FromWeights:
    """The default of an argument that a checkpoint decides (see `VisionTransformer`)."""

    def __init__(self, default):
        self.default = default

    def __repr__(self):
        return f"<the checkpoint's, else {self.default!r}>"


# What the encoder computes: with `weights=`, the checkpoint's, and a
# contradicting choice is an error.
_ENCODER_DEFAULTS = {
    "normalization": "inception",
    "class_token": True,
    "distillation_token": False,
    "num_register_tokens": 0,
    "layer_scale_init": None,
    "approximate_gelu": True,
    "layer_norm_epsilon": 1e-6,
}
# The head's shape: the checkpoint's unless the user chooses another head.
_HEAD_DEFAULTS = {"pooling": "token", "representation_size": None}
# The head's class count, as the input size: a checkpoint file's own (its
# head's, its position table's) unless set; a set one gives a new head, or
# the table resampled.
_SHAPE_DEFAULTS = {"classes": 1000}
# How the position table moves to other grids, and the image size it is laid
# out for (a model of run-time resolution): the checkpoint's unless set.
_RESOLUTION_DEFAULTS = {"resample_method": "bicubic", "base_image_size": None}
_FROM_WEIGHTS = {
    name: _FromWeights(value)
    for name, value in {
        **_ENCODER_DEFAULTS,
        **_HEAD_DEFAULTS,
        **_RESOLUTION_DEFAULTS,
        **_SHAPE_DEFAULTS,
    }.items()
}
# What a builder given `weights=` takes from the checkpoint unless set.
FROM_CHECKPOINT = frozenset(_FROM_WEIGHTS)
# The builder arguments that a checkpoint's shapes fix, and the weight that shows each.
_ARCHITECTURE_WEIGHTS = {
    "patch_size": "patch_embedding/kernel",
    "hidden_dim": "patch_embedding/kernel",
    "mlp_dim": "encoderblock_0/mlp_dense_1/kernel",
    "num_heads": "encoderblock_0/attention/qkv_kernel",
    "num_layers": "encoderblock_{last}",
}


def _same_normalization(first, second, channels):
    a, b = _pixel_rescaling(first, channels), _pixel_rescaling(second, channels)
    return all(np.allclose(a[key], b[key], rtol=1e-6, atol=1e-8) for key in a)


def _weight_shape(name, arguments):
    """The shape that the builder `arguments` give the weight that shows `name`."""
    patch_height, patch_width = _pair(arguments["patch_size"], "patch_size")
    width = arguments["hidden_dim"]
    if name in ("patch_size", "hidden_dim"):
        return (patch_height, patch_width, arguments["input_shape"][-1], width)
    if name == "mlp_dim":
        return (width, arguments["mlp_dim"])
    if name == "num_heads":
        return (width, 3, arguments["num_heads"], width // arguments["num_heads"])
    return None


def _check_architecture(source, weights, asked):
    """A checkpoint file whose shapes are not the model's: a `ValueError` naming both.

    `source` holds the file's architecture (its shapes, read by the
    checkpoint reader); `asked` the builder's. Every difference is named,
    with the weight that shows it.
    """
    differences, ours = [], {**source, **asked}
    for name, value in asked.items():
        if name not in source:
            continue  # a registered name, or a Keras weights file: loading checks them
        theirs = source[name]
        if name == "patch_size":
            theirs, value = _pair(theirs, name), _pair(value, name)
        if theirs == value:
            continue
        weight = _ARCHITECTURE_WEIGHTS[name]
        if name == "num_layers":
            shown = (
                f"its last block is {weight.format(last=theirs - 1)!r}, the model's "
                f"{weight.format(last=value - 1)!r}"
            )
        else:
            shown = (
                f"its {weight!r} has shape {_weight_shape(name, source)}, the model's "
                f"{_weight_shape(name, ours)}"
            )
        differences.append((name, theirs, value, shown))
    if differences:
        raise ValueError(
            f"weights={os.fspath(weights)!r} holds a ViT of "
            + ", ".join(f"{name}={theirs!r}" for name, theirs, _, _ in differences)
            + ", not the "
            + ", ".join(f"{name}={value!r}" for name, _, value, _ in differences)
            + " of the model asked for: "
            + "; ".join(dict.fromkeys(shown for *_, shown in differences))  # each weight once
            + ". Build the model with "
            + ", ".join(f"{name}={theirs!r}" for name, theirs, _, _ in differences)
            + ", or let keras_vit.from_checkpoint read the whole architecture "
            "from the file."
        )


def _checkpoint_function(given, source, recorded, weights, input_channels):
    """The function arguments of a model built with `weights=`.

    Arguments the user left unset take the checkpoint's values (`source`:
    what the checkpoint reader found, `recorded`: the names the file
    itself records). A set one that contradicts what the checkpoint
    records of its encoder is a `ValueError` naming both; one that only
    departs from its format's convention (an official `.npz` records no
    GELU form) is the user's.
    """
    chosen = {}
    for name, value in given.items():
        unset = isinstance(value, _FromWeights) or (name == "normalization" and value is None)
        if unset:
            chosen[name] = source.get(name, _FROM_WEIGHTS[name].default)
            if chosen[name] is None and name in ("pooling", "normalization"):
                # A pre-training model's file pools nothing: a classifier's default.
                chosen[name] = _FROM_WEIGHTS[name].default
            continue
        chosen[name] = value
        if name not in _ENCODER_DEFAULTS or name not in recorded:
            continue  # another head, or departing from a format's convention: the user's
        theirs = source[name]
        if name == "layer_scale_init":
            agree = (value is None) == (theirs is None)  # its values come from the file
        elif name == "normalization":
            agree = _same_normalization(value, theirs, input_channels)
        else:
            agree = value == theirs
        if not agree:
            raise ValueError(
                f"{name}={value!r} contradicts the checkpoint weights={os.fspath(weights)!r}, "
                f"whose model has {name}={theirs!r}. Leave {name} unset to build the "
                "checkpoint's function, or use another checkpoint."
            )
    return chosen


@keras.saving.register_keras_serializable(package="keras_vit")
class VisionTransformer(keras.Model):
    """A Vision Transformer (Dosovitskiy et al. 2020): a functional Keras model.

    The image is rescaled to `[-1, 1]` (with `include_rescaling`), cut into
    patches that are linearly embedded, a class token is prepended,
    position embeddings are added, and `num_layers` pre-norm Transformer
    blocks follow; a final LayerNorm, pooling (class token or average of the
    patch tokens), an optional tanh `pre_logits` layer and a zero-initialised
    linear head complete the model. Layers are named after the reference
    implementation: `patch_embedding`, `class_token`, `position_embedding`,
    `encoderblock_{i}`, `encoder_norm`, `pooling`, `pre_logits`, `head`.

    Args:
        patch_size: int or `(height, width)` of a patch.
        hidden_dim: int, the token width `D`.
        num_layers: int, the number of Transformer blocks.
        num_heads: int, the number of attention heads.
        mlp_dim: int, the hidden width of the MLPs.
        include_top: bool, whether to end with the classification head.
        weights: `None` (random initialisation), a checkpoint name
            registered for this variant (e.g. `"imagenet21k"`,
            `"augreg-imagenet21k+imagenet2012"`; downloaded once, see
            `keras_vit.weights.registry`), or the path of a weights file:
            Keras (`.weights.h5`, `.keras`), official `.npz`, or a Hugging
            Face / timm `.safetensors` (or `.bin` with torch) checkpoint.
            Left unset, `input_shape` and `classes` are the checkpoint's;
            set to another size, the position embeddings are resampled, to
            another class count, the head is new (zero-initialised). A file
            whose shapes are not the model's (another width, depth, head
            count, MLP width or patch size) is a `ValueError` naming the
            weight and both shapes. The model computes the checkpoint's
            function: the arguments marked "the checkpoint's" below come
            from the file (a checkpoint's `config.json` beside it, or the
            registry) unless set, and a set value that contradicts the
            checkpoint's encoder is a `ValueError` naming both.
        input_tensor: optional Keras tensor (`keras.Input(...)`) to use as
            the image input.
        input_shape: `(height, width, channels)` (`(channels, height,
            width)` with `data_format="channels_first"`); defaults to the
            checkpoint's (a registered one's, a file's position table and
            patch embedding), else `(224, 224, 3)`. Height and width must
            be multiples of the patch size unless `pad_to_patches`.
            `(None, None, channels)` builds
            a model of run-time resolution: it takes images of any size
            that is a multiple of the patch size (one size per batch) and
            resamples its position embeddings inside the graph for each
            (see `base_image_size` and `resample_method`); a size that is
            not a multiple is an error naming it when the images arrive.
        data_format: `"channels_last"` (images `(batch, height, width,
            channels)`), `"channels_first"` (`(batch, channels, height,
            width)`), or `None` for `keras.config.image_data_format()`.
            The layout of the input only: a channels-first model moves the
            channels last first (layer `channels_last`), so its weights,
            checkpoints and tokens are those of a channels-last model.
        pad_to_patches: bool, whether images whose sides are not multiples
            of the patch size are zero-padded on the right and bottom to
            whole patches (after the normalisation and the stem, as timm's
            `dynamic_img_pad`); `False` refuses them with an error naming
            the size.
        pooling: (the checkpoint's, else `"token"`) `"token"` (class token),
            `"gap"` or `"avg"` (mean of the patch tokens; `"avg"` is
            keras.applications' name), `"max"` (each feature's largest value
            over the patch tokens, as keras.applications' `"max"`),
            `"token_gap"` (both, concatenated, as DINOv2's classifiers),
            `"map"` (multihead attention pooling: a learned probe attends
            over the patch tokens, then an MLP, as big_vision's MAPHead and
            timm's `global_pool="map"`; layer `map_head`), or
            `None` with `include_top=False` to output every token.
        classes: (a checkpoint file's head's, else 1000) int, the number
            of classes of the head; another count than the file's gives a
            new zero-initialised head.
        classifier_activation: activation of the head (`"softmax"`, or
            `None` for logits).
        include_rescaling: bool, whether the model takes pixels in
            `[0, 255]` and normalises them itself (see `normalization`).
        normalization: (the checkpoint's) how `include_rescaling` normalises pixels:
            `"inception"` (to `[-1, 1]`, the paper's), `"imagenet"`
            (ImageNet mean/std, as DeiT, DINO and MAE), or a `(mean, std)`
            pair of per-channel values in `[0, 1]` units. Default: the
            checkpoint's, else `"inception"`.
        representation_size: (the checkpoint's, else `None`) int or `None`; when set, a `pre_logits`
            Dense + tanh layer of this width follows the pooling, as in the
            paper's pre-training head.
        class_token: (the checkpoint's, else `True`) bool, whether to prepend
            a class token.
        distillation_token: (the checkpoint's, else `False`) bool, DeiT's
            distillation token (Touvron et al.
            2021): a second learned token after the class token, with its
            own position embedding and its own head (`head_dist`); the
            model's logits are the mean of the two heads' logits, as DeiT
            predicts at inference. Needs `class_token` and
            `pooling="token"`.
        num_register_tokens: (the checkpoint's, else 0) int, the number of
            register tokens (Darcet et
            al. 2023, DINOv2 with registers): learned tokens without
            position embeddings, inserted after the class token and
            ignored by the pooling.
        stem_filters: `None` (the paper's ViT: patches of pixels) or a
            sequence of channel counts for a convolutional stem
            (`ConvStem`: stride-2 3×3 convolutions, as the paper's hybrid
            and Xiao et al. 2021); the patches are then cut from its feature
            map, `2 ** len(stem_filters)` times smaller than the image
            (each halving rounded up).
        stem_strides: `None` (every stem convolution of stride 2) or a
            stride (1 or 2) per convolution.
        stem_downsampling: `"convolution"` (stride-2 convolutions) or
            `"max_pool"` (stride-1 convolutions, each followed by 2×2 max
            pooling: a small CNN's stages as the stem), or one of them per
            stem convolution (e.g. a strided first stage before pooled ones).
        position_embedding: `"learned"` or `"sincos2d"` (fixed).
        dropout_rate: float, dropout after the embeddings and in the blocks.
        attention_dropout_rate: float, dropout on attention probabilities.
        drop_path_rate: float, stochastic depth rate of the last block,
            rising linearly from 0 in the first.
        patch_dropout_rate: float in `[0, 1)`, the share of patch tokens
            that training drops at random before the blocks (`PatchDropout`,
            layer `patch_dropout`: cheaper steps; inference sees every
            token). Needs a fixed `input_shape`.
        layer_scale_init: (the checkpoint's, else `None`) float or `None`,
            LayerScale initial value.
        approximate_gelu: (the checkpoint's, else `True`) bool,
            tanh-approximated GELU (`True`, original ViT) or exact GELU
            (`False`).
        layer_norm_epsilon: (the checkpoint's, else 1e-6) float, epsilon of
            every LayerNorm.
        base_image_size: (the checkpoint's, else 224) int or
            `(height, width)`, the image size that the position-embedding
            table of a model of run-time resolution is laid out for; images
            of other sizes use the table resampled. A fixed-size model's
            table is laid out for its `input_shape`.
        resample_method: (the checkpoint's, else `"bicubic"`) how the
            position table moves to another grid, at load time and at run
            time: `"bicubic"` (PyTorch's, as timm and Hugging Face),
            `"bicubic_antialias"` (DINOv2 with registers) or `"bilinear"`.
        seed: int or `None`, seed of dropout and stochastic depth.
        remat: bool, whether training recomputes each block's activations
            in the backward pass instead of keeping them (gradient
            checkpointing: a training step holds one block's activations
            instead of all of them, for about a third more compute); the
            gradients are the same. Inference is unchanged.
        name: str, the model's name.
        trainable: bool, whether the model's weights are trained.
        dtype: `None` (the global dtype policy) or a dtype policy (e.g.
            `"mixed_bfloat16"`) to build the layers under.

    The model's `get_config` is these arguments as built, a checkpoint's
    values in place of those it decided (never `weights` or
    `input_tensor`), so a `.keras` file reloads by building the model again
    and a configuration can be read and edited as data. A model changed in
    place after it was built (quantized, LoRA, frozen layers, or grafted
    onto layers before `input_tensor`) saves its graph instead and reloads
    as a plain functional model.

    Returns:
        A `keras.Model`: logits or probabilities `(batch, classes)`; with
        `include_top=False`, features `(batch, hidden_dim)` (or
        `representation_size`), or tokens `(batch, num_tokens, hidden_dim)`
        with `pooling=None`.

    Example:

    >>> model = VisionTransformer(
    ...     patch_size=4, hidden_dim=32, num_layers=2, num_heads=2,
    ...     mlp_dim=64, input_shape=(28, 28, 1), classes=10,
    ... )
    >>> model.output_shape
    (None, 10)
    """

    def __init__(
        self,
        patch_size=16,
        hidden_dim=768,
        num_layers=12,
        num_heads=12,
        mlp_dim=3072,
        *,
        include_top=True,
        weights=None,
        input_tensor=None,
        input_shape=None,
        data_format=None,
        pad_to_patches=False,
        pooling=_FROM_WEIGHTS["pooling"],
        classes=_FROM_WEIGHTS["classes"],
        classifier_activation="softmax",
        include_rescaling=True,
        normalization=_FROM_WEIGHTS["normalization"],
        representation_size=_FROM_WEIGHTS["representation_size"],
        class_token=_FROM_WEIGHTS["class_token"],
        distillation_token=_FROM_WEIGHTS["distillation_token"],
        num_register_tokens=_FROM_WEIGHTS["num_register_tokens"],
        stem_filters=None,
        stem_strides=None,
        stem_downsampling="convolution",
        position_embedding="learned",
        dropout_rate=0.0,
        attention_dropout_rate=0.0,
        drop_path_rate=0.0,
        patch_dropout_rate=0.0,
        layer_scale_init=_FROM_WEIGHTS["layer_scale_init"],
        approximate_gelu=_FROM_WEIGHTS["approximate_gelu"],
        layer_norm_epsilon=_FROM_WEIGHTS["layer_norm_epsilon"],
        base_image_size=_FROM_WEIGHTS["base_image_size"],
        resample_method=_FROM_WEIGHTS["resample_method"],
        seed=None,
        remat=False,
        name="vision_transformer",
        trainable=True,
        dtype=None,
    ):
        given = {key: value for key, value in locals().items() if key in _ARGUMENTS}
        # A Hub checkpoint is its file (downloaded once): read like any other.
        weights = checkpoints.hub.checkpoint_file(weights)
        # A checkpoint file is read for its shapes, then for its weights: once.
        reading = contextlib.nullcontext() if weights is None else checkpoints.reading_once()
        with reading:
            # Everything is checked before any weight is created or downloaded.
            arguments, variant = _resolve_checkpoint(given, weights, input_tensor)
            plan = _plan(arguments)
            weights_path = None if weights is None else checkpoints.resolve(weights, variant)[0]
            # A configuration names its dtype policy; layers take the global one.
            with _global_dtype_policy(dtype):
                if input_tensor is None:
                    images = inputs = keras.Input(shape=arguments["input_shape"], name="images")
                else:
                    images, inputs = input_tensor, keras.utils.get_source_inputs(input_tensor)
                super().__init__(inputs, _assemble(images, arguments, plan), name=name)
            self.trainable = trainable
            self._sizes_checked = frozenset()  # input sizes that `_check_image_size` passed
            # What `get_config` returns: the arguments as resolved (a checkpoint's
            # values in place of its defaults), so a file rebuilds this function.
            self._arguments = arguments
            self._grafted = input_tensor is not None and not (
                len(inputs) == 1 and inputs[0] is input_tensor
            )
            if weights_path is not None:
                checkpoints.load(self, weights_path, arguments["resample_method"])

    def fit(self, x=None, *args, **kwargs):
        self._check_image_size(x)
        return super().fit(x, *args, **kwargs)

    def evaluate(self, x=None, *args, **kwargs):
        self._check_image_size(x)
        return super().evaluate(x, *args, **kwargs)

    def predict(self, x, *args, **kwargs):
        self._check_image_size(x)
        return super().predict(x, *args, **kwargs)

    def _check_image_size(self, x):
        """Images of a size the model cannot take fail here, before Keras' loop starts.

        A model of any size learns the size of its images only when they
        arrive, and inside Keras' loops an error is worse than our
        `ValueError`: JAX's take the weights out of the model while they
        run (an error there leaves it without them: every later call
        fails), TensorFlow's graphs raise it as an assertion op's failure.
        Checked symbolically, once per size.
        """
        if None not in self.input_shape[1:] or self._arguments["pad_to_patches"]:
            return
        shape = _batch_shape(x)
        if shape is None or len(shape) != len(self.input_shape) or None in shape[1:]:
            return
        if shape[1:] not in self._sizes_checked:
            self.compute_output_spec(keras.KerasTensor((None, *shape[1:])))
            self._sizes_checked = self._sizes_checked | {shape[1:]}

    def get_config(self):
        if self._grafted or _changed_in_place(self):
            # Its graph is no longer what the arguments build (layers before
            # the input, quantized or frozen layers): the graph's own config.
            return keras.Model(self.inputs, self.outputs, name=self.name).get_config()
        arguments = dict(self._arguments)
        if callable(arguments["classifier_activation"]):
            arguments["classifier_activation"] = keras.activations.serialize(
                arguments["classifier_activation"]
            )
        return {
            **arguments,
            "name": self.name,
            "trainable": self.trainable,
            "dtype": self.dtype_policy.name,
        }

    @classmethod
    def from_config(cls, config, custom_objects=None):
        if "layers" in config:  # a graph's config (see `get_config`)
            return keras.Model.from_config(config, custom_objects=custom_objects)
        # Files of versions without `data_format` were channels-last.
        return cls(**{"data_format": "channels_last", **config})


def _batch_shape(x):
    """The static shape of a batch of images (an array, a tensor, a tf.data element), or None."""
    spec = getattr(x, "element_spec", None)  # a tf.data.Dataset
    if spec is not None:
        spec = spec[0] if isinstance(spec, (tuple, list)) else spec
        shape = getattr(spec, "shape", None)
        return None if shape is None or shape.rank is None else tuple(shape.as_list())
    shape = getattr(x, "shape", None)
    return None if shape is None else tuple(None if s is None else int(s) for s in shape)


# The arguments that a model's configuration holds (all but `weights`,
# `input_tensor` and what Keras keeps itself: name, trainable, dtype).
_ARGUMENTS = tuple(
    name
    for name in inspect.signature(VisionTransformer).parameters
    if name not in ("weights", "input_tensor", "name", "trainable", "dtype")
)


@contextlib.contextmanager
def _global_dtype_policy(dtype):
    if dtype is None:
        yield
        return
    previous = keras.config.dtype_policy()
    keras.config.set_dtype_policy(dtype)
    try:
        yield
    finally:
        keras.config.set_dtype_policy(previous)


def _changed_in_place(model):
    """Whether a model's layers were changed after it was built (quantized, LoRA, frozen)."""
    for variable in model.weights:
        if not keras.backend.is_float_dtype(variable.dtype) or any(
            marker in variable.path for marker in ("lora_kernel", "amax_history")
        ):
            return True
    return model.trainable and any(not layer.trainable for layer in model.layers)


def _resolve_checkpoint(given, weights, input_tensor):
    """The builder's arguments with a checkpoint's values where the user left them unset.

    Reads what the checkpoint records (a registered name's entry, a file's
    shapes and configs): no download, no weight. Also checks that the file's
    shapes are the model's, and the input shape. Returns the arguments and
    the variant's name (for the registry).
    """
    arguments = dict(given)
    arguments["patch_size"] = patch_size = _pair(given["patch_size"], "patch_size")
    arguments["data_format"] = data_format = resolve_data_format(given["data_format"])
    width, depth, heads, mlp = (
        given[name] for name in ("hidden_dim", "num_layers", "num_heads", "mlp_dim")
    )
    checkpoint = variant = None
    source, recorded = {}, set()
    if weights is not None:
        if patch_size[0] == patch_size[1]:
            variant = variant_name(patch_size[0], width, depth, heads, mlp)
        checkpoint = checkpoints.registered(weights, variant)
        source, recorded = checkpoints.function_arguments(weights, variant, heads)
        shape = {"patch_size": patch_size, "hidden_dim": width, "num_layers": depth}
        _check_architecture(source, weights, {**shape, "mlp_dim": mlp, "num_heads": heads})
    input_shape = given["input_shape"]
    if input_shape is None and input_tensor is None:
        if checkpoint is not None:
            input_shape = (checkpoint.image_size, checkpoint.image_size, 3)
        elif "input_shape" in source:
            input_shape = source["input_shape"]
        if input_shape is not None:  # a checkpoint's images are channels-last
            input_shape = in_data_format(input_shape, data_format)
    input_shape = _validate_input_shape(input_shape, input_tensor, data_format)
    arguments["input_shape"] = input_shape
    input_shape = channels_last(input_shape, data_format)
    if isinstance(given["classes"], _FromWeights):
        arguments["classes"] = source.get("classes", given["classes"].default)
    function = {name: given[name] for name in _FROM_WEIGHTS if name != "classes"}
    arguments.update(_checkpoint_function(function, source, recorded, weights, input_shape[-1]))
    if None not in input_shape[:2]:
        base_image_size = given["base_image_size"]
        if not isinstance(base_image_size, _FromWeights) and base_image_size is not None:
            if _pair(base_image_size, "base_image_size") != tuple(input_shape[:2]):
                raise ValueError(
                    "base_image_size sets the table of a model of run-time resolution "
                    "(input_shape with None height and width); a fixed-size model's "
                    f"table is laid out for its input. Received: base_image_size="
                    f"{base_image_size!r}, input_shape={input_shape!r}"
                )
        arguments["base_image_size"] = None  # the table is laid out for the input
    return arguments, variant


class _Plan(typing.NamedTuple):
    """What the arguments make of the image: derived once, checked before any layer."""

    dynamic: bool  # a model of run-time resolution
    rescaling: dict  # `Rescaling`'s scale and offset
    stem: object  # the `ConvStem`, or None
    grid_size: tuple  # the position table's grid


def _plan(arguments):
    """Checks the resolved arguments together; returns what assembling them needs."""
    a = arguments
    if a["resample_method"] not in vit_layers.position_embedding.RESAMPLE_METHODS:
        raise ValueError(
            f"`resample_method` must be one of {vit_layers.position_embedding.RESAMPLE_METHODS}. "
            f"Received: resample_method={a['resample_method']!r}"
        )
    input_shape = channels_last(a["input_shape"], a["data_format"])
    dynamic = None in input_shape[:2]
    vit_layers.patch_dropout.check_rate(a["patch_dropout_rate"], "patch_dropout_rate")
    if not isinstance(a["remat"], bool):
        raise TypeError(f"`remat` must be a bool. Received: remat={a['remat']!r}")
    if a["patch_dropout_rate"] and dynamic:
        raise ValueError(
            "patch_dropout_rate needs a fixed input size; a model of run-time "
            f"resolution was asked for. Received: patch_dropout_rate="
            f"{a['patch_dropout_rate']!r}, input_shape={input_shape!r}"
        )
    if dynamic:
        table_size = _pair(a["base_image_size"] or DEFAULT_INPUT_SHAPE[0], "base_image_size")
    else:
        table_size = tuple(input_shape[:2])
    rescaling = _pixel_rescaling(a["normalization"], input_shape[-1])
    stem = None
    if a["stem_filters"] is not None:
        stem = vit_layers.ConvStem(
            a["stem_filters"], a["stem_strides"], downsampling=a["stem_downsampling"], name="stem"
        )
        table_size = stem.output_size(table_size)
    grid_size = vit_layers.patch_grid(table_size, a["patch_size"], a["pad_to_patches"])
    pooling, include_top = a["pooling"], a["include_top"]
    if pooling not in POOLINGS and not (pooling is None and not include_top):
        allowed = POOLINGS if include_top else POOLINGS + (None,)
        raise ValueError(
            f"`pooling` must be one of {allowed} (None only with "
            f"include_top=False). Received: pooling={pooling!r}"
        )
    if pooling in ("token", "token_gap") and not a["class_token"]:
        raise ValueError(f"pooling={pooling!r} needs a class token. Received: class_token=False")
    if a["distillation_token"] and not (a["class_token"] and pooling == "token"):
        raise ValueError(
            "distillation_token=True needs class_token=True and "
            f"pooling='token'. Received: class_token={a['class_token']!r}, "
            f"pooling={pooling!r}"
        )
    if a["distillation_token"] and include_top and a["representation_size"]:
        raise ValueError(
            "distillation_token=True has two heads and no pre_logits layer. "
            f"Received: representation_size={a['representation_size']!r}"
        )
    registers = a["num_register_tokens"]
    if not isinstance(registers, int) or registers < 0:
        raise ValueError(
            "`num_register_tokens` must be an int >= 0. "
            f"Received: num_register_tokens={registers!r}"
        )
    classes = a["classes"]
    if include_top and (not isinstance(classes, int) or classes < 1):
        raise ValueError(f"`classes` must be a positive int. Received: classes={classes!r}")
    if a["hidden_dim"] % a["num_heads"]:
        raise ValueError(
            f"hidden_dim {a['hidden_dim']} is not divisible by num_heads {a['num_heads']}."
        )
    return _Plan(dynamic, rescaling, stem, grid_size)


def _assemble(images, arguments, plan):
    """The model's output tensor for `images`: embedding, encoder, head."""
    tokens, num_prefix_tokens = _embed(images, arguments, plan)
    tokens = _encode(tokens, arguments)
    return _head(tokens, arguments, num_prefix_tokens)


def _sublayer_seed(arguments, offset):
    return None if arguments["seed"] is None else arguments["seed"] + offset


def _embed(images, arguments, plan):
    """Pixels to the encoder's input tokens; also returns how many precede the patches."""
    a, width = arguments, arguments["hidden_dim"]
    x = images
    if a["data_format"] == "channels_first":
        x = keras.layers.Permute((2, 3, 1), name="channels_last")(x)
    if a["include_rescaling"]:
        x = keras.layers.Rescaling(**plan.rescaling, name="rescaling")(x)
    if plan.stem is not None:
        x = plan.stem(x)
    patches = None
    if plan.dynamic:
        # The patch grid is known when an image arrives; the position
        # embeddings read it from the unflattened patches.
        patches = vit_layers.PatchEmbedding(
            a["patch_size"],
            width,
            flatten=False,
            pad_to_patches=a["pad_to_patches"],
            name="patch_embedding",
        )(x)
        x = keras.layers.Reshape((-1, width), name="patch_tokens")(patches)
    else:
        x = vit_layers.PatchEmbedding(
            a["patch_size"], width, pad_to_patches=a["pad_to_patches"], name="patch_embedding"
        )(x)
    # Token order: class, distillation, registers, patches. Registers come
    # after the position embeddings, which they have none of.
    if a["distillation_token"]:
        x = vit_layers.ClassToken(name="distillation_token")(x)
    if a["class_token"]:
        x = vit_layers.ClassToken(name="class_token")(x)
    num_embedded_prefix = int(a["class_token"]) + int(a["distillation_token"])
    x = vit_layers.PositionEmbedding(
        plan.grid_size,
        num_prefix_tokens=num_embedded_prefix,
        kind=a["position_embedding"],
        resample_method=a["resample_method"],
        name="position_embedding",
    )(x, grid=patches)
    if a["num_register_tokens"]:
        x = vit_layers.RegisterTokens(
            a["num_register_tokens"], index=num_embedded_prefix, name="register_tokens"
        )(x)
    num_prefix_tokens = num_embedded_prefix + a["num_register_tokens"]
    if a["patch_dropout_rate"]:
        x = vit_layers.PatchDropout(
            a["patch_dropout_rate"],
            num_prefix_tokens=num_prefix_tokens,
            seed=_sublayer_seed(a, 1),
            name="patch_dropout",
        )(x)
    x = keras.layers.Dropout(a["dropout_rate"], seed=_sublayer_seed(a, 0), name="dropout")(x)
    return x, num_prefix_tokens


def _encode(tokens, arguments):
    """The pre-norm Transformer blocks and the final LayerNorm."""
    a = arguments
    rates = np.linspace(0.0, a["drop_path_rate"], a["num_layers"])  # rising to the last block
    for index, drop_path_rate in enumerate(rates):
        tokens = vit_layers.TransformerBlock(
            num_heads=a["num_heads"],
            mlp_dim=a["mlp_dim"],
            dropout_rate=a["dropout_rate"],
            attention_dropout_rate=a["attention_dropout_rate"],
            drop_path_rate=float(drop_path_rate),
            layer_scale_init=a["layer_scale_init"],
            approximate_gelu=a["approximate_gelu"],
            layer_norm_epsilon=a["layer_norm_epsilon"],
            seed=_sublayer_seed(a, 10 * (index + 1)),
            remat=a["remat"],
            name=f"encoderblock_{index}",
        )(tokens)
    return vit_layers.LayerNormalization(epsilon=a["layer_norm_epsilon"], name="encoder_norm")(
        tokens
    )


def _head(tokens, arguments, num_prefix_tokens):
    """Pooling, the optional `pre_logits` layer and the classifier (or the tokens)."""
    a, pooling, x = arguments, arguments["pooling"], tokens
    if pooling == "map":
        x = vit_layers.AttentionPooling(
            a["num_heads"],
            a["mlp_dim"],
            num_prefix_tokens=num_prefix_tokens,
            approximate_gelu=a["approximate_gelu"],
            layer_norm_epsilon=a["layer_norm_epsilon"],
            name="map_head",
        )(tokens)
    elif pooling is not None:
        mode = "gap" if pooling == "avg" else pooling
        x = vit_layers.TokenPooling(mode, num_prefix_tokens=num_prefix_tokens, name="pooling")(
            tokens
        )
    if pooling is not None and a["representation_size"]:
        x = keras.layers.Dense(a["representation_size"], activation="tanh", name="pre_logits")(x)
    if not a["include_top"]:
        return x
    # The head computes in the variable dtype (float32 under mixed
    # precision), so logits and probabilities come out in float32.
    head_dtype = keras.dtype_policies.get(keras.config.dtype_policy()).variable_dtype
    classes, activation = a["classes"], a["classifier_activation"]
    if not a["distillation_token"]:
        return keras.layers.Dense(
            classes,
            activation=activation,
            kernel_initializer="zeros",
            name="head",
            dtype=head_dtype,
        )(x)
    distilled = vit_layers.TokenPooling(
        "token", num_prefix_tokens=num_prefix_tokens, token_index=1, name="distillation_pooling"
    )(tokens)
    logits = [
        keras.layers.Dense(classes, kernel_initializer="zeros", name=head_name, dtype=head_dtype)(
            features
        )
        for head_name, features in (("head", x), ("head_dist", distilled))
    ]
    x = keras.layers.Average(name="head_average", dtype=head_dtype)(logits)
    if activation is not None:
        x = keras.layers.Activation(activation, name="predictions", dtype=head_dtype)(x)
    return x


def takes_channels_first(model):
    """Whether a ViT takes `(batch, channels, height, width)` images (layer `channels_last`)."""
    return any(layer.name == "channels_last" for layer in getattr(model, "layers", ()))


def image_shape(model):
    """`(height, width, channels)` of a ViT's images, whichever its `data_format`."""
    shape = tuple(model.input_shape[1:])
    return channels_last(shape, "channels_first") if takes_channels_first(model) else shape


def default_image_size(model):
    """`(height, width)` of the images a ViT takes unless told otherwise.

    A fixed-size model's input size; for a model of run-time resolution
    (`input_shape=(None, None, C)`), the size its position table is laid
    out for (`base_image_size`), where it computes without resampling.
    """
    size = image_shape(model)[:2]
    if None not in size:
        return size
    grid = model.get_layer("position_embedding").grid_size
    return tuple(g * p for g, p in zip(grid, patch_pixels(model)))


def patch_pixels(model):
    """`(height, width)` in input pixels of one patch of a ViT (a stem's stride included).

    Example:

    >>> model = VisionTransformer(patch_size=1, hidden_dim=8, num_layers=1, num_heads=2,
    ...                           mlp_dim=16, input_shape=(16, 16, 1), classes=2,
    ...                           stem_filters=(4, 8), stem_strides=(2, 2))
    >>> patch_pixels(model)
    (4, 4)
    """
    stride = (
        model.get_layer("stem").stride if any(layer.name == "stem" for layer in model.layers) else 1
    )
    return tuple(side * stride for side in model.get_layer("patch_embedding").patch_size)


def feature_extractor(model, blocks=None):
    """A model that returns the outputs of a ViT's encoder blocks.

    For users who take the model apart (linear probes, dense prediction,
    inspection): the returned model shares the layers and weights of
    `model`, takes the same images, and returns a dict of the token
    sequences after each chosen block (`"encoderblock_{i}"`) and after the
    final LayerNorm (`"encoder_norm"`).

    Args:
        model: a model built by `VisionTransformer` or a `ViT*` builder.
        blocks: iterable of block indices (negative ones count from the
            end), or `None` for every block.

    Returns:
        A `keras.Model` mapping images to
        `{"encoderblock_{i}": (batch, tokens, dim), ..., "encoder_norm": ...}`.

    Example:

    >>> vit = VisionTransformer(
    ...     patch_size=4, hidden_dim=32, num_layers=3, num_heads=2,
    ...     mlp_dim=64, input_shape=(16, 16, 3), classes=10,
    ... )
    >>> features = feature_extractor(vit, blocks=[0, -1])
    >>> sorted(features(keras.ops.zeros((1, 16, 16, 3))))
    ['encoder_norm', 'encoderblock_0', 'encoderblock_2']
    """
    block_layers = encoder_blocks(model)
    indices = range(len(block_layers)) if blocks is None else list(blocks)
    outputs = {}
    for index in indices:
        if not -len(block_layers) <= index < len(block_layers):
            raise ValueError(
                f"Block index {index} is out of range for a model with {len(block_layers)} blocks."
            )
        layer = block_layers[index]
        outputs[layer.name] = layer.output
    outputs["encoder_norm"] = model.get_layer("encoder_norm").output
    return keras.Model(model.input, outputs, name=f"{model.name}_features")


_BUILDER_DOC = """Builds ViT-{variant} ({num_layers} layers, width {hidden_dim}, \
MLP {mlp_dim}, {num_heads} heads, {patch_size}×{patch_size} patches).

    A keras.applications-style builder of `VisionTransformer`; with the
    defaults (224×224×3 inputs, 1000 classes) the model has
    {params} parameters.

    Args:
        include_top: bool, whether to end with the classification head.
        weights: `None`, a registered checkpoint name (e.g.
            `"imagenet21k"`; see `keras_vit.weights.registry.names("{variant}")`)
            or the path of a weights file or checkpoint (see
            `VisionTransformer`).
        input_tensor: optional Keras tensor to use as the image input.
        input_shape: `(height, width, channels)`, multiples of the patch size;
            defaults to the checkpoint's, else `(224, 224, 3)`.
        pooling: `"token"`, `"gap"` (or `"avg"`), `"max"`, or `None` (with
            `include_top=False`); see `VisionTransformer` for the others.
        classes: int, the number of classes; defaults to a checkpoint
            file's head's, else 1000.
        classifier_activation: the head's activation; `None` for logits.
        include_rescaling: bool, whether inputs are `[0, 255]` pixels.
        name: str, the model's name; defaults to `"{model_name}"`.
        **kwargs: any other argument of `VisionTransformer` (e.g.
            `dropout_rate`, `attention_dropout_rate`, `drop_path_rate`,
            `representation_size`, `approximate_gelu`).

    Returns:
        A `keras.Model`.

    Example:

    ```python
    model = keras_vit.{function_name}(input_shape=(384, 384, 3), classes=10)
    model.compile(optimizer="adam", loss="sparse_categorical_crossentropy")
    ```
    """


def _builder(variant):
    architecture = decode_variant(variant)
    function_name = "ViT" + variant.replace("/", "")
    model_name = "vit_" + variant.replace("/", "").lower()

    def builder(
        include_top=True,
        weights=None,
        input_tensor=None,
        input_shape=None,
        pooling=_FROM_WEIGHTS["pooling"],
        classes=_FROM_WEIGHTS["classes"],
        classifier_activation="softmax",
        include_rescaling=True,
        name=model_name,
        **kwargs,
    ):
        return VisionTransformer(
            **architecture,
            include_top=include_top,
            weights=weights,
            input_tensor=input_tensor,
            input_shape=input_shape,
            pooling=pooling,
            classes=classes,
            classifier_activation=classifier_activation,
            include_rescaling=include_rescaling,
            name=name,
            **kwargs,
        )

    builder.__name__ = builder.__qualname__ = function_name
    builder.__doc__ = _BUILDER_DOC.format(
        variant=variant,
        function_name=function_name,
        model_name=model_name,
        params=f"{parameter_count(variant):,}",
        **architecture,
    )
    return builder


BUILDERS = {variant: _builder(variant) for variant in PUBLISHED}
ViTTi16 = BUILDERS["Ti/16"]
ViTS16 = BUILDERS["S/16"]
ViTS32 = BUILDERS["S/32"]
ViTB8 = BUILDERS["B/8"]
ViTB16 = BUILDERS["B/16"]
ViTB32 = BUILDERS["B/32"]
ViTL16 = BUILDERS["L/16"]
ViTL32 = BUILDERS["L/32"]
ViTH14 = BUILDERS["H/14"]
