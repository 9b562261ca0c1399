"""DINOv3 and SigLIP inference: keras_vit beside keras-hub's same backbone, in one run.

For each family, keras-hub's backbone (`DINOV3Backbone`: ViT-B/16, 4
registers, rotary positions; `SigLIPVisionEncoder`: ViT-B/16 with its
attention-pooling head) is built with random weights and saved with its own
`save_to_preset`; keras_vit's model is `keras_vit.from_checkpoint` of that
folder, so both compute the same function (checked: the largest absolute
difference of their outputs is printed). Both are compiled as `predict`
compiles them and timed in alternating rounds in one process
(`predict_on_batch` on one batch at 224 px); the medians, their ratio and the
machine's fp32 GEMM rate (measured first) are printed, one JSON line per
family at the end.

    KERAS_BACKEND=jax python benchmarks/families_vs_keras_hub.py [--rounds 5]
        [--batch 8] [--steps 2] [--quick]

Needs keras-hub (`pip install --no-deps keras-hub==0.32.0`: its backbones
need none of its tokenizer dependencies). `--quick` runs tiny models for a
step (the test suite does, so the script cannot rot); its numbers mean
nothing.
"""

import argparse
import json
import statistics
import sys
import tempfile

import numpy as np
from harness import gemm_rate, timed

B16 = dict(patch_size=16, num_layers=12, num_heads=12, hidden_dim=768, intermediate_dim=3072)
TINY = dict(patch_size=8, num_layers=1, num_heads=2, hidden_dim=32, intermediate_dim=64)


def keras_hub_backbone(family, size, image_size):
    import keras_hub

    shape = (image_size, image_size, 3)
    if family == "DINOv3":
        return keras_hub.models.DINOV3Backbone(**size, num_register_tokens=4, image_shape=shape)
    return keras_hub.models.SigLIPVisionEncoder(**size, image_shape=shape)


def pair(family, size, image_size):
    """`(keras_vit model, keras-hub backbone)` computing the same function."""
    import keras_vit

    theirs = keras_hub_backbone(family, size, image_size)
    with tempfile.TemporaryDirectory() as folder:
        theirs.save_to_preset(f"{folder}/preset")
        # keras-hub's backbones take normalised images and end at the last
        # LayerNorm (SigLIP's at its pooling head): so does this model.
        ours = keras_vit.from_checkpoint(
            f"{folder}/preset",
            include_rescaling=False,
            **({"pooling": None} if family == "DINOv3" else {}),
        )
    return ours, theirs


def measure(family, size, image_size, batch, steps, rounds):
    import keras

    ours, theirs = pair(family, size, image_size)
    x = np.random.default_rng(0).uniform(-1, 1, (batch, image_size, image_size, 3))
    x = x.astype("float32")
    models = {"keras_vit": ours, "keras_hub": theirs}
    outputs = {}
    for name, model in models.items():
        model.compile(jit_compile="auto")
        outputs[name] = keras.ops.convert_to_numpy(model.predict_on_batch(x))
    difference = float(np.abs(outputs["keras_vit"] - outputs["keras_hub"]).max())
    seconds = {name: [] for name in models}
    for _ in range(rounds):  # alternating: the machine's drifts fall on both
        for name, model in models.items():
            seconds[name].append(timed(lambda m=model: m.predict_on_batch(x), steps, warmup=1))
    rates = {name: batch / statistics.median(s) for name, s in seconds.items()}
    return {
        "family": family,
        "backend": keras.backend.backend(),
        "image_size": image_size,
        "batch": batch,
        "rounds": rounds,
        "images_per_second": rates,
        "keras_vit_over_keras_hub": rates["keras_vit"] / rates["keras_hub"],
        "max_abs_difference": difference,
    }


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--steps", type=int, default=2, help="predict calls timed per round")
    parser.add_argument("--quick", action="store_true", help="tiny models, one round")
    args = parser.parse_args(argv)
    import keras

    size, image_size = (TINY, 32) if args.quick else (B16, 224)
    rounds, steps = (1, 1) if args.quick else (args.rounds, args.steps)
    variant = "tiny" if args.quick else "B/16"
    backend = keras.backend.backend()
    gflops = gemm_rate(128 if args.quick else 4096, backend=backend)["gflops"]
    print(f"fp32 GEMM: {gflops:.0f} GFLOP/s ({backend})")
    results = []
    for family in ("DINOv3", "SigLIP"):
        result = measure(family, size, image_size, args.batch, steps, rounds)
        result["gemm_gflops"] = gflops
        rates = result["images_per_second"]
        print(
            f"{family}-{variant} at {image_size} px, batch {args.batch}: keras_vit "
            f"{rates['keras_vit']:.2f} img/s, keras-hub {rates['keras_hub']:.2f} img/s "
            f"({result['keras_vit_over_keras_hub']:.2f}x; outputs within "
            f"{result['max_abs_difference']:.1e})"
        )
        results.append(result)
    for result in results:
        print(json.dumps(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
