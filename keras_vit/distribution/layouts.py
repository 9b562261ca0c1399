"""Model parallelism for ViT on `keras.distribution` (JAX backend).

The sharding is Megatron-LM's (Shoeybi et al. 2019) for a Transformer
block: the q/k/v projection is split by heads and the first MLP matmul by
hidden units (each device computes whole heads and a slice of the MLP
without talking to the others), the attention output projection and the
second MLP matmul are split by their input, so each block needs one
all-reduce after the attention and one after the MLP. Everything else
(patch embedding, tokens, position embeddings, LayerNorms, head) is small
and replicated.
"""

import re

from keras_vit import _options

MODEL_AXIS = "model"
BATCH_AXIS = "batch"

# Variable path (regex, matched in full) -> its layout: which axis is split
# over the model axis. The paths are keras_vit's layer names
# (`TransformerBlock`, `MultiHeadSelfAttention`); the prefix lets the rules
# hold for an encoder nested in another model.
SHARDED_LAYOUTS = {
    # (D, 3, heads, head_dim) and (3, heads, head_dim): split by heads.
    r"(.*/)?attention/qkv/kernel": (None, None, MODEL_AXIS, None),
    r"(.*/)?attention/qkv/bias": (None, MODEL_AXIS, None),
    # (heads, head_dim, D): split by its input heads.
    r"(.*/)?attention/out/kernel": (MODEL_AXIS, None, None),
    # (D, mlp_dim), (mlp_dim,) and (mlp_dim, D): split by hidden units.
    r"(.*/)?mlp_dense_1/kernel": (None, MODEL_AXIS),
    r"(.*/)?mlp_dense_1/bias": (MODEL_AXIS,),
    r"(.*/)?mlp_dense_2/kernel": (MODEL_AXIS, None),
}


def device_mesh(model_parallel=1, devices=None):
    """A `(batch, model)` `keras.distribution.DeviceMesh` over `devices`.

    Args:
        model_parallel: int, devices that share one copy of the model
            (the size of the `"model"` axis); the rest of the devices are
            data-parallel replicas (the `"batch"` axis).
        devices: list of device names, or `None` for all devices
            (`keras.distribution.list_devices()`).

    Example:

    >>> mesh = device_mesh(2, devices=["cpu:0", "cpu:1", "cpu:2", "cpu:3"])
    >>> mesh.shape, mesh.axis_names
    ((2, 2), ['batch', 'model'])
    """
    import keras

    if devices is None:
        devices = keras.distribution.list_devices()
    devices = list(devices)
    if (
        not isinstance(model_parallel, int)
        or isinstance(model_parallel, bool)
        or (model_parallel < 1 or len(devices) % model_parallel)
    ):
        raise ValueError(
            f"{_options.name('model_parallel')} must be a positive int that divides the "
            f"{len(devices)} devices. Received: {_options.given('model_parallel', model_parallel)}"
        )
    return keras.distribution.DeviceMesh(
        shape=(len(devices) // model_parallel, model_parallel),
        axis_names=[BATCH_AXIS, MODEL_AXIS],
        devices=devices,
    )


def _architecture(model):
    """`(num_heads, mlp_dim)` pairs that `model` holds, for the divisibility check."""
    import keras

    from keras_vit.models import decode_variant

    if model is None:
        return []
    if isinstance(model, str):
        variant = decode_variant(model)
        return [(variant["num_heads"], variant["mlp_dim"])]
    if isinstance(model, dict):
        missing = {"num_heads", "mlp_dim"} - set(model)
        if missing:
            raise ValueError(
                f"`model` as a dict needs 'num_heads' and 'mlp_dim'. Received keys: {sorted(model)}"
            )
        return [(model["num_heads"], model["mlp_dim"])]
    if isinstance(model, keras.Model):
        shapes = {v.path: tuple(v.shape) for v in model.variables}
        found = []
        for path, shape in shapes.items():
            if re.fullmatch(r"(.*/)?attention/qkv/kernel", path):
                mlp = next(
                    (
                        s[1]
                        for p, s in shapes.items()
                        if p == path.replace("attention/qkv/kernel", "mlp_dense_1/kernel")
                    ),
                    None,
                )
                found.append((shape[2], mlp))
        if not found:
            raise ValueError(
                f"Model {model.name!r} has no keras_vit attention layers to shard "
                "(no variable path ends in 'attention/qkv/kernel')."
            )
        return found
    raise TypeError(
        "`model` must be None, a variant name (e.g. 'B/16'), a dict with "
        f"'num_heads' and 'mlp_dim', or a keras_vit model. Received: model={model!r}"
    )


def layout_map(model, mesh):
    """The `keras.distribution.LayoutMap` that shards a ViT over `mesh`'s model axis.

    Attention q/k/v/output and MLP kernels are split over the `"model"`
    axis (by heads and by hidden units), everything else is replicated;
    the optimizer's slots follow their variables. Use it with
    `keras.distribution.ModelParallel` and build the model inside its
    scope (variables are placed when they are created).

    Args:
        model: what is sharded, for the check that heads and MLP width
            divide over the model axis: a variant name (`"B/16"`), a dict
            with `num_heads` and `mlp_dim`, a built keras_vit model, or
            `None` (no check).
        mesh: a `keras.distribution.DeviceMesh` with a `"model"` axis
            (see `device_mesh`).

    Returns:
        `keras.distribution.LayoutMap`.

    Example:

    ```python
    mesh = keras_vit.distribution.device_mesh(model_parallel=2)
    distribution = keras.distribution.ModelParallel(
        layout_map=keras_vit.distribution.layout_map("B/16", mesh),
        batch_dim_name="batch",
    )
    with distribution.scope():
        model = keras_vit.ViTB16(classes=10)
        model.compile(...)
    model.fit(dataset)
    ```
    """
    import keras

    if not isinstance(mesh, keras.distribution.DeviceMesh) or MODEL_AXIS not in mesh.axis_names:
        raise ValueError(
            f"`mesh` must be a keras.distribution.DeviceMesh with a {MODEL_AXIS!r} axis "
            f"(see keras_vit.distribution.device_mesh). Received: mesh={mesh!r}"
        )
    ways = mesh.shape[list(mesh.axis_names).index(MODEL_AXIS)]
    for num_heads, mlp_dim in _architecture(model):
        for name, size in (("num_heads", num_heads), ("mlp_dim", mlp_dim)):
            if size is not None and size % ways:
                raise ValueError(
                    f"{name}={size} does not divide over the {ways} devices of the mesh's "
                    f"{MODEL_AXIS!r} axis; pick a model-parallel size that divides "
                    f"both num_heads={num_heads} and mlp_dim={mlp_dim}."
                )
    layouts = keras.distribution.LayoutMap(mesh)
    for pattern, axes in SHARDED_LAYOUTS.items():
        layouts[pattern] = axes
    return layouts
