"""keras_vit: the Vision Transformer for Keras 3 (TensorFlow, JAX, PyTorch)."""

from keras_vit import (
    data,
    distribution,
    export,
    inspect,
    layers,
    models,
    ops,
    pretraining,
    training,
    weights,
)
from keras_vit.models import (
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
    decode_variant,
    feature_extractor,
)
from keras_vit.weights import from_checkpoint

__version__ = "0.1.0"
