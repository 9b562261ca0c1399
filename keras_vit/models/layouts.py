"""Which layouts the rewrites take: the residual-stream rotation and quantization-aware training.

The one place that says it: the model's constructor (`qat=`),
`rotation.rotated_copy`, `quantization_aware_copy`, the LiteRT export and
the training job's `qat` option all ask here. A layout is a model's flat
arguments (its configuration, or a checkpoint's resolved values); what is
missing takes the parts' defaults.
"""

from keras_vit.models import parts

# Poolings that commute with a rotation of the token features: a slice and a
# mean do, and a MAP head's keys and values take it into their kernel; a max
# does not, and "token_gap"'s head reads two copies of the stream.
ROTATABLE_POOLINGS = ("token", "gap", "avg", "map")


def _layout(arguments):
    return {**parts.default_arguments(), **arguments}


def _refused(layout, checks):
    return {name: layout[name] for name, supported in checks.items() if not supported}


def unrotatable(arguments):
    """`{argument: value}` of what `rotation.rotated_copy` cannot rewrite (empty: it can).

    The layout it rewrites: patches of pixels, a learned position table
    or rotary positions (a rotation of the stream leaves the heads'
    turns of their queries and keys as they are), class-token, average
    or attention (MAP) pooling, no `pre_logits` layer, one or two plain
    heads; either MLP (the paper's, or the gated one: its inside is its own).

    Example:

    >>> unrotatable({"pooling": "max"})
    {'pooling': 'max'}
    """
    layout = _layout(arguments)
    return _refused(
        layout,
        {
            "include_top": bool(layout["include_top"]),
            "stem_filters": layout["stem_filters"] is None,
            "position_embedding": layout["position_embedding"] in ("learned", "rope"),
            "pooling": layout["pooling"] in ROTATABLE_POOLINGS,
            "representation_size": not layout["representation_size"],
        },
    )


def qat_unsupported(arguments, folded=False):
    """`{argument: value}` of what quantization-aware training does not take (empty: it takes it).

    A QAT model is the rotated float model (`unrotatable`'s layout) without
    a distillation token; `quantization_aware_copy` folds LayerScale into
    the layers around it, so a QAT model itself (`folded=True`) has none.

    Example:

    >>> qat_unsupported({"distillation_token": True, "layer_scale_init": 1e-5})
    {'distillation_token': True}
    >>> qat_unsupported({"layer_scale_init": 1e-5}, folded=True)
    {'layer_scale_init': 1e-05}
    """
    layout = _layout(arguments)
    checks = {"distillation_token": not layout["distillation_token"]}
    if folded:
        checks["layer_scale_init"] = layout["layer_scale_init"] is None
    return {**unrotatable(layout), **_refused(layout, checks)}


def described(refused):
    """`"pooling='max', stem_filters=(8,)"`: a refusal's arguments as a message names them."""
    return ", ".join(f"{name}={value!r}" for name, value in refused.items())
