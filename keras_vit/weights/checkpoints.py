"""Reading ViT checkpoints of other origins into keras_vit's weight layout.

Every source is converted to one canonical form: a dict from a keras_vit
weight path (`"encoderblock_3/attention/qkv_kernel"`, as `weight.path` names
it) to a NumPy array of that weight's shape. Three layouts are understood:

- `official`: google-research/vision_transformer `.npz` files (original
  i21k / i21k+i1k and AugReg), Flax names such as `embedding/kernel` and
  `Transformer/encoderblock_0/MultiHeadDotProductAttention_1/query/kernel`;
- `huggingface`: `ViTModel` / `ViTForImageClassification` / DeiT (with
  teacher) / `Dinov2Model` (with registers, classifiers) / `ViTMAEModel`
  state dicts as saved on the Hub (`vit.encoder.layer.0.attention...`);
- `timm`: `timm` VisionTransformer state dicts (`blocks.0.attn.qkv.weight`),
  distilled DeiT (`dist_token`, `head_dist`) included;
- `keras_vit`: this package's own `.keras` files (a trained model to
  fine-tune at another resolution or on other classes).

Files are read without unpickling: `.npz` with `allow_pickle=False`,
`.safetensors` with `safetensors`, PyTorch `.bin`/`.pth` with
`torch.load(weights_only=True)`.
"""

import json
import os
import re
import zipfile

import numpy as np

CHECKPOINT_SUFFIXES = (".npz", ".safetensors", ".bin", ".pth", ".pt", ".keras")


def _read_npz(path):
    with np.load(path, allow_pickle=False) as archive:  # object arrays need pickle: refused
        return {key: archive[key] for key in archive.files}


def _read_safetensors(path):
    from safetensors.numpy import load_file

    return load_file(path)


def _read_keras(path):
    import keras

    import keras_vit  # noqa: F401  (registers the layers)

    # Keras' safe mode: a file with a Lambda layer is refused.
    model = keras.saving.load_model(path, compile=False, safe_mode=True)
    return {w.path: keras.ops.convert_to_numpy(w) for w in model.weights}


def _read_torch(path):
    try:
        import torch
    except ImportError:
        raise ImportError(
            f"Reading the PyTorch file {path!r} needs torch "
            "(`pip install keras-vit[torch]`); .safetensors files do not."
        ) from None
    state = torch.load(path, map_location="cpu", weights_only=True)
    if not isinstance(state, dict):
        raise ValueError(f"it holds a {type(state).__name__}, not a state dict")
    state = state.get("model", state.get("state_dict", state))
    return {k: v.float().numpy() for k, v in state.items() if hasattr(v, "numpy")}


_READERS = {
    ".npz": ("NumPy .npz", _read_npz),
    ".safetensors": ("safetensors", _read_safetensors),
    ".keras": ("Keras .keras", _read_keras),
    ".bin": ("PyTorch", _read_torch),
    ".pth": ("PyTorch", _read_torch),
    ".pt": ("PyTorch", _read_torch),
}


def read_tensors(path):
    """`{name: array}` of a checkpoint file, never unpickling anything.

    A damaged, truncated or crafted file ends in a `ValueError` that names
    the file and what the parser found, whatever the parser raised.
    """
    suffix = next((s for s in _READERS if str(path).endswith(s)), None)
    if suffix is None:
        raise ValueError(
            f"{path!r} is not a checkpoint file; expected one ending in "
            f"{' or '.join(CHECKPOINT_SUFFIXES)}."
        )
    if not os.path.isfile(path):
        raise ValueError(f"No such checkpoint file: {path!r}")
    kind, read = _READERS[suffix]
    try:
        return read(path)
    except ImportError:
        raise
    except Exception as error:  # noqa: BLE001  (parsers raise anything on bad bytes)
        raise ValueError(
            f"{path!r} is not a readable {kind} checkpoint "
            f"({type(error).__name__}: {str(error)[:500]})"
        ) from None


