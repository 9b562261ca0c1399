"""`keras-vit export`: a saved model as a TF Serving SavedModel, a TFLite file or an
ONNX file, checked against Keras.
"""

import os
import sys

from keras_vit.cli.options import live_bar, non_negative_int, positive_int
from keras_vit.cli.preflight import check_writable, fail
from keras_vit.cli.run_model import load_run_model, run_data
from keras_vit.models.anatomy import inference_image_shape as image_shape

NEEDS = ("export", ("tensorflow", "tensorflow_serving", "ai_edge_litert"))


def add_parser(command):
    export = command(
        "export",
        help="export a saved model for TF Serving (SavedModel), the edge (TFLite) or ONNX",
        description=(
            "Exports MODEL (a .keras file; class_names.json beside it is used) "
            "as a TF Serving SavedModel in OUTPUT/<version>/ (float and "
            "encoded-image signatures), as a .tflite file or as an .onnx file "
            "(each with its own .json beside it: model.tflite.json), then checks the export "
            "against the "
            "Keras model on images of --dataset: the SavedModel in a "
            "TensorFlow-only process through PredictRequest protos, the .tflite "
            "in the LiteRT interpreter, the .onnx in ONNX Runtime in a process "
            "without Keras."
        ),
    )
    export.add_argument("model", metavar="MODEL", help="a .keras file")
    export.add_argument(
        "--format",
        choices=("saved_model", "tflite", "onnx"),
        default="saved_model",
        help="TF Serving SavedModel, TFLite / LiteRT file or ONNX file",
    )
    export.add_argument(
        "--image-size",
        type=positive_int,
        default=None,
        help="for a model of any image size: the size to export a .tflite "
        "or .onnx at, or that serving_bytes resizes to",
    )
    export.add_argument(
        "--quantize",
        dest="quantization",
        choices=("none", "float16", "dynamic", "int8", "int8_full", "int16x8"),
        default="none",
        help="TFLite quantisation",
    )
    export.add_argument(
        "--output",
        default=None,
        help="default: MODEL's folder, serving/NAME/, model[_QUANT].tflite or model.onnx",
    )
    export.add_argument(
        "--top-k", type=positive_int, default=5, help="classes in the SavedModel's top-k outputs"
    )
    export.add_argument(
        "--dataset",
        default=None,
        help="images to calibrate int8 and check the export with (default: "
        "the run's own, from run.json beside MODEL; else fashion_mnist)",
    )
    export.add_argument("--data-dir", default=None, help="TFDS data folder")
    export.add_argument(
        "--calibration-images",
        type=positive_int,
        default=256,
        help="training images that calibrate int8",
    )
    export.add_argument("--check-images", type=non_negative_int, default=256, help="0: no check")
    export.add_argument(
        "--overwrite", action="store_true", help="replace an existing version directory / file"
    )
    # A SavedModel's version is the last part of --output (`export.saved_model`'s `version`).
    export.options["version"] = "--output version folder"
    export.set_defaults(run=run, needs=NEEDS)


def _dataset_images(model, dataset, split, count, options, image_size=None):
    """`count` evaluation-view images (a float array) of a split, at the model's input size."""
    from keras_vit import data as vit_data
    from keras_vit.export.litert import calibration_images

    shape = image_shape(model, image_size)
    loaded = vit_data.load(
        dataset,
        split,
        image_size=shape[:2],
        channels=shape[2],
        batch_size=min(count, 256),
        **options,
    )
    return calibration_images(loaded.data, shape, count)


def _has_test_split(dataset):
    """Whether a folder has test/ or a TFDS name is asked for (its "test" split is tried)."""
    if os.path.isdir(str(dataset)):
        return os.path.isdir(os.path.join(str(dataset), "test"))
    return False


def _default_output(args, model):
    """Where an export goes without --output: beside MODEL."""
    run_dir = os.path.dirname(os.path.abspath(args.model))
    if args.format == "saved_model":
        return os.path.join(run_dir, "serving", model.name)
    if args.format == "onnx":
        return os.path.join(run_dir, "model.onnx")
    suffix = "" if args.quantization == "none" else f"_{args.quantization}"
    return os.path.join(run_dir, f"model{suffix}.tflite")


