"""The one switch for keras_vit's fast kernels.

On by default. Off, every layer computes with plain `keras.ops` as the
paper writes it: `keras.ops.gelu`, `keras.ops.layer_normalization`, and
attention as two matmuls around a softmax. The values are the same either
way (to rounding); only which kernels run, and what the backward pass
keeps, change.
"""

import os

_ENVIRONMENT_VARIABLE = "KERAS_VIT_FAST_KERNELS"


def _from_environment():
    value = os.environ.get(_ENVIRONMENT_VARIABLE, "1").strip().lower()
    if value in ("1", "true", "on", "yes", ""):
        return True
    if value in ("0", "false", "off", "no"):
        return False
    raise ValueError(
        f"{_ENVIRONMENT_VARIABLE} must be 1 or 0 (also true/false, on/off). "
        f"Received: {_ENVIRONMENT_VARIABLE}={os.environ[_ENVIRONMENT_VARIABLE]!r}"
    )


_enabled = _from_environment()


def fast_kernels_enabled():
    """Whether layers traced from now on use keras_vit's fast kernels.

    Set by `enable_fast_kernels()` / `disable_fast_kernels()`; the starting
    value comes from the environment variable `KERAS_VIT_FAST_KERNELS`
    (`1` unless set to `0`).

    Example:
    >>> fast_kernels_enabled()
    True
    """
    return _enabled


def enable_fast_kernels():
    """Uses the fast kernels in every layer traced from now on (the default).

    Where each one runs:

    - GELU and LayerNorm with closed-form backward passes that keep only
      their inputs (TensorFlow and JAX; PyTorch's own kernels already do).
    - On TensorFlow, those backward passes (and GELU's training forward
      pass) XLA-compiled into one loop each (`compiled_on_tensorflow`).
    - Attention on `keras.ops.dot_product_attention` where that is a fused
      kernel (PyTorch's SDPA, cuDNN with JAX on a GPU, its tokens padded to
      a multiple of 8); head-major matmuls elsewhere.

    Functions already traced (a compiled `fit`, an exported graph) keep the
    kernels they were traced with.
    """
    global _enabled
    _enabled = True


def disable_fast_kernels():
    """Computes every layer traced from now on with plain `keras.ops`.

    The same values (to rounding) and gradients as with the fast kernels;
    for checking, profiling, or a backend where a kernel misbehaves.

    Example:
    >>> disable_fast_kernels()
    >>> fast_kernels_enabled()
    False
    >>> enable_fast_kernels()
    """
    global _enabled
    _enabled = False