def detect_layout(tensors):
    """`"official"`, `"huggingface"` or `"timm"`, from the tensor names."""
    names = set(tensors)
    if "patch_embedding/kernel" in names:
        return "keras_vit"
    if "embedding/kernel" in names:
        return "official"
    if "patch_embed.proj.weight" in names:
        return "timm"
    if any(n.endswith("embeddings.patch_embeddings.projection.weight") for n in names):
        return "huggingface"
    raise ValueError(
        "Not a ViT checkpoint of a known layout (official .npz, Hugging Face, "
        f"timm): none of its {len(names)} tensors is a patch embedding. "
        f"First names: {sorted(names)[:5]}"
    )


def _linear(weight):
    """PyTorch `(out, in)` Linear weight -> Keras `(in, out)` kernel."""
    return np.ascontiguousarray(weight.T)


def _norm(target, param, value):
    """A PyTorch LayerNorm `weight`/`bias` -> `{target/gamma|beta: value}`."""
    return {f"{target}/{'gamma' if param == 'weight' else 'beta'}": value}


def _dense(target, param, value):
    """A PyTorch Linear `weight`/`bias` -> `{target/kernel|bias: value}`."""
    if param == "weight":
        return {f"{target}/kernel": _linear(value)}
    return {f"{target}/bias": value}


def _out_projection(prefix, param, value, num_heads):
    """The attention output Linear -> `(H, hd, D)` kernel / `(D,)` bias."""
    if param == "weight":
        kernel = _linear(value).reshape(num_heads, -1, value.shape[0])
        return {prefix + "attention/out_kernel": kernel}
    return {prefix + "attention/out_bias": value}


def _heads(kernel, num_heads):
    """`(D, H * hd)` -> `(D, H, hd)`."""
    return kernel.reshape(kernel.shape[0], num_heads, -1)


# The official (Flax) checkpoints' tensor names -> keras_vit weight paths,
# outside and inside `Transformer/encoderblock_{i}/`. `to_official` writes
# with the same tables, read backwards. The q/k/v projections, stacked into
# one kernel here, are `_OFFICIAL_QKV`.
_OFFICIAL = {
    "embedding/kernel": "patch_embedding/kernel",
    "embedding/bias": "patch_embedding/bias",
    "cls": "class_token/token",
    "Transformer/posembed_input/pos_embedding": "position_embedding/embeddings",
    "Transformer/encoder_norm/scale": "encoder_norm/gamma",
    "Transformer/encoder_norm/bias": "encoder_norm/beta",
    "pre_logits/kernel": "pre_logits/kernel",
    "pre_logits/bias": "pre_logits/bias",
    "head/kernel": "head/kernel",
    "head/bias": "head/bias",
}
_OFFICIAL_BLOCK = {
    "LayerNorm_0/scale": "attention_norm/gamma",
    "LayerNorm_0/bias": "attention_norm/beta",
    "LayerNorm_2/scale": "mlp_norm/gamma",
    "LayerNorm_2/bias": "mlp_norm/beta",
    "MlpBlock_3/Dense_0/kernel": "mlp_dense_1/kernel",
    "MlpBlock_3/Dense_0/bias": "mlp_dense_1/bias",
    "MlpBlock_3/Dense_1/kernel": "mlp_dense_2/kernel",
    "MlpBlock_3/Dense_1/bias": "mlp_dense_2/bias",
    "MultiHeadDotProductAttention_1/out/kernel": "attention/out_kernel",
    "MultiHeadDotProductAttention_1/out/bias": "attention/out_bias",
}
_OFFICIAL_QKV = "MultiHeadDotProductAttention_1/{projection}/{kind}"


