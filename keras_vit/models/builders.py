"""The builders, keras.applications-style: `ViT(...)` of any size, `ViTB16(...)` and the others.

A builder takes the model's flat arguments (its parts' fields, as
`get_config` writes them) and `weights=`: it resolves what a checkpoint
decides, constructs the `VisionTransformer` from its parts, then loads the
weights (`keras_vit.models.checkpoint.build`).
"""

from keras_vit.models.checkpoint import build
from keras_vit.models.variants import PUBLISHED, decode_variant, parameter_count
from keras_vit.models.vision_transformer import VisionTransformer


def ViT(
    patch_size=16,
    hidden_dim=768,
    num_layers=12,
    num_heads=12,
    mlp_dim=3072,
    *,
    weights=None,
    **arguments,
):
    """Builds a Vision Transformer of any size from flat arguments, with optional weights.

    The model is a `VisionTransformer` assembled from its parts
    (`keras_vit.models.parts`); the arguments are the parts' fields under
    their names (those `get_config` writes), so `ViT(**config)` rebuilds a
    configuration. Arguments marked "the checkpoint's" are taken from the
    checkpoint given as `weights` unless set.

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
            loads the weights (`keras_vit.models.checkpoint.build`).
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
        position_embedding: `"learned"` or `"sincos2d"` (fixed), tables added
            to the tokens; or `"rope"`: no table, every attention turns its
            queries and keys by their patches' places (DINOv3's 2-D rotary
            embedding, any resolution with nothing to resample; the
            checkpoint's with a DINOv3 file).
        rope_base: the base of the rotary frequencies (DINOv3's
            `rope_theta`, 100), with `position_embedding="rope"`.
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
            `"mixed_bfloat16"`) for every layer.

    Returns:
        A `VisionTransformer`: logits or probabilities `(batch, classes)`;
        with `include_top=False`, features `(batch, hidden_dim)` (or
        `representation_size`), or tokens `(batch, num_tokens, hidden_dim)`
        with `pooling=None`.

    Example:

    >>> model = ViT(
    ...     patch_size=4, hidden_dim=32, num_layers=2, num_heads=2,
    ...     mlp_dim=64, input_shape=(28, 28, 1), classes=10,
    ... )
    >>> model.output_shape
    (None, 10)
    """
    arguments.update(
        patch_size=patch_size,
        hidden_dim=hidden_dim,
        num_layers=num_layers,
        num_heads=num_heads,
        mlp_dim=mlp_dim,
    )
    if weights is None:
        return VisionTransformer.from_arguments(**arguments)
    return build(weights, arguments)


class _CheckpointsOr:
    """The default of a builder argument that a checkpoint decides: its value, else `default`."""

    def __init__(self, default):
        self.default = default

    def __repr__(self):
        return f"<the checkpoint's, else {self.default!r}>"


_CHECKPOINTS_POOLING = _CheckpointsOr("token")
_CHECKPOINTS_CLASSES = _CheckpointsOr(1000)

_BUILDER_DOC = """Builds ViT-{variant} ({num_layers} layers, width {hidden_dim}, \
MLP {mlp_dim}, {num_heads} heads, {patch_size}×{patch_size} patches).

    A keras.applications-style builder (`ViT` with this variant's sizes); with the
    defaults (224×224×3 inputs, 1000 classes) the model has
    {params} parameters.

    Args:
        include_top: bool, whether to end with the classification head.
        weights: `None`, `"imagenet"` (the ImageNet-1k classifier, as in
            keras.applications), another registered checkpoint name (e.g.
            `"imagenet21k"`; see `keras_vit.weights.registry.names("{variant}")`)
            or the path of a weights file or checkpoint (see
            `ViT`).
        input_tensor: optional Keras tensor to use as the image input.
        input_shape: `(height, width, channels)`, multiples of the patch size;
            defaults to the checkpoint's, else `(224, 224, 3)`.
        pooling: `"token"`, `"gap"` (or `"avg"`), `"max"`, or `None` (with
            `include_top=False`); see `ViT` for the others.
        classes: int, the number of classes; defaults to a checkpoint
            file's head's, else 1000.
        classifier_activation: the head's activation; `None` for logits.
        include_rescaling: bool, whether inputs are `[0, 255]` pixels.
        name: str, the model's name; defaults to `"{model_name}"`.
        **kwargs: any other argument of `ViT` (e.g.
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
        pooling=_CHECKPOINTS_POOLING,
        classes=_CHECKPOINTS_CLASSES,
        classifier_activation="softmax",
        include_rescaling=True,
        name=model_name,
        **kwargs,
    ):
        # Left unset, the checkpoint's (else the constructor's default).
        chosen = {
            name: value
            for name, value in (("pooling", pooling), ("classes", classes))
            if not isinstance(value, _CheckpointsOr)
        }
        return ViT(
            **architecture,
            include_top=include_top,
            weights=weights,
            input_tensor=input_tensor,
            input_shape=input_shape,
            classifier_activation=classifier_activation,
            include_rescaling=include_rescaling,
            name=name,
            **chosen,
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
