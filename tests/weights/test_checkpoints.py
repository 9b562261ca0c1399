"""Checkpoints in the real formats load with parity to the reference.

The reference is Hugging Face `transformers`' PyTorch ViT / DINOv2, run in a
subprocess (it needs torch, whatever backend this suite runs on): a randomly
initialised reference model is saved with `save_pretrained` (the Hub's
safetensors layout), its outputs on fixed images are recorded, and keras_vit
must reproduce them from the file.
"""

import importlib.util
import json
import os

import keras
import numpy as np
import pytest
from keras import ops

import keras_vit
from keras_vit.models import from_checkpoint
from keras_vit.weights import assign_canonical, load
from keras_vit.weights.converters import to_canonical
from keras_vit.weights.converters.official import to_official
from keras_vit.weights.readers import read_tensors
from tests.conftest import artifact_maker, run_python, shared_artifact

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(
        importlib.util.find_spec("transformers") is None
        or importlib.util.find_spec("torch") is None,
        reason="the reference needs transformers and torch",
    ),
]

ARCH = dict(patch_size=4, hidden_dim=32, num_layers=2, num_heads=4, mlp_dim=64)

REFERENCE = """
import json, os, numpy as np, torch, transformers
torch.manual_seed(0)
out = {out!r}
kind = {kind!r}
if kind == "dinov2":
    config = transformers.Dinov2Config(
        hidden_size=32, num_hidden_layers=2, num_attention_heads=4, mlp_ratio=2,
        image_size=16, patch_size=4, layerscale_value=0.5)
    model = transformers.Dinov2Model(config)
elif kind == "dinov2_registers":  # registers, LayerScale, [class, mean] head
    config = transformers.Dinov2WithRegistersConfig(
        hidden_size=32, num_hidden_layers=2, num_attention_heads=4, mlp_ratio=2,
        image_size=16, patch_size=4, layerscale_value=0.5,
        num_register_tokens=3, num_labels=5)
    model = transformers.Dinov2WithRegistersForImageClassification(config)
elif kind == "deit":  # distillation token and head, logits = mean of both heads
    config = transformers.DeiTConfig(
        hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
        intermediate_size=64, image_size=16, patch_size=4, num_labels=5)
    model = transformers.DeiTForImageClassificationWithTeacher(config)
elif kind == "siglip":  # no class token, a MAP head, tanh GELU, pixels in [-1, 1]
    config = transformers.SiglipVisionConfig(
        hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
        intermediate_size=64, image_size=16, patch_size=4)
    model = transformers.SiglipVisionModel(config)
    transformers.SiglipImageProcessor().save_pretrained(out)
elif kind == "dinov3":  # rotary positions, registers, LayerScale, no key bias
    config = transformers.DINOv3ViTConfig(
        hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
        intermediate_size=64, image_size=16, patch_size=4, layerscale_value=0.5,
        num_register_tokens=2, rope_theta=50.0)
    model = transformers.DINOv3ViTModel(config)
elif kind == "dinov3_gated":  # S+ and H+: a gated (SwiGLU) MLP, SiLU
    config = transformers.DINOv3ViTConfig(
        hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
        intermediate_size=48, image_size=16, patch_size=4, num_register_tokens=4,
        use_gated_mlp=True, hidden_act="silu")
    model = transformers.DINOv3ViTModel(config)
elif kind == "mae":  # mask_ratio 0 and ordered noise: every patch, in order
    config = transformers.ViTMAEConfig(
        hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
        intermediate_size=64, image_size=16, patch_size=4, mask_ratio=0.0)
    model = transformers.ViTMAEModel(config)
else:  # "timm_like": a ViT with timm's LayerNorm epsilon
    config = transformers.ViTConfig(
        hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
        intermediate_size=64, image_size=16, patch_size=4, num_labels=5,
        layer_norm_eps=1e-6 if kind == "timm_like" else 1e-12)
    model = (transformers.ViTForImageClassification if kind in ("classifier", "timm_like")
             else transformers.ViTModel)(config)
with torch.no_grad():  # non-trivial values everywhere, incl. LN and head
    for p in model.parameters():
        p.add_(0.1 * torch.randn_like(p))
model.eval()
model.save_pretrained(out)
if kind == "siglip":
    # The Hub's SigLIP files are the two towers (SiglipModel): these vision
    # weights beside a text tower, the vision settings nested in its config.
    pair = transformers.SiglipModel(transformers.SiglipConfig(
        vision_config=config.to_dict(),
        text_config=dict(hidden_size=16, num_hidden_layers=1, num_attention_heads=2,
                         intermediate_size=32, vocab_size=50, max_position_embeddings=8)))
    pair.vision_model.load_state_dict(model.state_dict())
    pair.save_pretrained(os.path.join(out, "pair"))
if kind == "dinov3":  # transformers 5's module names (`model.layer.0...`)
    torch.save(model.state_dict(), os.path.join(out, "state_dict.pth"))
if kind == "model":
    # The same weights as the Hub's pickled pytorch_model.bin (Hub names),
    # and as `torch.save(model.state_dict())` (transformers 5 module names).
    from safetensors.torch import load_file
    os.makedirs(os.path.join(out, "bin"))
    torch.save(load_file(os.path.join(out, "model.safetensors")),
               os.path.join(out, "bin", "pytorch_model.bin"))
    torch.save(model.state_dict(), os.path.join(out, "bin", "state_dict.pth"))
rng = np.random.default_rng(0)
result = {{}}
sizes = {{"mae": (16,), "dinov2_registers": (16, 24, 12), "classifier": (16, 24, 32)}}.get(
    kind, (16, 24))
for size in sizes:
    x = rng.normal(size=(2, size, size, 3)).astype("float32")
    np.save(os.path.join(out, f"images_{{size}}.npy"), x)
    with torch.no_grad():
        pixels = torch.from_numpy(x).permute(0, 3, 1, 2)
        always = kind.startswith("dinov2")  # DINOv2 always interpolates
        kwargs = {{"interpolate_pos_encoding": True}} if size != 16 and not always else {{}}
        if kind == "mae":
            kwargs = {{"noise": torch.arange(16.0).repeat(2, 1)}}
        o = model(pixel_values=pixels, **kwargs)
    if hasattr(o, "logits"):
        np.save(os.path.join(out, f"logits_{{size}}.npy"), o.logits.numpy())
    else:
        np.save(os.path.join(out, f"tokens_{{size}}.npy"), o.last_hidden_state.numpy())
        if kind != "mae":
            np.save(os.path.join(out, f"pooled_{{size}}.npy"), o.pooler_output.numpy())
with open(os.path.join(out, "info.json"), "w") as f:
    json.dump({{"eps": config.layer_norm_eps, "act": config.hidden_act}}, f)
"""
KINDS = (
    "model",
    "classifier",
    "timm_like",
    "dinov2",
    "dinov2_registers",
    "deit",
    "mae",
    "siglip",
    "dinov3",
    "dinov3_gated",
)


