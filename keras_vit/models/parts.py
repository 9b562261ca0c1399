"""The parts a `VisionTransformer` is assembled from, each with the layers it makes.

A part is a small frozen dataclass: the settings of one stage of the model
(how images come in, how they become patch tokens, which extra tokens
precede them, how positions are told, the encoder, the pooling and head),
checked when it is made, and a method that applies the stage's layers to a
Keras tensor. `VisionTransformer(encoder=Encoder(...), head=Head(...), ...)`
takes them; a model's configuration (`get_config`) is their fields side by
side, each under its argument name (`ARGUMENTS`), as the builders and
`VisionTransformer.from_arguments` take them.

Example:

>>> from keras_vit.models.parts import Encoder, Head, ImageInput, Patches
>>> model = VisionTransformer(  # doctest: +SKIP
...     Encoder(hidden_dim=32, num_layers=2, num_heads=2, mlp_dim=64),
...     image=ImageInput(input_shape=(28, 28, 1)),
...     patches=Patches(patch_size=4),
...     head=Head(classes=10),
... )
"""

import dataclasses
import math

import keras
import numpy as np

from keras_vit import _compat
from keras_vit import layers as vit_layers
from keras_vit.layers.patch_embedding import _pair
from keras_vit.models.image_input import (
    DEFAULT_INPUT_SHAPE,
    channels_last,
    pixel_rescaling,
    resolve_data_format,
    validate_input_shape,
)

# keras.applications' "avg" is the paper's "gap" (the mean of the patch tokens).
POOLINGS = ("token", "gap", "avg", "max", "token_gap", "map")


def _set(part, field, value):
    object.__setattr__(part, field, value)  # (a frozen part normalising its own field)


def _seed(seed, offset):
    return None if seed is None else seed + offset


def quantization_point(x, qat, name, kind):
    """`x` through the quantization point `name` (tokens between layers) if mode `qat` has it."""
    made = vit_layers.fake_quantization.quantizers(qat, {name: kind})
    return made[name](x) if made else x


@dataclasses.dataclass(frozen=True)
class ImageInput:
    """How the model takes images: their shape, layout and pixel normalisation.

    Args:
        input_shape: `(height, width, channels)` (`(channels, height, width)`
            channels-first), `None` for `(224, 224, 3)`; `None` height and
            width for a model of run-time resolution.
        data_format: `"channels_last"`, `"channels_first"`, or `None` for
            `keras.config.image_data_format()`.
        include_rescaling: whether the model takes `[0, 255]` pixels and
            normalises them itself.
        normalization: `"inception"` (to `[-1, 1]`), `"imagenet"` or a
            `(mean, std)` pair in `[0, 1]` units.
    """

    input_shape: tuple = None
    data_format: str = None
    include_rescaling: bool = True
    normalization: object = "inception"

    def __post_init__(self):
        _set(self, "data_format", resolve_data_format(self.data_format))
        if self.normalization is None:  # (with `weights=`: the checkpoint's)
            _set(self, "normalization", "inception")

    def with_input(self, input_tensor):
        """This part with its `input_shape` checked (and taken from `input_tensor`, if given)."""
        checked = dataclasses.replace(
            self, input_shape=validate_input_shape(self.input_shape, input_tensor, self.data_format)
        )
        checked.rescaling()  # (a normalisation that does not fit the channels: refused now)
        return checked

    def rescaling(self):
        """`Rescaling`'s scale and offset for the images' channels (`pixel_rescaling`)."""
        return pixel_rescaling(self.normalization, self.image_size[-1])

    @property
    def image_size(self):
        """`(height, width, channels)` of the images, whatever their layout."""
        return channels_last(self.input_shape, self.data_format)

    @property
    def dynamic(self):
        """Whether the model takes images of any size (run-time resolution)."""
        return None in self.image_size[:2]

    def preprocess(self, images, dtype):
        """Channels last, then `[0, 255]` pixels to the normalised ones."""
        x = images
        if self.data_format == "channels_first":
            x = keras.layers.Permute((2, 3, 1), name="channels_last", dtype=dtype)(x)
        if self.include_rescaling:
            x = keras.layers.Rescaling(**self.rescaling(), name="rescaling", dtype=dtype)(x)
        return x


