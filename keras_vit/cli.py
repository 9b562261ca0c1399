"""The `keras-vit` command line."""

import argparse
import os
import re
import sys
import time


def _demo(args):
    """Builds a small ViT, trains it briefly on real Fashion-MNIST, predicts."""
    import keras
    import numpy as np
    import tensorflow as tf

    import keras_vit
    from keras_vit.data import CLASS_NAMES, load_fashion_mnist

    start = time.perf_counter()
    keras.utils.set_random_seed(args.seed)
    print(f"keras_vit {keras_vit.__version__} on Keras {keras.__version__}, "
          f"backend {keras.backend.backend()}")
    print(f"ViT-B/16 at 224 px, 1000 classes: "
          f"{keras_vit.models.parameter_count('B/16'):,} parameters (paper: 86,567,656)")

    train_images, train_labels = load_fashion_mnist("train")
    if args.limit:
        train_images, train_labels = train_images[: args.limit], train_labels[: args.limit]
    test_images, test_labels = load_fashion_mnist("test")
    print(f"Fashion-MNIST: {len(train_images):,} training and "
          f"{len(test_images):,} test images of {train_images.shape[1:]}")

    model = keras_vit.VisionTransformer(
        patch_size=4, hidden_dim=64, num_layers=4, num_heads=4, mlp_dim=128,
        input_shape=(28, 28, 1), classes=len(CLASS_NAMES),
        classifier_activation=None, seed=args.seed, name="vit_demo",
    )
    model.summary()
    steps = len(train_images) // args.batch_size * args.epochs
    model.compile(
        optimizer=keras.optimizers.AdamW(
            keras.optimizers.schedules.CosineDecay(
                0.0, steps, warmup_target=2e-3, warmup_steps=steps // 10
            ),
            weight_decay=0.05,
            global_clipnorm=1.0,
        ),
        loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
        metrics=["accuracy"],
    )
    options = tf.data.Options()
    options.autotune.enabled = False  # avoids start-of-epoch stalls on 2 cores
    train = (
        tf.data.Dataset.from_tensor_slices((train_images, train_labels))
        .shuffle(len(train_images), seed=args.seed)
        .batch(args.batch_size, drop_remainder=True)
        .with_options(options)
        .prefetch(2)
    )
    test = tf.data.Dataset.from_tensor_slices((test_images, test_labels)).batch(512)
    model.fit(train, epochs=args.epochs, shuffle=False, verbose=_progress())
    _, accuracy = model.evaluate(test.with_options(options), verbose=0)
    print(f"test accuracy after {args.epochs} epoch(s): {accuracy:.4f}")

    logits = model.predict(test_images[:1], verbose=0)[0]
    probabilities = np.exp(logits - logits.max())
    probabilities /= probabilities.sum()
    print(f"test image 0 (true class: {CLASS_NAMES[test_labels[0]]}):")
    for index in np.argsort(probabilities)[::-1][:3]:
        print(f"  {CLASS_NAMES[index]:<12} {probabilities[index]:.3f}")
    print(f"done in {time.perf_counter() - start:.0f} s")
    return 0


def _convert(args):
    """Converts a checkpoint into a `.keras` model file."""
    if not args.destination.endswith(".keras"):
        raise SystemExit(
            f"keras-vit convert: DST must end in .keras. Received: {args.destination!r}"
        )
    if os.path.exists(args.destination) and not args.overwrite:
        raise SystemExit(
            f"keras-vit convert: {args.destination!r} exists; pass --overwrite "
            "to replace it."
        )
    if not os.path.isfile(args.source):
        raise SystemExit(f"keras-vit convert: no such file: {args.source!r}")
    from keras_vit.weights import from_checkpoint

    overrides = {}
    if args.image_size:
        overrides["input_shape"] = (args.image_size, args.image_size, 3)
    if args.classes is not None:
        overrides.update(include_top=True, classes=args.classes)
    if args.no_top:
        overrides["include_top"] = False
    try:
        model = from_checkpoint(args.source, num_heads=args.num_heads, **overrides)
    except (ValueError, TypeError) as error:
        raise SystemExit(f"keras-vit convert: {error}") from None
    from keras_vit.models import encoder_blocks

    model.save(args.destination, overwrite=True)
    blocks = encoder_blocks(model)
    print(
        f"{args.source} -> {args.destination}: {len(blocks)} blocks, width "
        f"{blocks[0].input.shape[-1]}, {blocks[0].num_heads} heads, input "
        f"{model.input_shape[1:]}, output {model.output_shape[1:]}, "
        f"{model.count_params():,} parameters"
    )
    return 0


def _progress():
    """Keras' verbosity for long work: a live bar on a terminal, one line per epoch otherwise."""
    return 1 if sys.stdout.isatty() else 2


# The library's argument names, as the command line spells them.
_CLI_NAMES = {
    "gradient_accumulation_steps": "--accumulate", "quantization": "--quantize",
    **{name: "--" + name.replace("_", "-") for name in (
        "batch_size", "image_size", "patch_size", "data_dir", "output_dir", "validate_every",
        "epochs", "recipe", "augmentation", "model_parallel", "top_k", "validation_split",
        "max_image_pixels", "calibration_images", "dataset", "model", "seed", "distribute")},
}


