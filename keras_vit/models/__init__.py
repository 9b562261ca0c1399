"""ViT models: the variant table, the functional builders, and the model a checkpoint describes."""

from keras_vit.models.checkpoint import checkpoint_architecture, from_checkpoint
from keras_vit.models.preprocessing import preprocess_input
from keras_vit.models.token_merging import largest_merge, merge_tokens
from keras_vit.models.variants import (
    PUBLISHED,
    SMALL_MODELS,
    decode_variant,
    flop_count,
    parameter_count,
)
from keras_vit.models.vision_transformer import (
    BUILDERS,
    VisionTransformer,
    ViTB8,
    ViTB16,
    ViTB32,
    ViTH14,
    ViTL16,
    ViTL32,
    ViTS16,
    ViTS32,
    ViTTi16,
    default_image_size,
    feature_extractor,
    image_shape,
    patch_pixels,
    takes_channels_first,
)
from keras_vit.weights import encoder_blocks