@artifact_maker("huggingface_references", __file__)
def _make_references(root):
    # Every reference in one interpreter (torch and transformers load once),
    # each from its own seed as in a process of its own.
    run_python(
        "\n".join(REFERENCE.format(out=os.path.join(root, kind), kind=kind) for kind in KINDS),
        backend="torch",
        timeout=600,
    )


def _reference(tmp_path_factory, kind):
    out = os.path.join(
        shared_artifact("huggingface_references", _make_references, tmp_path_factory), kind
    )
    with open(os.path.join(out, "info.json")) as f:
        info = json.load(f)
    # The model must follow the source's GELU: exact, SigLIP's tanh.
    activations = {"siglip": "gelu_pytorch_tanh", "dinov3_gated": "silu"}
    assert info["act"] == activations.get(kind, "gelu")
    return out, info["eps"]


@pytest.fixture(scope="module")
def vit_model_reference(tmp_path_factory):
    return _reference(tmp_path_factory, "model")


@pytest.fixture(scope="module")
def classifier_reference(tmp_path_factory):
    return _reference(tmp_path_factory, "classifier")


@pytest.fixture(scope="module")
def dinov2_reference(tmp_path_factory):
    return _reference(tmp_path_factory, "dinov2")


@pytest.fixture(scope="module")
def mae_reference(tmp_path_factory):
    return _reference(tmp_path_factory, "mae")


@pytest.fixture(scope="module")
def deit_reference(tmp_path_factory):
    return _reference(tmp_path_factory, "deit")


@pytest.fixture(scope="module")
def dinov2_registers_reference(tmp_path_factory):
    return _reference(tmp_path_factory, "dinov2_registers")


@pytest.fixture(scope="module")
def siglip_reference(tmp_path_factory):
    return _reference(tmp_path_factory, "siglip")


@pytest.fixture(scope="module")
def dinov3_reference(tmp_path_factory):
    return _reference(tmp_path_factory, "dinov3")


def hf_model(eps, size=16, **kwargs):
    return keras_vit.ViT(
        **ARCH,
        input_shape=(size, size, 3),
        include_rescaling=False,
        approximate_gelu=False,
        layer_norm_epsilon=eps,
        **kwargs,
    )


def max_error(model, out, size, name):
    got = model.predict(np.load(os.path.join(out, f"images_{size}.npy")), verbose=0)
    error = float(np.abs(got - np.load(os.path.join(out, f"{name}_{size}.npy"))).max())
    print(f"max abs error vs reference ({name}, {size} px): {error:.2e}")
    return error


def test_huggingface_vit_model_safetensors_parity(tmp_path, vit_model_reference):
    out, eps = vit_model_reference
    path = os.path.join(out, "model.safetensors")
    tokens = hf_model(eps, include_top=False, pooling=None, weights=path)
    assert max_error(tokens, out, 16, "tokens") <= 1e-4
    # HF's tanh pooler on the class token is the paper's pre_logits layer.
    pooled = hf_model(eps, include_top=False, representation_size=32, weights=path)
    assert max_error(pooled, out, 16, "pooled") <= 1e-4


def test_huggingface_classifier_parity_and_new_head(tmp_path, classifier_reference):
    out, eps = classifier_reference
    path = os.path.join(out, "model.safetensors")
    model = hf_model(eps, classes=5, classifier_activation=None, weights=path)
    assert max_error(model, out, 16, "logits") <= 1e-4
    # Another class count: the encoder loads, the new head stays at zero.
    other = hf_model(eps, classes=7, weights=path)
    assert not np.any(ops.convert_to_numpy(other.get_layer("head").kernel))
    np.testing.assert_array_equal(
        ops.convert_to_numpy(other.get_layer("encoder_norm").gamma),
        ops.convert_to_numpy(model.get_layer("encoder_norm").gamma),
    )


def hub_cache(root, repo_id, files, commit="5e7a0c1d"):
    """A Hub cache as `huggingface_hub` lays it out: blobs, a snapshot of links, refs."""
    repo = os.path.join(root, "models--" + repo_id.replace("/", "--"))
    os.makedirs(os.path.join(repo, "refs"))
    with open(os.path.join(repo, "refs", "main"), "w") as f:
        f.write(commit)
    snapshot = os.path.join(repo, "snapshots", commit)
    os.makedirs(snapshot)
    os.makedirs(os.path.join(repo, "blobs"))
    for index, source in enumerate(files):
        blob = os.path.join(repo, "blobs", f"blob{index}")
        with open(source, "rb") as f, open(blob, "wb") as g:
            g.write(f.read())
        os.symlink(
            os.path.join("..", "..", "blobs", f"blob{index}"),
            os.path.join(snapshot, os.path.basename(source)),
        )
    return repo


def test_hub_ids_read_the_hugging_face_cache_offline(tmp_path, monkeypatch, classifier_reference):
    from huggingface_hub import constants

    out, eps = classifier_reference
    cache = tmp_path / "hub"
    files = [os.path.join(out, name) for name in ("model.safetensors", "config.json")]
    repo = hub_cache(cache, "someone/tiny-vit", files)
    # The Hub said it has no preprocessor_config.json (the cache's marker of that).
    os.makedirs(os.path.join(repo, ".no_exist", "5e7a0c1d"))
    open(os.path.join(repo, ".no_exist", "5e7a0c1d", "preprocessor_config.json"), "w").close()
    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(cache))
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", True)
    model = from_checkpoint(
        "hf-hub:someone/tiny-vit", include_rescaling=False, classifier_activation=None
    )
    assert max_error(model, out, 16, "logits") <= 1e-4
    built = hf_model(eps, classes=5, classifier_activation=None, weights="hf-hub:someone/tiny-vit")
    assert max_error(built, out, 16, "logits") <= 1e-4
    names = keras_vit.weights.class_names("hf-hub:someone/tiny-vit", classes=5)
    assert names == [f"LABEL_{i}" for i in range(5)]  # its config.json's id2label
    with pytest.raises(RuntimeError, match="someone/other.* or its cache .*hf download"):
        from_checkpoint("hf-hub:someone/other")
    # A config the cache lacks offline, unknown to it: refused, not guessed.
    os.remove(os.path.join(repo, ".no_exist", "5e7a0c1d", "preprocessor_config.json"))
    with pytest.raises(RuntimeError, match="preprocessor_config.json of 'someone/tiny-vit'"):
        from_checkpoint("hf-hub:someone/tiny-vit")
    with pytest.raises(ValueError, match="hf-hub:<organisation>/<name>"):
        from_checkpoint("hf-hub:tiny-vit")


