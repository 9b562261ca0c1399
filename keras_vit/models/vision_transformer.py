"""The Vision Transformer as a functional Keras model."""

import contextlib
import inspect
import math
import typing

import keras
import numpy as np

from keras_vit import _compat
from keras_vit import layers as vit_layers
from keras_vit.layers.patch_embedding import _pair
from keras_vit.models import lora
from keras_vit.models.image_input import (
    DEFAULT_INPUT_SHAPE,
    channels_last,
    pixel_rescaling,
    resolve_data_format,
    validate_input_shape,
)

# keras.applications' "avg" is the paper's "gap" (the mean of the patch tokens).
POOLINGS = ("token", "gap", "avg", "max", "token_gap", "map")


class _BuiltWithWeights(type):
    """`VisionTransformer(..., weights=...)` is a builder's call: resolve, construct, load.

    The constructor takes plain values and reads nothing. Given `weights`,
    the call resolves the arguments the checkpoint implies for those the
    user left unset (`keras_vit.models.checkpoint_arguments`), constructs
    the model with them, then loads the weights, as the `ViT*` builders and
    `from_checkpoint` do (`keras_vit.models.checkpoint.build`).
    """

    def __call__(cls, *args, weights=None, **kwargs):
        if weights is None:
            return super().__call__(*args, **kwargs)
        from keras_vit.models.checkpoint import build  # (it constructs this class)

        given = inspect.signature(cls.__init__).bind_partial(None, *args, **kwargs).arguments
        del given["self"]
        return build(weights, given, cls)


@keras.saving.register_keras_serializable(package="keras_vit")
class VisionTransformer(keras.Model, metaclass=_BuiltWithWeights):
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
            registered for this variant (e.g. `"imagenet"`, the ImageNet-1k
            classifier as in keras.applications, `"imagenet21k"`,
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
            checkpoint's encoder is a `ValueError` naming both. The call
            resolves those arguments, constructs the model from them, then
            loads the weights (`keras_vit.models.checkpoint.build`); the
            constructor itself takes plain values and reads nothing.
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
        qat: `None`, `"int8"` or `"int8_full"`: quantization-aware training
            for LiteRT. The model computes with the rounding that
            `keras_vit.export.tflite(..., quantization=qat)` will apply
            (int8 weights per output channel, int8 activations per tensor
            at the points that mode quantizes, their ranges tracked in
            training; `layers.fake_quantization`), and its LayerNorms only
            normalise (their scale and offset folded into the layers that
            read them). Made from a float model by
            `keras_vit.models.quantization_aware_copy`, which folds and
            calibrates; needs the plain layout: no stem, LayerScale,
            `pre_logits`, distillation token or attention pooling.
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
        input_tensor=None,
        input_shape=None,
        data_format=None,
        pad_to_patches=False,
        pooling="token",
        classes=1000,
        classifier_activation="softmax",
        include_rescaling=True,
        normalization="inception",
        representation_size=None,
        class_token=True,
        distillation_token=False,
        num_register_tokens=0,
        stem_filters=None,
        stem_strides=None,
        stem_downsampling="convolution",
        position_embedding="learned",
        dropout_rate=0.0,
        attention_dropout_rate=0.0,
        drop_path_rate=0.0,
        patch_dropout_rate=0.0,
        layer_scale_init=None,
        approximate_gelu=True,
        layer_norm_epsilon=1e-6,
        base_image_size=None,
        resample_method="bicubic",
        seed=None,
        remat=False,
        qat=None,
        name="vision_transformer",
        trainable=True,
        dtype=None,
    ):
        given = {key: value for key, value in locals().items() if key in _ARGUMENTS}
        # Everything is checked before any weight is created.
        arguments = _checked_arguments(given, input_tensor)
        plan = _plan(arguments)
        # A configuration names its dtype policy; layers take the global one.
        with _global_dtype_policy(dtype):
            if input_tensor is None:
                images = inputs = keras.Input(shape=arguments["input_shape"], name="images")
            else:
                images, inputs = input_tensor, keras.utils.get_source_inputs(input_tensor)
            super().__init__(inputs, _assemble(images, arguments, plan), name=name)
        if plan.remat_scope is not None and plan.remat_scope.mode != "activations":
            # The blocks took the scope over (see `_block_remat`).
            _compat.without_keras_remat([self, *self.operations, *_compat.all_layers(self)])
        self.trainable = trainable
        self._sizes_checked = frozenset()  # input sizes that `_check_image_size` passed
        # What `get_config` returns: the arguments as checked (with `weights=`,
        # a checkpoint's values in place of the defaults), so a file rebuilds
        # this function.
        self._arguments = arguments
        self._grafted = input_tensor is not None and not (
            len(inputs) == 1 and inputs[0] is input_tensor
        )

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

    def quantize(self, mode=None, *args, **kwargs):
        qat = self._arguments["qat"]
        if qat is not None:
            # (Keras quantizes leaf layers only: it would skip every layer
            # that holds quantizers and return the model as it was.)
            raise ValueError(
                f"Model {self.name!r} simulates LiteRT's {qat!r} quantization (qat): export it "
                f"with keras_vit.export.tflite(model, path, quantization={qat!r}), or quantize "
                f"the float model it was copied from. Received: mode={mode!r}"
            )
        return super().quantize(mode, *args, **kwargs)

    def enable_lora(self, rank, target=lora.DEFAULT_TARGETS, alpha=None):
        """LoRA adapters on every block's `target` projections (see `models.lora.enable_lora`)."""
        return lora.enable_lora(self, rank, target=target, alpha=alpha)

    def save_lora_weights(self, path):
        """Writes the adapters and the head to a `.lora.h5` file (`models.lora`)."""
        lora.save_lora_weights(self, path)

    def load_lora_weights(self, path):
        """Reads a `save_lora_weights` file into this model's LoRA (`models.lora`)."""
        lora.load_lora_weights(self, path)

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
            "dtype": _dtype_policy_config(self),
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