def _official(tensors, num_heads):
    del num_heads  # the Flax kernels carry the head axis
    out = {}
    qkv = {}
    for name, value in tensors.items():
        if name in _OFFICIAL:
            out[_OFFICIAL[name]] = value
            continue
        match = re.fullmatch(r"Transformer/encoderblock_(\d+)/(.+)", name)
        if not match:
            continue
        index, rest = int(match[1]), match[2]
        if rest in _OFFICIAL_BLOCK:
            out[f"encoderblock_{index}/{_OFFICIAL_BLOCK[rest]}"] = value
        projection = re.fullmatch(
            _OFFICIAL_QKV.format(projection="(query|key|value)", kind="(kernel|bias)"), rest
        )
        if projection:
            qkv[(index, projection[2], projection[1])] = value
    return _stack_qkv(out, qkv)


def _stack_qkv(out, qkv):
    """Stacks per-projection `(D, H, hd)` kernels / `(H, hd)` biases on axis 1 / 0."""
    for index, kind in sorted({(i, k) for i, k, _ in qkv}):
        parts = [qkv.get((index, kind, p)) for p in ("query", "key", "value")]
        if any(part is None for part in parts):
            continue  # reported as a missing weight
        if kind == "kernel":
            out[f"encoderblock_{index}/attention/qkv_kernel"] = np.stack(parts, axis=1)
        else:
            out[f"encoderblock_{index}/attention/qkv_bias"] = np.stack(parts, axis=0)
    return out


_HF_BLOCK = {
    # ViT names, then DINOv2's for the same weights.
    "layernorm_before": "attention_norm",
    "norm1": "attention_norm",
    "layernorm_after": "mlp_norm",
    "norm2": "mlp_norm",
    "intermediate.dense": "mlp_dense_1",
    "mlp.fc1": "mlp_dense_1",
    "output.dense": "mlp_dense_2",
    "mlp.fc2": "mlp_dense_2",
}
# transformers >= 5 module names (what `torch.save(model.state_dict())`
# writes; `save_pretrained` converts back to the Hub names above).
_HF_MODULE_NAMES = {
    r"^layers\.": "encoder.layer.",
    r"\.attention\.q_proj\.": ".attention.attention.query.",
    r"\.attention\.k_proj\.": ".attention.attention.key.",
    r"\.attention\.v_proj\.": ".attention.attention.value.",
    r"\.attention\.o_proj\.": ".attention.output.dense.",
}


def _huggingface(tensors, num_heads):
    out, qkv = {}, {}
    for name, value in tensors.items():
        name = re.sub(r"^(vit|deit|dinov2_with_registers|dinov2|model)\.", "", name)
        for pattern, hub_name in _HF_MODULE_NAMES.items():
            name = re.sub(pattern, hub_name, name)
        if name == "embeddings.cls_token":
            out["class_token/token"] = value
        elif name == "embeddings.distillation_token":
            out["distillation_token/token"] = value
        elif name == "embeddings.register_tokens":
            out["register_tokens/tokens"] = value
        elif name == "embeddings.position_embeddings":
            out["position_embedding/embeddings"] = value
        elif name.startswith("embeddings.patch_embeddings.projection."):
            if name.endswith("weight"):
                out["patch_embedding/kernel"] = value.transpose(2, 3, 1, 0)
            else:
                out["patch_embedding/bias"] = value
        elif name.startswith("layernorm."):
            out.update(_norm("encoder_norm", name.rsplit(".", 1)[1], value))
        elif name.startswith("pooler.dense."):
            out.update(_dense("pre_logits", name.rsplit(".", 1)[1], value))
        elif name.startswith(("classifier.", "cls_classifier.")):
            out.update(_dense("head", name.rsplit(".", 1)[1], value))
        elif name.startswith("distillation_classifier."):
            out.update(_dense("head_dist", name.rsplit(".", 1)[1], value))
        match = re.fullmatch(r"encoder\.layer\.(\d+)\.(.+)\.(weight|bias|lambda1)", name)
        if not match:
            continue
        index, module, param = int(match[1]), match[2], match[3]
        prefix = f"encoderblock_{index}/"
        projection = re.fullmatch(r"attention\.attention\.(query|key|value)", module)
        if projection:
            kind = "kernel" if param == "weight" else "bias"
            value = _heads(_linear(value), num_heads) if kind == "kernel" else value.reshape(num_heads, -1)
            qkv[(index, kind, projection[1])] = value
        elif module == "attention.output.dense":
            out.update(_out_projection(prefix, param, value, num_heads))
        elif module in ("layer_scale1", "layer_scale2"):
            out[prefix + ("attention_scale" if module.endswith("1") else "mlp_scale") + "/gamma"] = value
        elif module in _HF_BLOCK:
            target = _HF_BLOCK[module]
            convert = _norm if target.endswith("norm") else _dense
            out.update(convert(prefix + target, param, value))
    return _stack_qkv(out, qkv)


