"""Knowledge distillation: a student ViT learns from a frozen teacher with `fit` (DeiT)."""

import hashlib
import json
import os

import keras
import numpy as np
import pytest

import keras_vit
from keras_vit.training import Distiller, recompute_batch_norm_statistics, train
from tests.conftest import evaluated_accuracy, on_one_backend

SIDE = 16


def brightness_teacher(flipped=False, probabilities=False):
    """A CNN-like teacher: class 1 ("light") for bright images, class 0 ("dark") for dark ones.

    Its BatchNorm holds statistics of its own, which training the student
    must leave as they are. `flipped` teaches the opposite of the truth.
    """
    inputs = keras.Input((SIDE, SIDE, 3))
    norm = keras.layers.BatchNormalization(name="norm")
    x = keras.layers.GlobalAveragePooling2D()(norm(inputs))
    head = keras.layers.Dense(2, activation="softmax" if probabilities else None, name="logits")
    model = keras.Model(inputs, head(x), name="teacher")
    norm.moving_mean.assign(np.full(3, 120.0, "float32"))
    norm.moving_variance.assign(np.full(3, 60.0**2, "float32"))
    sign = -1.0 if flipped else 1.0
    head.kernel.assign(sign * np.array([[-2.0, 2.0]] * 3, "float32"))
    head.bias.assign(np.zeros(2, "float32"))
    return model


def tiny_student(distillation_token=True, classes=2):
    return keras_vit.ViT(
        input_shape=(SIDE, SIDE, 3),
        patch_size=8,
        hidden_dim=16,
        num_layers=1,
        num_heads=2,
        mlp_dim=16,
        classes=classes,
        classifier_activation=None,
        distillation_token=distillation_token,
        seed=0,
    )


def images_and_labels(count, seed=0):
    rng = np.random.default_rng(seed)
    labels = np.arange(count) % 2
    levels = np.where(labels == 1, 190.0, 50.0) + rng.normal(0, 25, count)
    images = np.clip(
        levels[:, None, None, None] + rng.normal(0, 20, (count, SIDE, SIDE, 3)), 0, 255
    )
    return images.astype("float32"), np.eye(2, dtype="float32")[labels]


def as_numpy(value):
    return keras.ops.convert_to_numpy(value)


def log_softmax(logits):
    shifted = logits - logits.max(-1, keepdims=True)
    return shifted - np.log(np.exp(shifted).sum(-1, keepdims=True))


@pytest.mark.parametrize("probabilities", [False, True])
def test_the_loss_is_deits_hard_and_soft_for_either_head(probabilities):
    images, labels = images_and_labels(6)
    teacher = brightness_teacher(probabilities=probabilities)
    teacher_logits = as_numpy(brightness_teacher()(images))  # the logits either way
    rng = np.random.default_rng(1)
    class_logits, distillation_logits = (rng.normal(size=(6, 2)).astype("float32") for _ in "cd")
    label_loss = -np.mean(np.sum(labels * log_softmax(class_logits), -1))
    for mode, temperature in (("hard", 1.0), ("soft", 3.0)):
        distiller = Distiller(
            tiny_student(), teacher, mode=mode, temperature=temperature, alpha=0.3
        )
        distiller.compile("sgd", keras.losses.CategoricalCrossentropy(from_logits=True))
        if mode == "hard":
            top = np.eye(2)[teacher_logits.argmax(-1)]
            term = -np.mean(np.sum(top * log_softmax(distillation_logits), -1))
        else:
            t = temperature
            target = log_softmax(teacher_logits / t)
            term = (
                t
                * t
                * np.mean(
                    np.sum(np.exp(target) * (target - log_softmax(distillation_logits / t)), -1)
                )
            )
        loss = distiller.compute_loss(
            images, labels, (class_logits, distillation_logits), training=True
        )
        np.testing.assert_allclose(as_numpy(loss), 0.7 * label_loss + 0.3 * term, rtol=1e-5)
        # Evaluation is the student's, the labels' loss alone.
        evaluated = distiller.compute_loss(images, labels, class_logits, training=False)
        np.testing.assert_allclose(as_numpy(evaluated), label_loss, rtol=1e-5)


