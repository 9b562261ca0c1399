"""Self-supervised pre-training with plain `model.fit`: masked patches and MAE.

See `objectives` for how the pieces fit, `masking` for what the data
pipeline computes, and `pretrain` for the `keras-vit pretrain` job.
"""

from keras_vit.pretraining.loop import pretrain
from keras_vit.pretraining.objectives import (
    OBJECTIVES,
    MaskedAutoencoder,
    MaskedPatchPrediction,
    PatchGeometry,
    get_objective,
    patch_geometry,
)
from keras_vit.pretraining.transfer import transfer_encoder

__all__ = [
    "OBJECTIVES",
    "MaskedAutoencoder",
    "MaskedPatchPrediction",
    "PatchGeometry",
    "get_objective",
    "patch_geometry",
    "pretrain",
    "transfer_encoder",
]