def test_another_resolution_matches_hf_interpolate_pos_encoding(tmp_path, vit_model_reference):
    out, eps = vit_model_reference
    path = os.path.join(out, "model.safetensors")
    model = hf_model(eps, size=24, include_top=False, pooling=None, weights=path)
    assert model.get_layer("position_embedding").grid_size == (6, 6)
    # Same bicubic (a=-0.75, half-pixel) as torch: float32 rounding only.
    assert max_error(model, out, 24, "tokens") <= 1e-4


def test_dinov2_layer_scale_parity(tmp_path, dinov2_reference):
    out, eps = dinov2_reference
    path = os.path.join(out, "model.safetensors")
    model = hf_model(eps, include_top=False, pooling=None, layer_scale_init=1.0, weights=path)
    gamma = ops.convert_to_numpy(model.get_layer("encoderblock_0").attention_scale.gamma)
    assert not np.allclose(gamma, 1.0)  # loaded, not the initial value
    assert max_error(model, out, 16, "tokens") <= 1e-4


@pytest.mark.parametrize("file", ["pytorch_model.bin", "state_dict.pth"])
def test_pytorch_state_dict_parity(vit_model_reference, file):
    out, eps = vit_model_reference
    path = os.path.join(out, "bin", file)
    tokens = hf_model(eps, include_top=False, pooling=None, weights=path)
    assert max_error(tokens, out, 16, "tokens") <= 1e-4


def test_mae_encoder_parity(mae_reference):
    out, eps = mae_reference
    path = os.path.join(out, "model.safetensors")
    model = from_checkpoint(path, include_rescaling=False, pooling=None)
    assert model.output_shape == (None, 17, 32)  # every token, as the MAE encoder
    assert max_error(model, out, 16, "tokens") <= 1e-4


def test_from_checkpoint_follows_the_source(
    vit_model_reference, classifier_reference, dinov2_reference
):
    out, eps = classifier_reference
    model = from_checkpoint(
        os.path.join(out, "model.safetensors"),
        include_rescaling=False,
        classifier_activation=None,
    )
    block = model.get_layer("encoderblock_0")
    assert (block.approximate_gelu, block.layer_norm_epsilon) == (False, eps)
    assert model.input_shape == (None, 16, 16, 3)
    assert max_error(model, out, 16, "logits") <= 1e-4
    # A ViTModel file: no head, and the HF pooler is the pre_logits layer.
    out, eps = vit_model_reference
    model = from_checkpoint(os.path.join(out, "model.safetensors"), include_rescaling=False)
    assert max_error(model, out, 16, "pooled") <= 1e-4
    # Asked for classes: a new head on the headless file.
    headed = from_checkpoint(os.path.join(out, "model.safetensors"), classes=3)
    assert headed.output_shape == (None, 3)
    assert not np.any(headed.get_layer("head").get_weights()[0])
    model = from_checkpoint(
        os.path.join(out, "model.safetensors"),
        include_rescaling=False,
        input_shape=(24, 24, 3),
        pooling=None,
        representation_size=None,
    )
    assert max_error(model, out, 24, "tokens") <= 1e-4
    # DINOv2: LayerScale and ImageNet mean/std pixels, from the source.
    out, eps = dinov2_reference
    model = from_checkpoint(os.path.join(out, "model.safetensors"), pooling=None)
    assert model.get_layer("encoderblock_0").layer_scale_init is not None
    scale = np.asarray(model.get_layer("rescaling").scale)
    np.testing.assert_allclose(scale, 1 / (255 * np.array([0.229, 0.224, 0.225])))
    plain = from_checkpoint(
        os.path.join(out, "model.safetensors"), pooling=None, include_rescaling=False
    )
    assert max_error(plain, out, 16, "tokens") <= 1e-4


def test_siglip_vision_tower_parity_pooled_and_tokens_at_two_sizes(siglip_reference):
    out, eps = siglip_reference
    path = os.path.join(out, "model.safetensors")
    pooled = from_checkpoint(path, include_rescaling=False)
    # What the file and its configs say: no class token, the MAP head, tanh GELU.
    block = pooled.get_layer("encoderblock_0")
    assert (block.approximate_gelu, block.layer_norm_epsilon) == (True, eps) and eps == 1e-6
    names = [layer.name for layer in pooled.layers]
    assert "class_token" not in names and "map_head" in names
    assert pooled.output_shape == (None, 32)
    assert max_error(pooled, out, 16, "pooled") <= 1e-5
    tokens = from_checkpoint(path, include_rescaling=False, pooling=None)
    assert tokens.output_shape == (None, 16, 32)
    assert max_error(tokens, out, 16, "tokens") <= 1e-5
    # Another resolution: its table resampled as SigLIP's interpolate_pos_encoding.
    larger = from_checkpoint(path, include_rescaling=False, input_shape=(24, 24, 3))
    assert max_error(larger, out, 24, "pooled") <= 1e-5
    # The two towers' file: its vision tower, its settings from vision_config.
    pair = from_checkpoint(os.path.join(out, "pair", "model.safetensors"), include_rescaling=False)
    assert pair.get_layer("encoderblock_0").approximate_gelu
    assert max_error(pair, out, 16, "pooled") <= 1e-5
    # Its processor's pixels: mean and std 0.5, so [0, 255] -> [-1, 1].
    scale = np.asarray(from_checkpoint(path).get_layer("rescaling").scale)
    np.testing.assert_allclose(scale, 1 / (255 * np.array([0.5, 0.5, 0.5])))