def run(args):
    """Exports a saved model as a TF Serving SavedModel or a TFLite file, then checks it."""
    try:
        if args.format != "tflite" and args.quantization != "none":
            raise ValueError("--quantize applies to --format tflite only")
        model, class_names = load_run_model(args.model)
        output = args.output or _default_output(args, model)
        check_writable(output, "--output", folder=args.format == "saved_model")
        dataset, data_options = run_data(args)
        path = _export(args, model, output, class_names, dataset, data_options)
    except (ValueError, TypeError) as error:
        fail("export", error)
    print(f"exported {args.format} to {path}")
    if args.check_images > 0:
        _check(args, model, path, dataset, data_options)
    return 0


def _export(args, model, output, class_names, dataset, data_options):
    """Writes the export; returns its path."""
    from keras_vit import export
    from keras_vit.export.litert import CALIBRATED

    if args.format == "saved_model":
        return export.saved_model(
            model,
            output,
            class_names=class_names,
            top_k=args.top_k,
            overwrite=args.overwrite,
            image_size=args.image_size,
        )
    if args.format == "onnx":
        return export.onnx(
            model,
            output,
            image_size=args.image_size,
            class_names=class_names,
            overwrite=args.overwrite,
        )["path"]
    calibration = None
    if args.quantization in CALIBRATED:
        # The representative data comes from the training split.
        calibration = _dataset_images(
            model, dataset, "train", args.calibration_images, data_options, args.image_size
        )
    return export.tflite(
        model,
        output,
        quantization=args.quantization,
        representative_data=calibration,
        calibration_count=args.calibration_images,
        class_names=class_names,
        overwrite=args.overwrite,
        image_size=args.image_size,
    )["path"]


def _check(args, model, path, dataset, data_options):
    """Checks the export against the model on images of the run's data; warns below 99%."""
    from keras_vit import export
    from keras_vit.export.checks import agreement_warning
    from keras_vit.export.saved_model import SIGNATURES

    check_split = (
        "train"
        if dataset != "fashion_mnist"
        and "validation_split" not in data_options
        and not _has_test_split(dataset)
        else "test"
    )
    images = _dataset_images(
        model,
        dataset,
        check_split,
        args.check_images,
        data_options,
        args.image_size if args.format != "saved_model" else None,
    )
    if args.format == "saved_model":
        import tensorflow as tf

        encoded = [tf.io.encode_png(tf.cast(tf.round(i), tf.uint8)).numpy() for i in images[:8]]
        print(f"checking the export in a TensorFlow-only process on {len(images)} images")
        report = export.check_saved_model(path, model, images, encoded, verbose=live_bar())
        print(report["signatures"])
        agreements = []
        for signature in SIGNATURES:
            numbers = report.get(signature)
            if numbers:
                print(
                    f"{signature}: max abs error {numbers['max_abs_error']:.2e}, "
                    f"top-1 agreement {numbers['top1_agreement']:.2%} "
                    "(TensorFlow-only process, PredictRequest)"
                )
                agreements.append(
                    (
                        numbers["top1_agreement"],
                        len(images) if signature != "serving_bytes" else len(encoded),
                    )
                )
        # (A signature the server refused has no agreement: its error is in the table.)
        top1_agreement, count = min(agreements, default=(1.0, 0))
    else:
        runtime = "ONNX Runtime" if args.format == "onnx" else "LiteRT"
        where = "ONNX Runtime (a process without Keras)" if args.format == "onnx" else "LiteRT"
        print(f"checking the export in {where} on {len(images)} images")
        check = export.check_onnx if args.format == "onnx" else export.check_tflite
        report = check(path, model, images, verbose=live_bar())
        print(
            f"{runtime}: {report['bytes'] / 1e6:.2f} MB, max abs error "
            f"{report['max_abs_error']:.2e}, top-1 agreement {report['top1_agreement']:.2%} "
            f"on {len(images)} {dataset} images, {report['latency_ms']:.2f} ms/image "
            "(2 threads)"
        )
        top1_agreement, count = report["top1_agreement"], len(images)
    # Kept, but flagged: the file is the user's to judge.
    warning = agreement_warning(top1_agreement, count, path)
    if warning:
        print(f"keras-vit export: warning: {warning}", file=sys.stderr)
