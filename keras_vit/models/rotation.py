"""A ViT whose residual stream is rotated: the same function, without outlier channels.

Real checkpoints (DINOv2, DeiT, CLIP) carry a few channels in the residual
stream that are tens of times larger than the rest. They survive
LayerNorm, and a per-tensor int8 scale set by them leaves the other
channels a few levels each. QuaRot (Ashkboos et al., 2024) removes them
without changing what the model computes: multiply the stream by an
orthogonal matrix `Q`, and every weight that writes to it by `Q` on the
right, every weight that reads it by `Q^T` on the left. An outlier channel
is then spread over all channels.

For a pre-norm ViT that takes three exact rewrites first:

- LayerScale's gains folded into the Dense layers that write the stream
  (the attention's output projection, the MLP's second layer);
- LayerNorm's `gamma` and `beta` folded into the layers that read it
  (q/k/v, the MLP's first layer, the heads);
- every writer centred (its outputs minus their mean over channels), so
  the stream's mean is zero and LayerNorm commutes with a `Q` that keeps
  the all-ones direction.

Each head's values are also turned by a Hadamard matrix (`v H`, the output
projection `H^T W`), which evens out the value channels' ranges. The
result computes the same logits (to float32 rounding) and is what the
integer TFLite exports quantise.
"""

import keras
import numpy as np

from keras_vit.models import layouts

# The weights of a layout the rewrite knows, besides the blocks'.
_STREAM_WRITERS = (
    "patch_embedding/kernel",
    "patch_embedding/bias",
    "class_token/token",
    "distillation_token/token",
    "register_tokens/tokens",
    "position_embedding/embeddings",
)
_READERS = ("head", "head_dist")
# A MAP head (`layers.AttentionPooling`): its keys and values read the
# encoder's stream; the rest is the head's own width, which stays unrotated.
_MAP_HEAD_WEIGHTS = tuple(
    f"map_head/{name}"
    for name in (
        "probe",
        "query/kernel",
        "query/bias",
        "key_value/kernel",
        "key_value/bias",
        "out/kernel",
        "out/bias",
        "norm/gamma",
        "norm/beta",
        "mlp_dense_1/kernel",
        "mlp_dense_1/bias",
        "mlp_dense_2/kernel",
        "mlp_dense_2/bias",
    )
)
_BLOCK_WEIGHTS = (
    "attention_norm/gamma",
    "attention_norm/beta",
    "attention/qkv/kernel",
    "attention/qkv/bias",
    "attention/out/kernel",
    "attention/out/bias",
    "attention_scale/gamma",
    "mlp_norm/gamma",
    "mlp_norm/beta",
    "mlp_dense_1/kernel",
    "mlp_dense_1/bias",
    "mlp_scale/gamma",
    "mlp_dense_2/kernel",
    "mlp_dense_2/bias",
)


def unrotatable_weights(model):
    """The weight paths of `model` outside the layout `rotated_copy` rewrites (empty: it can).

    The layout: a keras_vit `VisionTransformer` classifier with learned
    position embeddings, q/k/v biases, class-token, average or attention
    (MAP) pooling and one or two plain heads (a convolutional stem, a
    representation layer or no head at all are outside it).
    """
    paths = [variable.path for variable in model.weights]
    known = set(_STREAM_WRITERS) | {"encoder_norm/gamma", "encoder_norm/beta"}
    known |= set(_MAP_HEAD_WEIGHTS)
    known |= {f"{head}/{name}" for head in _READERS for name in ("kernel", "bias")}
    blocks = {path.split("/")[0] for path in paths if path.startswith("encoderblock_")}
    known |= {f"{block}/{name}" for block in blocks for name in _BLOCK_WEIGHTS}
    outside = [path for path in paths if path not in known]
    for required in ("patch_embedding/kernel", "head/kernel", "encoder_norm/gamma"):
        if required not in paths:
            outside.append(f"(no {required})")
    outside += [
        f"(no {block}/{name})"
        for block in sorted(blocks)
        for name in _BLOCK_WEIGHTS
        if "_scale/" not in name and f"{block}/{name}" not in paths
    ]
    return outside


