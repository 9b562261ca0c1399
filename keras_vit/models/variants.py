"""The ViT variants of the paper (Table 1) and its code, as data."""

# name -> (hidden_dim, num_layers, num_heads, mlp_dim)
WIDTHS = {
    "Ti": (192, 12, 3, 768),
    "S": (384, 12, 6, 1536),
    "B": (768, 12, 12, 3072),
    "L": (1024, 24, 16, 4096),
    "H": (1280, 32, 16, 5120),
}
PATCH_SIZES = (8, 14, 16, 32)

# The variants published as builders (keras_vit.ViTB16 etc.): those the
# paper and google-research/vision_transformer (incl. AugReg) released.
PUBLISHED = ("Ti/16", "S/16", "S/32", "B/8", "B/16", "B/32", "L/16", "L/32", "H/14")

# The default model of `keras-vit train`: a small hybrid ViT for 28x28
# images (the paper's hybrid input: tokens from a CNN's feature map).
# Three CNN stages (3x3 convolution, BatchNorm, ReLU; 16, 64, 128 channels)
# turn the image into a 4x4 map of 1x1 patches for 2 Transformer blocks of
# width 96: the first two stages halve the map with 2x2 max pooling, the
# last with a stride-2 convolution. The first stage's pooling is what lifts
# it above a small CNN (stride-2 convolutions throughout score about a point
# lower); the last stage's strided convolution and the 16-channel first
# stage make a step about a third cheaper than three 32-64-128 pooled
# stages, and the 9 epochs that buys beat their 6. How it compares with the
# plain ViT, other stems and a small CNN on Fashion-MNIST: docs/training.md.
SMALL_MODEL = dict(
    patch_size=1,
    hidden_dim=96,
    num_layers=2,
    num_heads=4,
    mlp_dim=192,
    stem_filters=(16, 64, 128),
    stem_strides=(2, 2, 2),
    stem_downsampling=("max_pool", "max_pool", "convolution"),
    class_token=False,
    pooling="gap",
)
# The same width on 4x4 pixel patches (7x7 of them at 28 px) and 4 blocks:
# the paper's plain ViT, which masked-patch pre-training needs (a stem's
# receptive field would show the encoder the pixels it must predict).
SMALL_PATCH_MODEL = dict(
    patch_size=4,
    hidden_dim=64,
    num_layers=4,
    num_heads=4,
    mlp_dim=128,
    class_token=True,
    pooling="token",
)
SMALL_MODELS = {"small": SMALL_MODEL, "small/4": SMALL_PATCH_MODEL}


def decode_variant(variant):
    """The architecture of a named variant, e.g. `"B/16"`.

    Args:
        variant: `"<width>/<patch size>"` with width one of Ti, S, B, L, H
            and patch size one of 8, 14, 16, 32.

    Returns:
        dict with `patch_size`, `hidden_dim`, `num_layers`, `num_heads` and
        `mlp_dim`, ready for `ViT(**decode_variant(...))`.

    Example:

    >>> decode_variant("B/16")["hidden_dim"]
    768
    """
    width, _, patch = str(variant).partition("/")
    if width not in WIDTHS or not patch.isdigit() or int(patch) not in PATCH_SIZES:
        raise ValueError(
            f"Unknown ViT variant {variant!r}: expected '<width>/<patch>' with "
            f"width in {tuple(WIDTHS)} and patch in {PATCH_SIZES}, e.g. 'B/16'."
        )
    hidden_dim, num_layers, num_heads, mlp_dim = WIDTHS[width]
    return {
        "patch_size": int(patch),
        "hidden_dim": hidden_dim,
        "num_layers": num_layers,
        "num_heads": num_heads,
        "mlp_dim": mlp_dim,
    }