def _cli_message(message):
    """A library message with its Python argument names spelled as the CLI's options."""
    message = re.sub(r"`?overwrite=True`?( \(`?--overwrite`?\))?", "--overwrite", message)
    message = message.replace("another `version`", "another --output version folder")
    message = re.sub(r"`?download=True`?", "--download", message)
    for name, option in _CLI_NAMES.items():
        message = re.sub(rf"`{name}=([^`]*)`", rf"{option} \1", message)
        message = re.sub(rf"`{name}`", option, message)
        message = re.sub(rf"\b{name}=", f"{option} ", message)
    return message


# What each sub-command needs beyond the library floor (Keras, NumPy,
# safetensors), and the extra of `pip install keras-vit[...]` that brings it.
_TRAINING = ("tensorflow", "tensorflow_datasets", "matplotlib")
_NEEDS = {
    "demo": ("train", ("tensorflow",)),
    "train": ("train", _TRAINING),
    "finetune": ("train", _TRAINING),
    "pretrain": ("train", _TRAINING),
    "evaluate": ("train", ("tensorflow", "tensorflow_datasets")),
    "predict": ("train", ("tensorflow",)),
    "inspect": ("train", ("tensorflow", "matplotlib")),
    "export": ("export", ("tensorflow", "tensorflow_serving", "ai_edge_litert")),
}


def _check_installed(command):
    """Fails at once, naming the extra to install, when a sub-command's packages are missing."""
    import importlib.util

    extra, modules = _NEEDS.get(command, (None, ()))
    missing = [module for module in modules if importlib.util.find_spec(module) is None]
    if missing:
        raise SystemExit(
            f"keras-vit {command}: needs {', '.join(missing)}, which "
            f"{'is' if len(missing) == 1 else 'are'} not installed; "
            f"install them with: pip install 'keras-vit[{extra}]'"
        )


def _fail(command, error):
    raise SystemExit(f"keras-vit {command}: {_cli_message(str(error))}")


def _train(args):
    """Trains (or, with a checkpoint, fine-tunes) a ViT and saves the run."""
    from keras_vit.training import train

    weights = getattr(args, "weights", None)
    try:
        result = train(
            args.dataset, model=getattr(args, "model", "small"),
            image_size=args.image_size, patch_size=getattr(args, "patch_size", None),
            epochs=args.epochs, batch_size=args.batch_size,
            recipe=args.recipe, augmentation=args.augmentation,
            output_dir=args.output_dir, seed=args.seed, data_dir=args.data_dir,
            overwrite=args.overwrite, weights=weights, distribute=args.distribute,
            model_parallel=args.model_parallel,
            gradient_accumulation_steps=args.accumulate,
            validate_every=args.validate_every, deterministic=args.deterministic,
            validation_split=args.validation_split, download=args.download,
            verbose=_progress(),
        )
    except (ValueError, RuntimeError) as error:
        _fail(args.command, error)
    metrics, paths = result["metrics"], result["paths"]
    if "test_accuracy" in metrics:
        print(f"test accuracy: {metrics['test_accuracy']:.4f}, "
              f"cross-entropy {metrics['test_cross_entropy']:.4f}")
    print(f"trained in {metrics['fit_seconds']:.0f} s, {metrics['total_seconds']:.0f} s in all")
    for name, path in paths.items():
        print(f"  {name:<20} {path}")
    return 0


def _pretrain(args):
    """Pre-trains a ViT encoder without labels and saves the run."""
    from keras_vit.pretraining import pretrain

    if args.objective == "mpp":
        options = {"target": args.target, "corruption_rate": args.corruption_rate}
    else:
        options = {"mask_ratio": args.mask_ratio}
        options.update({key: value for key, value in (
            ("decoder_dim", args.decoder_dim), ("decoder_depth", args.decoder_depth),
            ("decoder_heads", args.decoder_heads)) if value is not None})
    try:
        result = pretrain(
            args.dataset, objective=args.objective, objective_options=options,
            model=args.model, image_size=args.image_size, patch_size=args.patch_size,
            epochs=args.epochs, batch_size=args.batch_size, recipe=args.recipe,
            augmentation=args.augmentation, output_dir=args.output_dir, seed=args.seed,
            data_dir=args.data_dir, download=args.download, overwrite=args.overwrite,
            gradient_accumulation_steps=args.accumulate,
            deterministic=args.deterministic, verbose=_progress(),
        )
    except (ValueError, RuntimeError) as error:
        _fail("pretrain", error)
    metrics, paths = result["metrics"], result["paths"]
    shown = ", ".join(f"{k} {metrics[k]:.4f}" for k in ("loss", "accuracy") if k in metrics)
    print(f"last epoch: {shown}; pre-trained in {metrics['fit_seconds']:.0f} s, "
          f"{metrics['total_seconds']:.0f} s in all")
    for name, path in paths.items():
        print(f"  {name:<20} {path}")
    print(f"fine-tune it: keras-vit finetune {paths['model.keras']} --recipe small")
    return 0


