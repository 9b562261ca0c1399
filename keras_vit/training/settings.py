"""A training run's settings: one dataclass, each field with its option, help and check.

`keras-vit train` and `keras-vit finetune` build their parsers from the
fields of `TrainingSettings` (`keras-vit pretrain` from
`keras_vit.pretraining.PretrainingSettings`, which shares `RunSettings`);
a run records them in `run.json` (`recorded()`); the messages about them
name the option the user typed (`keras_vit._options`); and
`keras_vit.training.train` takes a `TrainingSettings`, or keywords that
build one.

Example:

```python
settings = TrainingSettings("photos/", model="Ti/16", image_size=64, epochs=5)
keras_vit.training.train(settings)
```
"""

import dataclasses
import os

from keras_vit import _options
from keras_vit._options import (
    decay_factor,
    fraction,
    non_negative_int,
    positive_float,
    positive_int,
)


def setting(
    default,
    help,  # noqa: A002  (argparse's word)
    *,
    option=None,
    type=None,  # noqa: A002
    metavar=None,
    choices=None,
    commands=None,
    recorded=True,
    check=None,
):
    """A settings field: its default, its command-line option and help, and its check.

    Args:
        default: the Python default (the commands may show another:
            `COMMAND_DEFAULTS`).
        help: the command line's help.
        option: the option (default: `--` and the name with dashes); `False`
            for none; a name in capitals for a positional argument.
        type: the command line's value type (`keras_vit._options`); a bool
            field is a flag.
        metavar, choices: as argparse takes them.
        commands: the commands that offer it (default: all of its job's).
        recorded: whether `run.json` records it: `True`, `False`, or a
            function of the settings.
        check: a function of the value that raises a `ValueError` or
            `TypeError` naming the argument (`keras_vit._options.given`).
    """
    return dataclasses.field(
        default=default,
        metadata=dict(
            help=help,
            option=option,
            type=type,
            metavar=metavar,
            choices=choices,
            commands=commands,
            recorded=recorded,
            check=check,
        ),
    )


def path_reference(path):
    """How a run records a file or folder: by its absolute path where it exists."""
    return (
        os.path.abspath(os.fspath(path))
        if path is not None and os.path.exists(os.fspath(path))
        else path
    )


# --- checks of one value (the settings' own: before any data is read) ----------------


def _positive(name, value):
    if not isinstance(value, int) or isinstance(value, bool) or value < 1:
        raise ValueError(
            f"{_options.name(name)} must be a positive int. Received: {_options.given(name, value)}"
        )


def _check_epochs(value):
    _positive("epochs", value)


def _check_batch_size(value):
    _positive("batch_size", value)


def _check_optional_positive(name):
    def check(value):
        if value is not None and (
            not isinstance(value, int) or isinstance(value, bool) or value < 1
        ):
            raise ValueError(
                f"{_options.name(name)} must be None or a positive int. "
                f"Received: {_options.given(name, value)}"
            )

    return check


def _check_accumulation(value):
    if value is not None and (not isinstance(value, int) or isinstance(value, bool) or value < 2):
        raise ValueError(
            f"{_options.name('gradient_accumulation_steps')} must be None or an int >= 2. "
            f"Received: {_options.given('gradient_accumulation_steps', value)}"
        )


def _check_flag(name):
    def check(value):
        if not isinstance(value, bool):
            raise TypeError(f"{_options.name(name)} must be a bool. Received: {name}={value!r}")

    return check


def _check_recipe(value):
    from keras_vit.training.recipes import get_recipe

    get_recipe(value)


def _check_augmentation(value):
    from keras_vit.data.augmentation import get_config

    get_config(value)


def _check_validation_split(value):
    if value is not None:
        from keras_vit.data.folders import check_validation_split

        check_validation_split(value)


def _check_patch_dropout(value):
    if value is not None:
        from keras_vit.layers.patch_dropout import check_rate

        check_rate(value, "patch_dropout_rate")


def _check_layer_decay(value):
    if value is not None:
        from keras_vit.training.recipes import check_layer_decay

        check_layer_decay(value)


def _check_ema(value):
    if value is not None:
        from keras_vit.training.recipes import check_ema_momentum

        check_ema_momentum(value)