@dataclasses.dataclass(frozen=True)
class Patches:
    """How the image becomes patch tokens: the patch size and an optional convolutional stem.

    Args:
        patch_size: int or `(height, width)` of a patch.
        pad_to_patches: whether sides that are not multiples of the patch
            size are zero-padded to whole patches (`False` refuses them).
        stem_filters: `None` (patches of pixels) or the channel counts of a
            convolutional stem (`ConvStem`) that the patches are cut from.
        stem_strides: `None` (stride 2 each) or a stride per convolution.
        stem_downsampling: `"convolution"`, `"max_pool"`, or one per stage.
    """

    patch_size: object = 16
    pad_to_patches: bool = False
    stem_filters: tuple = None
    stem_strides: tuple = None
    stem_downsampling: object = "convolution"

    def __post_init__(self):
        _set(self, "patch_size", _pair(self.patch_size, "patch_size"))

    def stem(self, dtype):
        """The `ConvStem` layer, or `None` for patches of pixels."""
        if self.stem_filters is None:
            return None
        return vit_layers.ConvStem(
            self.stem_filters,
            self.stem_strides,
            downsampling=self.stem_downsampling,
            name="stem",
            dtype=dtype,
        )

    def grid_size(self, image_size, stem):
        """The patch grid of an image of `(height, width)` (after the stem)."""
        if stem is not None:
            image_size = stem.output_size(image_size)
        return vit_layers.patch_grid(image_size, self.patch_size, self.pad_to_patches)

    def embed(self, x, stem, width, *, keep_grid, round_outputs, qat, dtype):
        """`(tokens, grid)`: the patch tokens, and their unflattened grid if `keep_grid`."""
        if stem is not None:
            x = stem(x)
        # A model of run-time resolution learns its grid when an image arrives:
        # the positions read it from the unflattened patches.
        patches = vit_layers.PatchEmbedding(
            self.patch_size,
            width,
            flatten=not keep_grid,
            pad_to_patches=self.pad_to_patches,
            qat=qat,
            round_outputs=round_outputs,
            name="patch_embedding",
            dtype=dtype,
        )(x)
        if not keep_grid:
            return patches, None
        tokens = keras.layers.Reshape((-1, width), name="patch_tokens", dtype=dtype)(patches)
        return tokens, patches


@dataclasses.dataclass(frozen=True)
class TokenLayout:
    """The learned tokens before the patches: class, distillation (DeiT), registers.

    Token order: class, distillation, registers, patches. Registers (Darcet
    et al. 2023) have no position embeddings.

    Args:
        class_token: whether to prepend a class token.
        distillation_token: DeiT's distillation token (needs `class_token`
            and `"token"` pooling; the head is then DeiT's two heads).
        num_register_tokens: int >= 0, the number of register tokens.
    """

    class_token: bool = True
    distillation_token: bool = False
    num_register_tokens: int = 0

    def __post_init__(self):
        registers = self.num_register_tokens
        if not isinstance(registers, int) or isinstance(registers, bool) or registers < 0:
            raise ValueError(
                "`num_register_tokens` must be an int >= 0. "
                f"Received: num_register_tokens={registers!r}"
            )

    @property
    def num_embedded(self):
        """The tokens before the patches that have position embeddings."""
        return int(self.class_token) + int(self.distillation_token)

    @property
    def num_prefix(self):
        """Every token before the patches."""
        return self.num_embedded + self.num_register_tokens

    def prepend(self, x, qat, dtype, registers=False):
        """The class and distillation tokens before the patch tokens; with `registers`, those too.

        (Registers join after a position table is added, `insert_registers`;
        where none is, they go in front of the patches before the class
        token: a concatenation with no slicing, whose int8 range in LiteRT
        is then the class token's point's.)
        """
        if registers:
            x = self.insert_registers(x, dtype, index=0)
        if self.distillation_token:
            x = vit_layers.ClassToken(name="distillation_token", dtype=dtype)(x)
        if self.class_token:
            # One int8 range for the class token and the patches: LiteRT's
            # convolution then writes the concatenation's scale, where a range
            # of its own would need a requantization (8-bit multiplier in XNNPACK).
            x = vit_layers.ClassToken(name="class_token", dtype=dtype)(x)
            x = quantization_point(x, qat, "class_token", "activations")
        return x

    def insert_registers(self, x, dtype, index=None):
        """The registers after the first `index` tokens (default: the class and distillation)."""
        if not self.num_register_tokens:
            return x
        index = self.num_embedded if index is None else index
        return vit_layers.RegisterTokens(
            self.num_register_tokens, index=index, name="register_tokens", dtype=dtype
        )(x)