def _load_run_model(path, classifier=True):
    """`(model, class_names)` of a `.keras` file, or a `ValueError` naming the real cause.

    With `classifier`, the model must map images to one row of class scores
    (a pre-training model does not).
    """
    import json
    import zipfile

    import keras

    if not os.path.isfile(path):
        raise ValueError(f"no such model file: {path!r}")
    if not zipfile.is_zipfile(path):
        raise ValueError(f"{path} is not a .keras model file: it is not a zip archive "
                         "(a truncated download, or another kind of file)")
    with zipfile.ZipFile(path) as archive:
        if "config.json" not in archive.namelist():
            raise ValueError(f"{path} is a zip archive without config.json: not a .keras "
                             "model file")
    try:
        model = keras.models.load_model(path)
    except (ValueError, TypeError, KeyError, OSError, zipfile.BadZipFile) as error:
        cause = str(error).strip().splitlines()[0] if str(error).strip() else type(error).__name__
        raise ValueError(f"{path} could not be loaded as a Keras model: {cause}") from None
    if classifier and (len(model.outputs) != 1 or len(model.outputs[0].shape) != 2
                       or len(model.inputs) != 1 or len(model.inputs[0].shape) != 4):
        outputs = [tuple(o.shape) for o in model.outputs]
        raise ValueError(
            f"{path} is not an image classifier (images in, one row of class scores out; it "
            f"outputs {outputs[0] if len(outputs) == 1 else outputs}): a pre-training or "
            f"feature model? Fine-tune it into one first: keras-vit finetune {path}"
        )
    names_path = os.path.join(os.path.dirname(os.path.abspath(path)), "class_names.json")
    class_names = None
    if os.path.isfile(names_path):
        with open(names_path) as f:
            class_names = json.load(f)
    return model, class_names


def _run_data(args):
    """`(dataset, options)` for a command on a run's model: the run's own data by default.

    A model written by `keras-vit train` has `run.json` beside it, which
    names its dataset (and data folder, held-out split); `--dataset` picks
    another. Without either, Fashion-MNIST.
    """
    from keras_vit.training.loop import dataset_reference, read_run

    recorded = read_run(os.path.dirname(os.path.abspath(args.model))) or {}
    dataset = args.dataset or recorded.get("dataset") or "fashion_mnist"
    options = {}
    same = dataset_reference(dataset) == recorded.get("dataset")
    data_dir = args.data_dir or (recorded.get("data_dir") if same else None)
    if data_dir:
        options["data_dir"] = data_dir
    if same and recorded.get("validation_split") is not None:
        options["validation_split"] = recorded["validation_split"]
    return dataset, options


def _evaluate(args):
    """Evaluates a saved model on a dataset split."""
    from keras_vit import data as vit_data

    try:
        model, _ = _load_run_model(args.model)
        height, width, channels = _image_shape(model)
        dataset, options = _run_data(args)
        if "validation_split" not in options and os.path.isdir(str(dataset)) \
                and vit_data.folder_layout(dataset)["flat"]:
            # Class folders at the top, named for evaluation: all of their images.
            test = vit_data.from_folder(dataset, image_size=(height, width), channels=channels,
                                        batch_size=args.batch_size)
        else:
            test = vit_data.load(
                dataset, args.split, image_size=(height, width), channels=channels,
                batch_size=args.batch_size, **options,
            )
        if test.num_classes != model.outputs[0].shape[-1]:
            raise ValueError(
                f"{dataset!r} has {test.num_classes} classes and the model "
                f"{model.outputs[0].shape[-1]}: not the data it was trained on? (--dataset)"
            )
    except (ValueError, RuntimeError) as error:
        _fail("evaluate", error)
    import keras

    from keras_vit.export.graph import outputs_probabilities

    # The model's own output kind: logits, or probabilities of a softmax head.
    from_logits = not outputs_probabilities(model)
    model.compile(
        loss=keras.losses.CategoricalCrossentropy(from_logits=from_logits),
        metrics=[keras.metrics.CategoricalAccuracy(name="accuracy")],
    )
    import warnings

    with warnings.catch_warnings():
        # An image folder's pipeline has no known length (undecodable files
        # are dropped), which Keras reports as running out of data; it did not.
        warnings.filterwarnings("ignore", message="Your input ran out of data")
        cross_entropy, accuracy = model.evaluate(test.data, verbose=_progress())
    print(f"{dataset} {args.split}: accuracy {accuracy:.4f}, cross-entropy "
          f"{cross_entropy:.4f} ({test.size} images)")
    return 0


def _missing_files(paths):
    missing = [p for p in paths if not os.path.isfile(p)]
    if missing:
        raise ValueError(f"no such image file(s): {missing}")