def _big_vision_npz(hf, heads):
    """A SigLIP two-tower `.npz` as big_vision writes it, from a `SiglipVisionModel` state dict.

    The names and layouts of transformers' own conversion script
    (`convert_siglip_to_hf.py`), read backwards; written here, apart from
    keras_vit's tables, so that a name both got wrong cannot pass.
    """
    hf = {k.removeprefix("vision_model."): v for k, v in hf.items()}
    width = hf["post_layernorm.weight"].shape[0]

    def heads_kernel(weight):  # PyTorch (out, in) -> Flax (in, heads, head_dim)
        return weight.T.reshape(width, heads, -1)

    img = {
        "embedding/kernel": hf["embeddings.patch_embedding.weight"].transpose(2, 3, 1, 0),
        "embedding/bias": hf["embeddings.patch_embedding.bias"],
        "pos_embedding": hf["embeddings.position_embedding.weight"][None],
        "Transformer/encoder_norm/scale": hf["post_layernorm.weight"],
        "Transformer/encoder_norm/bias": hf["post_layernorm.bias"],
        "MAPHead_0/probe": hf["head.probe"],
    }
    modules = {
        "layer_norm1": "LayerNorm_0",
        "layer_norm2": "LayerNorm_1",
        "mlp.fc1": "MlpBlock_0/Dense_0",
        "mlp.fc2": "MlpBlock_0/Dense_1",
        "self_attn.q_proj": "MultiHeadDotProductAttention_0/query",
        "self_attn.k_proj": "MultiHeadDotProductAttention_0/key",
        "self_attn.v_proj": "MultiHeadDotProductAttention_0/value",
        "self_attn.out_proj": "MultiHeadDotProductAttention_0/out",
    }
    for name, value in hf.items():
        parts = name.split(".")
        if parts[:2] != ["encoder", "layers"]:
            continue
        module, param = ".".join(parts[3:-1]), parts[-1]
        target = f"Transformer/encoderblock_{parts[2]}/{modules[module]}/"
        if module.startswith("layer_norm"):
            img[target + ("scale" if param == "weight" else "bias")] = value
        elif module == "self_attn.out_proj":
            img[target + "kernel" if param == "weight" else target + "bias"] = (
                value.T.reshape(heads, -1, width) if param == "weight" else value
            )
        elif module.startswith("self_attn"):
            img[target + "kernel" if param == "weight" else target + "bias"] = (
                heads_kernel(value) if param == "weight" else value.reshape(heads, -1)
            )
        else:
            img[target + ("kernel" if param == "weight" else "bias")] = (
                value.T if param == "weight" else value
            )
    head = "MAPHead_0/MultiHeadDotProductAttention_0/"
    weights = np.split(hf["head.attention.in_proj_weight"], 3)
    biases = np.split(hf["head.attention.in_proj_bias"], 3)
    for projection, weight, bias in zip(("query", "key", "value"), weights, biases):
        img[f"{head}{projection}/kernel"] = heads_kernel(weight)
        img[f"{head}{projection}/bias"] = bias.reshape(heads, -1)
    img[f"{head}out/kernel"] = hf["head.attention.out_proj.weight"].T.reshape(heads, -1, width)
    img[f"{head}out/bias"] = hf["head.attention.out_proj.bias"]
    img["MAPHead_0/LayerNorm_0/scale"] = hf["head.layernorm.weight"]
    img["MAPHead_0/LayerNorm_0/bias"] = hf["head.layernorm.bias"]
    for hf_name, flax in (("fc1", "Dense_0"), ("fc2", "Dense_1")):
        img[f"MAPHead_0/MlpBlock_0/{flax}/kernel"] = hf[f"head.mlp.{hf_name}.weight"].T
        img[f"MAPHead_0/MlpBlock_0/{flax}/bias"] = hf[f"head.mlp.{hf_name}.bias"]
    text = {  # the text tower, its temperature and bias: beside it, not read
        "params/txt/Embed_0/embedding": np.zeros((50, 16), "float32"),
        "params/t": np.zeros((1,), "float32"),
        "params/b": np.zeros((1,), "float32"),
    }
    return {**{f"params/img/{k}": v for k, v in img.items()}, **text}


def test_big_vision_siglip_npz_parity(tmp_path, siglip_reference):
    from safetensors.numpy import load_file

    out, _ = siglip_reference
    path = tmp_path / "webli_en_b16_224.npz"
    np.savez(path, **_big_vision_npz(load_file(os.path.join(out, "model.safetensors")), 4))
    pooled = from_checkpoint(path, include_rescaling=False)
    # Flax's convention, as SigLIP trained: tanh GELU, epsilon 1e-6, [-1, 1] pixels.
    block = pooled.get_layer("encoderblock_0")
    assert (block.approximate_gelu, block.layer_norm_epsilon) == (True, 1e-6)
    assert "class_token" not in [layer.name for layer in pooled.layers]
    assert max_error(pooled, out, 16, "pooled") <= 1e-5
    tokens = from_checkpoint(path, include_rescaling=False, pooling=None)
    assert max_error(tokens, out, 16, "tokens") <= 1e-5
    larger = from_checkpoint(path, include_rescaling=False, input_shape=(24, 24, 3))
    assert max_error(larger, out, 24, "pooled") <= 1e-5
    scale = np.asarray(from_checkpoint(path).get_layer("rescaling").scale)
    np.testing.assert_allclose(scale, 1 / 127.5)


