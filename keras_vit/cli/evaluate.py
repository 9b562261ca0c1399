"""`keras-vit evaluate`: a saved model's accuracy and loss on a dataset split."""

import os

from keras_vit.cli.options import positive_int, progress
from keras_vit.cli.preflight import fail
from keras_vit.cli.run_model import load_run_model, run_data
from keras_vit.models.anatomy import inference_image_shape as image_shape

NEEDS = ("train", ("tensorflow", "tensorflow_datasets"))


def add_parser(command):
    evaluate = command(
        "evaluate",
        help="evaluate a saved model",
        description=(
            "Accuracy and loss of a saved model on a dataset split. A model of a run "
            "evaluates on the run's own data: its dataset, data folder and held-out split "
            "(--validation-split of `keras-vit train`), from run.json beside MODEL."
        ),
    )
    evaluate.add_argument("--model", default="keras_vit_run/model.keras", help="a .keras file")
    evaluate.add_argument(
        "--dataset",
        default=None,
        help="'fashion_mnist', an image folder, or a TFDS name (default: the "
        "run's own, from run.json beside MODEL; else fashion_mnist)",
    )
    evaluate.add_argument("--split", default="test", help="dataset split")
    evaluate.add_argument("--batch-size", type=positive_int, default=500, help="images per step")
    evaluate.add_argument("--data-dir", default=None, help="TFDS data folder")
    evaluate.set_defaults(run=run, needs=NEEDS)


def run(args):
    """Evaluates a saved model on a dataset split."""
    from keras_vit import data as vit_data

    try:
        model, _ = load_run_model(args.model)
        height, width, channels = image_shape(model)
        dataset, options = run_data(args)
        if (
            "validation_split" not in options
            and os.path.isdir(str(dataset))
            and vit_data.folder_layout(dataset)["flat"]
        ):
            # Class folders at the top, named for evaluation: all of their images.
            test = vit_data.from_folder(
                dataset, image_size=(height, width), channels=channels, batch_size=args.batch_size
            )
        else:
            test = vit_data.load(
                dataset,
                args.split,
                image_size=(height, width),
                channels=channels,
                batch_size=args.batch_size,
                **options,
            )
        if test.num_classes != model.outputs[0].shape[-1]:
            raise ValueError(
                f"{dataset!r} has {test.num_classes} classes and the model "
                f"{model.outputs[0].shape[-1]}: not the data it was trained on? (--dataset)"
            )
    except (ValueError, RuntimeError) as error:
        fail("evaluate", error)
    import keras

    from keras_vit.export.checks import outputs_probabilities

    # The model's own output kind: logits, or probabilities of a softmax head.
    from_logits = not outputs_probabilities(model)
    model.compile(
        loss=keras.losses.CategoricalCrossentropy(from_logits=from_logits),
        metrics=[keras.metrics.CategoricalAccuracy(name="accuracy")],
    )
    import warnings

    with warnings.catch_warnings():
        # An image folder's pipeline has no known length (undecodable files
        # are dropped), which Keras reports as running out of data; it did not.
        warnings.filterwarnings("ignore", message="Your input ran out of data")
        cross_entropy, accuracy = model.evaluate(test.data, verbose=progress())
    print(
        f"{dataset} {args.split}: accuracy {accuracy:.4f}, cross-entropy "
        f"{cross_entropy:.4f} ({test.size} images)"
    )
    return 0
