"""`keras-vit convert`: an official .npz, Hugging Face or timm checkpoint to a .keras
model file.
"""

import os

from keras_vit.cli.options import positive_int
from keras_vit.cli.preflight import check_writable, fail

NEEDS = None  # the library floor suffices


def add_parser(command):
    convert = command(
        "convert",
        help="convert an official .npz, Hugging Face or timm checkpoint to .keras",
        description=(
            "Builds the ViT that SRC describes (width, depth, heads, patch, "
            "resolution, head, GELU form, LayerNorm epsilon and pixel "
            "normalisation of its source) and saves it with its weights as DST."
        ),
    )
    convert.add_argument("source", metavar="SRC", help="checkpoint file")
    convert.add_argument("destination", metavar="DST", help="output .keras file")
    convert.add_argument(
        "--image-size",
        type=positive_int,
        default=None,
        help="build at this resolution (position embeddings resampled)",
    )
    convert.add_argument(
        "--classes",
        type=positive_int,
        default=None,
        help="a new zero-initialised head of this many classes",
    )
    convert.add_argument("--no-top", action="store_true", help="drop the head")
    convert.add_argument(
        "--num-heads",
        type=positive_int,
        default=None,
        help="attention heads, for files without config.json outside the variant table",
    )
    convert.add_argument("--overwrite", action="store_true", help="replace DST")
    convert.set_defaults(run=run, needs=NEEDS)


def run(args):
    """Converts a checkpoint into a `.keras` model file."""
    if not args.destination.endswith(".keras"):
        raise SystemExit(
            f"keras-vit convert: DST must end in .keras. Received: {args.destination!r}"
        )
    if os.path.exists(args.destination) and not args.overwrite:
        raise SystemExit(
            f"keras-vit convert: {args.destination!r} exists; pass --overwrite to replace it."
        )
    if not os.path.isfile(args.source):
        raise SystemExit(f"keras-vit convert: no such file: {args.source!r}")
    try:
        check_writable(args.destination, "DST", folder=False)
    except ValueError as error:
        fail("convert", error)
    from keras_vit.models import from_checkpoint

    overrides = {}
    if args.image_size:
        overrides["input_shape"] = (args.image_size, args.image_size, 3)
    if args.classes is not None:
        overrides.update(include_top=True, classes=args.classes)
    if args.no_top:
        overrides["include_top"] = False
    try:
        model = from_checkpoint(args.source, num_heads=args.num_heads, **overrides)
    except (ValueError, TypeError) as error:
        raise SystemExit(f"keras-vit convert: {error}") from None
    from keras_vit.models import encoder_blocks
    from keras_vit.weights import block_tokens

    os.makedirs(os.path.dirname(os.path.abspath(args.destination)), exist_ok=True)
    model.save(args.destination, overwrite=True)
    blocks = encoder_blocks(model)
    print(
        f"{args.source} -> {args.destination}: {len(blocks)} blocks, width "
        f"{block_tokens(blocks[0]).shape[-1]}, {blocks[0].num_heads} heads, input "
        f"{model.input_shape[1:]}, output {model.output_shape[1:]}, "
        f"{model.count_params():,} parameters"
    )
    return 0