# The arguments that a model's configuration holds (all but `input_tensor`
# and what Keras keeps itself: name, trainable, dtype).
_ARGUMENTS = tuple(
    name
    for name in inspect.signature(VisionTransformer.__init__).parameters
    if name not in ("self", "input_tensor", "name", "trainable", "dtype")
)


def _signature_with_weights(constructor):
    """The constructor's signature with the call's `weights` (see `_BuiltWithWeights`)."""
    parameters = list(inspect.signature(constructor).parameters.values())[1:]
    at = [p.name for p in parameters].index("include_top") + 1
    weights = inspect.Parameter("weights", inspect.Parameter.KEYWORD_ONLY, default=None)
    return inspect.Signature(parameters[:at] + [weights] + parameters[at:])


VisionTransformer.__signature__ = _signature_with_weights(VisionTransformer.__init__)


def _checked_arguments(given, input_tensor):
    """The constructor's arguments in the form `get_config` keeps, the input's checked."""
    arguments = dict(given)
    arguments["patch_size"] = _pair(given["patch_size"], "patch_size")
    arguments["data_format"] = data_format = resolve_data_format(given["data_format"])
    input_shape = validate_input_shape(given["input_shape"], input_tensor, data_format)
    arguments["input_shape"] = input_shape
    if given["normalization"] is None:  # (with `weights=`: the checkpoint's)
        arguments["normalization"] = "inception"
    input_shape = channels_last(input_shape, data_format)
    if None not in input_shape[:2]:
        base_image_size = given["base_image_size"]
        if base_image_size is not None:
            if _pair(base_image_size, "base_image_size") != tuple(input_shape[:2]):
                raise ValueError(
                    "base_image_size sets the table of a model of run-time resolution "
                    "(input_shape with None height and width); a fixed-size model's "
                    f"table is laid out for its input. Received: base_image_size="
                    f"{base_image_size!r}, input_shape={input_shape!r}"
                )
        arguments["base_image_size"] = None  # the table is laid out for the input
    return arguments


@contextlib.contextmanager
def _global_dtype_policy(dtype):
    # Every layer takes the global policy; a `DTypePolicyMap` is one too,
    # shared by all layers, each looking its own path up in it.
    if dtype is None:
        yield
        return
    previous = keras.config.dtype_policy()
    keras.config.set_dtype_policy(keras.dtype_policies.get(dtype))
    try:
        yield
    finally:
        keras.config.set_dtype_policy(previous)


