"""Knowledge distillation with `model.fit`: a student classifier learns from a teacher's outputs.

DeiT (Touvron et al. 2021) trains a ViT from a CNN's predictions: the
student matches the true labels and the teacher's, through its class token
or, with a distillation token, through a second head of its own. At
inference the two heads are averaged (`ViT(
distillation_token=True)` does it in its graph), so what is saved and
exported is a plain classifier. `Distiller` is the training wrapper: it
holds the student and a frozen teacher, and its loss is DeiT's.
"""

import os

import keras
from keras import ops

from keras_vit import _options

MODES = ("hard", "soft")


def load_teacher(path, argument="teacher"):
    """A teacher model from a `.keras` file, frozen (never trained).

    Args:
        path: a `.keras` file of any Keras classifier (a CNN, a ViT), whose
            output is logits or softmax probabilities.
        argument: the argument's name in errors.

    Returns:
        The loaded `keras.Model`, `trainable=False`.
    """
    check_teacher_path(path, argument)
    import keras_vit  # noqa: F401 (a ViT teacher's layers registered)

    teacher = keras.saving.load_model(path, compile=False)
    teacher.trainable = False
    return teacher


def check_options(mode, temperature, mode_argument="mode"):
    """A clear error unless `mode` is one of `MODES` and `temperature` a positive number.

    Args:
        mode: `"hard"` or `"soft"`.
        temperature: a positive number.
        mode_argument: the mode's argument name in errors.
    """
    if mode not in MODES:
        raise ValueError(
            f"{_options.name(mode_argument)} must be one of {MODES}. "
            f"Received: {_options.given(mode_argument, mode)}"
        )
    if (
        not isinstance(temperature, (int, float))
        or isinstance(temperature, bool)
        or not temperature > 0
    ):
        raise ValueError(
            f"{_options.name('temperature')} must be a positive number. "
            f"Received: {_options.given('temperature', temperature)}"
        )


def check_teacher_path(path, argument="teacher"):
    """A clear error unless `path` is an existing `.keras` file (a whole archive)."""
    if not isinstance(path, (str, os.PathLike)) or not os.fspath(path).endswith(".keras"):
        raise ValueError(
            f"{_options.name(argument)} must be a path to a .keras file. Received: {path!r}"
        )
    if not os.path.isfile(path):
        raise ValueError(f"{_options.name(argument)} {os.fspath(path)!r} is not a file.")
    from keras_vit.weights.keras_archive import check_keras_archive

    check_keras_archive(path)


def check_teacher(teacher, image_shape, classes=None, name="the teacher"):
    """A `ValueError` naming both unless `teacher` takes the student's images and classes.

    Args:
        teacher: a Keras model.
        image_shape: `(height, width, channels)` of the student's images.
        classes: int, the student's class count (`None`: not checked).
        name: how the teacher is named in the error (e.g. its file).
    """
    inputs = teacher.inputs if isinstance(teacher.inputs, list) else [teacher.inputs]
    outputs = teacher.outputs if isinstance(teacher.outputs, list) else [teacher.outputs]
    if len(inputs) != 1 or len(outputs) != 1:
        raise ValueError(
            f"{name} must have one input and one output; it has {len(inputs)} "
            f"input(s) and {len(outputs)} output(s)."
        )
    taken = tuple(inputs[0].shape[1:])
    fits = len(taken) == len(image_shape) and all(
        t is None or t == s for t, s in zip(taken, image_shape)
    )
    if not fits:
        raise ValueError(
            f"{name} takes images of shape {taken} and the student's are "
            f"{tuple(image_shape)} (height, width, channels): it cannot teach this student."
        )
    given = tuple(outputs[0].shape[1:])
    if classes is not None and given != (classes,):
        raise ValueError(
            f"{name} gives outputs of shape {given} and the student has {classes} "
            f"classes: it cannot teach this student."
        )


def gives_probabilities(model):
    """Whether `model`'s output is a softmax (else it is taken as logits)."""
    last = model.layers[-1] if getattr(model, "layers", None) else None
    if isinstance(last, keras.layers.Softmax):
        return True
    activation = getattr(last, "activation", None)
    return getattr(activation, "__name__", None) == "softmax"


