"""The package's imports run one way: the library floor never reaches into the application."""

import ast
import os

import pytest

# Source text: the same under every backend.
pytestmark = pytest.mark.backend_independent

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PACKAGE = os.path.join(ROOT, "keras_vit")

# What each part may import of keras_vit (itself included); see docs/architecture.md.
LIBRARY = {"ops", "layers", "models", "weights"}
ALLOWED = {
    "ops": {"ops"},
    "layers": {"ops", "layers"},
    "models": {"ops", "layers", "models"},
    "weights": {"ops", "layers", "models", "weights"},
    "data": {"data"},
    "distribution": LIBRARY | {"distribution"},
    "inspect": LIBRARY | {"inspect"},
    "export": LIBRARY | {"data", "export"},
    "training": LIBRARY | {"data", "distribution", "training"},
    "pretraining": LIBRARY | {"data", "training", "pretraining"},
}


# `_compat` (every private Keras / TensorFlow / LiteRT name) sits below them all.
ALLOWED = {part: allowed | {"_compat"} for part, allowed in ALLOWED.items()}


def imported_parts(path):
    """The keras_vit sub-packages a module imports, at any depth (lazy imports too)."""
    tree = ast.parse(open(path).read(), path)
    parts = set()
    for node in ast.walk(tree):
        names = []
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names = [node.module] + [f"{node.module}.{alias.name}" for alias in node.names]
        for name in names:
            pieces = name.split(".")
            if pieces[0] == "keras_vit" and len(pieces) > 1:
                parts.add(pieces[1])
    return parts & (set(ALLOWED) | {"cli", "_compat"})


def modules_of(folder):
    """Every module of a part, its sub-packages' included."""
    return [os.path.join(here, name) for here, _, names in os.walk(folder)
            for name in names if name.endswith(".py")]


def test_every_part_imports_only_the_parts_below_it():
    violations = []
    for part, allowed in ALLOWED.items():
        for path in sorted(modules_of(os.path.join(PACKAGE, part))):
            found = imported_parts(path)
            name = os.path.relpath(path, ROOT)
            violations += [f"{name} imports keras_vit.{other}"
                           for other in sorted(found - allowed)]
    violations += [f"keras_vit/_compat.py imports keras_vit.{other}"
                   for other in sorted(imported_parts(os.path.join(PACKAGE, "_compat.py")))]
    assert not violations, "\n".join(violations)


def test_the_check_sees_lazy_imports(tmp_path):
    # A function-level import, as the builders once had of `weights`.
    path = tmp_path / "probe.py"
    path.write_text("def f():\n    from keras_vit import weights as w\n    import keras_vit.cli\n")
    assert imported_parts(str(path)) == {"weights", "cli"}


def test_the_check_sees_every_module_of_a_part():
    found = {os.path.relpath(path, PACKAGE) for path in modules_of(os.path.join(PACKAGE, "weights"))}
    assert os.path.join("weights", "converters", "timm.py") in found
