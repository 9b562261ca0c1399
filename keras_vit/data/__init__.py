"""Data for keras_vit: the Fashion-MNIST files the package's demo uses."""

from keras_vit.data.fashion_mnist import CLASS_NAMES, load_fashion_mnist, read_idx