def _read_images(command, paths, height, width, channels, max_pixels=None):
    """Image files as one float batch, prepared like evaluation images.

    Each file is checked from its header first (size limits: nothing above
    them is decoded). Returns `(paths, images)` of the files that decoded;
    each one that did not is reported on standard error with its cause.
    """
    import numpy as np
    import tensorflow as tf

    from keras_vit.data import image_limits
    from keras_vit.data.pipelines import decode_for_eval

    kept, images = [], []
    for path in paths:
        try:
            source_height, source_width = image_limits.check_file(path, max_pixels)
            images.append(decode_for_eval(tf.io.read_file(path), (height, width), channels,
                                          max_pixels=max_pixels))
        except image_limits.ImageTooLarge as error:
            print(f"keras-vit {command}: {path}: {error} (--max-image-pixels)", file=sys.stderr)
            continue
        except ValueError as error:
            print(f"keras-vit {command}: {path}: {error}", file=sys.stderr)
            continue
        except tf.errors.InvalidArgumentError as error:
            cause = re.sub(r"\{\{.*?\}\}|\[Op:.*$", "", error.message.strip().splitlines()[0])
            cause = cause.strip().rstrip(".")
            print(f"keras-vit {command}: {path}: could not be decoded ({cause}); a truncated "
                  "or damaged file, or an encoding TensorFlow does not read", file=sys.stderr)
            continue
        if source_height < height or source_width < width:
            print(f"keras-vit {command}: {path}: warning: {source_width}x{source_height} image "
                  f"upscaled to the model's {width}x{height}", file=sys.stderr)
        kept.append(path)
    return kept, (np.stack(images) if images else None)


def _predict(args):
    """Top-k classes of image files, with a .keras or a .tflite model."""
    import numpy as np

    from keras_vit.export.graph import as_probabilities

    try:
        _missing_files(args.images)
        if args.model.endswith(".tflite"):
            from keras_vit.export import TFLiteModel

            runner = TFLiteModel(args.model)
            _, height, width, channels = runner.input_shape
            class_names = runner.metadata.get("class_names")
            outputs_logits = runner.metadata.get("output", "logits") == "logits"
        else:
            from keras_vit.export.graph import outputs_probabilities

            model, class_names = _load_run_model(args.model)
            height, width, channels = _image_shape(model)
            runner = lambda images: model.predict(images, verbose=0)  # noqa: E731
            outputs_logits = not outputs_probabilities(model)
    except ValueError as error:
        _fail("predict", error)
    paths, batch = _read_images("predict", args.images, height, width, channels,
                                args.max_image_pixels)
    if batch is None:
        _fail("predict", "no image could be read")
    probabilities = as_probabilities(runner(batch), not outputs_logits)
    for path, row in zip(paths, probabilities):
        print(path)
        for index in np.argsort(row)[::-1][: args.top_k]:
            name = class_names[index] if class_names else str(index)
            print(f"  {name:<16} {row[index]:.3f}")
    return 0 if len(paths) == len(args.images) else 1


def _image_shape(model, image_size=None):
    """`(height, width, channels)` the CLI feeds `model`: its own, or for a model of any
    size `image_size` (else the size its position table is laid out for)."""
    from keras_vit.models import default_image_size

    size = (image_size, image_size) if image_size else default_image_size(model)
    if None not in model.input_shape[1:3]:
        size = model.input_shape[1:3]
    return (*size, model.input_shape[3])


def _dataset_images(model, dataset, split, count, options, image_size=None):
    """`count` evaluation-view images (float array) of a dataset split, at the model's input size."""
    from keras_vit import data as vit_data
    from keras_vit.export.litert import calibration_images

    shape = _image_shape(model, image_size)
    loaded = vit_data.load(dataset, split, image_size=shape[:2], channels=shape[2],
                           batch_size=min(count, 256), **options)
    return calibration_images(loaded.data, shape, count)


def _has_test_split(dataset):
    """Whether a folder has test/ or a TFDS name is asked for (its "test" split is tried)."""
    if os.path.isdir(str(dataset)):
        return os.path.isdir(os.path.join(str(dataset), "test"))
    return False


