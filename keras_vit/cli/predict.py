"""`keras-vit predict`: the top-k classes of image files, with a .keras or a .tflite
model.
"""

from keras_vit.cli.common import (
    add_image_limit,
    fail,
    image_shape,
    load_run_model,
    missing_files,
    positive_int,
    read_images,
)

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
        help="a .keras file, or a .tflite file from `keras-vit export`",
    )
    predict.add_argument("--top-k", type=positive_int, default=3, help="classes shown per image")
    add_image_limit(predict)
    predict.set_defaults(run=run, needs=NEEDS)


def run(args):
    """Top-k classes of image files, with a .keras or a .tflite model."""
    import numpy as np

    from keras_vit.export.graph import as_probabilities

    try:
        missing_files(args.images)
        if args.model.endswith(".tflite"):
            from keras_vit.export import TFLiteModel

            runner = TFLiteModel(args.model)
            _, height, width, channels = runner.input_shape
            class_names = runner.metadata.get("class_names")
            outputs_logits = runner.metadata.get("output", "logits") == "logits"
        else:
            from keras_vit.export.graph import outputs_probabilities

            model, class_names = load_run_model(args.model)
            height, width, channels = image_shape(model)
            runner = lambda images: model.predict(images, verbose=0)  # noqa: E731
            outputs_logits = not outputs_probabilities(model)
    except ValueError as error:
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
