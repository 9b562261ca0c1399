"""The library floor works without the application floor's dependencies.

`pip install keras-vit` (no extras) installs Keras, NumPy and safetensors:
the layers, models and checkpoint loading must then work on JAX and PyTorch
with TensorFlow, tensorflow-datasets, matplotlib and the export tools absent.
Each check runs in a fresh interpreter whose import system cannot see those
packages (the same `ModuleNotFoundError`, and `importlib.util.find_spec`
returning `None`, as when they are not installed).
"""

import json
import os
import subprocess
import sys
import textwrap

import keras
import pytest

from tests.conftest import BACKEND, SUITE_BACKENDS

# Under TensorFlow these checks run on JAX (see `library_backend`): when the
# JAX suite runs beside this one, it makes the same checks.
pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(
        BACKEND == "tensorflow" and "jax" in SUITE_BACKENDS,
        reason="the JAX suite runs the library floor on JAX",
    ),
]

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

# Every distribution that only the extras (`train`, `export`, `onnx`) install.
APPLICATION_ONLY = (
    "tensorflow",
    "tensorflow_datasets",
    "tf_keras",
    "matplotlib",
    "tf2onnx",
    "onnxruntime",
    "ai_edge_litert",
    "tensorflow_serving",
)

HIDE_APPLICATION_FLOOR = textwrap.dedent(
    """
    import importlib.abc, sys

    HIDDEN = set(sys.argv[1].split(","))

    class Uninstalled(importlib.abc.MetaPathFinder):
        # Wraps each finder: hidden packages are found by none of them.
        def __init__(self, finder):
            self.finder = finder

        def find_spec(self, name, path=None, target=None):
            if name.partition(".")[0] in HIDDEN:
                return None
            return self.finder.find_spec(name, path, target)

        def invalidate_caches(self):
            self.finder.invalidate_caches()

    sys.meta_path[:] = [Uninstalled(finder) for finder in sys.meta_path]
    """
)


def run_without_application_floor(code, backend, hidden=APPLICATION_ONLY):
    python_path = os.pathsep.join(filter(None, [ROOT, os.environ.get("PYTHONPATH")]))
    environment = {**os.environ, "KERAS_BACKEND": backend, "PYTHONPATH": python_path}
    done = subprocess.run(
        [sys.executable, "-c", HIDE_APPLICATION_FLOOR + textwrap.dedent(code), ",".join(hidden)],
        env=environment,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert done.returncode == 0, done.stderr[-4000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


def library_backend():
    # The suite's own backend; under TensorFlow the check runs on JAX, the
    # backend a TensorFlow-free install would use.
    backend = keras.backend.backend()
    return "jax" if backend == "tensorflow" else backend


def test_the_hiding_works():
    result = run_without_application_floor(
        """
        import importlib.util, json
        try:
            import tensorflow
            imported = True
        except ModuleNotFoundError:
            imported = False
        print(json.dumps({"imported": imported,
                          "spec": importlib.util.find_spec("tensorflow") is not None,
                          "json_found": importlib.util.find_spec("json") is not None}))
        """,
        library_backend(),
    )
    assert result == {"imported": False, "spec": False, "json_found": True}


def test_builds_vit_b16_and_loads_a_checkpoint_without_tensorflow():
    result = run_without_application_floor(
        """
        import json, os, sys, tempfile
        import numpy as np
        import keras
        import keras_vit
        loaded_on_import = sorted(name for name in sys.modules if name.split(".")[:2] in (
            ["keras_vit", part] for part in ("data", "training", "pretraining", "export",
                                             "inspect", "distribution")))
        from keras_vit.weights.converters.official import to_official

        vit_b16 = keras_vit.ViTB16()
        source = keras_vit.ViT(
            input_shape=(16, 16, 3), patch_size=8, hidden_dim=16, num_layers=2,
            num_heads=2, mlp_dim=32, classes=5, seed=1,
        )
        path = os.path.join(tempfile.mkdtemp(), "tiny.npz")
        np.savez(path, **to_official(source))  # the official checkpoints' format
        loaded = keras_vit.from_checkpoint(path)
        built = keras_vit.ViT(
            input_shape=(16, 16, 3), patch_size=8, hidden_dim=16, num_layers=2,
            num_heads=2, mlp_dim=32, classes=5, weights=path,
        )
        images = np.random.default_rng(0).uniform(0, 1, (2, 16, 16, 3)).astype("float32")
        expected = keras.ops.convert_to_numpy(source(images))
        errors = [float(np.max(np.abs(keras.ops.convert_to_numpy(model(images)) - expected)))
                  for model in (loaded, built)]
        print(json.dumps({
            "backend": keras.backend.backend(),
            "vit_b16_parameters": vit_b16.count_params(),
            "errors": errors,
            "subpackages": [name for name in ("ops", "layers", "models", "weights", "data",
                                              "training", "pretraining", "export", "inspect",
                                              "distribution")
                            if hasattr(keras_vit, name)],
            "hidden_but_imported": sorted(set(sys.argv[1].split(",")) & set(sys.modules)),
            "applications_loaded_on_import": loaded_on_import,
        }))
        """,
        library_backend(),
    )
    assert result["backend"] == library_backend()
    assert result["vit_b16_parameters"] == 86_567_656  # the paper's 86M
    assert max(result["errors"]) < 1e-6
    # `import keras_vit` reaches every part, but loads the application's
    # parts only when used, and they import their dependencies only when used.
    assert result["applications_loaded_on_import"] == []
    assert len(result["subpackages"]) == 10
    assert result["hidden_but_imported"] == []


def test_an_application_job_without_its_extra_says_what_to_install():
    result = run_without_application_floor(
        """
        import json
        from keras_vit import cli
        codes = {}
        commands = (["train", "--epochs", "1"], ["export", "model.keras"], ["convert", "x", "y"])
        for command in commands:
            try:
                cli.main(command)
            except SystemExit as exit:
                codes[command[0]] = exit.code
        print(json.dumps(codes))
        """,
        library_backend(),
    )
    assert result["train"] == (
        "keras-vit train: needs tensorflow, tensorflow_datasets, matplotlib, which are not "
        "installed; install them with: pip install 'keras-vit[train]'"
    )
    assert result["export"].startswith("keras-vit export: needs tensorflow, ")
    assert result["export"].endswith("pip install 'keras-vit[export]'")
    # `convert` needs only the library floor: it gets as far as its own check.
    assert "needs" not in result["convert"]
