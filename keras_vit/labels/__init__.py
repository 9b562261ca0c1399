"""Class names: the label sets of the published checkpoints, and decoding predictions.

The ImageNet-1k set (1,000 classes, WordNet ids in sorted order, as every
ImageNet-1k classifier orders them) and the ImageNet-21k set (21,843
classes, in the order of Google's ImageNet-21k release, which the paper's
and AugReg's ImageNet-21k checkpoints use) are package data: one
`wordnet_id<TAB>name` line per class, the name being the synset's first
WordNet lemma with underscores for spaces, as `keras.applications` names
ImageNet's classes (`"African_elephant"`).
"""

import functools
import os

import numpy as np

LABEL_SETS = {"imagenet-1k": 1000, "imagenet-21k": 21843}


@functools.cache
def _read(name):
    path = os.path.join(os.path.dirname(__file__), f"{name}.tsv")
    with open(path, encoding="utf-8") as f:
        return tuple(tuple(line.rstrip("\n").split("\t")) for line in f)


def label_set(name):
    """The `(wordnet_id, name)` of each class of a label set, in class order.

    Args:
        name: `"imagenet-1k"` or `"imagenet-21k"`.

    Returns:
        A tuple of `(wordnet_id, name)` pairs.

    Example:

    >>> label_set("imagenet-1k")[386]
    ('n02504458', 'African_elephant')
    """
    if name not in LABEL_SETS:
        raise ValueError(
            f"`label_set` must be one of {tuple(LABEL_SETS)}. Received: label_set={name!r}"
        )
    return _read(name)


def label_set_for(classes):
    """The name of the label set of a `classes`-class head, or `None` where none has that many.

    Example:

    >>> label_set_for(21843)
    'imagenet-21k'
    """
    return next((name for name, count in LABEL_SETS.items() if count == classes), None)


def _labels_for(classes, labels):
    """The `(id, name)` of each of `classes` classes that `labels` names."""
    if labels is None:
        labels = label_set_for(classes)
        if labels is None:
            raise ValueError(
                f"Predictions of {classes} classes match no label set "
                f"({', '.join(f'{n}: {c}' for n, c in LABEL_SETS.items())}); pass "
                "`labels`: a label set's name or the class names."
            )
    if isinstance(labels, str):
        pairs = label_set(labels)
    elif isinstance(labels, (list, tuple)) and all(isinstance(n, str) for n in labels):
        pairs = tuple((str(index), name) for index, name in enumerate(labels))
    else:
        raise TypeError(
            "`labels` must be None, a label set's name or a list of class names. "
            f"Received: labels={labels!r}"
        )
    if len(pairs) != classes:
        raise ValueError(
            f"The predictions have {classes} classes, the labels {len(pairs)}. "
            f"Received: labels={labels if isinstance(labels, str) else '<list>'!r}"
        )
    return pairs


def decode_predictions(preds, top=5, labels=None):
    """The `top` classes of each prediction, as `keras.applications` decodes them.

    Args:
        preds: array `(batch, classes)` of a classifier's scores
            (probabilities or logits: the order is the same).
        top: int, how many classes to return per image.
        labels: `None` (the label set of the predictions' class count:
            1,000 ImageNet-1k, 21,843 ImageNet-21k), a label set's name
            (see `LABEL_SETS`), or a list of class names (a run's own;
            their ids are the class indices as strings).

    Returns:
        A list with, for each image, a list of `(class_id, class_name,
        score)` tuples, highest score first.

    Example:

    ```python
    model = keras_vit.ViTB16(weights="augreg-imagenet21k+imagenet2012")
    keras_vit.decode_predictions(model.predict(images), top=3)[0]
    # [('n02504458', 'African_elephant', 0.87), ('n01871265', 'tusker', 0.09), ...]
    ```
    """
    preds = np.asarray(preds)
    if preds.ndim != 2:
        raise ValueError(
            "`decode_predictions` expects a batch of predictions of shape "
            f"(samples, classes). Received: preds.shape={preds.shape}"
        )
    if not isinstance(top, int) or isinstance(top, bool) or top < 1:
        raise ValueError(f"`top` must be a positive int. Received: top={top!r}")
    pairs = _labels_for(preds.shape[1], labels)
    decoded = []
    for row in preds:
        order = np.argsort(-row, kind="stable")[:top]
        decoded.append([(*pairs[index], float(row[index])) for index in order])
    return decoded
