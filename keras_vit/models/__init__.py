"""ViT models: the variant table and the functional builders."""

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
    encoder_blocks,
    feature_extractor,
    patch_pixels,
)