def _timm(tensors, num_heads):
    out = {}
    simple = {
        "cls_token": "class_token/token",
        "dist_token": "distillation_token/token",
        "pos_embed": "position_embedding/embeddings",
        "patch_embed.proj.bias": "patch_embedding/bias",
        "norm.weight": "encoder_norm/gamma",
        "norm.bias": "encoder_norm/beta",
        "head.bias": "head/bias",
        "head_dist.bias": "head_dist/bias",
        "pre_logits.fc.bias": "pre_logits/bias",
    }
    for name, value in tensors.items():
        if name in simple:
            out[simple[name]] = value
        elif name == "patch_embed.proj.weight":
            out["patch_embedding/kernel"] = value.transpose(2, 3, 1, 0)
        elif name in ("head.weight", "head_dist.weight"):
            out[name.split(".")[0] + "/kernel"] = _linear(value)
        elif name == "pre_logits.fc.weight":
            out["pre_logits/kernel"] = _linear(value)
        elif name.startswith("attn_pool."):
            out.update(_timm_attention_pool(name[len("attn_pool."):], value, num_heads))
        match = re.fullmatch(r"blocks\.(\d+)\.(.+)\.(weight|bias|gamma)", name)
        if not match:
            continue
        prefix, module, param = f"encoderblock_{match[1]}/", match[2], match[3]
        if module == "attn.qkv":
            if param == "weight":
                dim = value.shape[1]
                out[prefix + "attention/qkv_kernel"] = _linear(value).reshape(dim, 3, num_heads, -1)
            else:
                out[prefix + "attention/qkv_bias"] = value.reshape(3, num_heads, -1)
        elif module == "attn.proj":
            out.update(_out_projection(prefix, param, value, num_heads))
        elif module in ("ls1", "ls2"):
            out[prefix + ("attention_scale" if module == "ls1" else "mlp_scale") + "/gamma"] = value
        elif module in ("norm1", "norm2"):
            target = "attention_norm" if module == "norm1" else "mlp_norm"
            out.update(_norm(prefix + target, param, value))
        elif module in ("mlp.fc1", "mlp.fc2"):
            target = "mlp_dense_1" if module.endswith("1") else "mlp_dense_2"
            out.update(_dense(prefix + target, param, value))
    return out


def _timm_attention_pool(name, value, num_heads):
    """timm's `AttentionPoolLatent` (`attn_pool.*`) -> keras_vit's `map_head/*`."""
    if name == "latent":
        return {"map_head/probe": value}
    module, param = name.rsplit(".", 1)
    if module in ("q", "kv", "proj"):
        target = {"q": "query", "kv": "key_value", "proj": "out"}[module]
        if module == "proj":
            shape = (num_heads, -1, value.shape[0]) if param == "weight" else (-1,)
        else:
            parts = () if module == "q" else (2,)
            shape = ((value.shape[-1],) if param == "weight" else ()) + parts + (num_heads, -1)
        value = _linear(value) if param == "weight" else value
        return {f"map_head/{target}_{'kernel' if param == 'weight' else 'bias'}":
                value.reshape(shape)}
    if module == "norm":
        return _norm("map_head/norm", param, value)
    if module in ("mlp.fc1", "mlp.fc2"):
        return _dense("map_head/mlp_dense_" + module[-1], param, value)
    raise ValueError(f"timm attention pool tensor {'attn_pool.' + name!r} has no place "
                     "in keras_vit's MAP head (e.g. a latent length above 1 or q/k norms).")