# Position schemes with no table: the attentions turn queries and keys instead.
ROTARY_KINDS = ("rope",)


@dataclasses.dataclass(frozen=True)
class Positions:
    """How the tokens are told their positions: a table added to them, or rotations.

    A learned or a fixed 2-D sin-cos table is added to the embedded tokens
    (`PositionEmbedding`); `"rope"` adds nothing and turns every
    attention's queries and keys by their patches' places on the grid
    (DINOv3's 2-D rotary embedding, `RotaryPositionEmbedding2D`), which
    takes any grid with nothing to resample.

    Args:
        kind: `"learned"`, `"sincos2d"` or `"rope"` (the configuration's
            `position_embedding`).
        base_image_size: int or `(height, width)`, the image size a model
            of run-time resolution lays its table out for (default 224);
            a fixed-size model's table is laid out for its input.
        resample_method: how the table moves to another grid:
            `"bicubic"`, `"bicubic_antialias"` or `"bilinear"`.
        rope_base: the base of the rotary frequencies (DINOv3's
            `rope_theta`), with `kind="rope"`.
    """

    kind: str = dataclasses.field(default="learned", metadata={"argument": "position_embedding"})
    base_image_size: object = None
    resample_method: str = vit_layers.position_embedding.DEFAULT_RESAMPLE_METHOD
    rope_base: float = 100.0

    def __post_init__(self):
        kinds = vit_layers.position_embedding.POSITION_EMBEDDING_KINDS + ROTARY_KINDS
        if self.kind not in kinds:
            raise ValueError(
                f"`position_embedding` must be one of {kinds}. "
                f"Received: position_embedding={self.kind!r}"
            )
        methods = vit_layers.position_embedding.RESAMPLE_METHODS
        if self.resample_method not in methods:
            raise ValueError(
                f"`resample_method` must be one of {methods}. "
                f"Received: resample_method={self.resample_method!r}"
            )
        vit_layers.rotary_position_embedding.check_base(self.rope_base, "rope_base")

    @property
    def rotary(self):
        """Whether the positions are rotations of queries and keys (no table)."""
        return self.kind in ROTARY_KINDS

    def for_input(self, image):
        """This part for `image` (an `ImageInput`): a fixed-size model's table is its input's."""
        if image.dynamic:
            return self
        if self.base_image_size is not None:
            if _pair(self.base_image_size, "base_image_size") != tuple(image.image_size[:2]):
                raise ValueError(
                    "base_image_size sets the table of a model of run-time resolution "
                    "(input_shape with None height and width); a fixed-size model's "
                    f"table is laid out for its input. Received: base_image_size="
                    f"{self.base_image_size!r}, input_shape={image.input_shape!r}"
                )
        return dataclasses.replace(self, base_image_size=None)

    def table_size(self, image):
        """`(height, width)` of the image that the table is laid out for."""
        if image.dynamic:
            return _pair(self.base_image_size or DEFAULT_INPUT_SHAPE[0], "base_image_size")
        return tuple(image.image_size[:2])

    def add(self, x, grid_size, num_prefix_tokens, grid, dtype):
        """The position embeddings added to the tokens (resampled to `grid`'s size if given)."""
        if self.rotary:
            return x
        return vit_layers.PositionEmbedding(
            grid_size,
            num_prefix_tokens=num_prefix_tokens,
            kind=self.kind,
            resample_method=self.resample_method,
            name="position_embedding",
            dtype=dtype,
        )(x, grid=grid)

    def rotation(self, grid, encoder, num_prefix_tokens, dtype):
        """The rotation every attention applies (`None` for a table): one per image size."""
        if not self.rotary:
            return None
        return vit_layers.RotaryPositionEmbedding2D(
            encoder.hidden_dim // encoder.num_heads,
            base=self.rope_base,
            num_prefix_tokens=num_prefix_tokens,
            name="rotary_embedding",
            dtype=dtype,
        )(grid)


