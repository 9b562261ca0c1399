"""Data for keras_vit: tf.data pipelines (arrays, folders, TFDS, Fashion-MNIST)."""

from keras_vit.data import augmentation
from keras_vit.data.fashion_mnist import CLASS_NAMES, load_fashion_mnist, read_idx
from keras_vit.data.pipelines import (
    Dataset,
    decode_upright,
    fashion_mnist,
    folder_layout,
    from_arrays,
    from_folder,
    from_tfds,
    held_out_split,
    list_image_folder,
    load,
    make_pipeline,
)
