"""Self-supervised pre-training with plain `model.fit`: masked patches and MAE.

See `objectives` for how the pieces fit, `masking` for what the data
pipeline computes, and `pretrain` for the `keras-vit pretrain` job
(its settings: `PretrainingSettings`).
"""

from keras_vit.pretraining.objectives import (
    OBJECTIVES,
    MaskedAutoencoder,
    MaskedPatchPrediction,
    PatchGeometry,
    get_objective,
    patch_geometry,
)
from keras_vit.pretraining.pretrain_job import pretrain
from keras_vit.pretraining.settings import PretrainingSettings
from keras_vit.pretraining.transfer import transfer_encoder

__all__ = [
    "OBJECTIVES",
    "MaskedAutoencoder",
    "MaskedPatchPrediction",
    "PatchGeometry",
    "PretrainingSettings",
    "get_objective",
    "patch_geometry",
    "pretrain",
    "transfer_encoder",
]
