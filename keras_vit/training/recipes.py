"""The paper's training settings as code: schedules, optimizers, recipes.

Pre-training (paper §4.1, Appendix B.1): Adam with β1 0.9, β2 0.999, a
decoupled weight decay of 0.1 that skips biases, LayerNorm, position
embeddings and the class token, linear warm-up then linear (or cosine)
decay, global-norm clipping at 1.0, dropout 0.1. Fine-tuning (Appendix
B.1.1): SGD with momentum 0.9, no weight decay, cosine decay after a
warm-up, clipping at 1.0, a new zero-initialised head, optionally at a
higher resolution.
"""

import dataclasses

import keras

from keras_vit import _options
from keras_vit.layers.conv_stem import replicated_tensorflow
from keras_vit.optimizers import (
    ReplicatedAdamW,
    ReplicatedSGD,
    ScaledAdamW,
    ScaledSGD,
    WarmupDecay,
)

# On TensorFlow, XLA pays for itself after about this many training steps:
# compiling the small model's step and evaluation takes 4.6 s more than
# tracing them, and each step is then 27 ms faster (52 against 79 ms at batch
# 128; docs/performance.md). A shorter run (a quick trial, a test) starts
# and finishes sooner without it.
TENSORFLOW_XLA_MIN_STEPS = 200

# Weight-path parts that the paper's weight decay skips: every bias, the
# LayerNorms, the position embeddings and the class token.
_NO_DECAY_LAYERS = (
    "norm",
    "position_embedding",
    "class_token",
    "distillation_token",
    "register_tokens",
)


def no_weight_decay_variables(model):
    """The variables of a keras_vit model that weight decay must skip.

    Biases (every `bias`, attention's too), LayerNorm (and a convolutional
    stem's BatchNorm) scales and offsets, the position embeddings and the
    class, distillation and register tokens.
    """
    skipped = []
    for variable in model.trainable_variables:
        parts = variable.path.split("/")
        if parts[-1].endswith("bias") or any(
            marker in part for part in parts[:-1] for marker in _NO_DECAY_LAYERS
        ):
            skipped.append(variable)
    return skipped


# Below the first block: the embedding of the image and the tokens added to it.
_EMBEDDING_LAYERS = (
    "stem",
    "patch_embedding",
    "class_token",
    "distillation_token",
    "register_tokens",
    "position_embedding",
)


def check_layer_decay(layer_decay, argument="layer_decay"):
    """`layer_decay` as a float in `(0, 1]`, or a `ValueError` naming it."""
    if (
        not isinstance(layer_decay, (int, float))
        or isinstance(layer_decay, bool)
        or not 0 < layer_decay <= 1
    ):
        raise ValueError(
            f"{_options.name(argument)} must be a number in (0, 1] (1: one rate for every "
            f"layer). Received: {_options.given(argument, layer_decay)}"
        )
    return float(layer_decay)


def check_ema_momentum(ema_momentum, argument="ema_momentum"):
    """`ema_momentum` as `None` or a float in `(0, 1)`, or a `ValueError` naming it."""
    if ema_momentum is None:
        return None
    if (
        not isinstance(ema_momentum, (int, float))
        or isinstance(ema_momentum, bool)
        or not 0 < ema_momentum < 1
    ):
        raise ValueError(
            f"{_options.name(argument)} must be None or a number in (0, 1), the weight of the "
            f"average at each step. Received: {_options.given(argument, ema_momentum)}"
        )
    return float(ema_momentum)


def _optimizer(replicated, scaled, plain, learning_rate_scales, ema_momentum, **options):
    """An optimizer of the class the run needs, with its per-variable rates and average.

    `replicated` under a replicated `tf.distribute` strategy (whatever the
    rates), `scaled` for per-variable rates, else Keras' own `plain` one.
    """
    optimizer_class = (
        replicated if replicated_tensorflow() else scaled if learning_rate_scales else plain
    )
    if learning_rate_scales:
        options["learning_rate_scales"] = learning_rate_scales
    if check_ema_momentum(ema_momentum) is not None:
        options.update(use_ema=True, ema_momentum=ema_momentum)
    return optimizer_class(**options)