@dataclasses.dataclass(frozen=True)
class Encoder:
    """The pre-norm Transformer blocks, their regularisation, and the final LayerNorm.

    Args:
        hidden_dim: the token width `D` (a multiple of `num_heads`).
        num_layers: the number of blocks.
        num_heads: the number of attention heads.
        mlp_dim: the hidden width of the MLPs.
        layer_scale_init: `None`, or LayerScale's initial value.
        approximate_gelu: tanh-approximated GELU (the original ViT's) or exact.
        mlp: `"gelu"` (the paper's MLP) or `"swiglu"` (gated, `SwiGLUDense`:
            DINOv3's S+ and H+), of hidden width `mlp_dim`.
        layer_norm_epsilon: epsilon of every LayerNorm.
        dropout_rate: dropout after the embeddings and in the blocks.
        attention_dropout_rate: dropout on attention probabilities.
        drop_path_rate: stochastic depth of the last block, rising from 0.
        patch_dropout_rate: in `[0, 1)`, the share of patch tokens that
            training drops before the blocks (needs a fixed input size).
        seed: int or `None`, seed of the dropouts.
        remat: whether training recomputes each block's activations in the
            backward pass (gradient checkpointing).
    """

    hidden_dim: int = 768
    num_layers: int = 12
    num_heads: int = 12
    mlp_dim: int = 3072
    layer_scale_init: float = None
    approximate_gelu: bool = True
    mlp: str = "gelu"
    layer_norm_epsilon: float = 1e-6
    dropout_rate: float = 0.0
    attention_dropout_rate: float = 0.0
    drop_path_rate: float = 0.0
    patch_dropout_rate: float = 0.0
    seed: int = None
    remat: bool = False

    def __post_init__(self):
        if self.hidden_dim % self.num_heads:
            raise ValueError(
                f"hidden_dim {self.hidden_dim} is not divisible by num_heads {self.num_heads}."
            )
        vit_layers.transformer_block.check_mlp(self.mlp)
        vit_layers.patch_dropout.check_rate(self.patch_dropout_rate, "patch_dropout_rate")
        if not isinstance(self.remat, bool):
            raise TypeError(f"`remat` must be a bool. Received: remat={self.remat!r}")

    def encode(self, tokens, num_prefix_tokens, *, qat, remat_scope, dtype, rotation=None):
        """Patch dropout and dropout of the embedded tokens, the blocks, the final LayerNorm.

        `rotation`: a `RotaryPositionEmbedding2D`'s, handed to every block.
        """
        rotated = {} if rotation is None else {"rotation": rotation}
        entry = _compat.producing_layer(tokens)
        x = tokens
        if self.patch_dropout_rate:
            x = vit_layers.PatchDropout(
                self.patch_dropout_rate,
                num_prefix_tokens=num_prefix_tokens,
                seed=_seed(self.seed, 1),
                name="patch_dropout",
                dtype=dtype,
            )(x)
        x = keras.layers.Dropout(
            self.dropout_rate, seed=_seed(self.seed, 0), name="dropout", dtype=dtype
        )(x)
        rates = np.linspace(0.0, self.drop_path_rate, self.num_layers)  # rising to the last block
        for index, drop_path_rate in enumerate(rates):
            name = f"encoderblock_{index}"
            block = vit_layers.TransformerBlock(
                num_heads=self.num_heads,
                mlp_dim=self.mlp_dim,
                dropout_rate=self.dropout_rate,
                attention_dropout_rate=self.attention_dropout_rate,
                drop_path_rate=float(drop_path_rate),
                layer_scale_init=self.layer_scale_init,
                approximate_gelu=self.approximate_gelu,
                layer_norm_epsilon=self.layer_norm_epsilon,
                mlp=self.mlp,
                seed=_seed(self.seed, 10 * (index + 1)),
                remat=self.remat or _block_remat(remat_scope, name, x),
                qat=qat,
                name=name,
                dtype=dtype,
            )
            if index == 0 and isinstance(entry, vit_layers.fake_quantization.ActivationQuantizer):
                # The tokens enter int8 in LiteRT (a point's outputs, no table
                # added after it), and LiteRT's MEAN keeps its input's scale.
                block.attention_norm.round_to_input_levels = _levels_of(entry)
            x = block(x, **rotated)
        return vit_layers.LayerNormalization(
            epsilon=self.layer_norm_epsilon, qat=qat, name="encoder_norm", dtype=dtype
        )(x)


