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


def decode_variant(variant):
    """The architecture of a named variant, e.g. `"B/16"`.

    Args:
        variant: `"<width>/<patch size>"` with width one of Ti, S, B, L, H
            and patch size one of 8, 14, 16, 32.

    Returns:
        dict with `patch_size`, `hidden_dim`, `num_layers`, `num_heads` and
        `mlp_dim`, ready for `VisionTransformer(**decode_variant(...))`.

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
        patch * patch * channels * dim + dim  # patch embedding
        + dim  # class token
        + tokens * dim  # position embeddings
        + arch["num_layers"] * block
        + 2 * dim  # encoder norm
        + dim * classes + classes  # head
    )


def flop_count(variant, image_size=224, classes=1000, channels=3, training=False,
               patch_dropout_rate=0.0):
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
