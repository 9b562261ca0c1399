"""A trained ViT with fewer tokens in each block: token merging at inference."""

import keras

from keras_vit.layers.attention_pooling import AttentionPooling
from keras_vit.layers.rotary_position_embedding import RotaryPositionEmbedding2D
from keras_vit.layers.token_merging_block import TokenMergingBlock
from keras_vit.layers.token_pooling import TokenPooling
from keras_vit.layers.transformer_block import TransformerBlock
from keras_vit.weights import block_tokens, encoder_blocks


def largest_merge(num_patches, num_blocks):
    """The largest `r` that every one of `num_blocks` blocks can merge from `num_patches`.

    Each block merges at most half of the patch tokens it gets (one set of
    the bipartite matching into the other): `r <= (num_patches - i * r) // 2`
    for block `i`, the last one binding.
    """
    r = num_patches // 2
    while r and r > (num_patches - (num_blocks - 1) * r) // 2:
        r -= 1
    return r


def merge_tokens(model, r):
    """`model` with `r` pairs of patch tokens merged in each block (ToMe).

    Token merging (Bolya et al., ICLR 2023) needs no training: each block
    averages its `r` most similar pairs of patch tokens after its
    attention (`keras_vit.layers.TokenMergingBlock`), so a model of `L`
    blocks ends with `L * r` fewer tokens and each block costs less than
    the one before. The model gets a copy of `model`'s weights. Shapes
    are static, so `keras_vit.export` keeps the merging in SavedModel,
    TFLite and ONNX files.

    Args:
        model: a `keras_vit.VisionTransformer` classifier or feature model
            of a fixed input size with `pooling="token"` (the class token's
            features: the paper's, DeiT's and DINOv2's heads; a distilled
            DeiT's two heads, its class and distillation tokens never
            merged) or `pooling="map"` (SigLIP's attention-pooling head,
            whose probe then attends in proportion too: each key's logit
            gains `log(size)`). Its positions may be a table or rotary
            (DINOv3's): a merged token then turns by the rotation at the
            size-weighted mean of its patches' centres.
        r: int >= 1, the pairs merged in each block; at most what the
            patches allow (`largest_merge`, e.g. 19 for the 256 patches of
            a ViT-S/14 at 224 px).

    Returns:
        A functional `keras.Model` with the inputs and outputs of `model`.

    Example:

    >>> import keras_vit
    >>> model = keras_vit.ViT(
    ...     input_shape=(32, 32, 3), patch_size=4, hidden_dim=32,
    ...     num_layers=2, num_heads=2, mlp_dim=64, classes=10)
    >>> merged = keras_vit.models.merge_tokens(model, r=8)
    >>> tuple(merged.get_layer("encoderblock_1").output[0].shape)
    (None, 49, 32)
    """
    if not isinstance(model, keras.Model):
        raise TypeError(f"`model` must be a keras_vit model. Received: model={model!r}")
    blocks = encoder_blocks(model)
    pooling = next(
        (layer for layer in model.layers if isinstance(layer, (TokenPooling, AttentionPooling))),
        None,
    )
    mode = "map" if isinstance(pooling, AttentionPooling) else getattr(pooling, "mode", None)
    if mode not in ("token", "map") or len(model.inputs) + len(model.outputs) != 2:
        raise ValueError(
            "merge_tokens needs a model with pooling='token' (the class token's features) or "
            f"'map' (a MAP head) and one output. Received: model {model.name!r} with pooling "
            f"{mode!r}"
        )
    num_tokens = block_tokens(blocks[0]).shape[1]
    if num_tokens is None:
        raise ValueError(
            "merge_tokens needs a model of a fixed input size (static token counts). "
            f"Received: input_shape={model.input_shape}"
        )
    num_patches = num_tokens - pooling.num_prefix_tokens
    largest = largest_merge(num_patches, len(blocks))
    if isinstance(r, bool) or not isinstance(r, int) or not 1 <= r <= largest:
        raise ValueError(
            f"`r` must be an int from 1 to {largest}: the most that each of the "
            f"{len(blocks)} blocks can merge from {num_patches} patch tokens. Received: r={r!r}"
        )
    return keras.Model(model.inputs[0], _merged_graph(model, r, pooling), name=model.name)


def _merged_graph(model, r, pooling):
    """The model's layers called again in order, its blocks replaced by merging ones.

    Each layer takes the copies of the tensors it took (a distilled DeiT's
    second pooling and head, and their average, too); the blocks hand the
    merged tokens' sizes on from one to the next.
    """
    copied = {id(model.inputs[0]): model.inputs[0]}
    merged = None  # what each block hands the next: [sizes] or [sizes, coordinates]
    rotary = {}
    for layer in model.layers:
        if isinstance(layer, keras.layers.InputLayer):
            continue
        if isinstance(layer, RotaryPositionEmbedding2D):
            # Not copied: each merging block turns its tokens where they sit
            # (the blocks' `rotation` is not handed on).
            rotary = dict(rope_base=layer.base, grid_size=tuple(layer.input.shape[1:3]))
            copied[id(layer.output)] = None
            continue
        inputs = layer.input
        several = isinstance(inputs, (list, tuple))
        taken = list(inputs) if several else [inputs]
        if any(id(tensor) not in copied for tensor in taken):
            raise ValueError(
                f"merge_tokens takes the graph of a keras_vit model; layer {layer.name!r} "
                "takes a tensor from outside it."
            )
        taken = [copied[id(tensor)] for tensor in taken]
        if isinstance(layer, TransformerBlock):
            config = {**layer.get_config(), "remat": False}
            copy = TokenMergingBlock(
                r=r, num_prefix_tokens=pooling.num_prefix_tokens, **rotary, **config
            )
            output, *merged = copy(taken[0] if merged is None else [taken[0], *merged])
        elif isinstance(layer, AttentionPooling):
            # Proportional attention in the MAP head too: a merged token weighs as
            # the patches it stands for.
            copy = AttentionPooling.from_config(layer.get_config())
            output = copy(taken[0], sizes=merged[0])
        else:
            copy = type(layer).from_config(layer.get_config())
            output = copy(taken if several else taken[0])
        # Copies, not the model's layers: two models holding one variable
        # break on JAX, whose calls hand a model's buffers over to XLA.
        for target, source in zip(copy.weights, layer.weights, strict=True):
            target.assign(keras.ops.copy(source.value))
        copied[id(layer.output)] = output
    return copied[id(model.outputs[0])]