def _own_policy(layer):
    """The dtype policy `layer` computes with (its entry, where it holds a `DTypePolicyMap`)."""
    policy = layer.dtype_policy
    if isinstance(policy, keras.dtype_policies.DTypePolicyMap) and layer.path:
        return policy[layer.path]
    return policy


def _dtype_policy_config(model):
    """The model's dtype policy, as `dtype=` rebuilds it: a quantized model's is a map.

    The map (keras-hub's way) names each quantized layer's policy by its
    path (`encoderblock_0/attention/qkv`: `int8_from_float32`), so that the
    rebuilt layers create their quantized variables, whether the model was
    quantized after it was built or built from such a map.
    """
    policy = model.dtype_policy
    quantized = {
        layer.path: _own_policy(layer)
        for layer in _compat.all_layers(model)
        if layer.quantization_mode is not None
    }
    if isinstance(policy, keras.dtype_policies.DTypePolicyMap):
        # A copy: the model's own map is what its layers compute with.
        default, entries = policy.default_policy, {path: policy[path] for path in policy}
    elif quantized:
        default, entries = policy, {}
    else:
        return policy.name
    entries.update({path: p for path, p in quantized.items() if path not in entries})
    return keras.dtype_policies.serialize(keras.dtype_policies.DTypePolicyMap(default, entries))


def _changed_in_place(model):
    """Whether a model's layers were frozen after it was built.

    Not by LoRA: a LoRA model's file holds the merged kernels, the model
    its arguments build.
    """
    if lora.lora_settings(model) is not None:
        return False
    return model.trainable and any(not layer.trainable for layer in model.layers)


class _Plan(typing.NamedTuple):
    """What the arguments make of the image: derived once, checked before any layer."""

    dynamic: bool  # a model of run-time resolution
    rescaling: dict  # `Rescaling`'s scale and offset
    stem: object  # the `ConvStem`, or None
    grid_size: tuple  # the position table's grid
    remat_scope: object  # the active `keras.RematScope`'s mode, or None


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
    rescaling = pixel_rescaling(a["normalization"], input_shape[-1])
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
    vit_layers.fake_quantization.check_qat(a["qat"])
    unsimulated = [
        name
        for name, used in (
            ("stem_filters", a["stem_filters"] is not None),
            ("layer_scale_init", a["layer_scale_init"] is not None),
            ("representation_size", bool(a["representation_size"])),
            ("distillation_token", a["distillation_token"]),
            ("pooling", pooling == "map"),
        )
        if used
    ]
    if a["qat"] is not None and unsimulated:
        raise ValueError(
            f"qat={a['qat']!r} simulates the plain ViT layout; "
            + ", ".join(f"{name}={a[name]!r}" for name in unsimulated)
            + " has layers it does not simulate."
        )
    classes = a["classes"]
    if include_top and (not isinstance(classes, int) or classes < 1):
        raise ValueError(f"`classes` must be a positive int. Received: classes={classes!r}")
    if a["hidden_dim"] % a["num_heads"]:
        raise ValueError(
            f"hidden_dim {a['hidden_dim']} is not divisible by num_heads {a['num_heads']}."
        )
    return _Plan(dynamic, rescaling, stem, grid_size, _compat.remat_scope())