def _check_lora(value):
    if value is not None:
        from keras_vit.models.lora import check_rank

        check_rank(value, "lora")


def _check_lora_target(value):
    if value is not None:
        from keras_vit.models.lora import check_targets

        if not isinstance(value, str):
            raise TypeError(
                f"{_options.name('lora_target')} must be a str of comma-separated names. "
                f"Received: {_options.given('lora_target', value)}"
            )
        check_targets(lora_targets(value), "lora_target")


def _check_qat(value):
    if value is not None:
        from keras_vit.layers.fake_quantization import check_qat

        check_qat(value)


def lora_targets(value):
    """The projections named by a `lora_target` setting (`"query,value"`), as a tuple."""
    return tuple(name.strip() for name in value.split(","))


@dataclasses.dataclass(frozen=True)
class RunSettings:
    """What every job's run takes: its data, its schedule, its output folder.

    `epochs`, `batch_size`, `recipe` and `output_dir` left `None` are the
    job's (`resolved`).
    """

    dataset: str = setting(
        "fashion_mnist",
        "'fashion_mnist', an image folder, or a TFDS name",
        recorded=True,
    )
    image_size: int = setting(
        None,
        "default: 28 for the small models (Fashion-MNIST's size), 224 for the paper's "
        "variants; a fine-tune's: its checkpoint's",
        type=positive_int,
    )  # (checked with the model: `model_names.check_image_size`)
    epochs: int = setting(None, "training epochs", type=positive_int, check=_check_epochs)
    batch_size: int = setting(
        None,
        "images per step (the global batch with --distribute)",
        type=positive_int,
        check=_check_batch_size,
    )
    recipe: str = setting(None, "small | pretrain | finetune | paper_finetune", check=_check_recipe)
    augmentation: str = setting("none", "none | light | medium | strong", check=_check_augmentation)
    output_dir: str = setting(
        None, "folder for the run's files (and its resume checkpoints)", recorded=False
    )
    data_dir: str = setting(None, "TFDS data folder")
    download: bool = setting(
        False,
        "let TFDS download and prepare a dataset that is not prepared in --data-dir "
        "(without it, such a dataset is refused at once)",
        recorded=False,
        check=_check_flag("download"),
    )
    seed: int = setting(0, "random seed", type=non_negative_int)
    overwrite: bool = setting(
        False,
        "replace a finished run in OUTPUT_DIR, or start over an unfinished one whose "
        "settings differ",
        recorded=False,
        check=_check_flag("overwrite"),
    )
    deterministic: bool = setting(
        False,
        "deterministic kernels and batch order: a killed and resumed run ends with the "
        "weights of an uninterrupted one",
        recorded=False,
        check=_check_flag("deterministic"),
    )
    gradient_accumulation_steps: int = setting(
        None,
        "gradient accumulation: update every STEPS batches",
        option="--accumulate",
        type=positive_int,
        metavar="STEPS",
        check=_check_accumulation,
    )
    limit: int = setting(
        None,
        "train on the first N training images only (a quick trial run)",
        type=positive_int,
        metavar="N",
        check=_check_optional_positive("limit"),
    )

    # Each job's defaults of the settings left None, and its command's.
    JOB_DEFAULTS = {}

    @property
    def job(self):
        """The name of the job these settings run (`run.json` records it)."""
        raise NotImplementedError

    def resolved(self):
        """The settings with the job's defaults in place of those left `None`."""
        defaults = self.JOB_DEFAULTS[self.job]
        return dataclasses.replace(
            self,
            **{name: value for name, value in defaults.items() if getattr(self, name) is None},
        )

    def check(self):
        """Checks every field's value on its own (a `ValueError` naming the first bad one)."""
        for field in dataclasses.fields(self):
            check = field.metadata.get("check")
            if check is not None:
                check(getattr(self, field.name))

    def recorded(self):
        """What `run.json` records: the job and its recorded fields, paths made absolute."""
        record = {"job": self.job}
        for field in dataclasses.fields(self):
            wanted = field.metadata.get("recorded", True)
            if callable(wanted):
                wanted = wanted(self)
            if not wanted:
                continue
            value = getattr(self, field.name)
            if field.name in self.PATHS:
                value = path_reference(value)
            elif field.name == "recipe" and not isinstance(value, str):
                value = repr(value)  # a `Recipe` of the user's
            record[field.name] = value
        return record

    # The fields that name files or folders (recorded by their absolute paths).
    PATHS = ("dataset",)


