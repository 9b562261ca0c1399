"""`keras-vit evaluate`: a saved or exported model's accuracy and loss on a dataset split."""

import os

from keras_vit.cli.options import live_bar, positive_int, progress
from keras_vit.cli.preflight import fail
from keras_vit.cli.run_model import load_model_or_export, run_data
from keras_vit.models.anatomy import inference_image_shape

NEEDS = ("train", ("tensorflow", "tensorflow_datasets"))


def add_parser(command):
    evaluate = command(
        "evaluate",
        help="evaluate a saved model",
        description=(
            "Accuracy and loss of a saved model, or of a file `keras-vit export` wrote "
            "(run in its own runtime: LiteRT, ONNX Runtime, TensorFlow), on a dataset "
            "split. A model of a run evaluates on the run's own data: its dataset, data "
            "folder and held-out split (--validation-split of `keras-vit train`), from "
            "run.json beside MODEL."
        ),
    )
    evaluate.add_argument(
        "--model",
        default="keras_vit_run/model.keras",
        help="a .keras file, or an export: a .tflite, an .onnx, a SavedModel folder",
    )
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
    """Evaluates a saved or exported model on a dataset split."""
    import keras

    from keras_vit import data as vit_data

    try:
        model, _ = load_model_or_export(args.model)
        exported = not isinstance(model, keras.Model)
        height, width, channels = model.image_shape if exported else inference_image_shape(model)
        classes = model.classes if exported else model.outputs[0].shape[-1]
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
        if test.num_classes != classes:
            raise ValueError(
                f"{dataset!r} has {test.num_classes} classes and the model "
                f"{classes}: not the data it was trained on? (--dataset)"
            )
    except (ValueError, RuntimeError) as error:
        fail("evaluate", error)
    if exported:
        cross_entropy, accuracy = evaluated_export(model, test.data)
    else:
        cross_entropy, accuracy = evaluated_keras_model(model, test.data)
    print(
        f"{dataset} {args.split}: accuracy {accuracy:.4f}, cross-entropy "
        f"{cross_entropy:.4f} ({test.size} images)"
    )
    return 0


def _metrics(from_logits):
    import keras

    return (
        keras.metrics.CategoricalCrossentropy(from_logits=from_logits),
        keras.metrics.CategoricalAccuracy(name="accuracy"),
    )


def evaluated_keras_model(model, data):
    """`(cross-entropy, accuracy)` of a Keras model over `data`, by `model.evaluate`."""
    import warnings

    from keras_vit.export.checks import outputs_probabilities

    # The model's own output kind: logits, or probabilities of a softmax head.
    loss, accuracy = _metrics(from_logits=not outputs_probabilities(model))
    model.compile(loss=loss, metrics=[accuracy])
    with warnings.catch_warnings():
        # An image folder's pipeline has no known length (undecodable files
        # are dropped), which Keras reports as running out of data; it did not.
        warnings.filterwarnings("ignore", message="Your input ran out of data")
        return model.evaluate(data, verbose=progress())


def evaluated_export(export, data):
    """`(cross-entropy, accuracy)` of an export over `data`, run batch by batch in its runtime.

    The same metrics as `model.evaluate` reports for the `.keras` file (and
    the same mean over images), so the two reports compare line for line.
    """
    import keras

    cross_entropy, accuracy = _metrics(from_logits=not export.outputs_probabilities)
    bar = keras.utils.Progbar(None, verbose=live_bar(), unit_name="batch")
    for index, (images, labels) in enumerate(data.as_numpy_iterator()):
        scores = export(images)
        cross_entropy.update_state(labels, scores)
        accuracy.update_state(labels, scores)
        bar.update(index + 1)
    return float(cross_entropy.result()), float(accuracy.result())
