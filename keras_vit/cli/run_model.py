"""A run's saved model for the commands that use it: loaded with a clear error, and its data."""

import os

from keras_vit import _options


def load_run_model(path, classifier=True):
    """`(model, class_names)` of a `.keras` file, or a `ValueError` naming the real cause.

    With `classifier`, the model must map images to one row of class scores
    (a pre-training model does not).
    """
    import zipfile

    import keras

    from keras_vit.export.exported import exported_kind

    export = exported_kind(path)
    if export is not None:
        raise ValueError(
            f"{path} is {export}, not a .keras model file: give the model.keras it was "
            "exported from (keras-vit evaluate and predict also take exported files)"
        )
    if not os.path.isfile(path):
        raise ValueError(f"no such model file: {path!r}")
    from keras_vit.weights.keras_archive import check_keras_archive

    check_keras_archive(path)
    try:
        model = keras.models.load_model(path)
    except (ValueError, TypeError, KeyError, OSError, zipfile.BadZipFile) as error:
        raise ValueError(
            f"{path} could not be loaded as a Keras model: {_options.first_line(error)}"
        ) from None
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
    return model, _class_names_beside(path)


def load_model_or_export(path):
    """`(model, class_names)` of a `.keras` file, or of an exported file or folder.

    An export comes as `keras_vit.export.open_export` reads it; its class
    names are those its metadata records, else those beside it, as for a
    `.keras` file (`class_names.json`).
    """
    from keras_vit.export.exported import exported_kind, open_export

    if exported_kind(path) is None:
        return load_run_model(path)
    export = open_export(path)
    return export, export.class_names or _class_names_beside(path)


def _class_names_beside(path):
    import json

    names_path = os.path.join(os.path.dirname(os.path.abspath(path)), "class_names.json")
    if not os.path.isfile(names_path):
        return None
    with open(names_path) as f:
        return json.load(f)


def run_data(args):
    """`(dataset, options)` for a command on a run's model: the run's own data by default.

    A model written by `keras-vit train` has `run.json` beside it, which
    names its dataset (and data folder, held-out split); `--dataset` picks
    another. Without either, Fashion-MNIST.
    """
    from keras_vit.training.run_folder import read_run
    from keras_vit.training.settings import path_reference as dataset_reference

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