def layer_decay_scales(model, layer_decay):
    """Layer-wise learning-rate decay (BEiT, MAE, DINOv2): each variable's share of the rate.

    With `L` Transformer blocks, block `i` (from 0) trains at `layer_decay **
    (L - i)` of the rate, what comes after the blocks (the final LayerNorm,
    pooling, head) at the full rate, and the embedding (stem, patch
    embedding, tokens, position table) at the lowest, `layer_decay ** (L + 1)`:
    a pretrained model's lower layers, which hold its most general features,
    move least. For `ScaledAdamW` / `ScaledSGD`'s `learning_rate_scales`.

    Args:
        model: a keras_vit model (its layers named as `VisionTransformer` names them).
        layer_decay: float in `(0, 1]`.

    Returns:
        dict `{variable path: scale}` of every trainable variable.

    Example:

    >>> import keras_vit
    >>> model = keras_vit.ViT(
    ...     input_shape=(8, 8, 3), patch_size=4, hidden_dim=8, num_layers=2,
    ...     num_heads=2, mlp_dim=8, classes=2)
    >>> scales = layer_decay_scales(model, 0.5)
    >>> [scales[p] for p in ("patch_embedding/kernel", "encoderblock_0/mlp_dense_1/kernel",
    ...                       "encoderblock_1/mlp_dense_1/kernel", "head/kernel")]
    [0.125, 0.25, 0.5, 1.0]
    """
    layer_decay = check_layer_decay(layer_decay)
    blocks = sum(1 for layer in model.layers if layer.name.startswith("encoderblock_"))
    scales = {}
    for variable in model.trainable_variables:
        first = variable.path.split("/")[0]
        if first.startswith("encoderblock_"):
            depth = int(first[len("encoderblock_") :]) + 1
        elif first in _EMBEDDING_LAYERS:
            depth = 0
        else:
            depth = blocks + 1
        scales[variable.path] = layer_decay ** (blocks + 1 - depth)
    return scales


def pretraining_optimizer(
    model,
    schedule,
    weight_decay=0.1,
    beta_1=0.9,
    beta_2=0.999,
    clipnorm=1.0,
    gradient_accumulation_steps=None,
    learning_rate_scales=None,
    ema_momentum=None,
):
    """The paper's pre-training optimizer: AdamW, decay skipping what it must.

    Args:
        model: the model to train (its variables decide what is decayed).
        schedule: a learning rate or schedule (e.g. `WarmupDecay`).
        weight_decay: float, decoupled weight decay.
        beta_1, beta_2: Adam's moment decays.
        clipnorm: float or `None`, global-norm gradient clipping.
        gradient_accumulation_steps: int or `None`: apply the update every
            this many batches, for a larger effective batch.
        learning_rate_scales: `None` (one rate for every variable), or each
            variable's share of the rate (`layer_decay_scales`).
        ema_momentum: `None`, or a float in `(0, 1)`: the optimizer keeps
            an exponential moving average of the weights (Keras' `use_ema`),
            which `fit` puts into the model at its end.
    """
    optimizer = _optimizer(
        ReplicatedAdamW,
        ScaledAdamW,
        keras.optimizers.AdamW,
        learning_rate_scales,
        ema_momentum,
        learning_rate=schedule,
        weight_decay=weight_decay,
        beta_1=beta_1,
        beta_2=beta_2,
        global_clipnorm=clipnorm,
        gradient_accumulation_steps=gradient_accumulation_steps,
    )
    optimizer.exclude_from_weight_decay(var_list=no_weight_decay_variables(model))
    return optimizer


def finetuning_optimizer(
    schedule,
    momentum=0.9,
    clipnorm=1.0,
    gradient_accumulation_steps=None,
    learning_rate_scales=None,
    ema_momentum=None,
):
    """The paper's fine-tuning optimizer: SGD with momentum, no weight decay.

    `learning_rate_scales` and `ema_momentum`: as `pretraining_optimizer`'s.
    """
    return _optimizer(
        ReplicatedSGD,
        ScaledSGD,
        keras.optimizers.SGD,
        learning_rate_scales,
        ema_momentum,
        learning_rate=schedule,
        momentum=momentum,
        global_clipnorm=clipnorm,
        gradient_accumulation_steps=gradient_accumulation_steps,
    )