def _levels_of(quantizer):
    """The rounding to `quantizer`'s int8 levels, its range left as it is."""
    return lambda x: quantizer(x, training=False)


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


@dataclasses.dataclass(frozen=True)
class Head:
    """Pooling, an optional tanh `pre_logits` layer and the classifier.

    Args:
        include_top: whether to end with the classifier (else features).
        pooling: `"token"`, `"gap"` (or `"avg"`), `"max"`, `"token_gap"`,
            `"map"` (attention pooling, layer `map_head`), or `None` with
            `include_top=False` for every token.
        classes: the classifier's class count.
        classifier_activation: the classifier's activation (`None`: logits).
        representation_size: `None`, or the width of a `pre_logits` layer.
    """

    include_top: bool = True
    pooling: str = "token"
    classes: int = 1000
    classifier_activation: object = "softmax"
    representation_size: int = None

    def __post_init__(self):
        if self.pooling not in POOLINGS and not (self.pooling is None and not self.include_top):
            allowed = POOLINGS if self.include_top else POOLINGS + (None,)
            raise ValueError(
                f"`pooling` must be one of {allowed} (None only with "
                f"include_top=False). Received: pooling={self.pooling!r}"
            )
        classes = self.classes
        if self.include_top and (not isinstance(classes, int) or classes < 1):
            raise ValueError(f"`classes` must be a positive int. Received: classes={classes!r}")

    def check_tokens(self, tokens):
        """Refuses a pooling that reads a token `tokens` (a `TokenLayout`) does not have."""
        if self.pooling in ("token", "token_gap") and not tokens.class_token:
            raise ValueError(
                f"pooling={self.pooling!r} needs a class token. Received: class_token=False"
            )
        if tokens.distillation_token and not (tokens.class_token and self.pooling == "token"):
            raise ValueError(
                "distillation_token=True needs class_token=True and "
                f"pooling='token'. Received: class_token={tokens.class_token!r}, "
                f"pooling={self.pooling!r}"
            )
        if tokens.distillation_token and self.include_top and self.representation_size:
            raise ValueError(
                "distillation_token=True has two heads and no pre_logits layer. "
                f"Received: representation_size={self.representation_size!r}"
            )

    def apply(self, tokens, encoder, layout, *, qat, dtype):
        """The head's output for the encoder's `tokens` (or the tokens, with no pooling)."""
        x, num_prefix_tokens = tokens, layout.num_prefix
        if self.pooling == "map":
            x = vit_layers.AttentionPooling(
                encoder.num_heads,
                encoder.mlp_dim,
                num_prefix_tokens=num_prefix_tokens,
                approximate_gelu=encoder.approximate_gelu,
                layer_norm_epsilon=encoder.layer_norm_epsilon,
                qat=qat,
                name="map_head",
                dtype=dtype,
            )(tokens)
        elif self.pooling is not None:
            mode = "gap" if self.pooling == "avg" else self.pooling
            x = vit_layers.TokenPooling(
                mode, num_prefix_tokens=num_prefix_tokens, name="pooling", dtype=dtype
            )(tokens)
            if mode != "token":  # (a slice keeps its input's scale; a mean or a max has its own)
                x = quantization_point(x, qat, "pooling", "steps")
        if self.pooling is not None and self.representation_size:
            x = keras.layers.Dense(
                self.representation_size, activation="tanh", name="pre_logits", dtype=dtype
            )(x)
        if not self.include_top:
            return x
        if layout.distillation_token:
            return self._distilled(x, tokens, num_prefix_tokens, dtype)
        head = keras.layers.Dense if qat is None else vit_layers.QuantizationAwareDense
        return head(
            self.classes,
            activation=self.classifier_activation,
            kernel_initializer="zeros",
            name="head",
            dtype=_head_dtype_policy("head", dtype),
            **({} if qat is None else {"qat": qat}),
        )(x)

    def _distilled(self, x, tokens, num_prefix_tokens, dtype):
        """DeiT's two heads (class and distillation token), their logits averaged."""
        distilled = vit_layers.TokenPooling(
            "token",
            num_prefix_tokens=num_prefix_tokens,
            token_index=1,
            name="distillation_pooling",
            dtype=dtype,
        )(tokens)
        logits = [
            keras.layers.Dense(
                self.classes,
                kernel_initializer="zeros",
                name=head_name,
                dtype=_head_dtype_policy(head_name, dtype),
            )(features)
            for head_name, features in (("head", x), ("head_dist", distilled))
        ]
        x = keras.layers.Average(
            name="head_average", dtype=_head_dtype_policy("head_average", dtype)
        )(logits)
        if self.classifier_activation is not None:
            x = keras.layers.Activation(
                self.classifier_activation,
                name="predictions",
                dtype=_head_dtype_policy("predictions", dtype),
            )(x)
        return x