def _keras_vit(tensors, num_heads):
    del num_heads  # already in keras_vit's layout
    return dict(tensors)


CONVERTERS = {
    "official": _official, "huggingface": _huggingface, "timm": _timm,
    "keras_vit": _keras_vit,
}


def keras_layer_configs(path):
    """`{layer name: config}` of a `.keras` file's functional model.

    Read from the archive's `config.json`, without building anything.
    """
    try:
        with zipfile.ZipFile(path) as archive:
            config = json.loads(archive.read("config.json"))
        layers = config["config"]["layers"]
        return {layer["name"]: layer["config"] for layer in layers}
    except (zipfile.BadZipFile, KeyError, TypeError, ValueError) as error:
        raise ValueError(f"{path!r} is not a Keras functional model file: {error}") from None


def _keras_vit_arguments(path, arguments):
    """What a keras_vit `.keras` file's layer configs add to its shapes."""
    configs = keras_layer_configs(path)
    # The image input (a pre-training model has mask inputs too).
    batch_shape = configs.get("images", {}).get("batch_shape") or next(
        (c["batch_shape"] for c in configs.values() if "batch_shape" in c), None
    )
    if batch_shape:
        arguments["input_shape"] = tuple(batch_shape[1:])
    positions = configs.get("position_embedding", {})
    if "resample_method" in positions:
        arguments["resample_method"] = positions["resample_method"]
    if arguments["input_shape"][0] is None and "grid_size" in positions:
        # A model of run-time resolution: its table's image size.
        stride = int(np.prod(configs.get("stem", {}).get("strides") or
                             [2] * len(configs.get("stem", {}).get("filters", ()))))
        patch = configs.get("patch_embedding", {}).get("patch_size", (1, 1))
        arguments["base_image_size"] = tuple(
            int(g) * int(p) * stride for g, p in zip(positions["grid_size"], patch))
    block = configs.get("encoderblock_0", {})
    arguments["approximate_gelu"] = block.get("approximate_gelu", True)
    arguments["layer_norm_epsilon"] = block.get("layer_norm_epsilon", 1e-6)
    arguments["position_embedding"] = configs.get("position_embedding", {}).get("kind", "learned")
    if "stem" in configs:
        arguments["stem_filters"] = tuple(configs["stem"]["filters"])
        arguments["stem_strides"] = tuple(configs["stem"].get("strides") or ()) or None
    pooling = configs.get("pooling")
    arguments["pooling"] = "map" if "map_head" in configs else pooling["mode"] if pooling else None
    rescaling = configs.get("rescaling")
    arguments["include_rescaling"] = rescaling is not None
    if rescaling is not None:
        channels = arguments["input_shape"][-1]
        scale = np.broadcast_to(np.asarray(rescaling["scale"], "float64"), (channels,))
        offset = np.broadcast_to(np.asarray(rescaling["offset"], "float64"), (channels,))
        std = 1.0 / (255.0 * scale)
        arguments["normalization"] = (tuple(-offset * std), tuple(std))
    return arguments


def to_canonical(tensors, num_heads):
    """Converts a checkpoint's tensors to `{keras_vit weight path: array}`.

    Args:
        tensors: `{name: array}` as read from the file.
        num_heads: the attention heads of the target model (PyTorch layouts
            store projections as `(D, D)` matrices without a head axis).

    Returns:
        `(layout, canonical)`.
    """
    layout = detect_layout(tensors)
    canonical = CONVERTERS[layout](tensors, num_heads)
    return layout, {k: np.asarray(v, dtype="float32") for k, v in canonical.items()}


