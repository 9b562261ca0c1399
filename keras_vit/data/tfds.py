"""TensorFlow Datasets by name: read where they are prepared, downloaded only when asked."""

from keras_vit import _options
from keras_vit.data.pipeline import Dataset, limited, make_pipeline


def check_tfds_name(name):
    """Fails at once, without network, for a name TFDS does not know."""
    import tensorflow_datasets as tfds

    if name not in tfds.list_builders():
        raise ValueError(
            f"Unknown dataset {name!r}: not 'fashion_mnist', not a folder, and not a TFDS "
            "name (see `tfds.list_builders()`)."
        )


def from_tfds(name, split="train", data_dir=None, download=False, **kwargs):
    """A pipeline over a TensorFlow Datasets dataset, by name.

    Args:
        name: TFDS name, e.g. `"cifar10"`, `"oxford_flowers102"`.
        split: TFDS split, e.g. `"train"`, `"test[:10%]"`.
        data_dir: where TFDS keeps its data (default `~/tensorflow_datasets`).
        download: whether TFDS may download and prepare the data; without
            it a dataset that is not prepared fails at once.
        **kwargs: `make_pipeline` arguments.

    Raises:
        ValueError: unknown dataset name.
        RuntimeError: the data is not prepared (and may not, or could not,
            be downloaded), saying how to prepare it.
    """
    import tensorflow_datasets as tfds

    check_tfds_name(name)
    try:
        # Without download, TFDS reads what is prepared in data_dir or fails at once.
        dataset, info = tfds.load(
            name,
            split=split,
            data_dir=data_dir,
            download=download,
            as_supervised=True,
            with_info=True,
        )
    except Exception as error:
        if not download:
            raise RuntimeError(
                f"TFDS dataset {name!r} ({split}) is not prepared in "
                f"{data_dir or '~/tensorflow_datasets'}. Pass "
                f"{_options.given('download', True)} to download and prepare it there (needs "
                f"internet), or prepare it on a machine with internet access (`tfds build {name} "
                f"--data_dir DIR`), copy DIR here and pass it as {_options.name('data_dir')}."
            ) from error
        raise RuntimeError(
            f"TFDS dataset {name!r} ({split}) could not be read from "
            f"{data_dir or '~/tensorflow_datasets'}"
            + (" or downloaded" if download else "")
            + f" ({type(error).__name__}: {_options.first_line(error)}). Prepare it on a "
            f"machine with internet access (`tfds build {name}`) and copy the "
            f"data directory here, then pass it as {_options.name('data_dir')}."
        ) from error
    class_names = tuple(info.features["label"].names)
    size = info.splits[split].num_examples if split in info.splits else None
    data = make_pipeline(dataset, len(class_names), shuffle_buffer=10_000, **kwargs)
    return Dataset(data, class_names, limited(size, kwargs.get("limit")))