def encoder_pooling(class_token):
    """The pooling of a classifier on an encoder's tokens: its class token, else their mean.

    What a head added to an encoder-only file (pre-training's, a backbone's)
    reads, and what a checkpoint without a recorded pooling is read with.
    """
    return "token" if class_token else "gap"


def _head_dtype_policy(name, dtype):
    """The policy of the head's layer `name`: the variable dtype (float32 under mixed precision).

    Its logits and probabilities then come out in float32, as Keras' mixed
    precision guide asks of a model's last layer; where a `DTypePolicyMap`
    names the layer (a quantized head), that entry.
    """
    policy = keras.dtype_policies.get(dtype)  # (None: the global policy)
    if isinstance(policy, keras.dtype_policies.DTypePolicyMap) and name in policy:
        return policy
    return policy.variable_dtype


# The parts, under the constructor argument that takes each.
PARTS = {
    "image": ImageInput,
    "patches": Patches,
    "tokens": TokenLayout,
    "positions": Positions,
    "encoder": Encoder,
    "head": Head,
}


def _fields(part_class):
    """`(argument name, field name)` of each field of a part class."""
    return [
        (field.metadata.get("argument", field.name), field.name)
        for field in dataclasses.fields(part_class)
    ]


# A model's flat arguments (its configuration's keys), each the field of one part.
PART_ARGUMENTS = {
    argument: (part, field)
    for part, part_class in PARTS.items()
    for argument, field in _fields(part_class)
}


def default_arguments():
    """`{argument: default}` of every part's fields."""
    return {
        argument: next(f.default for f in dataclasses.fields(PARTS[part]) if f.name == field)
        for argument, (part, field) in PART_ARGUMENTS.items()
    }


def parts_from_arguments(arguments):
    """`{part name: part}` made from flat arguments (unset fields take their defaults).

    Raises:
        TypeError: for a name that is no part's field.
    """
    unknown = sorted(set(arguments) - set(PART_ARGUMENTS))
    if unknown:
        raise TypeError(f"Unknown VisionTransformer arguments: {unknown}.")
    fields = {part: {} for part in PARTS}
    for argument, value in arguments.items():
        part, field = PART_ARGUMENTS[argument]
        fields[part][field] = value
    return {part: PARTS[part](**fields[part]) for part in PARTS}


def arguments_of(parts):
    """The flat arguments of `{part name: part}` (the inverse of `parts_from_arguments`)."""
    return {
        argument: getattr(parts[part], field) for argument, (part, field) in PART_ARGUMENTS.items()
    }
