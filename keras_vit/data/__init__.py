"""Data for keras_vit: tf.data pipelines (arrays, folders, TFDS, Fashion-MNIST)."""

from keras_vit.data import augmentation
from keras_vit.data.fashion_mnist import CLASS_NAMES, load_fashion_mnist, read_idx
from keras_vit.data.pipelines import (
    Dataset,
    decode_upright,
    fashion_mnist,
    from_arrays,
    folder_layout,
    from_folder,
    held_out_split,
    from_tfds,
    list_image_folder,
    load,
    make_pipeline,
)