def test_each_head_of_a_distillation_token_student_learns_its_target_and_the_teacher_stays():
    """The class head learns the labels; the distillation head the teacher, which disagrees."""
    images, labels = images_and_labels(64)
    teacher = brightness_teacher(flipped=True)
    frozen = [as_numpy(w) for w in teacher.weights]
    student = tiny_student()
    distiller = Distiller(student, teacher)
    distiller.compile(
        keras.optimizers.Adam(3e-3),
        keras.losses.CategoricalCrossentropy(from_logits=True),
        metrics=["accuracy"],
    )
    distiller.fit(images, labels, batch_size=16, epochs=25, verbose=0, shuffle=False)
    heads = keras.Model(
        student.input, [student.get_layer("head").output, student.get_layer("head_dist").output]
    )
    class_logits, distillation_logits = (as_numpy(h) for h in heads(images))
    truth = labels.argmax(-1)
    assert np.mean(class_logits.argmax(-1) == truth) >= 0.9
    assert np.mean(distillation_logits.argmax(-1) == 1 - truth) >= 0.9  # the teacher's classes
    # A run's BatchNorm statistics are the student's: the teacher's are its own.
    assert recompute_batch_norm_statistics(distiller, lambda: [images]) == 0
    for before, after in zip(frozen, teacher.weights):
        np.testing.assert_array_equal(before, as_numpy(after))
    # The model to keep is the student: one output, the average of the heads.
    np.testing.assert_allclose(
        as_numpy(distiller.predict(images, verbose=0)),
        (class_logits + distillation_logits) / 2,
        rtol=1e-4,
        atol=1e-5,
    )


def test_a_student_without_the_token_learns_the_teacher_over_noisy_labels():
    images, labels = images_and_labels(64)
    noise = np.eye(2, dtype="float32")[np.random.default_rng(2).integers(0, 2, 64)]
    student = tiny_student(distillation_token=False)
    distiller = Distiller(student, brightness_teacher(probabilities=True), alpha=0.7)
    distiller.compile(
        keras.optimizers.Adam(3e-3), keras.losses.CategoricalCrossentropy(from_logits=True)
    )
    distiller.fit(images, noise, batch_size=16, epochs=25, verbose=0, shuffle=False)
    assert np.mean(as_numpy(student(images)).argmax(-1) == labels.argmax(-1)) >= 0.9


def test_a_vit_saved_as_a_keras_file_teaches_as_loaded(tmp_path):
    from keras_vit.training import load_teacher

    path = str(tmp_path / "vit_teacher.keras")
    tiny_student(distillation_token=False).save(path)
    teacher = load_teacher(path)
    assert not teacher.trainable
    frozen = [as_numpy(w) for w in teacher.weights]
    images, labels = images_and_labels(16)
    distiller = Distiller(tiny_student(), teacher, mode="soft", temperature=2.0)
    distiller.compile("adam", keras.losses.CategoricalCrossentropy(from_logits=True))
    distiller.fit(images, labels, batch_size=8, epochs=1, verbose=0)
    for before, after in zip(frozen, teacher.weights):
        np.testing.assert_array_equal(before, as_numpy(after))


def test_a_teacher_that_cannot_serve_the_student_is_refused_naming_both():
    with pytest.raises(ValueError, match=r"takes images of shape \(28, 28, 1\).*\(16, 16, 3\)"):
        Distiller(
            tiny_student(), keras.Sequential([keras.Input((28, 28, 1)), keras.layers.Dense(2)])
        )
    with pytest.raises(ValueError, match=r"outputs of shape \(3,\) and the student has 2 classes"):
        Distiller(
            tiny_student(),
            keras.Sequential(
                [keras.Input((SIDE, SIDE, 3)), keras.layers.Flatten(), keras.layers.Dense(3)]
            ),
        )
    for argument, value in (("mode", "medium"), ("temperature", 0), ("alpha", 1.5)):
        with pytest.raises(ValueError, match=f"Received: {argument}={value!r}"):
            Distiller(tiny_student(), brightness_teacher(), **{argument: value})


def file_digest(path):
    with open(path, "rb") as f:
        return hashlib.sha256(f.read()).hexdigest()


