"""The settings of a pre-training run (`keras-vit pretrain`): a run's, and the objective's.

`PretrainingSettings` extends the settings every run has
(`keras_vit.training.settings.RunSettings`) with the objective and the
encoder; the command builds its parser from its fields, the run records
them in `run.json`.
"""

import dataclasses

from keras_vit._options import fraction, positive_int
from keras_vit.models.variants import SMALL_MODELS
from keras_vit.training.settings import RunSettings, setting

# MAE's decoder for the small models (its paper's is 512 wide, 8 deep,
# 16 heads, for encoders of width 768 and more).
SMALL_DECODER = dict(decoder_dim=64, decoder_depth=2, decoder_heads=4)


def _of(objective):
    """Which objective's option a field is (see `PretrainingSettings.options`)."""
    return {"objective": objective}


@dataclasses.dataclass(frozen=True)
class PretrainingSettings(RunSettings):
    """The settings of `keras_vit.pretraining.pretrain` (`keras-vit pretrain`).

    The objective's options come from `objective_options` (a dict, any
    option of the objective) and from the fields that the command line
    offers for them (`target`, `corruption_rate` for `"mpp"`; `mask_ratio`,
    `decoder_*` for `"mae"`), which win.
    """

    objective: str = setting(
        "mpp",
        "masked patch prediction (the paper's) or MAE",
        choices=("mpp", "mae"),
    )
    objective_options: dict = setting(None, "the objective's options", option=False)
    model: str = setting("small/4", "'small/4' or a variant of the paper, e.g. Ti/16")
    patch_size: int = setting(
        None, "patch size in pixels (default: the model's)", type=positive_int
    )
    target: str = setting(
        None,
        "mpp: what to predict per corrupted patch",
        choices=("mean_color", "color_grid", "pixels"),
        recorded=False,
    )
    corruption_rate: float = setting(
        None, "mpp: fraction of patches corrupted", type=fraction, recorded=False
    )
    mask_ratio: float = setting(
        None, "mae: fraction of patches dropped", type=fraction, recorded=False
    )
    decoder_dim: int = setting(None, "mae decoder width", type=positive_int, recorded=False)
    decoder_depth: int = setting(None, "mae decoder blocks", type=positive_int, recorded=False)
    decoder_heads: int = setting(None, "mae decoder heads", type=positive_int, recorded=False)

    JOB_DEFAULTS = {
        "pretrain": dict(
            epochs=10, batch_size=128, recipe="small", output_dir="keras_vit_pretrain"
        ),
    }
    # The objective each command-line option belongs to.
    OBJECTIVE_FIELDS = {
        "mpp": ("target", "corruption_rate"),
        "mae": ("mask_ratio", "decoder_dim", "decoder_depth", "decoder_heads"),
    }

    @property
    def job(self):
        return "pretrain"

    def resolved(self):
        """The job's defaults; the objective's options as one dict (MAE's small decoder)."""
        settings = super().resolved()
        options = dict(self.objective_options or {})
        for name in self.OBJECTIVE_FIELDS.get(self.objective, ()):
            if getattr(self, name) is not None:
                options[name] = getattr(self, name)
        if self.objective == "mae" and self.model in SMALL_MODELS:
            options = {**SMALL_DECODER, **options}
        return dataclasses.replace(settings, objective_options=options)

    def recorded(self):
        record = super().recorded()
        objective = self.objective
        if not isinstance(objective, str):  # an objective object of the user's
            record["objective"] = getattr(objective, "name", type(objective).__name__)
        return record


# The command's defaults where they differ from Python's.
COMMAND_DEFAULTS = {
    "pretrain": {
        **PretrainingSettings.JOB_DEFAULTS["pretrain"],
        "target": "mean_color",
        "corruption_rate": 0.5,
        "mask_ratio": 0.75,
    }
}