@dataclasses.dataclass(frozen=True)
class Recipe:
    """A training recipe: optimizer, schedule and regularisation settings.

    Attributes:
        optimizer: `"adamw"` (pre-training) or `"sgd"` (fine-tuning).
        learning_rate: peak learning rate.
        weight_decay: AdamW's decoupled weight decay.
        warmup_fraction: fraction of the steps spent warming up.
        decay: `"cosine"` or `"linear"`.
        clipnorm: global gradient-norm clip.
        label_smoothing: float.
        dropout_rate: dropout of the model (applied when it is built).
        drop_path_rate: stochastic depth of the model.
        patch_dropout_rate: share of the patch tokens that training drops
            (`keras_vit.layers.PatchDropout`: cheaper steps, a regulariser;
            inference sees every token).
        beta_2: Adam's second-moment decay.
        data_autotune: whether tf.data tunes the run's pipelines to the
            machine (`keras_vit.data.make_pipeline`'s `autotune`).
        crop_scale: `(min, max)` area share of the training images'
            random-resized crop, or `None` (the whole image, resized); not
            applied to Fashion-MNIST (`Run.training_crop`).
        head_first: fit a checkpoint's new head on the frozen model's
            features before training every weight (linear probing, then
            fine-tuning: `keras_vit.training.finetuning.fit_new_heads`).
        layer_decay: float in `(0, 1]`, layer-wise learning-rate decay
            (`layer_decay_scales`: block `i` of `L` at `layer_decay ** (L -
            i)` of the rate); 1 (the default): one rate for every layer.
        ema_momentum: `None` (the default), or a float in `(0, 1)`: an
            exponential moving average of the weights, the model that is
            validated, reported and saved (`pretraining_optimizer`).
        lora_learning_rate: the peak learning rate of a LoRA run (`train(...,
            lora=RANK)`), whose adapters start at zero and want a larger
            rate than whole weights; `None`: `learning_rate`.
        qat_learning_rate: the peak learning rate of a quantization-aware
            run (`train(..., qat=MODE)`), which starts from a trained float
            model and trains in its rotated, folded copy's weights (a rate
            that suits the float model moves them too far); `None`:
            `learning_rate`.
    """

    optimizer: str = "adamw"
    learning_rate: float = 1e-3
    weight_decay: float = 0.1
    warmup_fraction: float = 0.1
    decay: str = "linear"
    clipnorm: float = 1.0
    label_smoothing: float = 0.0
    dropout_rate: float = 0.1
    drop_path_rate: float = 0.0
    patch_dropout_rate: float = 0.0
    beta_2: float = 0.999
    data_autotune: bool = True
    crop_scale: tuple = (0.08, 1.0)
    head_first: bool = False
    layer_decay: float = 1.0
    ema_momentum: float = None
    lora_learning_rate: float = None
    qat_learning_rate: float = None

    def __post_init__(self):
        check_layer_decay(self.layer_decay)
        check_ema_momentum(self.ema_momentum)

    def __str__(self):
        """One readable line, e.g. for a training log."""
        optimizer = "AdamW" if self.optimizer == "adamw" else "SGD with momentum 0.9"
        parts = [
            f"{optimizer}, learning rate {self.learning_rate:g} "
            f"({self.warmup_fraction:.0%} warm-up, then {self.decay} decay)",
        ]
        if self.weight_decay:
            parts.append(f"weight decay {self.weight_decay:g}")
        if self.clipnorm:
            parts.append(f"gradient clip {self.clipnorm:g}")
        for name in ("label_smoothing", "dropout_rate", "drop_path_rate", "patch_dropout_rate"):
            if getattr(self, name):
                parts.append(
                    f"{name.replace('_rate', '').replace('_', ' ')} {getattr(self, name):g}"
                )
        if self.layer_decay < 1:
            parts.append(f"layer-wise rate decay {self.layer_decay:g}")
        if self.ema_momentum is not None:
            parts.append(f"weight average (EMA) {self.ema_momentum:g}")
        if self.head_first:
            parts.insert(0, "a new head fitted on the frozen features first")
        return ", ".join(parts)

    def for_lora(self):
        """The recipe of a LoRA run: its `lora_learning_rate` as the learning rate."""
        if self.lora_learning_rate is None:
            return self
        return dataclasses.replace(self, learning_rate=self.lora_learning_rate)

    def for_qat(self):
        """The recipe of a quantization-aware run: its `qat_learning_rate` as the learning rate."""
        if self.qat_learning_rate is None:
            return self
        return dataclasses.replace(self, learning_rate=self.qat_learning_rate)

    def make_optimizer(self, model, total_steps, gradient_accumulation_steps=None):
        """The optimizer for `total_steps` training steps of `model`.

        Steps are batches, accumulated or not: Keras evaluates the learning
        rate schedule at each batch.
        """
        schedule = WarmupDecay(
            self.learning_rate,
            total_steps,
            warmup_steps=int(round(self.warmup_fraction * total_steps)),
            decay=self.decay,
        )
        options = dict(
            clipnorm=self.clipnorm,
            gradient_accumulation_steps=gradient_accumulation_steps,
            learning_rate_scales=layer_decay_scales(model, self.layer_decay)
            if self.layer_decay < 1
            else None,
            ema_momentum=self.ema_momentum,
        )
        if self.optimizer == "sgd":
            return finetuning_optimizer(schedule, **options)
        return pretraining_optimizer(
            model, schedule, weight_decay=self.weight_decay, beta_2=self.beta_2, **options
        )

    def compile(self, model, total_steps, gradient_accumulation_steps=None, **kwargs):
        """Compiles `model` for this recipe (classifier: logits out, one-hot labels in).

        XLA is on for TensorFlow too (`jit_compile=True`; Keras leaves it
        off on machines without an accelerator; on CPUs it is faster here,
        see docs/performance.md) for runs of `TENSORFLOW_XLA_MIN_STEPS`
        training steps or more: a shorter one finishes before the compile
        pays back. Not under a `tf.distribute` strategy with several
        replicas: XLA cannot reach the variables mirrored on other devices
        ("Trying to access resource ... located in device CPU:1").
        `kwargs` (e.g. `jit_compile=False`, or a self-supervised
        objective's `loss` and `weighted_metrics`) override.
        """
        if keras.backend.backend() == "jax":
            kwargs.setdefault("jit_compile", True)
        elif keras.backend.backend() == "tensorflow":
            kwargs.setdefault(
                "jit_compile",
                not replicated_tensorflow() and total_steps >= TENSORFLOW_XLA_MIN_STEPS,
            )
        if "loss" not in kwargs:
            kwargs["loss"] = keras.losses.CategoricalCrossentropy(
                from_logits=True, label_smoothing=self.label_smoothing
            )
            # The cross-entropy without label smoothing: the test loss every
            # command reports, the same quantity as `keras-vit evaluate`'s.
            kwargs.setdefault(
                "metrics",
                [
                    keras.metrics.CategoricalAccuracy(name="accuracy"),
                    keras.metrics.CategoricalCrossentropy(from_logits=True, name="cross_entropy"),
                ],
            )
        # A `Distiller` trains its student's variables alone: their layer
        # names decide the layer-wise rates and which ones decay.
        trained = getattr(model, "student", model)
        model.compile(
            optimizer=self.make_optimizer(trained, total_steps, gradient_accumulation_steps),
            **kwargs,
        )
        if model.built:
            # The optimizer's slots made now, not inside the first training
            # step: TensorFlow traces a step that creates variables twice
            # (seconds of Python each time a model starts training).
            model.optimizer.build(model.trainable_variables)
        return model