def _export(args):
    """Exports a saved model as a TF Serving SavedModel or a TFLite file, then checks it."""
    from keras_vit import export
    from keras_vit.export.saved_model import SIGNATURES

    try:
        if args.format != "tflite" and args.quantize != "none":
            raise ValueError("--quantize applies to --format tflite only")
        model, class_names = _load_run_model(args.model)
        dataset, data_options = _run_data(args)
        run_dir = os.path.dirname(os.path.abspath(args.model))
        if args.format == "saved_model":
            output = args.output or os.path.join(run_dir, "serving", model.name)
            path = export.saved_model(model, output, class_names=class_names,
                                      top_k=args.top_k, overwrite=args.overwrite,
                                      image_size=args.image_size)
        elif args.format == "onnx":
            output = args.output or os.path.join(run_dir, "model.onnx")
            path = export.onnx(model, output, image_size=args.image_size,
                               class_names=class_names, overwrite=args.overwrite)["path"]
        else:
            suffix = "" if args.quantize == "none" else f"_{args.quantize}"
            output = args.output or os.path.join(run_dir, f"model{suffix}.tflite")
            calibration = None
            if args.quantize in ("int8", "int8_full"):
                # The representative data comes from the training split.
                calibration = _dataset_images(model, dataset, "train",
                                              args.calibration_images, data_options,
                                              args.image_size)
            result = export.tflite(model, output, quantization=args.quantize,
                                   representative_data=calibration,
                                   calibration_count=args.calibration_images,
                                   class_names=class_names, overwrite=args.overwrite,
                                   image_size=args.image_size)
            path = result["path"]
    except (ValueError, TypeError) as error:
        _fail("export", error)
    print(f"exported {args.format} to {path}")
    if args.check_images <= 0:
        return 0
    check_split = "train" if dataset != "fashion_mnist" and "validation_split" not in \
        data_options and not _has_test_split(dataset) else "test"
    images = _dataset_images(model, dataset, check_split, args.check_images, data_options,
                             args.image_size if args.format != "saved_model" else None)
    if args.format == "saved_model":
        import tensorflow as tf

        encoded = [tf.io.encode_png(tf.cast(tf.round(i), tf.uint8)).numpy() for i in images[:8]]
        print(f"checking the export in a TensorFlow-only process on {len(images)} images")
        report = export.check_saved_model(path, model, images, encoded, verbose=_progress())
        print(report["signatures"])
        for signature in SIGNATURES:
            numbers = report.get(signature)
            if numbers:
                print(f"{signature}: max abs error {numbers['max_abs_error']:.2e}, "
                      f"top-1 agreement {numbers['top1_agreement']:.2%} "
                      "(TensorFlow-only process, PredictRequest)")
    elif args.format == "onnx":
        print(f"checking the export in ONNX Runtime (a process without Keras) on "
              f"{len(images)} images")
        report = export.check_onnx(path, model, images, verbose=_progress())
        print(f"ONNX Runtime: {report['bytes'] / 1e6:.2f} MB, max abs error "
              f"{report['max_abs_error']:.2e}, top-1 agreement {report['top1_agreement']:.2%} "
              f"on {len(images)} {dataset} images, {report['latency_ms']:.2f} ms/image "
              "(2 threads)")
    else:
        print(f"checking the export in LiteRT on {len(images)} images")
        report = export.check_tflite(path, model, images, verbose=_progress())
        print(f"LiteRT: {report['bytes'] / 1e6:.2f} MB, max abs error "
              f"{report['max_abs_error']:.2e}, top-1 agreement {report['top1_agreement']:.2%} "
              f"on {len(images)} {dataset} images, {report['latency_ms']:.2f} ms/image "
              "(2 threads)")
    return 0


def _inspect(args):
    """Writes the paper's inspection figures for a model and some images."""
    from keras_vit import inspect as vit_inspect

    try:
        _missing_files(args.images)
        model, _ = _load_run_model(args.model, classifier=False)
        try:
            vit_inspect.token_layout(model)  # a ViT of this package, or a clear error
        except ValueError as error:
            raise ValueError(f"{args.model}: {error}") from None
    except ValueError as error:
        _fail("inspect", error)
    paths, images = _read_images("inspect", args.images, *_image_shape(model),
                                 args.max_image_pixels)
    if images is None:
        _fail("inspect", "no image could be read")
    titles = [os.path.basename(p) for p in paths]
    paths = vit_inspect.write_figures(model, images, args.out, titles)
    for name, path in paths.items():
        print(f"  {name:<20} {path}")
    if vit_inspect.has_stem(model):
        print(f"  {'embedding_filters':<20} skipped: the model has a convolutional stem, so its "
              "patch filters see feature maps, not pixels")
    return 0


