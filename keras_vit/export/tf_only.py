"""Reading an exported SavedModel with TensorFlow alone (no Keras, no keras_vit).

This file imports only the standard library, NumPy, TensorFlow and the
`tensorflow-serving-api` protos, so it shows what a serving client or a TF
Serving process sees. `keras_vit.export.check_saved_model` runs it as a
script in a fresh interpreter:

    python tf_only.py SAVED_MODEL_DIR REQUESTS.json OUTPUTS.npz

REQUESTS.json maps a signature name to `{input name: value}`, where a value
is `{"npy": path}` (a float array) or `{"base64": [...]}` (encoded images).
Each request goes through a `PredictRequest` proto, as TF Serving receives it.
"""

import base64
import json
import sys


def signature_table(loaded):
    """The signatures of a loaded SavedModel, as `saved_model_cli show --all` lists them."""
    lines = []
    for name, function in sorted(loaded.signatures.items()):
        lines.append(f"signature_def['{name}']:")
        lines.append("  inputs:")
        for key, spec in sorted(function.structured_input_signature[1].items()):
            lines.append(f"    {key}: {spec.dtype.name} {_shape(spec.shape)}")
        lines.append("  outputs:")
        for key, spec in sorted(function.structured_outputs.items()):
            lines.append(f"    {key}: {spec.dtype.name} {_shape(spec.shape)}")
    return "\n".join(lines)


def _shape(shape):
    return "(" + ", ".join("-1" if d is None else str(d) for d in shape.as_list()) + ")"


def predict(loaded, request):
    """Answers a `PredictRequest` the way TF Serving's Predict API does.

    Picks the signature by `request.model_spec.signature_name`
    (`serving_default` when empty), feeds the request's tensor protos and
    returns a `PredictResponse` holding the outputs named by
    `request.output_filter` (all when empty).
    """
    import tensorflow as tf
    from tensorflow_serving.apis import predict_pb2

    name = request.model_spec.signature_name or "serving_default"
    if name not in loaded.signatures:
        raise ValueError(f"no signature {name!r}; the model has {sorted(loaded.signatures)}")
    function = loaded.signatures[name]
    inputs = {key: tf.constant(tf.make_ndarray(proto)) for key, proto in request.inputs.items()}
    outputs = function(**inputs)
    response = predict_pb2.PredictResponse()
    response.model_spec.CopyFrom(request.model_spec)
    response.model_spec.signature_name = name
    for key in request.output_filter or outputs:
        response.outputs[key].CopyFrom(tf.make_tensor_proto(outputs[key].numpy()))
    return response


def main(argv):
    import numpy as np
    import tensorflow as tf
    from tensorflow_serving.apis import predict_pb2

    directory, requests_path, outputs_path = argv
    loaded = tf.saved_model.load(directory)
    with open(requests_path) as f:
        requests = json.load(f)
    arrays, errors = {}, {}
    for signature, inputs in requests.items():
        request = predict_pb2.PredictRequest()
        request.model_spec.name = "vit"
        request.model_spec.signature_name = signature
        for key, value in inputs.items():
            if "npy" in value:
                tensor = tf.make_tensor_proto(np.load(value["npy"]))
            else:
                tensor = tf.make_tensor_proto([base64.b64decode(v) for v in value["base64"]])
            request.inputs[key].CopyFrom(tensor)
        try:
            response = predict(loaded, request)
        except tf.errors.InvalidArgumentError as error:  # a bad request, not a crash
            errors[signature] = error.message.splitlines()[0]
            continue
        for key, proto in response.outputs.items():
            array = tf.make_ndarray(proto)
            if array.dtype == object:  # strings come back as bytes objects
                array = np.array([[b.decode() for b in row] for row in array], dtype=str)
            arrays[f"{signature}/{key}"] = array
    np.savez(outputs_path, **arrays)
    report = {
        "signatures": signature_table(loaded),
        "errors": errors,
        "keras_vit_imported": any(m.split(".")[0] == "keras_vit" for m in sys.modules),
    }
    print(json.dumps(report))


if __name__ == "__main__":
    main(sys.argv[1:])
