"""Untrusted files never run code; damaged ones end in a clear error.

Crafted files try to run code when loaded (a pickle payload in an `.npz`
and in a PyTorch `.pth`, a Lambda layer in a `.keras`); the payload would
write a marker file, which must never appear. Then hypothesis feeds random,
truncated and mangled bytes to every loader.
"""

import importlib.util
import io
import os
import re
import zipfile

import keras
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import keras_vit
from keras_vit.cli import main
from keras_vit.weights.readers import read_tensors
from tests.conftest import BACKEND, TINY

MARKER = os.path.join(os.path.dirname(os.path.abspath(__file__)), ".payload_ran")


class Payload:
    """Unpickling this writes MARKER: code execution, if it ever happens."""

    def __reduce__(self):
        return (open, (MARKER, "w"))


@pytest.fixture(autouse=True)
def no_marker():
    if os.path.exists(MARKER):
        os.remove(MARKER)
    yield
    ran = os.path.exists(MARKER)
    if ran:
        os.remove(MARKER)
    assert not ran, "a crafted file ran code"


def test_a_pickle_payload_in_an_npz_is_refused_unexecuted(tmp_path):
    path = str(tmp_path / "evil.npz")
    np.savez(path, **{"embedding/kernel": np.array([Payload()], dtype=object)})
    with pytest.raises(ValueError, match="evil.npz.*not a readable NumPy .npz checkpoint"):
        read_tensors(path)
    with pytest.raises(ValueError, match="not a readable"):
        keras_vit.from_checkpoint(path)


@pytest.mark.skipif(importlib.util.find_spec("torch") is None, reason="needs torch")
def test_a_pickle_payload_in_a_pytorch_file_is_refused_unexecuted(tmp_path):
    import pickle

    path = str(tmp_path / "evil.pth")
    # A PyTorch zip checkpoint whose data.pkl calls open(): weights_only refuses it.
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w") as archive:
        archive.writestr("evil/data.pkl", pickle.dumps({"w": Payload()}))
        archive.writestr("evil/version", "3\n")
    with open(path, "wb") as f:
        f.write(buffer.getvalue())
    with pytest.raises(ValueError, match="evil.pth.*not a readable PyTorch checkpoint"):
        read_tensors(path)


def lambda_model_file(tmp_path):
    inputs = keras.Input((16, 16, 3))
    outputs = keras.layers.Lambda(lambda x: x * 2.0)(inputs)  # bytecode in the file
    model = keras.Model(inputs, keras.layers.Dense(2)(keras.layers.Flatten()(outputs)))
    path = str(tmp_path / "lambda.keras")
    model.save(path)
    return path


def test_a_lambda_layer_in_a_keras_file_is_refused(tmp_path):
    path = lambda_model_file(tmp_path)
    with pytest.raises(ValueError, match="lambda.keras.*Lambda"):
        read_tensors(path)
    with pytest.raises(SystemExit, match="keras-vit evaluate: .*Lambda"):
        main(["evaluate", "--model", path])
    with pytest.raises(SystemExit, match="keras-vit predict: .*Lambda"):
        main(["predict", path, "--model", path])


# Bytes a loader sees: random, a real file truncated anywhere, or a real
# file with bytes flipped.
def mangled(real):
    return st.one_of(
        st.binary(max_size=2048),
        st.integers(0, len(real) - 1).map(lambda n: real[:n]),
        st.lists(
            st.tuples(st.integers(0, len(real) - 1), st.integers(0, 255)), min_size=1, max_size=8
        ).map(lambda edits: bytes(_edit(real, edits))),
    )


def _edit(real, edits):
    data = bytearray(real)
    for position, value in edits:
        data[position] = value
    return data


def real_checkpoints(tmp_path_factory):
    from safetensors.numpy import save_file

    folder = tmp_path_factory.mktemp("real")
    model = keras_vit.ViT(**TINY)
    arrays = {w.path: keras.ops.convert_to_numpy(w) for w in model.weights}
    files = {}
    np.savez(folder / "a.npz", **arrays)
    save_file({k.replace("/", "."): v for k, v in arrays.items()}, str(folder / "a.safetensors"))
    model.save(folder / "a.keras")
    for suffix in (".npz", ".safetensors", ".keras"):
        files[suffix] = (folder / f"a{suffix}").read_bytes()
    return files


FUZZ_EXAMPLES = 40  # per test: 5 tests, 200 cases a run on each backend


@pytest.fixture(scope="module")
def real_files(tmp_path_factory):
    return real_checkpoints(tmp_path_factory)


@pytest.mark.parametrize("suffix", [".npz", ".safetensors", ".keras"])
def test_fuzzed_checkpoint_bytes_end_in_a_clear_error(real_files, tmp_path, suffix):
    real = real_files[suffix]
    path = str(tmp_path / f"fuzzed{suffix}")

    @settings(
        max_examples=FUZZ_EXAMPLES,
        deadline=None,
        database=None,
        suppress_health_check=list(HealthCheck),
    )
    @given(data=mangled(real))
    def check(data):
        with open(path, "wb") as f:
            f.write(data)
        try:
            tensors = read_tensors(path)
        except ValueError as error:
            assert "fuzzed" in str(error)  # names the file
            return
        # Read without error: then it is what it says, arrays by name.
        assert isinstance(tensors, dict)
        assert all(isinstance(v, np.ndarray) for v in tensors.values())

    check()