def _add_run_arguments(parser, *, epochs, batch_size, recipe, output_dir, distributed=True):
    """The data, schedule and output options that `train`, `finetune` and `pretrain` share."""
    parser.add_argument("--dataset", default="fashion_mnist",
                        help="'fashion_mnist', an image folder, or a TFDS name")
    parser.add_argument("--image-size", type=_positive_int, default=None,
                        help="default: the data's (train) or the checkpoint's (finetune)")
    parser.add_argument("--epochs", type=_positive_int, default=epochs, help="training epochs")
    parser.add_argument("--batch-size", type=_positive_int, default=batch_size,
                        help="images per step (the global batch with --distribute)")
    parser.add_argument("--recipe", default=recipe, help="small | pretrain | finetune")
    parser.add_argument("--augmentation", default="none",
                        help="none | light | medium | strong")
    parser.add_argument("--output-dir", default=output_dir,
                        help="folder for the run's files (and its resume checkpoints)")
    parser.add_argument("--data-dir", default=None, help="TFDS data folder")
    parser.add_argument("--download", action="store_true",
                        help="let TFDS download and prepare a dataset that is not prepared in "
                             "--data-dir (without it, such a dataset is refused at once)")
    parser.add_argument("--seed", type=_non_negative_int, default=0, help="random seed")
    parser.add_argument("--overwrite", action="store_true",
                        help="replace a finished run in OUTPUT_DIR")
    parser.add_argument("--deterministic", action="store_true",
                        help="deterministic kernels: a killed and resumed run ends with the "
                             "weights of an uninterrupted one")
    parser.add_argument("--accumulate", type=_positive_int, default=None, metavar="STEPS",
                        help="gradient accumulation: update every STEPS batches")
    if not distributed:
        return
    parser.add_argument("--distribute", choices=("data", "model"), default=None,
                        help="data parallel over all devices (JAX: keras.distribution, "
                             "TensorFlow: tf.distribute, multi-worker with TF_CONFIG) or "
                             "model parallel (JAX); --batch-size is the global batch")
    parser.add_argument("--model-parallel", type=_positive_int, default=2,
                        help="devices per model copy with --distribute model")
    parser.add_argument("--cpu-devices", type=_positive_int, default=None,
                        help="split the CPU into this many devices (to try --distribute "
                             "on one machine)")
    parser.add_argument("--validation-split", type=_fraction, default=None, metavar="FRACTION",
                        help="for an image folder without test/: hold out this share of each "
                             "class's training images as the test set (the same files each time)")
    parser.add_argument("--validate-every", type=_positive_int, default=None, metavar="EPOCHS",
                        help="evaluate on the test split every EPOCHS epochs (default: "
                             "after the last one only)")


class _HelpFormatter(argparse.ArgumentDefaultsHelpFormatter):
    """Shows every option's default (but not `None` or `False`)."""

    def _get_help_string(self, action):
        if action.default in (None, False, argparse.SUPPRESS) or "%(default)" in (action.help or ""):
            return action.help
        return super()._get_help_string(action)


def _version():
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("keras-vit")
    except PackageNotFoundError:  # run from a source tree that is not installed
        return "unknown (not installed)"


def _whole_number(text, smallest, what):
    try:
        value = int(text)
    except ValueError:
        value = None
    if value is None or value < smallest:
        raise argparse.ArgumentTypeError(f"must be {what}, not {text!r}")
    return value


def _positive_int(text):
    return _whole_number(text, 1, "a positive whole number")


def _non_negative_int(text):
    return _whole_number(text, 0, "a whole number, 0 or more")


def _fraction(text):
    try:
        value = float(text)
    except ValueError:
        value = None
    if value is None or not 0.0 < value < 1.0:
        raise argparse.ArgumentTypeError(f"must be a number between 0 and 1, not {text!r}")
    return value


def _add_image_limit(parser):
    from keras_vit.data import image_limits

    parser.add_argument("--max-image-pixels", type=_positive_int, default=image_limits.MAX_PIXELS,
                        help="refuse images whose header declares more pixels, before "
                             "decoding them")


