"""keras_vit: the Vision Transformer for Keras 3 (TensorFlow, JAX, PyTorch).

`import keras_vit` loads the library floor: layers, models, checkpoints and
the optimizers that trained models name. The application floor (`data`,
`training`, `pretraining`, `export`, `inspect`, `distribution`) loads when a
program first uses it, e.g. `keras_vit.training.train(...)`: a program that
only builds or loads models imports none of the pipelines, jobs or
exporters.
"""

import importlib

from keras_vit import labels, layers, models, ops, optimizers, weights
from keras_vit.labels import decode_predictions
from keras_vit.models import (
    VisionTransformer,
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
    decode_variant,
    feature_extractor,
    from_checkpoint,
    preprocess_input,
)

__version__ = "0.1.0"

_APPLICATION_FLOOR = ("data", "distribution", "export", "inspect", "pretraining", "training")


def __getattr__(name):
    # PEP 562: `keras_vit.training` etc. import on first use.
    if name in _APPLICATION_FLOOR:
        return importlib.import_module(f"{__name__}.{name}")
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def __dir__():
    return sorted(set(globals()) | set(_APPLICATION_FLOOR))