@pytest.mark.slow
@pytest.mark.backend_independent  # keras_vit.data: tf.data alone
def test_fuzzed_image_files_in_a_folder_are_skipped_not_fatal(tmp_path, caplog):
    import tensorflow as tf

    from keras_vit import data as vit_data

    rng = np.random.default_rng(0)
    good = tf.io.encode_png(rng.integers(0, 256, (12, 12, 3)).astype("uint8")).numpy()
    for name in ("a", "b"):
        os.makedirs(tmp_path / name)
        (tmp_path / name / "good.png").write_bytes(good)

    def read_folder():
        pipeline = vit_data.from_folder(str(tmp_path), image_size=8, batch_size=4)
        return np.concatenate([x.numpy() for x, _ in pipeline.data])

    good_image = read_folder()[0]

    # Several bad files to a folder: a pipeline is built (traced) once per
    # example, about as many bad files in all as the other fuzz tests' cases.
    suffixes = st.sampled_from([".png", ".jpg", ".bmp", ".gif"])

    @settings(
        max_examples=FUZZ_EXAMPLES // 5,
        deadline=None,
        database=None,
        suppress_health_check=list(HealthCheck),
    )
    @given(files=st.lists(st.tuples(mangled(good), suffixes), min_size=1, max_size=8))
    def check(files):
        bad = [tmp_path / "a" / f"bad{i}{suffix}" for i, (_, suffix) in enumerate(files)]
        for path, (data, _) in zip(bad, files):
            path.write_bytes(data)
        images = read_folder()
        # The good ones always, each bad one only if it decodes.
        assert 2 <= len(images) <= 2 + len(files)
        assert np.all(images == good_image, axis=(1, 2, 3)).sum() >= 2
        assert np.isfinite(images).all()
        for path in bad:
            path.unlink()

    check()


@settings(
    max_examples=FUZZ_EXAMPLES,
    deadline=None,
    database=None,
    suppress_health_check=list(HealthCheck),
)
# Non-empty arrays of rank >= 1: Keras' own `predict` ends a 0-d array
# with an IndexError ("tuple index out of range") and an empty one with an
# UnboundLocalError, from its batching code, before the model sees them.
@given(
    shape=st.lists(st.integers(1, 20), min_size=1, max_size=5),
    dtype=st.sampled_from(["float32", "float64", "int32", "uint8", "bool"]),
)
def test_models_refuse_wrong_inputs_clearly_or_answer_correctly(shape, dtype):
    model = _fuzz_model()
    array = np.zeros(shape, dtype)
    try:
        outputs = model.predict(array, verbose=0)
    except (ValueError, TypeError) as error:
        assert str(error)
        return
    # Accepted: only a batch of images of the model's size, and a right answer.
    assert tuple(shape[1:]) == TINY["input_shape"]
    assert outputs.shape == (shape[0], TINY["classes"]) and np.isfinite(outputs).all()


_MODELS = {}


def _fuzz_model():
    if "tiny" not in _MODELS:
        _MODELS["tiny"] = keras_vit.ViT(**TINY)
    return _MODELS["tiny"]


@pytest.mark.skipif(
    BACKEND == "torch",
    reason="the serving graph is traced on TensorFlow or JAX; "
    "torch models are exported through rebuild_on_tensorflow (tests/export)",
)
def test_fuzzed_bytes_to_the_serving_signature_fail_the_request_clearly():
    import tensorflow as tf

    from keras_vit.export.saved_model import serving_module

    module = serving_module(keras_vit.ViT(**TINY))
    rng = np.random.default_rng(0)
    good = tf.io.encode_png(rng.integers(0, 256, (20, 20, 3)).astype("uint8")).numpy()

    @settings(
        max_examples=FUZZ_EXAMPLES,
        deadline=None,
        database=None,
        suppress_health_check=list(HealthCheck),
    )
    @given(data=mangled(good))
    def check(data):
        try:
            result = module.serving_bytes(tf.constant([data, good]))
        except tf.errors.InvalidArgumentError as error:
            assert error.message  # the request fails, the server goes on
            return
        probabilities = result["probabilities"].numpy()
        assert probabilities.shape == (2, TINY["classes"])
        np.testing.assert_allclose(probabilities.sum(-1), 1.0, rtol=1e-5)

    check()
    # The module still answers a good request after all that.
    assert module.serving_bytes(tf.constant([good]))["probabilities"].shape == (1, 5)


def test_a_truncated_keras_file_gets_one_message_wherever_it_is_read(tmp_path):
    from keras_vit.training import train

    whole = tmp_path / "whole.keras"
    keras_vit.ViT(
        patch_size=4, hidden_dim=8, num_layers=1, num_heads=2, mlp_dim=16, input_shape=(8, 8, 3)
    ).save(whole)
    path = str(tmp_path / "trunc.keras")
    with open(path, "wb") as f:
        f.write(whole.read_bytes()[:200])  # a download cut short
    said = rf"{re.escape(path)} is not a \.keras model file: it is not a zip archive"
    with pytest.raises(ValueError, match=said):
        keras_vit.from_checkpoint(path)
    with pytest.raises(ValueError, match=said):
        train(str(tmp_path), weights=path, output_dir=str(tmp_path / "run"))
    with pytest.raises(ValueError, match=said):
        train(str(tmp_path), teacher=path, output_dir=str(tmp_path / "run"))
    for command in (["evaluate", "--model", path], ["predict", path, "--model", path]):
        with pytest.raises(SystemExit, match=said):
            main(command)