def _distilling(settings):
    return settings.teacher is not None


def _adapting(settings):
    return settings.lora is not None


def _quantizing(settings):
    return settings.qat is not None


@dataclasses.dataclass(frozen=True)
class TrainingSettings(RunSettings):
    """The settings of `keras_vit.training.train` (`keras-vit train` and `finetune`).

    Every field is a keyword of `train` and an option of the commands (its
    help is the command's); see `keras_vit.training.train` for what each does.
    """

    model: str = setting(
        "small",
        "'small' (a hybrid with a convolutional stem), 'small/4' (4x4 pixel patches) or "
        "a variant of the paper, e.g. Ti/16, S/16",
        commands=("train",),
        recorded=True,
    )
    patch_size: int = setting(
        None,
        "patch size in pixels of the model's input (default: the model's); with a "
        "convolutional stem, in pixels of the stem's feature map",
        type=positive_int,
        commands=("train",),
        check=_check_optional_positive("patch_size"),
    )
    weights: str = setting(
        None,
        "a .keras file, an official .npz, a Hugging Face or timm file",
        option="CHECKPOINT",
        commands=("finetune",),
    )
    distribute: str = setting(
        None,
        "data parallel over all devices (JAX: keras.distribution, TensorFlow: "
        "tf.distribute, multi-worker with TF_CONFIG) or model parallel (JAX); "
        "--batch-size is the global batch",
        choices=("data", "model"),
    )
    model_parallel: int = setting(
        2, "devices per model copy with --distribute model", type=positive_int, recorded=False
    )
    validation_split: float = setting(
        None,
        "for an image folder without test/ (one with test/ is refused): hold out this "
        "share of each class's training images as the test set (the same files each time)",
        type=fraction,
        metavar="FRACTION",
        check=_check_validation_split,
    )
    validate_every: int = setting(
        None,
        "evaluate on the test split every EPOCHS epochs (default: after the last one only)",
        type=positive_int,
        metavar="EPOCHS",
        recorded=False,
        check=_check_optional_positive("validate_every"),
    )
    patch_dropout_rate: float = setting(
        None,
        "train on a random share 1 - RATE of each image's patch tokens (cheaper steps at "
        "high resolution; evaluation sees all)",
        option="--patch-dropout",
        type=fraction,
        metavar="RATE",
        check=_check_patch_dropout,
    )
    layer_decay: float = setting(
        None,
        "layer-wise learning-rate decay in (0, 1]: block i of L trains at FACTOR**(L-i) "
        "of the rate, the embedding lowest, the head at the full rate (default: the "
        "recipe's, 1 for every recipe)",
        type=decay_factor,
        metavar="FACTOR",
        check=_check_layer_decay,
    )
    ema_momentum: float = setting(
        None,
        "validate, report and save an exponential moving average of the weights, "
        "MOMENTUM in (0, 1) its weight at each step, e.g. 0.99 (default: the recipe's, "
        "none for every recipe)",
        option="--ema",
        type=fraction,
        metavar="MOMENTUM",
        check=_check_ema,
    )
    remat: bool = setting(
        False,
        "recompute each block's activations in the backward pass instead of keeping them "
        "(gradient checkpointing): less memory per step for about a third more compute",
        check=_check_flag("remat"),
    )
    lora: int = setting(
        None,
        "LoRA: freeze the encoder and train low-rank adapters of rank RANK (and the head); "
        "model.keras is the merged model, model.lora.h5 the adapters and head alone",
        type=positive_int,
        metavar="RANK",
        recorded=_adapting,
        check=_check_lora,
    )
    lora_target: str = setting(
        None,
        "with --lora: the adapted projections of every block, comma-separated among query, "
        "key, value, out, mlp_dense_1, mlp_dense_2 (default: query,value)",
        metavar="NAMES",
        recorded=_adapting,
        check=_check_lora_target,
    )
    lora_base: str = setting(
        None,
        "with --lora: int8 stores the frozen encoder in Keras' int8 (QLoRA: the adapters "
        "train beside int8 kernels, the head stays float); model.keras is then the int8 "
        "model, each adapted kernel merged and requantized",
        choices=("int8",),
        metavar="MODE",
        recorded=_adapting,
    )
    qat: str = setting(
        None,
        "quantization-aware fine-tuning for LiteRT: train with the int8 rounding of "
        "`keras-vit export --quantize MODE` in the forward pass (from a fine-tuned model or a "
        "checkpoint of the plain ViT layout); model.keras then exports in MODE with the ranges "
        "it learned",
        choices=("int8", "int8_full"),
        metavar="MODE",
        recorded=_quantizing,
        check=_check_qat,
    )
    teacher: str = setting(
        None,
        "a .keras classifier of the same images and classes (a CNN, a ViT) to learn from "
        "besides the labels (DeiT's distillation); it is never trained, and model.keras "
        "is the student alone",
        metavar="PATH",
        recorded=_distilling,
    )
    distillation: str = setting(
        None,
        "with --teacher: learn its top class (hard, the default) or its softmax at "
        "--temperature (soft)",
        choices=("hard", "soft"),
        recorded=_distilling,
    )
    distillation_token: bool = setting(
        False,
        "with --teacher: a DeiT distillation token and second head learn the teacher, the "
        "class head the labels; inference averages both (needs a model with a class "
        "token: small/4 or a variant of the paper)",
        recorded=_distilling,
        check=_check_flag("distillation_token"),
    )
    temperature: float = setting(
        1.0,
        "with --distillation soft: the softmax temperature",
        type=positive_float,
        recorded=_distilling,
    )

    PATHS = ("dataset", "weights", "teacher")
    # A run's defaults, the command's and `train`'s alike: from scratch (the main
    # job: a small ViT on Fashion-MNIST), and fine-tuning a pretrained checkpoint,
    # typically on a small dataset (small batches: a folder of a thousand images
    # gives each epoch tens of steps).
    JOB_DEFAULTS = {
        "train": dict(epochs=9, batch_size=128, recipe="small", output_dir="keras_vit_run"),
        "finetune": dict(epochs=3, batch_size=32, recipe="finetune", output_dir="keras_vit_run"),
    }

    @property
    def job(self):
        return "train" if self.weights is None else "finetune"

    def resolved(self):
        """The job's defaults in place of those left `None`; a fine-tune names no model."""
        settings = super().resolved()
        if self.weights is not None:
            settings = dataclasses.replace(settings, model=None)
        if self.lora is not None and self.lora_target is None:
            from keras_vit.models.lora import DEFAULT_TARGETS

            settings = dataclasses.replace(settings, lora_target=",".join(DEFAULT_TARGETS))
        if self.teacher is not None:
            settings = dataclasses.replace(
                settings,
                distillation=self.distillation or "hard",
                temperature=_float(self.temperature),
            )
        return settings