def rotatable(model):
    """Whether `rotated_copy` rewrites `model`: its layout (`layouts.unrotatable`), its weights."""
    return not layouts.unrotatable(_arguments(model)) and not unrotatable_weights(model)


def _arguments(model):
    """A model's layout as flat arguments: its configuration, or what a saved graph shows."""
    config = model.get_config()
    if "layers" not in config:
        return config
    # (A graph: the weights tell the rest, `unrotatable_weights`.)
    pooling = next((layer for layer in model.layers if layer.name == "pooling"), None)
    return {} if pooling is None else {"pooling": pooling.get_config()["mode"]}


def _rotation(width, seed):
    """A random orthogonal `(width, width)` matrix that maps the all-ones vector to itself."""
    rng = np.random.default_rng(seed)
    ones = np.full((width, 1), width**-0.5)
    basis, _ = np.linalg.qr(np.concatenate([ones, rng.normal(size=(width, width - 1))], axis=1))
    complement = basis[:, 1:]  # an orthonormal basis of the vectors with zero mean
    turn, _ = np.linalg.qr(rng.normal(size=(width - 1, width - 1)))
    return complement @ turn @ complement.T + ones @ ones.T


def _hadamard(size):
    """The orthonormal Hadamard matrix of a power-of-two `size`, else `None`."""
    if size < 1 or size & (size - 1):
        return None
    matrix = np.ones((1, 1))
    while len(matrix) < size:
        matrix = np.block([[matrix, matrix], [matrix, -matrix]])
    return matrix / np.sqrt(size)