@on_one_backend("torch", "the command's own work")
@pytest.mark.slow
def test_a_run_with_a_teacher_resumes_keeps_the_teacher_and_saves_a_plain_student(tmp_path):
    from tests.training.test_train_command import killed_after_first_checkpoint, write_dataset

    data = write_dataset(tmp_path / "data", per_class=16)
    teacher_path = str(tmp_path / "teacher.keras")
    brightness_teacher(probabilities=True).save(teacher_path)
    digest = file_digest(teacher_path)
    out = str(tmp_path / "run")
    lines = []

    def run():
        return train(
            data,
            model="small/4",
            image_size=SIDE,
            epochs=2,
            batch_size=8,
            output_dir=out,
            teacher=teacher_path,
            distillation="soft",
            temperature=2.0,
            distillation_token=True,
            verbose=0,
            log=lines.append,
        )

    with killed_after_first_checkpoint():
        run()
    assert any(line.startswith("teacher: ") and "soft distillation" in line for line in lines)
    del lines[:]
    result = run()
    assert any("resuming from" in line for line in lines), lines
    assert file_digest(teacher_path) == digest
    with open(os.path.join(out, "run.json")) as f:
        settings = json.load(f)
    assert settings["teacher"] == os.path.abspath(teacher_path)
    assert (settings["distillation"], settings["temperature"]) == ("soft", 2.0)
    assert result["metrics"]["test_accuracy"] == pytest.approx(
        evaluated_accuracy(result["paths"]["model.keras"]), abs=1e-4
    )  # (the student's, alone)
    student = keras.saving.load_model(result["paths"]["model.keras"])
    assert isinstance(student, keras.Model) and len(student.outputs) == 1
    assert student.output_shape == (None, 2)
    assert student.get_layer("distillation_token") is not None
    assert not any(layer.name == "teacher" for layer in student.layers)


def test_distillation_settings_are_checked_before_any_data_is_read(tmp_path):
    teacher_path = str(tmp_path / "teacher.keras")
    brightness_teacher().save(teacher_path)
    out = str(tmp_path / "run")
    nowhere = str(tmp_path / "no_data")  # never read: each error comes first
    with pytest.raises(ValueError, match=r"Received: distillation='soft', teacher=None"):
        train(nowhere, distillation="soft", output_dir=out)
    with pytest.raises(ValueError, match=r"hard distillation.*Received: temperature=2"):
        train(nowhere, teacher=teacher_path, temperature=2, output_dir=out)
    with pytest.raises(ValueError, match=r"`teacher` must be a path to a \.keras file"):
        train(nowhere, teacher=str(tmp_path / "teacher.h5"), output_dir=out)
    # The main job's Fashion-MNIST images are 28x28x1; this teacher's are 16x16x3.
    with pytest.raises(ValueError, match=r"takes images of shape \(16, 16, 3\).*\(28, 28, 1\)"):
        train(teacher=teacher_path, output_dir=out)
    # The default model pools the mean of its patches: no class token to sit beside.
    with pytest.raises(ValueError, match=r"model='small' has none\. Use model='small/4'"):
        train(nowhere, teacher=teacher_path, distillation_token=True, output_dir=out)
    assert not os.path.exists(out)
    # A teacher the run would write over.
    os.makedirs(out)
    os.replace(teacher_path, os.path.join(out, "model.keras"))
    with pytest.raises(ValueError, match="it would be replaced"):
        train(nowhere, teacher=os.path.join(out, "model.keras"), output_dir=out)


@pytest.mark.backend_independent
def test_the_commands_take_a_teacher_and_check_its_options(capsys):
    from keras_vit.cli import main

    with pytest.raises(SystemExit):
        main(["train", "--teacher", "t.keras", "--distillation", "medium"])
    assert "--distillation: invalid choice: 'medium'" in capsys.readouterr().err
    # A model name that is not one: the error lists the small models too.
    with pytest.raises(
        SystemExit,
        match=r"--model 'small/8' is not a model of keras_vit's: "
        r"'small', 'small/4' \(the small models\) or a variant of the paper",
    ):
        main(["train", "--model", "small/8", "--dataset", "/no/such/folder"])
    with pytest.raises(SystemExit):
        main(["train", "--teacher", "t.keras", "--distillation", "soft", "--temperature", "0"])
    assert "--temperature: must be a positive number, not '0'" in capsys.readouterr().err
