"""Private Keras, TensorFlow and LiteRT names are used in `keras_vit/_compat.py` only.

So a Keras release that moves one breaks one module, with a message, and
the Keras requirement can be widened knowing what to re-check.
"""

import ast
import importlib
import inspect
import os
import pkgutil

import keras
import pytest

import keras_vit

# Source text: the same under every backend.
pytestmark = pytest.mark.backend_independent

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PACKAGE = os.path.join(ROOT, "keras_vit")
# argparse's formatter hook, overridden as the standard library's own
# ArgumentDefaultsHelpFormatter does: not a Keras name.
ALLOWED_ATTRIBUTES = {("options.py", "_get_help_string")}
PRIVATE_MODULES = ("keras.src", "tensorflow.python", "jax._src", "torch._")


def private_uses(path):
    """`(line, what)` of private names a module reaches into."""
    tree = ast.parse(open(path).read(), path)
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names = [node.module]
        else:
            names = []
        found += [(node.lineno, f"import {n}") for n in names if n.startswith(PRIVATE_MODULES)]
        if (
            isinstance(node, ast.Attribute)
            and node.attr.startswith("_")
            and not node.attr.startswith("__")
            and not (isinstance(node.value, ast.Name) and node.value.id in ("self", "cls"))
        ):
            found.append((node.lineno, f"._{node.attr[1:]}"))
    return found


def test_no_module_but_compat_reaches_into_private_names():
    violations = []
    for folder, _, files in os.walk(PACKAGE):
        for name in sorted(files):
            path = os.path.join(folder, name)
            if not name.endswith(".py") or name == "_compat.py":
                continue
            for line, what in private_uses(path):
                if (name, what.lstrip(".")) not in ALLOWED_ATTRIBUTES:
                    violations.append(f"{os.path.relpath(path, ROOT)}:{line}: {what}")
    assert not violations, "\n".join(violations)


def test_no_class_but_compats_overrides_a_private_keras_method():
    overrides = []
    for module_info in pkgutil.walk_packages(keras_vit.__path__, "keras_vit."):
        if module_info.name in (
            "keras_vit._compat",
            "keras_vit.export.onnx_only",
            "keras_vit.export.tf_only",
            "keras_vit.cli.__main__",
        ):
            continue
        module = importlib.import_module(module_info.name)
        for _, cls in inspect.getmembers(module, inspect.isclass):
            if cls.__module__ != module.__name__:
                continue
            keras_bases = [b for b in cls.__mro__[1:] if b.__module__.startswith("keras")]
            for attribute in vars(cls):
                if (
                    attribute.startswith("_")
                    and not attribute.startswith("__")
                    and any(hasattr(base, attribute) for base in keras_bases)
                ):
                    overrides.append(f"{cls.__module__}.{cls.__name__}.{attribute}")
    assert not overrides, "\n".join(overrides)


def test_the_checks_see_what_they_look_for(tmp_path):
    probe = tmp_path / "probe.py"
    probe.write_text(
        "from keras.src import ops\nimport tensorflow.python.framework\n"
        "model._initial_epoch = 3\nself._mine = 1\n"
    )
    assert [what for _, what in private_uses(str(probe))] == [
        "import keras.src",
        "import tensorflow.python.framework",
        "._initial_epoch",
    ]

    class Sneaky(keras.callbacks.BackupAndRestore):
        def _save_model(self):
            pass

    keras_bases = [b for b in Sneaky.__mro__[1:] if b.__module__.startswith("keras")]
    assert any(hasattr(b, "_save_model") for b in keras_bases)