def test_dinov3_parity_pooled_and_tokens_at_any_resolution(tmp_path, dinov3_reference):
    out, eps = dinov3_reference
    path = os.path.join(out, "model.safetensors")
    pooled = from_checkpoint(path, include_rescaling=False)
    # What the file and its config say: no table, rotations of base
    # rope_theta, registers, LayerScale, exact GELU, epsilon 1e-5.
    names = [layer.name for layer in pooled.layers]
    assert "position_embedding" not in names and "rotary_embedding" in names
    assert pooled.get_layer("rotary_embedding").base == 50.0
    assert pooled.get_layer("register_tokens").num_tokens == 2
    block = pooled.get_layer("encoderblock_0")
    assert (block.approximate_gelu, block.layer_norm_epsilon) == (False, eps) and eps == 1e-5
    assert pooled.input_shape == (None, 16, 16, 3)
    assert max_error(pooled, out, 16, "pooled") <= 1e-5
    # Another resolution, nothing resampled; a model of any size; and the
    # file `torch.save(model.state_dict())` writes.
    larger = from_checkpoint(path, include_rescaling=False, input_shape=(24, 24, 3))
    assert max_error(larger, out, 24, "pooled") <= 1e-5
    tokens = from_checkpoint(
        os.path.join(out, "state_dict.pth"),
        include_rescaling=False,
        pooling=None,
        input_shape=(None, None, 3),
    )
    assert tokens.get_layer("rotary_embedding").base == 50.0
    for size in (16, 24):
        assert max_error(tokens, out, size, "tokens") <= 1e-5
    # Its pixels: ImageNet's mean and std (DINOv3's processor).
    scale = np.asarray(from_checkpoint(path).get_layer("rescaling").scale)
    np.testing.assert_allclose(scale, 1 / (255 * np.array([0.229, 0.224, 0.225])))
    # Saved and reloaded, it computes the same; quantized, its graph's
    # rotation is kept (the file is the graph's).
    images = np.load(os.path.join(out, "images_24.npy"))
    expected = tokens.predict(images, verbose=0)
    tokens.save(tmp_path / "dinov3.keras")
    reloaded = keras.models.load_model(tmp_path / "dinov3.keras")
    np.testing.assert_allclose(reloaded.predict(images, verbose=0), expected, atol=2e-6)
    assert from_checkpoint(tmp_path / "dinov3.keras").get_layer("rotary_embedding").base == 50.0
    tokens.quantize("int8")
    tokens.save(tmp_path / "int8.keras")
    quantized = keras.models.load_model(tmp_path / "int8.keras").predict(images, verbose=0)
    assert 0 < np.abs(quantized - expected).max() < 0.1 * np.abs(expected).max()
    # A builder given the file builds its rotations; a table contradicts it.
    built = keras_vit.ViT(**ARCH, weights=path, include_top=False, include_rescaling=False)
    assert max_error(built, out, 16, "pooled") <= 1e-5
    with pytest.raises(ValueError, match=r"position_embedding='learned' contradicts"):
        keras_vit.ViT(**ARCH, weights=path, position_embedding="learned")


def test_dinov3_with_a_gated_mlp_parity(tmp_path, tmp_path_factory):
    # DINOv3's S+ and H+: SwiGLU MLPs (gate and up projections in one kernel).
    out, _ = _reference(tmp_path_factory, "dinov3_gated")
    path = os.path.join(out, "model.safetensors")
    model = from_checkpoint(path, include_rescaling=False, pooling=None)
    block = model.get_layer("encoderblock_0")
    assert block.mlp == "swiglu" and block.mlp_dim == 48
    assert tuple(block.mlp_dense_1.kernel.shape) == (32, 96)
    assert model.get_layer("register_tokens").num_tokens == 4
    for size in (16, 24):
        model = from_checkpoint(
            path, include_rescaling=False, pooling=None, input_shape=(size, size, 3)
        )
        assert max_error(model, out, size, "tokens") <= 1e-5
    # Saved and reloaded as keras_vit's own file: the same MLP.
    model.save(tmp_path / "gated.keras")
    assert from_checkpoint(tmp_path / "gated.keras").get_layer("encoderblock_1").mlp == "swiglu"
    # A config whose activation is not the MLP's: refused, naming it.
    config = json.load(open(os.path.join(out, "config.json")))
    (tmp_path / "gelu").mkdir()
    json.dump({**config, "hidden_act": "gelu"}, open(tmp_path / "gelu" / "config.json", "w"))
    os.symlink(path, tmp_path / "gelu" / "model.safetensors")
    with pytest.raises(ValueError, match=r"hidden_act='gelu'.*mlp='swiglu'"):
        from_checkpoint(tmp_path / "gelu" / "model.safetensors")


def test_convert_command_writes_a_keras_model(tmp_path, classifier_reference):
    from keras_vit.cli import main

    out, eps = classifier_reference
    source = os.path.join(out, "model.safetensors")
    destination = str(tmp_path / "vit.keras")
    assert main(["convert", source, destination]) == 0
    model = keras.models.load_model(destination)
    # The converted model takes [0, 255] pixels and normalises to [-1, 1].
    images = np.load(os.path.join(out, "images_16.npy"))
    pixels = (images + 1.0) * 127.5
    got = model.predict(pixels, verbose=0)
    expected = np.load(os.path.join(out, "logits_16.npy"))
    np.testing.assert_allclose(
        np.log(got), expected - np.log(np.exp(expected).sum(-1, keepdims=True)), atol=1e-4
    )
    with pytest.raises(SystemExit, match="exists; pass --overwrite"):
        main(["convert", source, destination])
    assert (
        main(
            ["convert", source, destination, "--overwrite", "--image-size", "24", "--classes", "3"]
        )
        == 0
    )
    model = keras.models.load_model(destination)
    assert (model.input_shape, model.output_shape) == ((None, 24, 24, 3), (None, 3))
    with pytest.raises(SystemExit, match="must end in .keras"):
        main(["convert", source, str(tmp_path / "vit.h5")])
    with pytest.raises(SystemExit, match="no such file"):
        main(["convert", str(tmp_path / "missing.npz"), str(tmp_path / "x.keras")])
    # Its output is checked before any work: a folder it cannot write is one
    # line; a folder that does not exist yet is made.
    read_only = tmp_path / "read_only"
    read_only.mkdir(mode=0o555)
    if os.access(read_only, os.W_OK):  # (root writes anywhere: a file stands in the way)
        read_only.rmdir()
        read_only.write_text("a file where the folder would be")
    with pytest.raises(
        SystemExit, match=r"^keras-vit convert: DST .*read_only.*(cannot write|is a file)"
    ):
        main(["convert", source, str(read_only / "x.keras")])
    nested = tmp_path / "new" / "folder" / "x.keras"
    assert main(["convert", source, str(nested)]) == 0 and nested.is_file()


OFFICIAL_KEYS = [
    "embedding/kernel",
    "embedding/bias",
    "cls",
    "Transformer/posembed_input/pos_embedding",
    "Transformer/encoder_norm/scale",
    "Transformer/encoder_norm/bias",
    "head/kernel",
    "head/bias",
] + [
    f"Transformer/encoderblock_{i}/{name}"
    for i in range(2)
    for name in [
        "LayerNorm_0/scale",
        "LayerNorm_0/bias",
        "LayerNorm_2/scale",
        "LayerNorm_2/bias",
        "MlpBlock_3/Dense_0/kernel",
        "MlpBlock_3/Dense_0/bias",
        "MlpBlock_3/Dense_1/kernel",
        "MlpBlock_3/Dense_1/bias",
        "MultiHeadDotProductAttention_1/out/kernel",
        "MultiHeadDotProductAttention_1/out/bias",
    ]
    + [
        f"MultiHeadDotProductAttention_1/{p}/{k}"
        for p in ("query", "key", "value")
        for k in ("kernel", "bias")
    ]
]