def parameter_count(variant, image_size=224, classes=1000, channels=3):
    """The parameter count of a variant with a class token and linear head.

    Counted from the architecture alone (no model is built): patch
    embedding, class token, position embeddings, blocks, final LayerNorm
    and head. Used for documentation and as a check on built models.

    Args:
        variant: a name (`"B/16"`) or a dict of `patch_size`, `hidden_dim`,
            `num_layers` and `mlp_dim` (e.g. `decode_variant(...)`).
        image_size: int, the side of the square input.
        classes: int, the head's classes (0: no head).
        channels: int, image channels.

    Returns:
        int, the number of weights.

    Example:

    >>> parameter_count("B/16")
    86567656
    >>> parameter_count({**decode_variant("B/16"), "num_layers": 1})
    8601064
    """
    arch = decode_variant(variant) if isinstance(variant, str) else variant
    patch, dim, mlp = arch["patch_size"], arch["hidden_dim"], arch["mlp_dim"]
    tokens = (image_size // patch) ** 2 + 1
    block = 4 * dim * dim + 2 * dim * mlp + 9 * dim + mlp  # 2 LN, qkv, out, MLP
    return (
        patch * patch * channels * dim
        + dim  # patch embedding
        + dim  # class token
        + tokens * dim  # position embeddings
        + arch["num_layers"] * block
        + 2 * dim  # encoder norm
        + dim * classes
        + classes  # head
    )


def flop_count(
    variant, image_size=224, classes=1000, channels=3, training=False, patch_dropout_rate=0.0
):
    """Floating-point operations of one image through a ViT, counted analytically.

    The matrix multiplications, at 2 FLOPs per multiply-add (the convention
    of GEMM rates, so `flops * images/s` compares with a GEMM's FLOP/s):
    the patch embedding, per block the q/k/v projections, the attention
    scores and their product with the values, the output projection and
    the two MLP layers, and the head. LayerNorms, softmax, GELU, biases and
    residual additions (under 1% for the paper's variants) are not counted.
    A training step counts 3x the forward pass (the backward pass computes
    two products per forward one: gradients of inputs and of weights).

    Args:
        variant: a name (`"B/16"`) or a dict of `patch_size`, `hidden_dim`,
            `num_layers` and `mlp_dim` (e.g. `decode_variant(...)`); a
            class token is assumed.
        image_size: int, the side of the square input.
        classes: int, the head's classes (0: no head).
        channels: int, image channels.
        training: bool, count a training step (forward and backward).
        patch_dropout_rate: float, the share of patch tokens that a
            training step drops before the blocks (`PatchDropout`): the
            blocks of a training step count the kept ones.

    Returns:
        int, FLOPs per image.

    Example:

    >>> round(flop_count("B/16") / 1e9, 2)   # 17.56 GMACs per image
    35.13
    """
    arch = decode_variant(variant) if isinstance(variant, str) else variant
    patch, dim = arch["patch_size"], arch["hidden_dim"]
    mlp, layers = arch["mlp_dim"], arch["num_layers"]
    patches = (image_size // patch) ** 2
    embedding = 2 * patches * patch * patch * channels * dim
    if training and patch_dropout_rate:
        from keras_vit.layers.patch_dropout import kept_patch_count

        patches = kept_patch_count(patches, patch_dropout_rate)
    tokens = patches + 1
    block = (
        2 * tokens * dim * 3 * dim  # q, k, v
        + 2 * 2 * tokens * tokens * dim  # q k^T and attention x v, over all heads
        + 2 * tokens * dim * dim  # output projection
        + 2 * 2 * tokens * dim * mlp  # the two MLP layers
    )
    forward = embedding + layers * block + 2 * dim * classes
    return 3 * forward if training else forward


def variant_name(patch_size, hidden_dim, num_layers, num_heads, mlp_dim):
    """The table's name of an architecture (`"B/16"`), or `None`.

    Example:

    >>> variant_name(16, 768, 12, 12, 3072)
    'B/16'
    """
    for width, row in WIDTHS.items():
        if row == (hidden_dim, num_layers, num_heads, mlp_dim):
            return f"{width}/{patch_size}"
    return None
