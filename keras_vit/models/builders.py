"""The builders of the paper's variants, keras.applications-style: `ViTB16(...)` and the others."""

from keras_vit.models.variants import PUBLISHED, decode_variant, parameter_count
from keras_vit.models.vision_transformer import VisionTransformer


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

    A keras.applications-style builder of `VisionTransformer`; with the
    defaults (224×224×3 inputs, 1000 classes) the model has
    {params} parameters.

    Args:
        include_top: bool, whether to end with the classification head.
        weights: `None`, `"imagenet"` (the ImageNet-1k classifier, as in
            keras.applications), another registered checkpoint name (e.g.
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
        return VisionTransformer(
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