def to_official(model):
    """A model's weights as `{name: array}` in the official `.npz` layout.

    The inverse of the `official` reader, for writing checkpoints that the
    original JAX code (and this package) read.
    """
    from keras import ops

    inverse = {path: name for name, path in _OFFICIAL.items()}
    block = {path: name for name, path in _OFFICIAL_BLOCK.items()}
    out = {}
    for weight in model.weights:
        value = ops.convert_to_numpy(weight).astype("float32")
        if weight.path in inverse:
            out[inverse[weight.path]] = value
            continue
        match = re.fullmatch(r"encoderblock_(\d+)/(.+)", weight.path)
        if not match:
            raise ValueError(f"{weight.path!r} has no place in the official layout.")
        prefix, rest = f"Transformer/encoderblock_{match[1]}/", match[2]
        if rest in block:
            out[prefix + block[rest]] = value
        elif rest in ("attention/qkv_kernel", "attention/qkv_bias"):
            kind = "kernel" if rest.endswith("kernel") else "bias"
            for i, projection in enumerate(("query", "key", "value")):
                part = value[:, i] if kind == "kernel" else value[i]
                out[prefix + _OFFICIAL_QKV.format(projection=projection, kind=kind)] = part
        else:
            raise ValueError(f"{weight.path!r} has no place in the official layout.")
    return out


def read_json_beside(path, name):
    """A JSON file (`config.json`, ...) in the checkpoint's folder, or `{}`."""
    json_path = os.path.join(os.path.dirname(os.path.abspath(path)), name)
    if not os.path.isfile(json_path):
        return {}
    with open(json_path) as f:
        return json.load(f)


# Hugging Face model types that resample their position grid with
# `antialias=True` (the others: plain bicubic, as PyTorch's default).
_ANTIALIASED_MODEL_TYPES = ("dinov2_with_registers",)


def source_resample_method(path):
    """How the checkpoint's own code resamples its position grid.

    `"bicubic_antialias"` for the Hugging Face models that interpolate with
    `antialias=True` (read from `config.json` beside the file), else
    `"bicubic"` (PyTorch's bicubic, as timm and Hugging Face ViT/DeiT/DINOv2).
    """
    model_type = read_json_beside(path, "config.json").get("model_type")
    return "bicubic_antialias" if model_type in _ANTIALIASED_MODEL_TYPES else "bicubic"


# Tensors of architectures that keras_vit does not build (yet): loading
# them into a plain ViT would silently change the model's outputs.
_UNSUPPORTED = {
    "reg_token": "timm register tokens (timm's own position-embedding rules)",
}

# Hugging Face model types trained on ImageNet mean/std pixels.
_IMAGENET_MODEL_TYPES = ("deit", "dinov2", "vit_mae", "dino")