def test_official_npz_layout_parity(tmp_path, classifier_reference):
    out, eps = classifier_reference
    model = hf_model(
        eps, classes=5, classifier_activation=None, weights=os.path.join(out, "model.safetensors")
    )
    tensors = to_official(model)
    assert sorted(tensors) == sorted(OFFICIAL_KEYS)
    shapes = {
        "embedding/kernel": (4, 4, 3, 32),
        "cls": (1, 1, 32),
        "Transformer/posembed_input/pos_embedding": (1, 17, 32),
        "Transformer/encoderblock_0/MultiHeadDotProductAttention_1/query/kernel": (32, 4, 8),
        "Transformer/encoderblock_0/MultiHeadDotProductAttention_1/query/bias": (4, 8),
        "Transformer/encoderblock_0/MultiHeadDotProductAttention_1/out/kernel": (4, 8, 32),
        "Transformer/encoderblock_0/MlpBlock_3/Dense_0/kernel": (32, 64),
        "head/kernel": (32, 5),
    }
    for key, shape in shapes.items():
        assert tensors[key].shape == shape, key
    path = os.path.join(tmp_path, "ViT-tiny.npz")
    np.savez(path, **tensors)
    loaded = hf_model(eps, classes=5, classifier_activation=None, weights=path)
    assert max_error(loaded, out, 16, "logits") <= 1e-4
    # Built from the file alone: the official code's tanh GELU and eps 1e-6.
    inferred = from_checkpoint(path, classifier_activation=None)
    block = inferred.get_layer("encoderblock_0")
    assert (block.approximate_gelu, block.layer_norm_epsilon, block.num_heads) == (True, 1e-6, 4)
    assert inferred.output_shape == (None, 5)
    exact = from_checkpoint(
        path,
        classifier_activation=None,
        include_rescaling=False,
        approximate_gelu=False,
        layer_norm_epsilon=eps,
    )
    assert max_error(exact, out, 16, "logits") <= 1e-4


def _timm_names(hf, prefix):
    """A HF reference's tensors under timm's state-dict names.

    timm itself needs torchvision, which has no CPU wheel here; its names
    are written from the reference's tensors instead.
    """
    timm = {
        "cls_token": hf[f"{prefix}.embeddings.cls_token"],
        "pos_embed": hf[f"{prefix}.embeddings.position_embeddings"],
        "patch_embed.proj.weight": hf[f"{prefix}.embeddings.patch_embeddings.projection.weight"],
        "patch_embed.proj.bias": hf[f"{prefix}.embeddings.patch_embeddings.projection.bias"],
        "norm.weight": hf[f"{prefix}.layernorm.weight"],
        "norm.bias": hf[f"{prefix}.layernorm.bias"],
    }
    for i in range(2):
        layer = f"{prefix}.encoder.layer.{i}."
        attention = layer + "attention.attention."
        for kind in ("weight", "bias"):
            timm[f"blocks.{i}.attn.qkv.{kind}"] = np.concatenate(
                [hf[attention + f"{p}.{kind}"] for p in ("query", "key", "value")]
            )
            timm[f"blocks.{i}.attn.proj.{kind}"] = hf[layer + f"attention.output.dense.{kind}"]
            timm[f"blocks.{i}.norm1.{kind}"] = hf[layer + f"layernorm_before.{kind}"]
            timm[f"blocks.{i}.norm2.{kind}"] = hf[layer + f"layernorm_after.{kind}"]
            timm[f"blocks.{i}.mlp.fc1.{kind}"] = hf[layer + f"intermediate.dense.{kind}"]
            timm[f"blocks.{i}.mlp.fc2.{kind}"] = hf[layer + f"output.dense.{kind}"]
    return timm


def test_timm_layout_parity(tmp_path, classifier_reference):
    out, eps = classifier_reference
    hf = read_tensors(os.path.join(out, "model.safetensors"))
    timm = _timm_names(hf, "vit")
    timm.update({"head.weight": hf["classifier.weight"], "head.bias": hf["classifier.bias"]})
    from safetensors.numpy import save_file

    path = os.path.join(tmp_path, "timm.safetensors")
    save_file(timm, path)
    model = hf_model(eps, classes=5, classifier_activation=None, weights=path)
    assert max_error(model, out, 16, "logits") <= 1e-4


def test_timm_distilled_deit_parity(tmp_path, deit_reference):
    out, eps = deit_reference
    hf = read_tensors(os.path.join(out, "model.safetensors"))
    timm = _timm_names(hf, "deit")
    timm["dist_token"] = hf["deit.embeddings.distillation_token"]
    for kind in ("weight", "bias"):
        timm[f"head.{kind}"] = hf[f"cls_classifier.{kind}"]
        timm[f"head_dist.{kind}"] = hf[f"distillation_classifier.{kind}"]
    from safetensors.numpy import save_file

    path = os.path.join(tmp_path, "deit_timm.safetensors")
    save_file(timm, path)
    model = hf_model(
        eps, classes=5, classifier_activation=None, distillation_token=True, weights=path
    )
    assert max_error(model, out, 16, "logits") <= 1e-4


def test_token_layouts_keras_vit_cannot_reproduce_are_refused(tmp_path, deit_reference):
    from safetensors.numpy import save_file

    out, _ = deit_reference
    hf = read_tensors(os.path.join(out, "model.safetensors"))
    # DeiTForImageClassification: a distillation token but one head.
    one_head = {k: v for k, v in hf.items() if not k.startswith("distillation_classifier")}
    path = os.path.join(tmp_path, "deit_one_head.safetensors")
    save_file(one_head, path)
    with pytest.raises(ValueError, match="distillation token but one head"):
        from_checkpoint(path)
    # timm register tokens follow timm's own position rules.
    timm = _timm_names(hf, "deit")
    timm["reg_token"] = np.zeros((1, 4, 32), "float32")
    path = os.path.join(tmp_path, "timm_reg.safetensors")
    save_file(timm, path)
    with pytest.raises(ValueError, match="timm register tokens.*'reg_token'"):
        from_checkpoint(path, num_heads=4)


def _snapshot(model):
    return [ops.convert_to_numpy(w).copy() for w in model.weights]


