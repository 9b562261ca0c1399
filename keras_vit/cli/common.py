"""What the sub-commands share: argument types, messages, loading a run's model and data."""

import argparse
import os
import re
import sys
import tempfile


def progress():
    """Keras' verbosity for long work: a live bar on a terminal, one line per epoch otherwise."""
    return 1 if sys.stdout.isatty() else 2


# The library's argument names, as the command line spells them.
_CLI_NAMES = {
    "gradient_accumulation_steps": "--accumulate",
    "quantization": "--quantize",
    **{
        name: "--" + name.replace("_", "-")
        for name in (
            "batch_size",
            "image_size",
            "patch_size",
            "data_dir",
            "output_dir",
            "validate_every",
            "epochs",
            "recipe",
            "augmentation",
            "model_parallel",
            "top_k",
            "validation_split",
            "max_image_pixels",
            "calibration_images",
            "dataset",
            "model",
            "seed",
            "distribute",
        )
    },
}


def cli_message(message):
    """A library message with its Python argument names spelled as the CLI's options."""
    message = re.sub(r"`?overwrite=True`?( \(`?--overwrite`?\))?", "--overwrite", message)
    message = message.replace("another `version`", "another --output version folder")
    message = re.sub(r"`?download=True`?", "--download", message)
    for name, option in _CLI_NAMES.items():
        message = re.sub(rf"`{name}=([^`]*)`", rf"{option} \1", message)
        message = re.sub(rf"`{name}`", option, message)
        message = re.sub(rf"\b{name}=", f"{option} ", message)
    return message


def check_writable(path, option, folder):
    """Refuses, before any work, an output `path` that the command could not write.

    Probes the folder the output goes in (or the nearest one that exists:
    the command makes the rest) by writing a temporary file there, so that a
    read-only folder or file system, or a full disk, is one line instead of
    a traceback after the work.

    Args:
        path: the output: a folder (`folder=True`) or a file, to be made or replaced.
        option: the command-line option that gave it, for the message.
        folder: whether `path` is a folder.

    Raises:
        ValueError: naming `option`, `path` and the system's reason.
    """
    target = os.path.abspath(path)
    if folder and os.path.exists(target) and not os.path.isdir(target):
        raise ValueError(f"{option} {path} is a file, not a folder")
    parent = target if folder else os.path.dirname(target)
    while not os.path.exists(parent):
        parent = os.path.dirname(parent)
    if not os.path.isdir(parent):
        raise ValueError(f"{option} {path}: {parent} is a file, not a folder")
    try:
        tempfile.TemporaryFile(dir=parent).close()
        if os.statvfs(parent).f_bavail == 0:
            raise OSError(28, os.strerror(28))  # ENOSPC: what the first write would meet
    except OSError as error:
        raise ValueError(
            f"{option} {path}: cannot write in {parent} ({error.strerror or error})"
        ) from None


def check_installed(command, needs):
    """Fails at once, naming the extra to install, when a sub-command's packages are missing.

    Args:
        command: the sub-command's name.
        needs: `None` (the library floor suffices) or `(extra, modules)`:
            the `pip install keras-vit[extra]` that brings `modules`.
    """
    import importlib.util

    if needs is None:
        return
    extra, modules = needs
    missing = [module for module in modules if importlib.util.find_spec(module) is None]
    if missing:
        listed = ", ".join(missing)
        are = "is" if len(missing) == 1 else "are"
        raise SystemExit(
            f"keras-vit {command}: needs {listed}, which {are} not installed; "
            f"install {'it' if len(missing) == 1 else 'them'} with: "
            f"pip install 'keras-vit[{extra}]'"
        )


# What the training jobs need beyond the library floor.
TRAINING = ("train", ("tensorflow", "tensorflow_datasets", "matplotlib"))


def fail(command, error):
    raise SystemExit(f"keras-vit {command}: {cli_message(str(error))}")


def exported_kind(path):
    """What kind of export `path` is ("a TFLite model", ...), or `None` for anything else."""
    if os.path.isdir(path):
        if os.path.isfile(os.path.join(path, "saved_model.pb")):
            return "an exported SavedModel folder"
        return None
    if path.endswith(".onnx"):
        return "an ONNX model"
    try:
        with open(path, "rb") as f:
            head = f.read(8)
    except OSError:
        return None
    return "a TFLite model" if head[4:8] == b"TFL3" else None  # its FlatBuffer's identifier


