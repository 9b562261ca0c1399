"""Training beyond one device on Keras' and TensorFlow's own engines.

`distribute("data" | "model")` picks `keras.distribution` (JAX) or
`tf.distribute` (TensorFlow); `layout_map` is the model-parallel sharding
of any ViT variant; `simulate_cpu_devices` splits one CPU into several
devices to try it all on a laptop.
"""

from keras_vit.distribution.engines import (
    Distributed,
    distribute,
    initialize,
    simulate_cpu_devices,
)
from keras_vit.distribution.layouts import SHARDED_LAYOUTS, device_mesh, layout_map