def test_bad_checkpoints_fail_clearly_and_leave_the_model_unchanged(tmp_path, vit_model_reference):
    out, eps = vit_model_reference
    path = os.path.join(out, "model.safetensors")
    tensors = read_tensors(path)
    model = hf_model(eps, include_top=False, pooling=None)
    before = _snapshot(model)

    _, canonical = to_canonical(tensors, num_heads=4)
    missing = dict(canonical)
    del missing["encoderblock_1/mlp_norm/gamma"]
    with pytest.raises(
        ValueError,
        match="no weight for 'encoderblock_1/mlp_norm/gamma' \\(model shape \\(32,\\)\\)",
    ):
        assign_canonical(model, missing)

    wider = keras_vit.ViT(**{**ARCH, "hidden_dim": 48}, input_shape=(16, 16, 3), include_top=False)
    with pytest.raises(
        ValueError,
        match=r"'patch_embedding/kernel': .* shape \(4, 4, 3, 32\) "
        r"but the model has \(4, 4, 3, 48\)",
    ):
        load(wider, path)

    shallower = keras_vit.ViT(
        **{**ARCH, "num_layers": 1}, input_shape=(16, 16, 3), include_top=False
    )
    with pytest.raises(ValueError, match="has 2 encoder blocks but the model has 1"):
        load(shallower, path)

    truncated = os.path.join(tmp_path, "truncated.safetensors")
    with open(path, "rb") as f, open(truncated, "wb") as g:
        g.write(f.read()[:1000])
    with pytest.raises(Exception, match="(?i)safetensor|header|incomplete|invalid"):
        load(model, truncated)

    for got, expected in zip(_snapshot(model), before):
        np.testing.assert_array_equal(got, expected)


def test_npz_with_pickled_objects_is_refused(tmp_path):
    path = os.path.join(tmp_path, "evil.npz")
    np.savez(path, **{"embedding/kernel": np.array([{"x": 1}], dtype=object)})
    model = keras_vit.ViT(**ARCH, input_shape=(16, 16, 3))
    with pytest.raises(
        ValueError, match="evil.npz.*not a readable NumPy .npz checkpoint.*allow_pickle"
    ):
        load(model, path)


def test_deit_distilled_parity_at_two_resolutions(deit_reference):
    out, _ = deit_reference
    path = os.path.join(out, "model.safetensors")
    for size in (16, 24):
        model = from_checkpoint(
            path,
            include_rescaling=False,
            classifier_activation=None,
            input_shape=(size, size, 3),
        )
        assert model.get_layer("position_embedding").num_prefix_tokens == 2
        head_dist = ops.convert_to_numpy(model.get_layer("head_dist").kernel)
        assert np.any(head_dist)  # the distillation head loaded too
        assert max_error(model, out, size, "logits") <= 1e-4


def test_dinov2_registers_parity_with_antialiased_resampling(dinov2_registers_reference):
    out, _ = dinov2_registers_reference
    path = os.path.join(out, "model.safetensors")
    model = from_checkpoint(path, include_rescaling=False, classifier_activation=None)
    assert model.get_layer("register_tokens").num_tokens == 3
    assert model.get_layer("pooling").mode == "token_gap"
    assert max_error(model, out, 16, "logits") <= 1e-4
    for size in (24, 12):  # up and down: torch's antialiased bicubic
        model = from_checkpoint(
            path,
            include_rescaling=False,
            classifier_activation=None,
            input_shape=(size, size, 3),
        )
        assert max_error(model, out, size, "logits") <= 1e-4
    # The plain bicubic (another filter) would not reproduce the source.
    plain = from_checkpoint(
        path,
        include_rescaling=False,
        classifier_activation=None,
        input_shape=(24, 24, 3),
        resample_method="bicubic",
    )
    assert max_error(plain, out, 24, "logits") > 1e-3


@pytest.fixture(scope="module")
def timm_like_reference(tmp_path_factory):
    return _reference(tmp_path_factory, "timm_like")


def builder(path, **kwargs):
    """`ViT(weights=path)` told only the size: the rest is the checkpoint's."""
    return keras_vit.ViT(
        **ARCH,
        input_shape=(16, 16, 3),
        include_rescaling=False,
        classifier_activation=None,
        weights=path,
        **kwargs,
    )


def test_builders_build_the_checkpoints_function(
    tmp_path,
    classifier_reference,
    deit_reference,
    dinov2_reference,
    dinov2_registers_reference,
    timm_like_reference,
):
    from safetensors.numpy import save_file

    # A timm file: timm's names (exact GELU, epsilon 1e-6 by its convention).
    out, _ = timm_like_reference
    hf = read_tensors(os.path.join(out, "model.safetensors"))
    timm = _timm_names(hf, "vit")
    timm.update({"head.weight": hf["classifier.weight"], "head.bias": hf["classifier.bias"]})
    timm_path = os.path.join(tmp_path, "timm.safetensors")
    save_file(timm, timm_path)
    cases = {
        "HF ViT (exact GELU, epsilon 1e-12)": (classifier_reference, None, "logits", {}),
        "HF DeiT distilled": (deit_reference, None, "logits", {}),
        "HF DINOv2 (LayerScale)": (
            dinov2_reference,
            None,
            "tokens",
            {"include_top": False, "pooling": None},
        ),
        "HF DINOv2 with registers": (dinov2_registers_reference, None, "logits", {}),
        "timm": (timm_like_reference, timm_path, "logits", {}),
    }
    for case, ((out, _), path, name, extra) in cases.items():
        path = path or os.path.join(out, "model.safetensors")
        through_builder = builder(path, **({"classes": 5} if name == "logits" else {}), **extra)
        assert max_error(through_builder, out, 16, name) <= 1e-5, case
        reference = from_checkpoint(
            path, num_heads=4, include_rescaling=False, classifier_activation=None, **extra
        )
        images = np.load(os.path.join(out, "images_16.npy"))
        np.testing.assert_allclose(
            through_builder.predict(images, verbose=0),
            reference.predict(images, verbose=0),
            atol=1e-6,
            err_msg=case,
        )  # the same numbers as from_checkpoint


