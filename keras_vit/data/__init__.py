"""Data for keras_vit: tf.data pipelines (arrays, folders, TFDS, Fashion-MNIST).

`pipeline` turns examples into batches (`make_pipeline`); `sources` reads
them by name (`load`) and checks a source before any data is read;
`folders` and `tfds` are the two kinds of source on disk.
"""

from keras_vit.data import augmentation
from keras_vit.data.fashion_mnist import CLASS_NAMES, load_fashion_mnist, read_idx
from keras_vit.data.folders import (
    folder_layout,
    from_folder,
    held_out_split,
    list_image_folder,
)
from keras_vit.data.pipeline import Dataset, PipelineOptions, decode_upright, make_pipeline
from keras_vit.data.sources import check_source, fashion_mnist, from_arrays, load
from keras_vit.data.tfds import from_tfds
