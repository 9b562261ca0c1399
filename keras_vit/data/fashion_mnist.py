"""Fashion-MNIST from Debian's `dataset-fashion-mnist` files, or a download."""

import gzip
import os

import numpy as np

DEBIAN_DIR = "/usr/share/datasets/fashion-mnist"
CLASS_NAMES = (
    "T-shirt/top",
    "Trouser",
    "Pullover",
    "Dress",
    "Coat",
    "Sandal",
    "Shirt",
    "Sneaker",
    "Bag",
    "Ankle boot",
)
_FILES = {
    "train": ("train-images-idx3-ubyte.gz", "train-labels-idx1-ubyte.gz"),
    "test": ("t10k-images-idx3-ubyte.gz", "t10k-labels-idx1-ubyte.gz"),
}
_IDX_MAGIC = {1: 2049, 3: 2051}  # labels, images (unsigned bytes)


def read_idx(path):
    """Reads a (gzipped) IDX file of unsigned bytes into a NumPy array.

    Raises:
        ValueError: when the file is not an IDX file of unsigned bytes or is
            truncated.
    """
    opener = gzip.open if path.endswith(".gz") else open
    with opener(path, "rb") as f:
        data = f.read()
    if len(data) < 8:
        raise ValueError(f"{path!r} is too short to be an IDX file.")
    magic = int.from_bytes(data[:4], "big")
    ndim = data[3]
    if _IDX_MAGIC.get(ndim) != magic:
        raise ValueError(f"{path!r} is not an IDX file of unsigned bytes (magic {magic}).")
    header = 4 + 4 * ndim
    shape = tuple(int.from_bytes(data[4 + 4 * i : 8 + 4 * i], "big") for i in range(ndim))
    size = int(np.prod(shape))
    if len(data) - header != size:
        raise ValueError(
            f"{path!r} holds {len(data) - header} bytes of data; its header "
            f"announces shape {shape} ({size} bytes)."
        )
    return np.frombuffer(data, np.uint8, offset=header).reshape(shape)


def load_fashion_mnist(split="train", data_dir=DEBIAN_DIR):
    """Loads a split of Fashion-MNIST (Xiao et al. 2017).

    Reads the IDX files that Debian's `dataset-fashion-mnist` package puts
    in `/usr/share/datasets/fashion-mnist/`; where they are absent, falls
    back to `keras.datasets.fashion_mnist` (a cached download).

    Args:
        split: `"train"` (60,000 images) or `"test"` (10,000 images).
        data_dir: folder with the four `*-ubyte.gz` files.

    Returns:
        `(images, labels)`: uint8 `(N, 28, 28, 1)` and int64 `(N,)`.
    """
    if split not in _FILES:
        raise ValueError(f"`split` must be one of {tuple(_FILES)}. Received: split={split!r}")
    image_file, label_file = (os.path.join(data_dir, f) for f in _FILES[split])
    if os.path.isfile(image_file) and os.path.isfile(label_file):
        images, labels = read_idx(image_file), read_idx(label_file)
    else:
        import keras

        try:
            train, test = keras.datasets.fashion_mnist.load_data()
        except Exception as error:  # offline: say how to get the data
            raise RuntimeError(
                f"Fashion-MNIST is not in {data_dir!r} and could not be "
                "downloaded. On Debian: `apt-get install dataset-fashion-mnist`."
            ) from error
        images, labels = train if split == "train" else test
    if len(images) != len(labels):
        raise ValueError(f"Fashion-MNIST {split}: {len(images)} images but {len(labels)} labels.")
    return images[..., None], labels.astype("int64")