RECIPES = {
    # The paper's ImageNet pre-training (Appendix B.1).
    "pretrain": Recipe(),
    # A pretrained checkpoint on a dataset of its own (the `keras-vit
    # finetune` default): its new head fitted on the frozen features first
    # (LP-FT), then every weight at a small AdamW rate, whole images (a crop
    # of 8% of a small image cuts its object away). DINOv2-S on 1,500
    # Fashion-MNIST images (benchmarks/real_weights.py finetune): above the
    # frozen probe, where the paper's recipe ends far below it.
    "finetune": Recipe(
        learning_rate=3e-5,
        weight_decay=0.05,
        warmup_fraction=0.1,
        decay="cosine",
        dropout_rate=0.0,
        crop_scale=None,
        head_first=True,
        # LoRA's adapters (`--lora`) on the same data: 83.7% at 3e-4, 84.5%
        # at 1e-3, 84.9% at 3e-3 (rank 8 on query and value, seed 0).
        lora_learning_rate=3e-3,
        # Quantization-aware training (`--qat int8_full`) of the probe's
        # classifier, one epoch at a constant AdamW rate, seed 0: the
        # simulated model at 83.0% before, 84.0% after at 1e-6, 83.4% at
        # 3e-6, 81.2% at 1e-5 (the float model: 84.2%; 500 test images).
        qat_learning_rate=1e-6,
    ),
    # The paper's fine-tuning (Appendix B.1.1), for runs of thousands of
    # steps at batch 512; the rate is its sweep's middle.
    "paper_finetune": Recipe(
        optimizer="sgd",
        learning_rate=0.01,
        weight_decay=0.0,
        warmup_fraction=0.05,
        decay="cosine",
        dropout_rate=0.0,
    ),
    # From scratch on a small dataset in a few epochs (the `keras-vit train`
    # default): a higher rate, lighter decay, cosine, no dropout, label
    # smoothing 0.1 (on Fashion-MNIST: 91.2% vs 90.4% without, same 8 epochs).
    "small": Recipe(
        learning_rate=2e-3,
        weight_decay=0.05,
        warmup_fraction=0.1,
        decay="cosine",
        dropout_rate=0.0,
        label_smoothing=0.1,
        # Fashion-MNIST's batches take microseconds of tf.data work: tuning
        # threads cost a 2-core machine more than they save (the main job's
        # first 2 epochs: 55.9-57.2 s with fixed pipelines, 64.6-83.5 s tuned).
        data_autotune=False,
    ),
}


def get_recipe(recipe):
    """A `Recipe` from a name in `RECIPES` or a `Recipe`."""
    if isinstance(recipe, Recipe):
        return recipe
    if recipe not in RECIPES:
        raise ValueError(
            f"{_options.name('recipe')} must be one of {tuple(RECIPES)} or a Recipe. "
            f"Received: {_options.given('recipe', recipe)}"
        )
    return RECIPES[recipe]
