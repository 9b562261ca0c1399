"""Deployment: SavedModel for TF Serving, TFLite / LiteRT for the edge, and ONNX.

```python
keras_vit.export.saved_model(model, "serving/vit", class_names=names)  # serving/vit/1
keras_vit.export.tflite(model, "vit.tflite", quantization="dynamic")
keras_vit.export.onnx(model, "vit.onnx")                                 # ONNX Runtime
```
"""

from keras_vit.export.litert import (
    TFLiteModel,
    check_tflite,
    delegate_partitions,
    op_counts,
    tflite,
)
from keras_vit.export.onnx_file import check_onnx, onnx
from keras_vit.export.saved_model import check_saved_model, saved_model, serving_module