def infer_architecture(path, tensors, num_heads=None):
    """The `VisionTransformer` arguments that reproduce a checkpoint's model.

    Shapes give the width, depth, patch size, MLP width, position grid,
    class token, `pre_logits` and head; the head count comes from the
    official kernels, `config.json` beside the file, `num_heads`, or the
    paper's variant table. The GELU form, LayerNorm epsilon and pixel
    normalisation follow the checkpoint's source: the official code uses
    tanh GELU and eps 1e-6 on `[-1, 1]` pixels; Hugging Face its config
    (`hidden_act`, `layer_norm_eps`) and `preprocessor_config.json`; timm
    exact GELU, eps 1e-6 and the mean/std in its `config.json`.

    Returns:
        `(layout, arguments)`.
    """
    for name in tensors:
        for marker, what in _UNSUPPORTED.items():
            if marker in name:
                raise ValueError(
                    f"{path!r} is a ViT with {what} ({name!r}), which "
                    "keras_vit does not build."
                )
    layout, shapes = to_canonical(tensors, num_heads=1)
    if "patch_embedding/kernel" not in shapes:
        raise ValueError(f"{path!r} has no patch embedding kernel.")
    distillation_token = "distillation_token/token" in shapes
    if distillation_token and "head/kernel" in shapes and "head_dist/kernel" not in shapes:
        raise ValueError(
            f"{path!r} is a DeiT with a distillation token but one head "
            "(DeiTForImageClassification); keras_vit builds distilled DeiTs "
            "with both heads (DeiTForImageClassificationWithTeacher). Use the "
            "checkpoint without its head (`keras_vit.weights.load` into a "
            "model with include_top=False)."
        )
    patch_h, patch_w, channels, hidden_dim = shapes["patch_embedding/kernel"].shape
    depth = 1 + max(
        (int(m[1]) for k in shapes if (m := re.match(r"encoderblock_(\d+)/", k))),
        default=-1,
    )
    if depth == 0 or "encoderblock_0/mlp_dense_1/kernel" not in shapes:
        raise ValueError(f"{path!r} has no encoder blocks.")
    config = read_json_beside(path, "config.json")
    if layout in ("official", "keras_vit"):  # kernels with a head axis
        num_heads = shapes["encoderblock_0/attention/qkv_kernel"].shape[2]
    num_heads = num_heads or config.get("num_attention_heads")
    if num_heads is None:
        from keras_vit.models.variants import WIDTHS

        by_width = {row[0]: row[2] for row in WIDTHS.values()}
        if hidden_dim not in by_width:
            raise ValueError(
                f"{path!r}: the head count of a width-{hidden_dim} ViT is not "
                "in the checkpoint, a config.json or the variant table; pass "
                "num_heads."
            )
        num_heads = by_width[hidden_dim]
    class_token = "class_token/token" in shapes
    positions = (
        shapes["position_embedding/embeddings"].shape[1]
        - int(class_token)
        - int(distillation_token)
    )
    grid = int(round(positions ** 0.5))
    if grid * grid != positions and layout != "keras_vit":  # (its config has the shape)
        raise ValueError(
            f"{path!r}: {positions} position embeddings are not a square grid."
        )
    arguments = {
        "patch_size": (patch_h, patch_w) if patch_h != patch_w else int(patch_h),
        "hidden_dim": int(hidden_dim),
        "num_layers": depth,
        "num_heads": int(num_heads),
        "mlp_dim": int(shapes["encoderblock_0/mlp_dense_1/kernel"].shape[1]),
        "input_shape": (grid * patch_h, grid * patch_w, int(channels)),
        "class_token": class_token,
        "distillation_token": distillation_token,
        "num_register_tokens": (
            int(shapes["register_tokens/tokens"].shape[1]) if "register_tokens/tokens" in shapes else 0
        ),
        "pooling": "map" if "map_head/probe" in shapes else "token" if class_token else "gap",
        "include_top": "head/kernel" in shapes,
        "representation_size": (
            int(shapes["pre_logits/kernel"].shape[1]) if "pre_logits/kernel" in shapes else None
        ),
        "layer_scale_init": 1.0 if "encoderblock_0/attention_scale/gamma" in shapes else None,
        "approximate_gelu": True,
        "layer_norm_epsilon": 1e-6,
        "normalization": "inception",
    }
    if arguments["include_top"]:
        arguments["classes"] = int(shapes["head/kernel"].shape[1])
        if class_token and shapes["head/kernel"].shape[0] == 2 * hidden_dim:
            arguments["pooling"] = "token_gap"  # DINOv2's classifiers
    if layout == "huggingface":
        arguments["approximate_gelu"] = config.get("hidden_act", "gelu") in (
            "gelu_new", "gelu_pytorch_tanh", "gelu_fast"
        )
        arguments["layer_norm_epsilon"] = float(config.get("layer_norm_eps", 1e-12))
        preprocessor = read_json_beside(path, "preprocessor_config.json")
        if "image_mean" in preprocessor:
            arguments["normalization"] = (preprocessor["image_mean"], preprocessor["image_std"])
        elif config.get("model_type") in _IMAGENET_MODEL_TYPES:
            arguments["normalization"] = "imagenet"
    elif layout == "keras_vit":
        arguments = _keras_vit_arguments(path, arguments)
    elif layout == "timm":
        arguments["approximate_gelu"] = False
        pretrained = config.get("pretrained_cfg", {})
        if "mean" in pretrained:
            arguments["normalization"] = (pretrained["mean"], pretrained["std"])
    return layout, arguments