def load_run_model(path, classifier=True):
    """`(model, class_names)` of a `.keras` file, or a `ValueError` naming the real cause.

    With `classifier`, the model must map images to one row of class scores
    (a pre-training model does not).
    """
    import json
    import zipfile

    import keras

    export = exported_kind(path)
    if export is not None:
        raise ValueError(
            f"{path} is {export}, not a .keras model file: give the model.keras it was "
            "exported from (keras-vit predict also runs a .tflite; keras-vit export checks "
            "an export against its model when it makes it)"
        )
    if not os.path.isfile(path):
        raise ValueError(f"no such model file: {path!r}")
    if not zipfile.is_zipfile(path):
        raise ValueError(
            f"{path} is not a .keras model file: it is not a zip archive "
            "(a truncated download, or another kind of file)"
        )
    with zipfile.ZipFile(path) as archive:
        if "config.json" not in archive.namelist():
            raise ValueError(
                f"{path} is a zip archive without config.json: not a .keras model file"
            )
    try:
        model = keras.models.load_model(path)
    except (ValueError, TypeError, KeyError, OSError, zipfile.BadZipFile) as error:
        cause = str(error).strip().splitlines()[0] if str(error).strip() else type(error).__name__
        raise ValueError(f"{path} could not be loaded as a Keras model: {cause}") from None
    if classifier and (
        len(model.outputs) != 1
        or len(model.outputs[0].shape) != 2
        or len(model.inputs) != 1
        or len(model.inputs[0].shape) != 4
    ):
        outputs = [tuple(o.shape) for o in model.outputs]
        raise ValueError(
            f"{path} is not an image classifier (images in, one row of class scores out; it "
            f"outputs {outputs[0] if len(outputs) == 1 else outputs}): a pre-training or "
            f"feature model? Fine-tune it into one first: keras-vit finetune {path}"
        )
    if classifier:  # the commands' pipelines make channels-last images
        from keras_vit.export.graph import channels_last_input

        model = channels_last_input(model)
    names_path = os.path.join(os.path.dirname(os.path.abspath(path)), "class_names.json")
    class_names = None
    if os.path.isfile(names_path):
        with open(names_path) as f:
            class_names = json.load(f)
    return model, class_names


def run_data(args):
    """`(dataset, options)` for a command on a run's model: the run's own data by default.

    A model written by `keras-vit train` has `run.json` beside it, which
    names its dataset (and data folder, held-out split); `--dataset` picks
    another. Without either, Fashion-MNIST.
    """
    from keras_vit.training.run import dataset_reference, read_run

    recorded = read_run(os.path.dirname(os.path.abspath(args.model))) or {}
    dataset = args.dataset or recorded.get("dataset") or "fashion_mnist"
    options = {}
    same = dataset_reference(dataset) == recorded.get("dataset")
    data_dir = args.data_dir or (recorded.get("data_dir") if same else None)
    if data_dir:
        options["data_dir"] = data_dir
    if same and recorded.get("validation_split") is not None:
        options["validation_split"] = recorded["validation_split"]
    return dataset, options


def missing_files(paths):
    missing = [p for p in paths if not os.path.isfile(p)]
    if missing:
        raise ValueError(f"no such image file(s): {missing}")


def read_images(command, paths, height, width, channels, max_pixels=None):
    """Image files as one float batch, prepared like evaluation images.

    Each file is checked from its header first (size limits: nothing above
    them is decoded). Returns `(paths, images)` of the files that decoded;
    each one that did not is reported on standard error with its cause.
    """
    import numpy as np
    import tensorflow as tf

    from keras_vit.data import image_limits
    from keras_vit.data.pipelines import decode_for_eval

    kept, images = [], []
    for path in paths:
        try:
            source_height, source_width = image_limits.check_file(path, max_pixels)
            images.append(
                decode_for_eval(
                    tf.io.read_file(path), (height, width), channels, max_pixels=max_pixels
                )
            )
        except image_limits.ImageTooLarge as error:
            print(f"keras-vit {command}: {path}: {error} (--max-image-pixels)", file=sys.stderr)
            continue
        except ValueError as error:
            print(f"keras-vit {command}: {path}: {error}", file=sys.stderr)
            continue
        except tf.errors.InvalidArgumentError as error:
            cause = re.sub(r"\{\{.*?\}\}|\[Op:.*$", "", error.message.strip().splitlines()[0])
            cause = cause.strip().rstrip(".")
            print(
                f"keras-vit {command}: {path}: could not be decoded ({cause}); a truncated "
                "or damaged file, or an encoding TensorFlow does not read",
                file=sys.stderr,
            )
            continue
        if source_height < height or source_width < width:
            print(
                f"keras-vit {command}: {path}: warning: {source_width}x{source_height} image "
                f"upscaled to the model's {width}x{height}",
                file=sys.stderr,
            )
        kept.append(path)
    return kept, (np.stack(images) if images else None)


def image_shape(model, image_size=None):
    """`(height, width, channels)` the CLI feeds `model`: its own, or for a model of any
    size `image_size` (else the size its position table is laid out for)."""
    from keras_vit.models import default_image_size

    size = (image_size, image_size) if image_size else default_image_size(model)
    if None not in model.input_shape[1:3]:
        size = model.input_shape[1:3]
    return (*size, model.input_shape[3])


