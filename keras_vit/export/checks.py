"""How an export is checked against its Keras model: outputs, top-1 agreement, the warning."""

import os


def cpu_threads(num_threads=None):
    """`num_threads`, or for `None` the CPUs this process may run on."""
    if num_threads is not None:
        return num_threads
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # (not on every platform)
        return os.cpu_count() or 1


def outputs_probabilities(model):
    """Whether the model ends in a softmax (else it returns logits)."""
    last = model.layers[-1]
    activation = getattr(last, "activation", None)
    return activation is not None and getattr(activation, "__name__", "") == "softmax"


def as_probabilities(scores, already_probabilities):
    """Model outputs as float64 probabilities (a softmax over logits)."""
    import numpy as np

    scores = np.asarray(scores, "float64")
    if already_probabilities:
        return scores
    scores = np.exp(scores - scores.max(-1, keepdims=True))
    return scores / scores.sum(-1, keepdims=True)


# Below this share of images whose top-1 class an export keeps, `keras-vit
# export` warns: a quantized file that loses points (or collapses) must not
# pass unnoticed.
AGREEMENT_WARNING_BELOW = 0.99


def agreement_warning(top1_agreement, count, what):
    """One line saying that `what` agrees too rarely with its Keras model; `None` if it does not.

    Example:

    >>> print(agreement_warning(0.916, 500, "model_int8.tflite"))  # doctest: +NORMALIZE_WHITESPACE
    model_int8.tflite gives the Keras model's top-1 class for 91.60% of 500 images,
    below 99%: measure its accuracy before shipping it (keras-vit evaluate --model FILE)
    >>> agreement_warning(0.998, 500, "model.onnx") is None
    True
    """
    if top1_agreement >= AGREEMENT_WARNING_BELOW:
        return None
    return (
        f"{what} gives the Keras model's top-1 class for {top1_agreement:.2%} of {count} "
        f"images, below {AGREEMENT_WARNING_BELOW:.0%}: measure its accuracy before "
        "shipping it (keras-vit evaluate --model FILE)"
    )


def agreement(served, model, images, verbose=0):
    """`max_abs_error` and `top1_agreement` of an export's outputs against `model` on `images`.

    With `top1_classes`, the export's own top-1 class of each image (to score
    it against labels).
    """
    import numpy as np

    expected = np.asarray(model.predict(images, verbose=verbose), "float32")
    return {
        "max_abs_error": float(np.max(np.abs(served - expected))),
        "top1_agreement": float(np.mean(served.argmax(-1) == expected.argmax(-1))),
        "top1_classes": served.argmax(-1).tolist(),
    }