@keras.saving.register_keras_serializable(package="keras_vit")
class Distiller(keras.Model):
    """Trains `student` with `fit` from the labels and a frozen `teacher`'s predictions.

    The loss is DeiT's (Touvron et al. 2021): half the compiled loss on the
    true labels, half a distillation term on the teacher's predictions of
    the same (augmented) images:

    - `"hard"`: the cross-entropy to the teacher's top class (DeiT's best);
    - `"soft"`: `temperature**2` times the KL divergence between the
      teacher's and the student's softmax at `temperature` (Hinton et al.).

    `alpha` is the distillation term's share. A student with DeiT's
    distillation token (`ViT(distillation_token=True)`)
    learns the labels through its class head and the teacher through its
    distillation head; without the token one head learns both. The student
    gives logits (`classifier_activation=None`); the teacher logits or
    softmax probabilities (their log is its logits up to a constant). The
    teacher is never trained: its weights, BatchNorm statistics included,
    stay as loaded.

    Evaluation and prediction are the student's (the average of its two
    heads, as at inference), and so is the validation loss: the compiled
    loss alone. Save or export `distiller.student`, a plain classifier.

    Args:
        student: a Keras classifier giving logits.
        teacher: a Keras classifier of the same images and classes.
        mode: `"hard"` or `"soft"`.
        temperature: positive float, for `"soft"`.
        alpha: float in `[0, 1]`, the distillation term's share of the loss.

    Example:

    >>> import numpy as np, keras, keras_vit
    >>> teacher = keras.Sequential([keras.Input((8, 8, 3)), keras.layers.Flatten(),
    ...                             keras.layers.Dense(4)])
    >>> student = keras_vit.ViT(
    ...     input_shape=(8, 8, 3), patch_size=4, hidden_dim=8, num_layers=1, num_heads=2,
    ...     mlp_dim=8, classes=4, classifier_activation=None, distillation_token=True)
    >>> distiller = Distiller(student, teacher, mode="hard")
    >>> distiller.compile("adam", keras.losses.CategoricalCrossentropy(from_logits=True))
    >>> images, labels = np.zeros((8, 8, 8, 3)), np.eye(4)[np.arange(8) % 4]
    >>> history = distiller.fit(images, labels, epochs=1, verbose=0)
    >>> distiller.student.output_shape
    (None, 4)
    """

    def __init__(self, student, teacher, mode="hard", temperature=1.0, alpha=0.5, **kwargs):
        super().__init__(**kwargs)
        check_options(mode, temperature)
        if not isinstance(alpha, (int, float)) or isinstance(alpha, bool) or not 0 <= alpha <= 1:
            raise ValueError(f"`alpha` must be a number in [0, 1]. Received: alpha={alpha!r}")
        student_inputs = student.inputs if isinstance(student.inputs, list) else [student.inputs]
        check_teacher(
            teacher,
            tuple(student_inputs[0].shape[1:]),
            student.output_shape[-1],
            name=f"The teacher {teacher.name!r}",
        )
        self.student = student
        self.teacher = teacher
        teacher.trainable = False
        self.mode = mode
        self.temperature = float(temperature)
        self.alpha = float(alpha)
        self._teacher_gives_probabilities = gives_probabilities(teacher)
        names = {layer.name for layer in student.layers}
        # A distillation token's student: its two heads' logits, before the
        # average that inference takes (the same layers and weights).
        self.heads = (
            keras.Model(
                student.input,
                [student.get_layer("head").output, student.get_layer("head_dist").output],
                name=f"{student.name}_heads",
            )
            if {"head", "head_dist"} <= names
            else None
        )
        self.built = True

    def call(self, images, training=False):
        if training and self.heads is not None:
            return tuple(self.heads(images, training=True))
        return self.student(images, training=training)

    def teacher_logits(self, images):
        """The teacher's logits of `images` (a softmax teacher's log-probabilities), no gradient."""
        outputs = ops.cast(self.teacher(images, training=False), "float32")
        if self._teacher_gives_probabilities:
            outputs = ops.log(ops.maximum(outputs, 1e-12))
        return ops.stop_gradient(outputs)

    def compute_loss(self, x=None, y=None, y_pred=None, sample_weight=None, training=True):
        class_logits, distillation_logits = (
            y_pred if isinstance(y_pred, tuple) else (y_pred, y_pred)
        )
        label_loss = super().compute_loss(x, y, class_logits, sample_weight, training)
        if not training:
            return label_loss
        teacher = self.teacher_logits(x)
        student = ops.cast(distillation_logits, "float32")
        if self.mode == "hard":
            targets = ops.one_hot(ops.argmax(teacher, axis=-1), ops.shape(teacher)[-1])
            terms = -ops.sum(targets * ops.log_softmax(student, axis=-1), axis=-1)
        else:
            t = self.temperature
            teacher_log = ops.log_softmax(teacher / t, axis=-1)
            terms = (t * t) * ops.sum(
                ops.exp(teacher_log) * (teacher_log - ops.log_softmax(student / t, axis=-1)),
                axis=-1,
            )
        if sample_weight is None:
            distillation_loss = ops.mean(terms)
        else:
            weights = ops.cast(ops.reshape(sample_weight, ops.shape(terms)), terms.dtype)
            distillation_loss = ops.sum(weights * terms) / ops.cast(ops.size(terms), terms.dtype)
        return (1 - self.alpha) * label_loss + self.alpha * distillation_loss

    def compute_metrics(self, x, y, y_pred, sample_weight=None):
        if isinstance(y_pred, tuple):  # training: the average inference takes
            y_pred = (y_pred[0] + y_pred[1]) / 2
        return super().compute_metrics(x, y, y_pred, sample_weight)

    def get_config(self):
        return {
            "name": self.name,
            "student": keras.saving.serialize_keras_object(self.student),
            "teacher": keras.saving.serialize_keras_object(self.teacher),
            "mode": self.mode,
            "temperature": self.temperature,
            "alpha": self.alpha,
        }

    @classmethod
    def from_config(cls, config):
        config = dict(config)
        for key in ("student", "teacher"):
            config[key] = keras.saving.deserialize_keras_object(config[key])
        return cls(**config)