def add_run_arguments(parser, *, epochs, batch_size, recipe, output_dir, distributed=True):
    """The data, schedule and output options that `train`, `finetune` and `pretrain` share."""
    parser.add_argument(
        "--dataset",
        default="fashion_mnist",
        help="'fashion_mnist', an image folder, or a TFDS name",
    )
    parser.add_argument(
        "--image-size",
        type=positive_int,
        default=None,
        help="default: 28 for the small models (Fashion-MNIST's size), 224 for "
        "the paper's variants; a fine-tune's: its checkpoint's",
    )
    parser.add_argument("--epochs", type=positive_int, default=epochs, help="training epochs")
    parser.add_argument(
        "--batch-size",
        type=positive_int,
        default=batch_size,
        help="images per step (the global batch with --distribute)",
    )
    parser.add_argument(
        "--recipe", default=recipe, help="small | pretrain | finetune | paper_finetune"
    )
    parser.add_argument("--augmentation", default="none", help="none | light | medium | strong")
    parser.add_argument(
        "--output-dir",
        default=output_dir,
        help="folder for the run's files (and its resume checkpoints)",
    )
    parser.add_argument("--data-dir", default=None, help="TFDS data folder")
    parser.add_argument(
        "--download",
        action="store_true",
        help="let TFDS download and prepare a dataset that is not prepared in "
        "--data-dir (without it, such a dataset is refused at once)",
    )
    parser.add_argument("--seed", type=non_negative_int, default=0, help="random seed")
    parser.add_argument(
        "--overwrite",
        action="store_true",
        help="replace a finished run in OUTPUT_DIR, or start over an unfinished "
        "one whose settings differ",
    )
    parser.add_argument(
        "--deterministic",
        action="store_true",
        help="deterministic kernels and batch order: a killed and resumed run ends "
        "with the weights of an uninterrupted one",
    )
    parser.add_argument(
        "--accumulate",
        type=positive_int,
        default=None,
        metavar="STEPS",
        help="gradient accumulation: update every STEPS batches",
    )
    parser.add_argument(
        "--limit",
        type=positive_int,
        default=None,
        metavar="N",
        help="train on the first N training images only (a quick trial run)",
    )
    if not distributed:
        return
    parser.add_argument(
        "--distribute",
        choices=("data", "model"),
        default=None,
        help="data parallel over all devices (JAX: keras.distribution, "
        "TensorFlow: tf.distribute, multi-worker with TF_CONFIG) or "
        "model parallel (JAX); --batch-size is the global batch",
    )
    parser.add_argument(
        "--model-parallel",
        type=positive_int,
        default=2,
        help="devices per model copy with --distribute model",
    )
    parser.add_argument(
        "--cpu-devices",
        type=positive_int,
        default=None,
        help="split the CPU into this many devices (to try --distribute on one machine)",
    )
    parser.add_argument(
        "--validation-split",
        type=fraction,
        default=None,
        metavar="FRACTION",
        help="for an image folder without test/ (one with test/ is refused): "
        "hold out this share of each class's training images as the test "
        "set (the same files each time)",
    )
    parser.add_argument(
        "--validate-every",
        type=positive_int,
        default=None,
        metavar="EPOCHS",
        help="evaluate on the test split every EPOCHS epochs (default: after the last one only)",
    )


class HelpFormatter(argparse.ArgumentDefaultsHelpFormatter):
    """Shows every option's default (but not `None` or `False`)."""

    def _get_help_string(self, action):
        if action.default in (None, False, argparse.SUPPRESS) or "%(default)" in (
            action.help or ""
        ):
            return action.help
        return super()._get_help_string(action)


def installed_version():
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("keras-vit")
    except PackageNotFoundError:  # run from a source tree that is not installed
        return "unknown (not installed)"


def _whole_number(text, smallest, what):
    try:
        value = int(text)
    except ValueError:
        value = None
    if value is None or value < smallest:
        raise argparse.ArgumentTypeError(f"must be {what}, not {text!r}")
    return value


def positive_int(text):
    return _whole_number(text, 1, "a positive whole number")


def non_negative_int(text):
    return _whole_number(text, 0, "a whole number, 0 or more")


def _real_number(text, accepts, what):
    try:
        value = float(text)
    except ValueError:
        value = None
    if value is None or not accepts(value):
        raise argparse.ArgumentTypeError(f"must be {what}, not {text!r}")
    return value


def fraction(text):
    return _real_number(text, lambda v: 0.0 < v < 1.0, "a number between 0 and 1")


def decay_factor(text):
    """A number in (0, 1]: `--layer-decay`'s."""
    return _real_number(text, lambda v: 0.0 < v <= 1.0, "a number in (0, 1]")


def positive_float(text):
    return _real_number(text, lambda v: 0.0 < v < float("inf"), "a positive number")


def add_image_limit(parser):
    from keras_vit.data import image_limits

    parser.add_argument(
        "--max-image-pixels",
        type=positive_int,
        default=image_limits.MAX_PIXELS,
        help="refuse images whose header declares more pixels, before decoding them",
    )
