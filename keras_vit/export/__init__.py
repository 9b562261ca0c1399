"""Deployment: SavedModel for TF Serving and TFLite / LiteRT for the edge.

```python
keras_vit.export.saved_model(model, "serving/vit", class_names=names)  # serving/vit/1
keras_vit.export.tflite(model, "vit.tflite", quantization="dynamic")
```
"""

from keras_vit.export.saved_model import check_saved_model, saved_model, serving_module
from keras_vit.export.litert import (
    TFLiteModel,
    check_tflite,
    delegate_partitions,
    op_counts,
    tflite,
)
