"""Moving a pre-trained encoder into a classifier."""

import os


def transfer_encoder(pretrained, model):
    """Copies the encoder weights of a pre-training model into a keras_vit model.

    Every weight of `model` except its head must be in `pretrained` under
    the same path (patch embedding, class token, position embeddings,
    encoder blocks, final LayerNorm); position embeddings are resampled when
    the grids differ (fine-tuning at a higher resolution), the head keeps
    its zero initialisation, and the pre-training parts (`[mask]`
    embedding, prediction head, MAE's decoder) are left out. Nothing is
    assigned unless everything fits.

    Args:
        pretrained: a model built by a `keras_vit.pretraining` objective (or
            any keras_vit model), or the path of its `.keras` file.
        model: the keras_vit model to receive the weights.

    Returns:
        dict with the lists `"loaded"`, `"kept"` and `"dropped"` (see
        `keras_vit.weights.assign_canonical`).

    Example:

    ```python
    classifier = keras_vit.ViT(..., classes=10)
    keras_vit.pretraining.transfer_encoder("pretrain_run/model.keras", classifier)
    ```
    """
    import keras

    from keras_vit.weights import assign_canonical
    from keras_vit.weights.readers import read_tensors

    if isinstance(pretrained, (str, os.PathLike)):
        source = os.fspath(pretrained)
        if not source.endswith(".keras") or not os.path.isfile(source):
            raise ValueError(
                "`pretrained` must be a model or an existing .keras file. "
                f"Received: pretrained={source!r}"
            )
        tensors = read_tensors(source)
    elif isinstance(pretrained, keras.Model):
        source = f"model {pretrained.name!r}"
        tensors = {w.path: keras.ops.convert_to_numpy(w) for w in pretrained.weights}
    else:
        raise TypeError(
            "`pretrained` must be a keras.Model or a .keras path. "
            f"Received: pretrained={pretrained!r}"
        )
    return assign_canonical(model, tensors, source=source)