def build_parser():
    parser = argparse.ArgumentParser(
        prog="keras-vit",
        description="The Vision Transformer for Keras 3.",
    )
    parser.add_argument("--version", action="version", version=f"keras-vit {_version()}")
    # The options of every sub-command.
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument("--backend", choices=("tensorflow", "jax", "torch"), default=None,
                        help="Keras backend (default: KERAS_BACKEND, else tensorflow)")
    common.add_argument("--verbose", action="store_true",
                        help="show the log lines of TensorFlow and the other libraries")
    commands = parser.add_subparsers(dest="command", metavar="COMMAND")

    def command(name, **kwargs):
        return commands.add_parser(name, parents=[common], formatter_class=_HelpFormatter,
                                   **kwargs)

    demo = command(
        "demo",
        help="build a small ViT, train it briefly on Fashion-MNIST, predict",
    )
    demo.add_argument("--epochs", type=_positive_int, default=1, help="training epochs")
    demo.add_argument("--batch-size", type=_positive_int, default=128, help="images per step")
    demo.add_argument("--seed", type=_non_negative_int, default=0, help="random seed")
    demo.add_argument(
        "--limit", type=_positive_int, default=None, help="use only the first N training images"
    )
    demo.set_defaults(run=_demo)

    convert = command(
        "convert",
        help="convert an official .npz, Hugging Face or timm checkpoint to .keras",
        description=(
            "Builds the ViT that SRC describes (width, depth, heads, patch, "
            "resolution, head, GELU form, LayerNorm epsilon and pixel "
            "normalisation of its source) and saves it with its weights as DST."
        ),
    )
    convert.add_argument("source", metavar="SRC", help="checkpoint file")
    convert.add_argument("destination", metavar="DST", help="output .keras file")
    convert.add_argument(
        "--image-size", type=_positive_int, default=None,
        help="build at this resolution (position embeddings resampled)",
    )
    convert.add_argument(
        "--classes", type=_positive_int, default=None,
        help="a new zero-initialised head of this many classes",
    )
    convert.add_argument("--no-top", action="store_true", help="drop the head")
    convert.add_argument(
        "--num-heads", type=_positive_int, default=None,
        help="attention heads, for files without config.json outside the variant table",
    )
    convert.add_argument("--overwrite", action="store_true", help="replace DST")
    convert.set_defaults(run=_convert)

    train = command(
        "train",
        help="train a ViT (default: a small ViT on Fashion-MNIST), evaluate, save",
        description=(
            "Trains a ViT with model.fit on a tf.data pipeline, evaluates it on "
            "the test split, and saves model.keras, class_names.json, "
            "history.csv, learning_curves.png and metrics.json in OUTPUT_DIR. "
            "Interrupted? Run the same command again: it resumes from the last "
            "finished epoch."
        ),
    )
    train.add_argument("--model", default="small",
                       help="'small' or a variant of the paper, e.g. Ti/16, S/16")
    train.add_argument("--patch-size", type=_positive_int, default=None,
                       help="patch size in pixels (default: the model's)")
    _add_run_arguments(train, epochs=8, batch_size=128, recipe="small",
                       output_dir="keras_vit_run")
    train.set_defaults(run=_train)

    finetune = command(
        "finetune",
        help="fine-tune a checkpoint (optionally at a higher resolution), evaluate, save",
        description=(
            "Fine-tunes a checkpoint (a model.keras of an earlier run, an official "
            ".npz, a Hugging Face or timm .safetensors) on a dataset with the "
            "paper's fine-tuning recipe: position embeddings resampled to "
            "--image-size, a new zero head for another class count. Same "
            "outputs and resume as `keras-vit train`."
        ),
    )
    finetune.add_argument("weights", metavar="CHECKPOINT",
                          help="a .keras file, an official .npz, a Hugging Face or timm file")
    _add_run_arguments(finetune, epochs=2, batch_size=256, recipe="finetune",
                       output_dir="keras_vit_finetune")
    finetune.set_defaults(run=_train)

    pretrain = command(
        "pretrain",
        help="self-supervised pre-training: masked patch prediction (the paper's) or MAE",
        description=(
            "Pre-trains a ViT encoder on the training images of a dataset without "
            "their labels, with model.fit on a tf.data pipeline that computes the "
            "masks and targets: the paper's masked patch prediction (--objective "
            "mpp: 50% of the patch embeddings corrupted, 80/10/10 [mask]/other "
            "patch/kept, predict each one's 3-bit mean colour) or MAE (--objective "
            "mae). Saves model.keras, history.csv, learning_curves.png and "
            "metrics.json in OUTPUT_DIR; resumes like `keras-vit train`. Then: "
            "keras-vit finetune OUTPUT_DIR/model.keras."
        ),
    )
    pretrain.add_argument("--objective", choices=("mpp", "mae"), default="mpp",
                          help="masked patch prediction (the paper's) or MAE")
    pretrain.add_argument("--model", default="small/4",
                          help="'small/4' or a variant of the paper, e.g. Ti/16")
    pretrain.add_argument("--patch-size", type=_positive_int, default=None,
                          help="patch size in pixels (default: the model's)")
    pretrain.add_argument("--target", choices=("mean_color", "color_grid", "pixels"),
                          default="mean_color", help="mpp: what to predict per corrupted patch")
    pretrain.add_argument("--corruption-rate", type=_fraction, default=0.5,
                          help="mpp: fraction of patches corrupted")
    pretrain.add_argument("--mask-ratio", type=_fraction, default=0.75,
                          help="mae: fraction of patches dropped")
    pretrain.add_argument("--decoder-dim", type=_positive_int, default=None, help="mae decoder width")
    pretrain.add_argument("--decoder-depth", type=_positive_int, default=None, help="mae decoder blocks")
    pretrain.add_argument("--decoder-heads", type=_positive_int, default=None, help="mae decoder heads")
    _add_run_arguments(pretrain, epochs=10, batch_size=128, recipe="small",
                       output_dir="keras_vit_pretrain", distributed=False)
    pretrain.set_defaults(run=_pretrain)

    evaluate = command(
        "evaluate", help="evaluate a saved model",
        description="Accuracy and loss of a saved model on a dataset split.",
    )
    evaluate.add_argument("--model", default="keras_vit_run/model.keras", help="a .keras file")
    evaluate.add_argument("--dataset", default=None,
                          help="'fashion_mnist', an image folder, or a TFDS name (default: the "
                               "run's own, from run.json beside MODEL; else fashion_mnist)")
    evaluate.add_argument("--split", default="test", help="dataset split")
    evaluate.add_argument("--batch-size", type=_positive_int, default=500, help="images per step")
    evaluate.add_argument("--data-dir", default=None, help="TFDS data folder")
    evaluate.set_defaults(run=_evaluate)

    export = command(
        "export",
        help="export a saved model for TF Serving (SavedModel), the edge (TFLite) or ONNX",
        description=(
            "Exports MODEL (a .keras file; class_names.json beside it is used) "
            "as a TF Serving SavedModel in OUTPUT/<version>/ (float and "
            "encoded-image signatures), as a .tflite file or as an .onnx file "
            "(each with a .json beside it), then checks the export against the "
            "Keras model on images of --dataset: the SavedModel in a "
            "TensorFlow-only process through PredictRequest protos, the .tflite "
            "in the LiteRT interpreter, the .onnx in ONNX Runtime in a process "
            "without Keras."
        ),
    )
    export.add_argument("model", metavar="MODEL", help="a .keras file")
    export.add_argument("--format", choices=("saved_model", "tflite", "onnx"),
                        default="saved_model",
                        help="TF Serving SavedModel, TFLite / LiteRT file or ONNX file")
    export.add_argument("--image-size", type=_positive_int, default=None,
                        help="for a model of any image size: the size to export a .tflite "
                             "or .onnx at, or that serving_bytes resizes to")
    export.add_argument("--quantize", choices=("none", "float16", "dynamic", "int8", "int8_full"),
                        default="none", help="TFLite quantisation")
    export.add_argument("--output", default=None,
                        help="default: MODEL's folder, serving/NAME/, model[_QUANT].tflite "
                             "or model.onnx")
    export.add_argument("--top-k", type=_positive_int, default=5,
                        help="classes in the SavedModel's top-k outputs")
    export.add_argument("--dataset", default=None,
                        help="images to calibrate int8 and check the export with (default: "
                             "the run's own, from run.json beside MODEL; else fashion_mnist)")
    export.add_argument("--data-dir", default=None, help="TFDS data folder")
    export.add_argument("--calibration-images", type=_positive_int, default=256,
                        help="training images that calibrate int8")
    export.add_argument("--check-images", type=_non_negative_int, default=256, help="0: no check")
    export.add_argument("--overwrite", action="store_true",
                        help="replace an existing version directory / file")
    export.set_defaults(run=_export)

    inspect = command(
        "inspect",
        help="attention rollout, attention distance, position and filter figures",
        description=(
            "Writes the figures of the paper's section 4.5 for MODEL as PNGs in "
            "--out: attention rollout over each IMAGE, mean attention distance "
            "of every head against depth (over the given images), "
            "position-embedding similarity, and the patch filters' principal "
            "components (models without a convolutional stem)."
        ),
    )
    inspect.add_argument("model", metavar="MODEL", help="a .keras file")
    inspect.add_argument("images", metavar="IMAGE", nargs="+", help="image files")
    inspect.add_argument("--out", default="keras_vit_inspect", help="folder for the PNGs")
    _add_image_limit(inspect)
    inspect.set_defaults(run=_inspect)

    predict = command("predict", help="top-k classes of image files",
                      description="The top-k classes of each image file (JPEG, PNG, GIF, BMP).")
    predict.add_argument("images", metavar="IMAGE", nargs="+", help="image files")
    predict.add_argument("--model", default="keras_vit_run/model.keras",
                         help="a .keras file, or a .tflite file from `keras-vit export`")
    predict.add_argument("--top-k", type=_positive_int, default=3, help="classes shown per image")
    _add_image_limit(predict)
    predict.set_defaults(run=_predict)
    return parser


