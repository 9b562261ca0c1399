"""`keras-vit predict`: the top-k classes of image files, with a .keras model, an
exported file, a checkpoint file or a registered checkpoint.
"""

import os

from keras_vit._options import options_named
from keras_vit.cli.images import missing_files, read_images
from keras_vit.cli.options import add_image_limit, positive_int
from keras_vit.cli.preflight import fail
from keras_vit.cli.run_model import load_model_or_export, load_run_model
from keras_vit.models.anatomy import inference_image_shape as image_shape

NEEDS = ("train", ("tensorflow",))


def add_parser(command):
    predict = command(
        "predict",
        help="top-k classes of image files",
        description="The top-k classes of each image file (JPEG, PNG, GIF, BMP).",
    )
    predict.add_argument("images", metavar="IMAGE", nargs="+", help="image files")
    predict.add_argument(
        "--model",
        default="keras_vit_run/model.keras",
        help="a .keras file, a file of `keras-vit export` (.tflite, .onnx, a SavedModel "
        "folder), a checkpoint file "
        "(.npz, .safetensors, .bin, .pth) or a registered checkpoint as VARIANT:NAME "
        "(e.g. B/16:augreg-imagenet21k+imagenet2012) or on the Hugging Face Hub "
        "(hf-hub:google/vit-base-patch16-224), downloaded once: the last three name "
        "their classes",
    )
    predict.add_argument("--top-k", type=positive_int, default=3, help="classes shown per image")
    add_image_limit(predict)
    predict.set_defaults(run=run, needs=NEEDS)


def pretrained_model(spec):
    """`(model, class_names)` of a checkpoint file, a Hub id or a registered `VARIANT:NAME`."""
    import keras_vit
    from keras_vit.weights import class_names, hub
    from keras_vit.weights.readers import CHECKPOINT_SUFFIXES

    spec = hub.checkpoint_file(spec)  # a Hub id: its file, fetched once for both reads below
    if os.path.isfile(spec) and spec.endswith(CHECKPOINT_SUFFIXES):
        model = keras_vit.from_checkpoint(spec)
        if len(model.outputs[0].shape) != 2 or "head" not in [la.name for la in model.layers]:
            raise ValueError(
                f"{spec} has no classification head (an encoder's checkpoint): fine-tune it "
                f"into a classifier first: keras-vit finetune {spec}"
            )
        return model, class_names(spec, classes=model.output_shape[-1])
    variant, _, name = spec.partition(":")
    if not name or os.path.exists(spec):
        return load_run_model(spec)  # its error: a missing or unreadable model file
    if variant not in keras_vit.models.BUILDERS:
        raise ValueError(
            f"--model {spec!r} is neither a model file nor a registered checkpoint as "
            f"VARIANT:NAME (variants: {', '.join(keras_vit.models.BUILDERS)})"
        )
    with options_named({"weights": "--model"}):  # (a download's advice names the option)
        model = keras_vit.models.BUILDERS[variant](weights=name)
    return model, class_names(name, variant)


def run(args):
    """Top-k classes of image files, with a .keras model, an export or a checkpoint."""
    import numpy as np

    from keras_vit.export.checks import as_probabilities
    from keras_vit.export.exported import exported_kind

    try:
        missing_files(args.images)
        if exported_kind(args.model):
            runner, class_names = load_model_or_export(args.model)
            height, width, channels = runner.image_shape
            outputs_logits = not runner.outputs_probabilities
        else:
            from keras_vit.export.checks import outputs_probabilities

            if args.model.endswith(".keras"):
                model, class_names = load_run_model(args.model)
            else:
                model, class_names = pretrained_model(args.model)
            height, width, channels = image_shape(model)
            runner = lambda images: model.predict(images, verbose=0)  # noqa: E731
            outputs_logits = not outputs_probabilities(model)
    # RuntimeError: a download that failed; ImportError: a Hub id without huggingface_hub.
    except (ValueError, RuntimeError, ImportError) as error:
        fail("predict", error)
    paths, batch = read_images(
        "predict", args.images, height, width, channels, args.max_image_pixels
    )
    if batch is None:
        fail("predict", "no image could be read")
    probabilities = as_probabilities(runner(batch), not outputs_logits)
    for path, row in zip(paths, probabilities):
        print(path)
        for index in np.argsort(row)[::-1][: args.top_k]:
            name = class_names[index] if class_names else str(index)
            print(f"  {name:<16} {row[index]:.3f}")
    return 0 if len(paths) == len(args.images) else 1
