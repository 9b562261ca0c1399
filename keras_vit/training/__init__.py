"""Training: the paper's recipes and the `keras-vit train` job."""

from keras_vit.training.backup import CrashSafeBackup, StopOnNonFiniteLoss, latest_checkpoint
from keras_vit.training.batch_norm_statistics import (
    PreciseBatchNorm,
    recompute_batch_norm_statistics,
)
from keras_vit.training.curves import plot_history
from keras_vit.training.distillation import Distiller, load_teacher
from keras_vit.training.finetuning import fit_new_heads
from keras_vit.training.model_names import model_arguments
from keras_vit.training.recipes import (
    RECIPES,
    Recipe,
    WarmupDecay,
    finetuning_optimizer,
    get_recipe,
    layer_decay_scales,
    no_weight_decay_variables,
    pretraining_optimizer,
)
from keras_vit.training.run import Run
from keras_vit.training.settings import RunSettings, TrainingSettings
from keras_vit.training.train_job import DEFAULTS, SMALL_MODEL, train
