"""What a ViT attends to and what it learned, as NumPy arrays (paper section 4.5).

Every function takes a model built by `keras_vit.VisionTransformer` (trained
here or loaded from a checkpoint) and leaves it untouched: attention is read
through a second functional graph over the same layers and weights.
"""

import keras
import numpy as np

from keras_vit.models.anatomy import default_image_size, encoder_blocks, patch_pixels
from keras_vit.weights import block_tokens


def token_layout(model, image_size=None):
    """`(prefix_tokens, (rows, cols), (patch_height, patch_width))` of a ViT.

    `prefix_tokens` counts the class / distillation / register tokens before
    the patches; the patch size is in input pixels (a convolutional stem's
    stride included).

    Args:
        model: a ViT built by keras_vit.
        image_size: `(height, width)` of the images; `None`: the model's
            input size (a model of run-time resolution: its table's).

    Raises:
        ValueError: `model` is not a ViT built by keras_vit.
    """
    names = {layer.name for layer in getattr(model, "layers", ())}
    positions = names & {"position_embedding", "rotary_embedding"}
    if not positions or not any(n.startswith("encoderblock_") for n in names):
        raise ValueError(
            f"{getattr(model, 'name', model)!r} is not a ViT built by keras_vit (it has no "
            "position_embedding (or rotary_embedding) and encoderblock_N layers); the "
            "inspection reads those."
        )
    positions = model.get_layer(positions.pop())
    patch = patch_pixels(model)
    if image_size is None:
        image_size = default_image_size(model)
    # The patches are cut from the stem's feature map, whose halvings round
    # up (28 px -> 14 -> 7 -> 4): not image size / patch pixels.
    feature_size = tuple(image_size)
    if has_stem(model):
        feature_size = model.get_layer("stem").output_size(feature_size)
    cut = model.get_layer("patch_embedding").patch_size
    grid = tuple(side // size for side, size in zip(feature_size, cut))
    prefix = positions.num_prefix_tokens  # (the rotation's counts the registers too)
    if positions.name == "position_embedding" and "register_tokens" in names:
        prefix += model.get_layer("register_tokens").num_tokens
    return prefix, grid, patch


def has_stem(model):
    """Whether a convolutional stem sits between the pixels and the patch embedding."""
    return any(layer.name == "stem" for layer in model.layers)


def block_inputs_model(model):
    """A model from images to the token sequence entering each encoder block.

    Shares `model`'s layers and weights and leaves its forward pass as it is.
    """
    blocks = encoder_blocks(model)
    return keras.Model(
        model.inputs, [block_tokens(block) for block in blocks], name=f"{model.name}_block_inputs"
    )


def attention_maps(model, images, batch_size=32):
    """The attention probabilities of every block and head.

    The tokens entering each block are computed by the model's own graph,
    then each block is called on them with `return_attention_scores=True`:
    its attention layer's explicit path, with its own weights.

    Args:
        model: a ViT built by this package.
        images: array `(batch, H, W, C)` as the model takes them.
        batch_size: int, images per forward pass.

    Returns:
        float32 array `(layers, batch, heads, tokens, tokens)`; each row
        (a query's attention over the keys) sums to 1.

    Example:

    >>> import keras_vit
    >>> vit = keras_vit.ViT(
    ...     patch_size=4, hidden_dim=32, num_layers=2, num_heads=2, mlp_dim=64,
    ...     input_shape=(16, 16, 3), classes=10)
    >>> attention_maps(vit, np.zeros((1, 16, 16, 3))).shape
    (2, 1, 2, 17, 17)
    """
    images = np.asarray(images, "float32")
    expected = tuple(model.input_shape[1:])
    if images.ndim != 4 or any(
        side not in (None, got) for side, got in zip(expected, images.shape[1:])
    ):
        raise ValueError(
            f"`images` must be a batch of {expected} images (None: any size). "
            f"Received shape {images.shape}."
        )
    blocks = encoder_blocks(model)
    inputs = block_inputs_model(model).predict(images, batch_size=batch_size, verbose=0)
    if not isinstance(inputs, (list, tuple)):
        inputs = [inputs]
    rotated = {}  # (the rotation of the images' grid, as the model hands it to each block)
    if any(layer.name == "rotary_embedding" for layer in model.layers):
        _, grid, _ = token_layout(model, images.shape[1:3])
        rotated["rotation"] = model.get_layer("rotary_embedding")(grid=grid)
    maps = []
    for block, tokens in zip(blocks, inputs):
        scores = []
        for start in range(0, len(tokens), batch_size):
            batch = tokens[start : start + batch_size]
            _, probabilities = block(batch, return_attention_scores=True, **rotated)
            scores.append(keras.ops.convert_to_numpy(probabilities))
        maps.append(np.concatenate(scores).astype("float32"))
    return np.stack(maps)


def attention_rollout(attentions, num_prefix_tokens=1, grid_size=None, token_index=None):
    """Attention rollout (Abnar & Zuidema 2020) from the pooled output to the patches.

    Each layer's attention is averaged over heads, the identity added for
    the residual connection (`0.5 A + 0.5 I`), rows re-normalised, and the
    layers multiplied from the first to the last.

    Args:
        attentions: `(layers, batch, heads, tokens, tokens)` from
            `attention_maps`.
        num_prefix_tokens: tokens before the patches.
        grid_size: `(rows, cols)` to reshape the patch weights to, or `None`.
        token_index: the prefix token whose rollout is returned; `None`:
            the class token (0) when there are prefix tokens, else the mean
            over all tokens (what average pooling reads).

    Returns:
        `(batch, patches)` or `(batch, rows, cols)`: how much each patch
        flows into the token; each map sums to at most 1.
    """
    attentions = np.asarray(attentions, "float64")
    tokens = attentions.shape[-1]
    identity = np.eye(tokens)
    rollout = np.broadcast_to(identity, attentions.shape[1:2] + (tokens, tokens))
    for layer in attentions:
        mixed = 0.5 * layer.mean(axis=1) + 0.5 * identity
        mixed /= mixed.sum(axis=-1, keepdims=True)
        rollout = mixed @ rollout
    if token_index is None and num_prefix_tokens == 0:
        patches = rollout.mean(axis=1)
    else:
        patches = rollout[:, token_index or 0, num_prefix_tokens:]
    if grid_size is not None:
        patches = patches.reshape((-1, *grid_size))
    return patches.astype("float32")


def patch_distances(grid_size, patch_size):
    """`(patches, patches)` distances in pixels between patch centres."""
    rows, cols = grid_size
    y, x = np.meshgrid(
        np.arange(rows) * patch_size[0], np.arange(cols) * patch_size[1], indexing="ij"
    )
    centres = np.stack([y.ravel(), x.ravel()], axis=-1).astype("float64")
    return np.linalg.norm(centres[:, None] - centres[None], axis=-1)


def mean_attention_distance(attentions, grid_size, patch_size, num_prefix_tokens=1):
    """The attention-weighted mean distance between query and key patches (paper Fig. 7).

    Patch queries over patch keys; each query's weights are re-normalised
    over the patches (prefix tokens have no position in the image), then the
    distance is averaged over queries and images.

    Args:
        attentions: `(layers, batch, heads, tokens, tokens)`.
        grid_size: `(rows, cols)` of the patch grid.
        patch_size: `(height, width)` of a patch in pixels.
        num_prefix_tokens: tokens before the patches.

    Returns:
        `(layers, heads)` distances in pixels.
    """
    attentions = np.asarray(attentions, "float64")
    patch = attentions[..., num_prefix_tokens:, num_prefix_tokens:]
    patch = patch / np.maximum(patch.sum(axis=-1, keepdims=True), 1e-12)
    distances = patch_distances(grid_size, patch_size)
    per_query = (patch * distances).sum(axis=-1)  # (layers, batch, heads, queries)
    return per_query.mean(axis=(1, 3)).astype("float32")


def uniform_attention_distance(grid_size, patch_size):
    """The mean attention distance of a head that attends to every patch alike (pixels)."""
    return float(patch_distances(grid_size, patch_size).mean())


def position_similarity(model):
    """Cosine similarity of each patch position's embedding with every other (paper Fig. 10).

    Returns:
        `(rows, cols, rows, cols)`: `[i, j]` is the similarity map of the
        position at row `i`, column `j` with all positions.
    """
    layer = model.get_layer("position_embedding")
    table = np.asarray(keras.ops.convert_to_numpy(layer.embeddings), "float64")[0]
    rows, cols = layer.grid_size
    grid = table[layer.num_prefix_tokens :]
    grid = grid / np.maximum(np.linalg.norm(grid, axis=-1, keepdims=True), 1e-12)
    return (grid @ grid.T).reshape(rows, cols, rows, cols).astype("float32")


def embedding_filters(model, components=28):
    """The principal components of the patch projection's filters (paper Fig. 7 left).

    The `hidden_dim` filters of the patch embedding, each a `(P, P, C)`
    patch, are centred and decomposed; the leading right-singular vectors
    are the components.

    Returns:
        `(components, P, P, C)` float32, each component scaled to `[0, 1]`
        for display.
    """
    if has_stem(model):
        raise ValueError(
            f"Model {model.name!r} has a convolutional stem: its patch embedding filters "
            "act on the stem's features, not on pixels, so they are not images."
        )
    kernel = np.asarray(
        keras.ops.convert_to_numpy(model.get_layer("patch_embedding").kernel), "float64"
    )
    height, width, channels, dim = kernel.shape
    filters = kernel.reshape(-1, dim).T  # (dim, P*P*C)
    filters = filters - filters.mean(axis=0)
    _, _, basis = np.linalg.svd(filters, full_matrices=False)
    basis = basis[: min(components, len(basis))].reshape(-1, height, width, channels)
    low = basis.min(axis=(1, 2, 3), keepdims=True)
    high = basis.max(axis=(1, 2, 3), keepdims=True)
    return ((basis - low) / np.maximum(high - low, 1e-12)).astype("float32")
