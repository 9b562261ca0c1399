"""ViT models: the variant table, the model, its builders, and the model a checkpoint describes."""

from keras_vit.models.anatomy import (
    default_image_size,
    feature_extractor,
    image_shape,
    inference_image_shape,
    patch_pixels,
    takes_channels_first,
)
from keras_vit.models.builders import (
    BUILDERS,
    ViT,
    ViTB8,
    ViTB16,
    ViTB32,
    ViTH14,
    ViTL16,
    ViTL32,
    ViTS16,
    ViTS32,
    ViTTi16,
)
from keras_vit.models.checkpoint import from_checkpoint
from keras_vit.models.checkpoint_arguments import checkpoint_architecture
from keras_vit.models.lora import merge_lora
from keras_vit.models.parts import Encoder, Head, ImageInput, Patches, Positions, TokenLayout
from keras_vit.models.preprocessing import preprocess_input
from keras_vit.models.quantization_aware import float_copy, qat_mode, quantization_aware_copy
from keras_vit.models.token_merging import largest_merge, merge_tokens
from keras_vit.models.variants import (
    PUBLISHED,
    SMALL_MODELS,
    decode_variant,
    flop_count,
    parameter_count,
)
from keras_vit.models.vision_transformer import VisionTransformer
from keras_vit.weights import encoder_blocks