def _assemble(images, arguments, plan):
    """The model's output tensor for `images`: embedding, encoder, head."""
    tokens, num_prefix_tokens = _embed(images, arguments, plan)
    tokens = _encode(tokens, arguments, plan.remat_scope)
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
            qat=a["qat"],
            round_outputs=not a["class_token"],
            name="patch_embedding",
        )(x)
        x = keras.layers.Reshape((-1, width), name="patch_tokens")(patches)
    else:
        x = vit_layers.PatchEmbedding(
            a["patch_size"],
            width,
            pad_to_patches=a["pad_to_patches"],
            qat=a["qat"],
            round_outputs=not a["class_token"],
            name="patch_embedding",
        )(x)
    # Token order: class, distillation, registers, patches. Registers come
    # after the position embeddings, which they have none of.
    if a["distillation_token"]:
        x = vit_layers.ClassToken(name="distillation_token")(x)
    if a["class_token"]:
        # One int8 range for the class token and the patches: LiteRT's
        # convolution then writes the concatenation's scale, where a range
        # of its own would need a requantization (8-bit multiplier in XNNPACK).
        x = vit_layers.ClassToken(name="class_token")(x)
        x = _rounded(x, a["qat"], "class_token", "activations")
    num_embedded_prefix = int(a["class_token"]) + int(a["distillation_token"])
    x = vit_layers.PositionEmbedding(
        plan.grid_size,
        num_prefix_tokens=num_embedded_prefix,
        kind=a["position_embedding"],
        resample_method=a["resample_method"],
        name="position_embedding",
    )(x, grid=patches)
    x = _rounded(x, a["qat"], "position_embedding", "steps")
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


def _encode(tokens, arguments, remat_scope):
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
            remat=a["remat"] or _block_remat(remat_scope, f"encoderblock_{index}", tokens),
            qat=a["qat"],
            name=f"encoderblock_{index}",
        )(tokens)
    return vit_layers.LayerNormalization(
        epsilon=a["layer_norm_epsilon"], qat=a["qat"], name="encoder_norm"
    )(tokens)


def _rounded(x, qat, name, kind):
    """`x` through the quantization point `name` (tokens between layers) if mode `qat` has it."""
    made = vit_layers.fake_quantization.quantizers(qat, {name: kind})
    return made[name](x) if made else x


def _block_remat(scope, name, tokens):
    """Whether a `keras.RematScope` asks block `name` to recompute its activations.

    The blocks hold nearly all of a ViT's activations, and they recompute
    theirs with `remat=True`: `"full"` asks every block, `"larger_than"` a
    block whose tokens (batch counted once) are larger than the threshold,
    `"list_of_layers"` the blocks named. `"activations"` is Keras' own
    (a `Dense` layer's activation function: `pre_logits`, the head).
    """
    if scope is None:
        return False
    if scope.mode == "full":
        return True
    if scope.mode == "larger_than":
        return math.prod(size or 1 for size in tokens.shape) > scope.output_size_threshold
    return scope.mode == "list_of_layers" and name in scope.layer_names


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
        if mode != "token":  # (a slice keeps its input's scale; a mean or a max has its own)
            x = _rounded(x, a["qat"], "pooling", "steps")
    if pooling is not None and a["representation_size"]:
        x = keras.layers.Dense(a["representation_size"], activation="tanh", name="pre_logits")(x)
    if not a["include_top"]:
        return x
    classes, activation = a["classes"], a["classifier_activation"]
    if not a["distillation_token"]:
        head = keras.layers.Dense if a["qat"] is None else vit_layers.QuantizationAwareDense
        return head(
            classes,
            activation=activation,
            kernel_initializer="zeros",
            name="head",
            dtype=_head_dtype_policy("head"),
            **({} if a["qat"] is None else {"qat": a["qat"]}),
        )(x)
    distilled = vit_layers.TokenPooling(
        "token", num_prefix_tokens=num_prefix_tokens, token_index=1, name="distillation_pooling"
    )(tokens)
    logits = [
        keras.layers.Dense(
            classes, kernel_initializer="zeros", name=head_name, dtype=_head_dtype_policy(head_name)
        )(features)
        for head_name, features in (("head", x), ("head_dist", distilled))
    ]
    x = keras.layers.Average(name="head_average", dtype=_head_dtype_policy("head_average"))(logits)
    if activation is not None:
        x = keras.layers.Activation(
            activation, name="predictions", dtype=_head_dtype_policy("predictions")
        )(x)
    return x


def _head_dtype_policy(name):
    """The policy of the head's layer `name`: the variable dtype (float32 under mixed precision).

    Its logits and probabilities then come out in float32, as Keras' mixed
    precision guide asks of a model's last layer; where a `DTypePolicyMap`
    names the layer (a quantized head), that entry.
    """
    policy = keras.config.dtype_policy()
    if isinstance(policy, keras.dtype_policies.DTypePolicyMap) and name in policy:
        return policy
    return policy.variable_dtype
