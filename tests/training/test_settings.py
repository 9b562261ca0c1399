"""A training job's settings: one dataclass that the parsers, run.json and messages read."""

import dataclasses
import os

import pytest

from keras_vit._options import options_named
from keras_vit.cli import build_parser
from keras_vit.cli.options import settings_from
from keras_vit.pretraining import PretrainingSettings
from keras_vit.training import TrainingSettings, train
from keras_vit.training.settings import COMMAND_DEFAULTS, settings_of

pytestmark = pytest.mark.backend_independent

# The settings `run.json` recorded before they were one dataclass: a run
# started then resumes now.
TRAIN_RECORD = {
    "job", "dataset", "data_dir", "validation_split", "model", "weights", "image_size",
    "patch_size", "distribute", "gradient_accumulation_steps", "limit", "patch_dropout_rate",
    "layer_decay", "ema_momentum", "remat", "batch_size", "recipe", "augmentation", "seed",
    "epochs",
}  # fmt: skip
DISTILLATION_RECORD = {"teacher", "distillation", "distillation_token", "temperature"}
PRETRAIN_RECORD = {
    "job", "dataset", "data_dir", "objective", "objective_options", "model", "image_size",
    "patch_size", "gradient_accumulation_steps", "limit", "batch_size", "recipe",
    "augmentation", "seed", "epochs",
}  # fmt: skip


def parsed(*argv):
    return build_parser().parse_args(list(argv))


@pytest.mark.parametrize(
    "command, settings_class",
    [
        ("train", TrainingSettings),
        ("finetune", TrainingSettings),
        ("pretrain", PretrainingSettings),
    ],
)
def test_each_command_offers_its_settings_fields_with_their_option_and_help(
    command, settings_class, capsys
):
    argv = [command] + (["ckpt.npz"] if command == "finetune" else [])
    args = parsed(*argv)
    for field in dataclasses.fields(settings_class):
        meta = field.metadata
        offered = meta["option"] is not False and (
            not meta["commands"] or command in meta["commands"]
        )
        assert (field.name in args.options) == offered, field.name
        if not offered:
            continue
        option = meta["option"] or "--" + field.name.replace("_", "-")
        assert args.options[field.name] == option
        default = COMMAND_DEFAULTS.get(command, {}).get(field.name, field.default)
        if command == "pretrain":
            from keras_vit.pretraining.settings import COMMAND_DEFAULTS as PRETRAIN_DEFAULTS

            default = PRETRAIN_DEFAULTS["pretrain"].get(field.name, field.default)
        if not option.isupper():
            assert getattr(args, field.name) == default, field.name
    with pytest.raises(SystemExit):
        parsed(command, "--help")
    helped = capsys.readouterr().out
    for field in dataclasses.fields(settings_class):
        if field.name in args.options and not args.options[field.name].isupper():
            assert args.options[field.name] in helped, field.name
    assert "--accumulate STEPS" in helped and "images per step" in helped
    if command == "train":  # an option whose unit depends on the model says so
        assert "in pixels of the stem's feature map" in " ".join(helped.split())


def test_the_command_line_builds_the_settings_that_python_keywords_build():
    args = parsed(
        "finetune", "ckpt.npz", "--dataset", "photos", "--epochs", "2", "--accumulate", "4",
        "--patch-dropout", "0.25", "--ema", "0.9", "--remat", "--validation-split", "0.2",
    )  # fmt: skip
    from_cli = settings_from(args, TrainingSettings)
    from_python = TrainingSettings(
        dataset="photos",
        weights="ckpt.npz",
        epochs=2,
        gradient_accumulation_steps=4,
        patch_dropout_rate=0.25,
        ema_momentum=0.9,
        remat=True,
        validation_split=0.2,
        batch_size=32,
        recipe="finetune",
        output_dir="keras_vit_finetune",  # the command's own folder
    )
    assert from_cli == from_python
    assert from_cli.resolved().job == "finetune" and from_cli.resolved().model is None


def test_run_json_records_the_settings_it_always_recorded():
    assert set(TrainingSettings().resolved().recorded()) == TRAIN_RECORD
    distilled = TrainingSettings(teacher="cnn.keras").resolved()
    assert set(distilled.recorded()) == TRAIN_RECORD | DISTILLATION_RECORD
    assert distilled.recorded()["distillation"] == "hard"  # its default, resolved
    pretraining = PretrainingSettings(objective="mae", model="small/4").resolved()
    assert set(pretraining.recorded()) == PRETRAIN_RECORD
    # MAE's small decoder for the small models, as the run records it.
    assert pretraining.recorded()["objective_options"] == {
        "decoder_dim": 64,
        "decoder_depth": 2,
        "decoder_heads": 4,
    }


def test_paths_are_recorded_absolute_where_they_exist(tmp_path):
    folder = tmp_path / "photos"
    folder.mkdir()
    recorded = TrainingSettings(str(folder), weights="nowhere.npz").resolved().recorded()
    assert recorded["dataset"] == os.path.abspath(folder)
    assert recorded["weights"] == "nowhere.npz"  # (refused later: it does not exist)


def test_keywords_a_settings_object_and_a_first_positional_dataset_build_the_same():
    assert settings_of(TrainingSettings, "photos", {"epochs": 2}) == TrainingSettings(
        dataset="photos", epochs=2
    )
    base = TrainingSettings(dataset="photos")
    assert settings_of(TrainingSettings, base, {"epochs": 2}) == dataclasses.replace(base, epochs=2)
    with pytest.raises(TypeError, match=r"Unknown setting\(s\) \['epoch'\]"):
        train("photos", epoch=2)
    with pytest.raises(TypeError, match="The dataset was given twice"):
        train("photos", dataset="other")


def test_a_fields_check_names_the_argument_as_its_caller_spelled_it(tmp_path):
    bad = TrainingSettings(gradient_accumulation_steps=1, output_dir=str(tmp_path / "run"))
    bad = bad.resolved()  # (epochs, batch size and recipe: the job's)
    with pytest.raises(ValueError, match=r"Received: gradient_accumulation_steps=1$"):
        bad.check()
    with options_named(parsed("train").options):
        with pytest.raises(ValueError, match=r"^--accumulate must be .*Received: --accumulate 1$"):
            bad.check()
    with pytest.raises(TypeError, match="`remat` must be a bool. Received: remat='yes'"):
        TrainingSettings(remat="yes").resolved().check()
    assert not (tmp_path / "run").exists()