def rotated_copy(model, seed=0):
    """A copy of a ViT classifier with its residual stream rotated (see the module's notes).

    The copy computes the same outputs as `model` to float32 rounding;
    `model` is left as it is.

    Args:
        model: a keras_vit `VisionTransformer` classifier of the layout that
            `unrotatable_weights` accepts.
        seed: int, the seed of the random rotation.

    Returns:
        A new `keras.Model` with rewritten weights.

    Raises:
        ValueError: the model has weights outside that layout (named).

    Example:
    >>> import keras_vit
    >>> model = keras_vit.ViT(
    ...     patch_size=7, hidden_dim=32, num_layers=1, num_heads=2, mlp_dim=64,
    ...     input_shape=(28, 28, 1), classes=10)
    >>> head = model.get_layer("head")
    >>> _ = head.kernel.assign(np.random.default_rng(0).normal(size=head.kernel.shape))
    >>> rotated = rotated_copy(model)
    >>> images = np.random.default_rng(0).uniform(0, 255, (2, 28, 28, 1))
    >>> bool(np.allclose(rotated.predict(images, verbose=0), model.predict(images, verbose=0),
    ...                  atol=1e-4))
    True
    """
    refused = layouts.unrotatable(_arguments(model))
    if refused:
        raise ValueError(
            f"`rotated_copy` rewrites the layout it computes the same function in; "
            f"{layouts.described(refused)} is outside it. Received: model={model.name!r}"
        )
    outside = unrotatable_weights(model)
    if outside:
        raise ValueError(
            "`rotated_copy` rewrites keras_vit ViT classifiers with a patch embedding, "
            f"q/k/v biases and plain heads; this model has {', '.join(outside[:5])}"
            f"{' and more' if len(outside) > 5 else ''}. Received: model={model.name!r}"
        )
    copy = keras.saving.deserialize_keras_object(keras.saving.serialize_keras_object(model))
    copy.set_weights(model.get_weights())
    weights = {variable.path: variable for variable in copy.weights}

    def get(path):
        return np.asarray(keras.ops.convert_to_numpy(weights[path]), np.float64)

    def put(path, value):
        weights[path].assign(value.astype(weights[path].dtype))

    width = weights["patch_embedding/kernel"].shape[-1]
    rotation = _rotation(width, seed)
    write = (np.eye(width) - 1.0 / width) @ rotation  # centre, then rotate

    def folded(norm, kernel, bias):
        """`kernel` and `bias` of a layer that reads `norm`'s output, with its gamma and beta in."""
        return get(f"{norm}/gamma")[:, None] * kernel, bias + get(f"{norm}/beta") @ kernel

    def read_after(norm, kernel, bias):
        """`folded`, for a layer that reads the rotated stream through `norm`."""
        kernel, bias = folded(norm, kernel, bias)
        return rotation.T @ kernel, bias

    def reset(norm):
        put(f"{norm}/gamma", np.ones(width))
        put(f"{norm}/beta", np.zeros(width))

    for path in _STREAM_WRITERS:
        if path in weights:
            put(path, get(path) @ write)
    blocks = sorted(
        {path.split("/")[0] for path in weights if path.startswith("encoderblock_")},
        key=lambda block: int(block.rsplit("_", 1)[1]),
    )
    for block in blocks:
        qkv = get(f"{block}/attention/qkv/kernel")  # (width, 3, heads, head_dim)
        kernel, bias = read_after(
            f"{block}/attention_norm",
            qkv.reshape(width, -1),
            get(f"{block}/attention/qkv/bias").reshape(-1),
        )
        kernel, bias = kernel.reshape(qkv.shape), bias.reshape(qkv.shape[1:])
        reset(f"{block}/attention_norm")
        out = get(f"{block}/attention/out/kernel")  # (heads, head_dim, width)
        spread = _hadamard(qkv.shape[-1])
        if spread is not None:
            kernel[:, 2], bias[2] = kernel[:, 2] @ spread, bias[2] @ spread
            out = np.einsum("ji,hjd->hid", spread, out)
        put(f"{block}/attention/qkv/kernel", kernel)
        put(f"{block}/attention/qkv/bias", bias)
        for scale, writer in (
            ("attention_scale", ("attention/out/kernel", "attention/out/bias")),
            ("mlp_scale", ("mlp_dense_2/kernel", "mlp_dense_2/bias")),
        ):
            gain = get(f"{block}/{scale}/gamma") if f"{block}/{scale}/gamma" in weights else 1.0
            for name in writer:
                value = out if name == "attention/out/kernel" else get(f"{block}/{name}")
                put(f"{block}/{name}", (value * gain) @ write)
            if f"{block}/{scale}/gamma" in weights:
                put(f"{block}/{scale}/gamma", np.ones(width))
        kernel, bias = read_after(
            f"{block}/mlp_norm",
            get(f"{block}/mlp_dense_1/kernel"),
            get(f"{block}/mlp_dense_1/bias"),
        )
        put(f"{block}/mlp_dense_1/kernel", kernel)
        put(f"{block}/mlp_dense_1/bias", bias)
        reset(f"{block}/mlp_norm")
    if "map_head/probe" in weights:
        # The probe's keys and values read the stream; the head's own norm
        # reads the head's width, whose gain and offset its MLP takes in.
        key_value = get("map_head/key_value/kernel")  # (width, 2, heads, head_dim)
        kernel, bias = read_after(
            "encoder_norm",
            key_value.reshape(width, -1),
            get("map_head/key_value/bias").reshape(-1),
        )
        put("map_head/key_value/kernel", kernel.reshape(key_value.shape))
        put("map_head/key_value/bias", bias.reshape(key_value.shape[1:]))
        kernel, bias = folded(
            "map_head/norm", get("map_head/mlp_dense_1/kernel"), get("map_head/mlp_dense_1/bias")
        )
        put("map_head/mlp_dense_1/kernel", kernel)
        put("map_head/mlp_dense_1/bias", bias)
        reset("map_head/norm")
    else:
        for head in _READERS:
            if f"{head}/kernel" in weights:
                kernel, bias = read_after(
                    "encoder_norm", get(f"{head}/kernel"), get(f"{head}/bias")
                )
                put(f"{head}/kernel", kernel)
                put(f"{head}/bias", bias)
    reset("encoder_norm")
    return copy