def _float(value):
    # (A bad temperature is the distillation check's to name.)
    return (
        float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else value
    )


# The commands' defaults where they differ from Python's: `keras-vit finetune`
# writes into its own folder.
COMMAND_DEFAULTS = {
    "train": TrainingSettings.JOB_DEFAULTS["train"],
    "finetune": {**TrainingSettings.JOB_DEFAULTS["finetune"], "output_dir": "keras_vit_finetune"},
}


def settings_of(settings_class, settings, keywords):
    """A `settings_class` from a settings object, or its first field, and keywords.

    What `train(settings, **keywords)` and `pretrain(...)` take: a settings
    object (the keywords change fields of it), the dataset (the first field)
    with the other fields as keywords, or keywords alone. An unknown keyword
    is a `TypeError` naming it.
    """
    names = {field.name for field in dataclasses.fields(settings_class)}
    unknown = sorted(set(keywords) - names)
    if unknown:
        raise TypeError(
            f"Unknown setting(s) {unknown} of {settings_class.__name__}; the settings are "
            f"{sorted(names)}."
        )
    if isinstance(settings, settings_class):
        return dataclasses.replace(settings, **keywords)
    if settings is None:
        return settings_class(**keywords)
    if "dataset" in keywords:
        raise TypeError(
            f"The dataset was given twice. Received: {settings!r} and dataset="
            f"{keywords['dataset']!r}"
        )
    return settings_class(dataset=settings, **keywords)