def _quiet_python_logs():
    """Keeps TensorFlow's and absl's Python loggers to errors (the CLI prints its own lines).

    The native (C++) log lines are kept out by the `keras-vit` launcher
    (`keras_vit_launcher`), before TensorFlow loads.
    """
    import logging

    for name in ("tensorflow", "absl", "jax._src.xla_bridge"):
        logging.getLogger(name).setLevel(logging.ERROR)


def main(argv=None):
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.command is None:
        parser.print_help()
        return 2
    _check_installed(args.command)
    if not args.verbose:
        _quiet_python_logs()
    backend = getattr(args, "backend", None)
    if backend:
        if "keras" in sys.modules and sys.modules["keras"].backend.backend() != backend:
            raise SystemExit(
                f"keras-vit: Keras is already loaded with another backend; set "
                f"KERAS_BACKEND={backend} instead of --backend."
            )
        os.environ["KERAS_BACKEND"] = backend
    if getattr(args, "cpu_devices", None) is not None:
        from keras_vit.distribution import simulate_cpu_devices

        try:
            simulate_cpu_devices(args.cpu_devices)
        except (ValueError, RuntimeError) as error:
            _fail(args.command, error)
    try:
        return args.run(args)
    except KeyboardInterrupt:
        print(_interrupted(args), file=sys.stderr)
        return 130


def _interrupted(args):
    """The one line for Ctrl-C: where the run stands and how to go on."""
    output_dir = getattr(args, "output_dir", None)
    if output_dir is None:
        return f"keras-vit {args.command}: interrupted."
    from keras_vit.training.backup import latest_checkpoint

    found = latest_checkpoint(os.path.join(output_dir, "backup"))
    if found is None:
        return (f"keras-vit {args.command}: interrupted before the first epoch ended; "
                "nothing was kept.")
    return (f"keras-vit {args.command}: interrupted after epoch {found[0]} (checkpoint in "
            f"{found[1]}); run the same command again to resume.")


if __name__ == "__main__":
    sys.exit(main())