def test_a_choice_that_contradicts_the_checkpoint_is_refused_naming_both(
    classifier_reference,
    deit_reference,
    dinov2_reference,
):
    hf_vit = os.path.join(classifier_reference[0], "model.safetensors")
    for arguments, message in (
        ({"approximate_gelu": True}, "approximate_gelu=True contradicts .*approximate_gelu=False"),
        ({"layer_norm_epsilon": 1e-6}, "layer_norm_epsilon=1e-06 contradicts .*=1e-12"),
        ({"class_token": False, "pooling": "gap"}, "class_token=False contradicts"),
    ):
        with pytest.raises(ValueError, match=message):
            builder(hf_vit, classes=5, **arguments)
    with pytest.raises(ValueError, match="distillation_token=False contradicts"):
        builder(
            os.path.join(deit_reference[0], "model.safetensors"),
            classes=5,
            distillation_token=False,
        )
    with pytest.raises(ValueError, match="normalization='inception' contradicts"):
        keras_vit.ViT(
            **ARCH,
            input_shape=(16, 16, 3),
            include_top=False,
            normalization="inception",
            weights=os.path.join(dinov2_reference[0], "model.safetensors"),
        )
    # Choices the file does not record stay the user's, and agreeing ones are fine.
    agreeing = builder(hf_vit, classes=5, approximate_gelu=False, layer_norm_epsilon=1e-12)
    assert max_error(agreeing, classifier_reference[0], 16, "logits") <= 1e-5


def test_a_builder_given_a_file_builds_its_size_and_head(classifier_reference):
    out, _ = classifier_reference
    path = os.path.join(out, "model.safetensors")
    # Told only the variant: the file's input size and its trained head.
    model = keras_vit.ViT(**ARCH, include_rescaling=False, classifier_activation=None, weights=path)
    assert model.input_shape == (None, 16, 16, 3)
    assert max_error(model, out, 16, "logits") <= 1e-5
    # Chosen: another size resamples the table, another class count is a new head.
    other = keras_vit.ViT(**ARCH, input_shape=(24, 24, 3), classes=3, weights=path)
    assert other.output_shape == (None, 3)
    assert not np.any(other.get_layer("head").get_weights()[0])
    # Shapes that are not the model's: the weight and both shapes named, before any work.
    for change, message in (
        (
            {"hidden_dim": 64},
            r"hidden_dim=32, not the hidden_dim=64 .* "
            r"'patch_embedding/kernel' has shape \(4, 4, 3, 32\), "
            r"the model's \(4, 4, 3, 64\)",
        ),
        (
            {"num_layers": 3},
            r"num_layers=2, .*its last block is 'encoderblock_1', "
            r"the model's 'encoderblock_2'",
        ),
        (
            {"mlp_dim": 128},
            r"'encoderblock_0/mlp_dense_1/kernel' has shape \(32, 64\), "
            r"the model's \(32, 128\)",
        ),
        (
            {"num_heads": 8},
            r"num_heads=4, not the num_heads=8 .*qkv/kernel' has shape "
            r"\(32, 3, 4, 8\), the model's \(32, 3, 8, 4\)",
        ),
        ({"patch_size": 8}, r"patch_size=\(4, 4\), not the patch_size=\(8, 8\)"),
    ):
        with pytest.raises(ValueError, match=message):
            keras_vit.ViT(**{**ARCH, **change}, weights=path)
    # Every difference at once, each weight named once.
    with pytest.raises(
        ValueError,
        match=r"patch_size=\(4, 4\), hidden_dim=32, num_layers=2, "
        r"mlp_dim=64, num_heads=4, not the patch_size=\(16, 16\), "
        r"hidden_dim=192, .*'patch_embedding/kernel' has shape "
        r"\(4, 4, 3, 32\), the model's \(16, 16, 3, 192\); its "
        r"last block",
    ):
        keras_vit.ViTTi16(weights=path)
    # from_checkpoint refuses what contradicts the file as the builders do.
    with pytest.raises(ValueError, match="approximate_gelu=True contradicts"):
        from_checkpoint(path, approximate_gelu=True)
    with pytest.raises(ValueError, match="num_heads=2 contradicts"):
        from_checkpoint(path, num_heads=2)
    with pytest.raises(TypeError, match="takes no `weights`"):
        from_checkpoint(path, weights=path)


def test_one_model_at_run_time_resolution_matches_the_reference_at_every_size(
    classifier_reference,
    deit_reference,
    dinov2_registers_reference,
):
    cases = {
        "HF ViT (bicubic)": (classifier_reference, (16, 24, 32)),
        "HF DeiT distilled (bicubic)": (deit_reference, (16, 24)),
        "HF DINOv2 with registers (antialiased bicubic)": (
            dinov2_registers_reference,
            (16, 24, 12),
        ),
    }
    for case, ((out, _), sizes) in cases.items():
        path = os.path.join(out, "model.safetensors")
        model = keras_vit.ViT(
            **ARCH,
            input_shape=(None, None, 3),
            include_rescaling=False,
            classes=5,
            classifier_activation=None,
            weights=path,
        )
        positions = model.get_layer("position_embedding")
        assert positions.grid_size == (4, 4), case  # the checkpoint's own table
        for size in sizes:
            assert max_error(model, out, size, "logits") <= 1e-5, (case, size)
            fixed = from_checkpoint(
                path,
                include_rescaling=False,
                classifier_activation=None,
                input_shape=(size, size, 3),
            )
            images = np.load(os.path.join(out, f"images_{size}.npy"))
            np.testing.assert_allclose(  # as the table resampled once at load
                model.predict(images, verbose=0),
                fixed.predict(images, verbose=0),
                atol=1e-5,
                err_msg=f"{case}, {size} px",
            )


def test_building_from_a_checkpoint_file_reads_it_once(tmp_path, monkeypatch):
    # A builder reads the file for its shapes, then for its weights; a
    # ViT-B/16 checkpoint is 330 MB.
    from keras_vit.weights import readers

    source = keras_vit.ViT(**ARCH, input_shape=(16, 16, 3), classes=3)
    path = str(tmp_path / "vit.npz")
    np.savez(path, **to_official(source))
    kind, read = readers._READERS[".npz"]
    reads = []
    monkeypatch.setitem(readers._READERS, ".npz", (kind, lambda p: reads.append(p) or read(p)))
    from_checkpoint(path)
    assert reads == [path]
    keras_vit.ViT(**ARCH, weights=path)
    assert reads == [path, path]  # once per build: nothing is kept between them
    # A file changed inside the block is read again.
    with readers.reading_once():
        first = read_tensors(path)
        np.savez(path, **{**to_official(source), "extra": np.zeros(2)})
        os.utime(path, ns=(0, os.stat(path).st_mtime_ns + 10**9))
        assert "extra" in read_tensors(path) and "extra" not in first
