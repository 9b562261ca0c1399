"""keras_vit's fast kernels, behind one switch.

The layers of `keras_vit.layers` read as the paper; the kernels that make
them fast on each backend live here, and one call turns them all off
(`disable_fast_kernels`) with the same outputs either way:

- `gelu` and `layer_norm`: closed-form backward passes that keep only
  their inputs (TensorFlow and JAX);
- `batch_norm`: the training step's BatchNorm with a closed-form backward
  pass (JAX, where it is faster: `closed_form_batch_norm_preferred`);
- `compiled_on_tensorflow`: those backward passes XLA-compiled on
  TensorFlow;
- `fused_attention`: attention on the backend's fused kernel (PyTorch's
  SDPA; cuDNN with JAX on a GPU, its tokens padded to a multiple of 8).

Example:
>>> import keras_vit
>>> keras_vit.ops.disable_fast_kernels()   # plain keras.ops from now on
>>> keras_vit.ops.enable_fast_kernels()    # the default
"""

from keras_vit.ops.attention import (
    CUDNN_TOKEN_MULTIPLE,
    fused_attention,
    fused_attention_kernel_available,
    padded_dot_product_attention,
)
from keras_vit.ops.batch_norm import batch_norm, closed_form_batch_norm_preferred
from keras_vit.ops.gelu import gelu, gelu_derivative
from keras_vit.ops.layer_norm import layer_norm
from keras_vit.ops.switch import (
    disable_fast_kernels,
    enable_fast_kernels,
    fast_kernels_enabled,
)
from keras_vit.ops.xla import compiled_on_tensorflow

__all__ = [
    "CUDNN_TOKEN_MULTIPLE",
    "batch_norm",
    "closed_form_batch_norm_preferred",
    "compiled_on_tensorflow",
    "disable_fast_kernels",
    "enable_fast_kernels",
    "fast_kernels_enabled",
    "fused_attention",
    "fused_attention_kernel_available",
    "gelu",
    "gelu_derivative",
    "layer_norm",
    "padded_dot_product_attention",
]
