"""Deployment: SavedModel for TF Serving, TFLite / LiteRT for the edge, and ONNX.

```python
keras_vit.export.saved_model(model, "serving/vit", class_names=names)  # serving/vit/1
keras_vit.export.tflite(model, "vit.tflite", quantization="dynamic")
keras_vit.export.onnx(model, "vit.onnx")                                 # ONNX Runtime
scores = keras_vit.export.open_export("vit.tflite")(images)  # any of them, run back
```
"""

from keras_vit.export.exported import open_export
from keras_vit.export.litert import tflite
from keras_vit.export.litert_runtime import TFLiteModel, delegate_partitions, op_counts
from keras_vit.export.onnx_file import onnx
from keras_vit.export.saved_model import saved_model, serving_module
from keras_vit.export.verification import check_onnx, check_saved_model, check_tflite
