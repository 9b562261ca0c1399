"""This package's own `.keras` files (a trained model to fine-tune at another
resolution or on other classes): already in keras_vit's layout, as the
archive reader names them (`keras_vit.weights.keras_archive`).
"""


def to_canonical(tensors, num_heads):
    del num_heads  # already in keras_vit's layout
    return dict(tensors)
