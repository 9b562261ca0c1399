"""What a model's name (`--model`) says: its architecture, image size and channels.

The training and pretraining jobs both build their models from a name: the
main job's small models (`"small"`, `"small/4"`) or a variant of the
paper's table (`"S/16"`).
"""

from keras_vit import _options
from keras_vit.models.variants import SMALL_MODELS


def model_arguments(model, patch_size=None):
    """`VisionTransformer` architecture arguments for a model name.

    Args:
        model: `"small"` (the default of `keras-vit train`: a hybrid with
            a convolutional stem), `"small/4"` (the same width on 4x4 pixel
            patches, the default of `keras-vit pretrain`) or a variant of
            the paper's table (`"Ti/16"`, `"S/16"`, ...).
        patch_size: int or `None`, overrides the patch size.
    """
    from keras_vit.models import decode_variant

    if model in SMALL_MODELS:
        arguments = dict(SMALL_MODELS[model])
    else:
        try:
            arguments = dict(decode_variant(model), pooling="token", class_token=True)
        except ValueError as error:
            raise ValueError(
                f"{_options.given('model', model)} is not a model of keras_vit's: "
                f"{', '.join(map(repr, SMALL_MODELS))} (the small models) or a variant of the "
                f"paper ({error})."
            ) from None
    if patch_size is not None:
        arguments["patch_size"] = patch_size
    return arguments


def stem_strides(arguments):
    """The strides of a model's convolutional stem (`()` without one)."""
    filters = arguments.get("stem_filters") or ()
    return tuple(arguments.get("stem_strides") or (2,) * len(filters))


def check_image_size(image_size, patch_size, stem_strides=()):
    """A clear error unless `image_size` cuts into whole patches, two or more.

    With a convolutional stem the patches are cut from its feature map, so
    `patch_size` is in pixels of that map: the messages say so.
    """
    from keras_vit.layers.conv_stem import stem_output_side
    from keras_vit.layers.patch_embedding import patch_grid

    if not isinstance(image_size, int) or isinstance(image_size, bool) or image_size < 1:
        raise ValueError(f"{_options.given('image_size', image_size)} is not a positive int.")
    side = stem_output_side(image_size, stem_strides)
    try:
        patch_grid((side, side), patch_size)  # (the layer's rule, in the command's words below)
        whole = True
    except ValueError:
        whole = False
    if not whole:
        if side == image_size:
            raise ValueError(
                f"{_options.given('image_size', image_size)} is not a positive multiple of "
                f"the patch size {patch_size}."
            )
        raise ValueError(
            f"{_options.given('image_size', image_size)} leaves a {side}-pixel feature map "
            f"after the stem (strides {tuple(stem_strides)}, each halving rounded up), not a "
            f"multiple of the patch size {patch_size}."
        )
    patches = (side // patch_size) ** 2
    if patches < 2:
        where = f"{image_size}x{image_size} images"
        if side != image_size:
            stride = 1
            for step in stem_strides:
                stride *= step
            where = (
                f"the {side}x{side} feature map that the model's convolutional stem makes of "
                f"{image_size}x{image_size} images (a patch of {patch_size} of its pixels is "
                f"{patch_size * stride}x{patch_size * stride} image pixels)"
            )
        raise ValueError(
            f"A patch size of {patch_size} cuts {where} into {patches} patch: a ViT needs two "
            f"or more. Use a smaller {_options.name('patch_size')} or a larger "
            f"{_options.name('image_size')}."
        )


def image_size_for(model):
    """A model name's image size: Fashion-MNIST's for the small models, else 224."""
    return 28 if model in SMALL_MODELS else 224


def default_channels(dataset, model):
    """Fashion-MNIST's grey images for the small models, else colour."""
    return 1 if (dataset == "fashion_mnist" and model in SMALL_MODELS) else 3
