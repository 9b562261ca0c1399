"""`keras-vit inspect`: the paper's inspection figures of a model on some images."""

import os

from keras_vit.cli.images import missing_files, read_images
from keras_vit.cli.options import add_image_limit
from keras_vit.cli.preflight import check_writable, fail
from keras_vit.cli.run_model import load_run_model
from keras_vit.models.anatomy import inference_image_shape as image_shape

NEEDS = ("train", ("tensorflow", "matplotlib"))


def add_parser(command):
    inspect = command(
        "inspect",
        help="attention rollout, attention distance, position and filter figures",
        description=(
            "Writes the figures of the paper's section 4.5 for MODEL as PNGs in "
            "--out: attention rollout over each IMAGE, mean attention distance "
            "of every head against depth (over the given images), "
            "position-embedding similarity, and the patch filters' principal "
            "components (models without a convolutional stem)."
        ),
    )
    inspect.add_argument("model", metavar="MODEL", help="a .keras file")
    inspect.add_argument("images", metavar="IMAGE", nargs="+", help="image files")
    inspect.add_argument("--out", default="keras_vit_inspect", help="folder for the PNGs")
    add_image_limit(inspect)
    inspect.set_defaults(run=run, needs=NEEDS)


def run(args):
    """Writes the paper's inspection figures for a model and some images."""
    from keras_vit import inspect as vit_inspect

    try:
        missing_files(args.images)
        model, _ = load_run_model(args.model, classifier=False)
        check_writable(args.out, "--out", folder=True)
        try:
            vit_inspect.token_layout(model)  # a ViT of this package, or a clear error
        except ValueError as error:
            raise ValueError(f"{args.model}: {error}") from None
    except ValueError as error:
        fail("inspect", error)
    paths, images = read_images("inspect", args.images, *image_shape(model), args.max_image_pixels)
    if images is None:
        fail("inspect", "no image could be read")
    titles = [os.path.basename(p) for p in paths]
    paths = vit_inspect.write_figures(model, images, args.out, titles)
    for name, path in paths.items():
        print(f"  {name:<20} {path}")
    if vit_inspect.has_stem(model):
        print(
            f"  {'embedding_filters':<20} skipped: the model has a convolutional stem, so its "
            "patch filters see feature maps, not pixels"
        )
    return 0
