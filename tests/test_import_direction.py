"""The package's imports run one way: the library floor never reaches into the application."""

import ast
import os

import pytest

# Source text: the same under every backend.
pytestmark = pytest.mark.backend_independent

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PACKAGE = os.path.join(ROOT, "keras_vit")

# What each part may import of keras_vit (itself included); see docs/architecture.md.
LIBRARY = {"ops", "layers", "models", "weights", "optimizers", "labels"}
ALLOWED = {
    "ops": {"ops"},
    "layers": {"ops", "layers"},
    "weights": {"ops", "layers", "labels", "weights"},
    "models": {"ops", "layers", "weights", "models"},
    "optimizers": {"ops", "layers", "optimizers"},
    "labels": {"labels"},
    "data": {"data"},
    "distribution": LIBRARY | {"distribution"},
    "inspect": LIBRARY | {"inspect"},
    "export": LIBRARY | {"data", "export"},
    "training": LIBRARY | {"data", "distribution", "training"},
    "pretraining": LIBRARY | {"data", "training", "pretraining"},
}


# `_compat` (every private Keras / TensorFlow / LiteRT name), `_native_output`
# (standard library only: the console script loads it first) and `_options` (how
# messages name arguments; standard library only) sit below them all.
BELOW_ALL = {"_compat", "_native_output", "_options"}
ALLOWED = {part: allowed | BELOW_ALL for part, allowed in ALLOWED.items()}
# The root (the library floor whole) where every part of the library is allowed.
ALLOWED = {
    part: allowed | ({"keras_vit"} if LIBRARY <= allowed else set())
    for part, allowed in ALLOWED.items()
}


# The package root: `import keras_vit` (or a name it exports) loads the whole
# library floor, models included.
ROOT_PACKAGE = "keras_vit"
PARTS = set(ALLOWED) | {"cli"} | BELOW_ALL


def imported_parts(path):
    """The keras_vit sub-packages a module imports, at any depth (lazy imports too).

    A bare `import keras_vit`, or a name the package root exports (`from
    keras_vit import VisionTransformer`), counts as `"keras_vit"`: the root.
    """
    tree = ast.parse(open(path).read(), path)
    parts = set()
    for node in ast.walk(tree):
        names = []
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            if node.module == ROOT_PACKAGE:
                names = [f"{ROOT_PACKAGE}.{alias.name}" for alias in node.names]
            else:
                names = [node.module]
        for name in names:
            pieces = name.split(".")
            if pieces[0] != ROOT_PACKAGE:
                continue
            parts.add(pieces[1] if len(pieces) > 1 and pieces[1] in PARTS else ROOT_PACKAGE)
    return parts & (PARTS | {ROOT_PACKAGE})


def modules_of(folder):
    """Every module of a part, its sub-packages' included (a part may be one module)."""
    if os.path.isfile(f"{folder}.py"):
        return [f"{folder}.py"]
    return [
        os.path.join(here, name)
        for here, _, names in os.walk(folder)
        for name in names
        if name.endswith(".py")
    ]


def test_every_part_imports_only_the_parts_below_it():
    violations = []
    for part, allowed in ALLOWED.items():
        for path in sorted(modules_of(os.path.join(PACKAGE, part))):
            found = imported_parts(path)
            name = os.path.relpath(path, ROOT)
            violations += [
                f"{name} imports {'the package root' if other == ROOT_PACKAGE else other}"
                for other in sorted(found - allowed)
            ]
    violations += [
        f"keras_vit/_compat.py imports {other}"
        for other in sorted(imported_parts(os.path.join(PACKAGE, "_compat.py")))
    ]
    assert not violations, "\n".join(violations)


def imported_modules(path):
    """The top-level names of every module `path` imports (absolute imports)."""
    tree = ast.parse(open(path).read(), path)
    names = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names.update(alias.name.split(".")[0] for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names.add(node.module.split(".")[0])
    return names


def test_the_package_never_imports_the_console_script_and_its_first_module_only_the_stdlib():
    import sys

    importing = [
        os.path.relpath(path, ROOT)
        for path in modules_of(PACKAGE)
        if "keras_vit_launcher" in imported_modules(path)
    ]
    assert not importing, importing  # the package works without the launcher beside it
    # The launcher loads `_native_output` before Keras or TensorFlow may load.
    beyond = imported_modules(os.path.join(PACKAGE, "_native_output.py")) - set(
        sys.stdlib_module_names
    )
    assert not beyond, beyond
    # The launcher: TensorFlow (loaded quietly), then keras_vit's `cli`.
    assert imported_modules(os.path.join(ROOT, "keras_vit_launcher.py")) - set(
        sys.stdlib_module_names
    ) == {"tensorflow", "keras_vit"}


def test_the_check_sees_lazy_imports(tmp_path):
    # A function-level import, as the builders once had of `weights`.
    path = tmp_path / "probe.py"
    path.write_text("def f():\n    from keras_vit import weights as w\n    import keras_vit.cli\n")
    assert imported_parts(str(path)) == {"weights", "cli"}


def test_the_check_sees_the_package_root(tmp_path):
    # `weights` once imported the root to rebuild a `.keras` file's model.
    for source in (
        "def f():\n    import keras_vit  # noqa\n",
        "from keras_vit import VisionTransformer\n",
        "from keras_vit import models\n",
    ):
        path = tmp_path / "probe.py"
        path.write_text(source)
        found = imported_parts(str(path))
        assert found == ({"models"} if "models" in source else {"keras_vit"}), source
    assert "keras_vit" not in ALLOWED["weights"] and "keras_vit" in ALLOWED["training"]


def test_the_check_sees_every_module_of_a_part():
    found = {
        os.path.relpath(path, PACKAGE) for path in modules_of(os.path.join(PACKAGE, "weights"))
    }
    assert os.path.join("weights", "converters", "timm.py") in found


def test_what_sits_below_every_part_needs_only_the_standard_library():
    import sys

    for name in ("_native_output", "_options"):
        beyond = imported_modules(os.path.join(PACKAGE, f"{name}.py")) - set(
            sys.stdlib_module_names
        )
        assert not beyond, (name, beyond)


def module_imports(path):
    """The keras_vit modules (not packages) that the module at `path` imports, lazily too."""
    tree = ast.parse(open(path).read(), path)
    found = set()
    for node in ast.walk(tree):
        names = []
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            # `from a.b import c`: module `a.b.c` where c is one, else module `a.b`.
            names = [f"{node.module}.{alias.name}" for alias in node.names] + [node.module]
        for name in names:
            if name.split(".")[0] == ROOT_PACKAGE and os.path.isfile(
                os.path.join(ROOT, *name.split(".")) + ".py"
            ):
                found.add(name)
    return found


def import_circles():
    """Every circle of imports between keras_vit's modules, as lists of module names."""
    graph = {}
    for path in modules_of(PACKAGE):
        if os.path.basename(path) == "__init__.py":
            continue  # (a package imports its modules; that is no circle)
        name = os.path.relpath(path, ROOT)[: -len(".py")].replace(os.sep, ".")
        graph[name] = module_imports(path) - {name}
    circles, done = [], set()

    def visit(module, trail):
        if module in trail:
            circles.append(trail[trail.index(module) :] + [module])
            return
        if module in done:
            return
        for other in sorted(graph.get(module, ())):
            visit(other, trail + [module])
        done.add(module)

    for module in sorted(graph):
        visit(module, [])
    return circles


def test_no_module_imports_a_module_that_imports_it_back():
    assert not import_circles(), import_circles()


def test_the_circle_check_sees_a_lazy_circle(tmp_path, monkeypatch):
    package = tmp_path / ROOT_PACKAGE
    package.mkdir()
    (package / "__init__.py").write_text("")
    (package / "a.py").write_text("from keras_vit.b import f\n")
    (package / "b.py").write_text("def f():\n    from keras_vit import a\n")
    monkeypatch.setattr(__import__(__name__, fromlist=["_"]), "ROOT", str(tmp_path))
    monkeypatch.setattr(__import__(__name__, fromlist=["_"]), "PACKAGE", str(package))
    assert import_circles() == [["keras_vit.a", "keras_vit.b", "keras_vit.a"]]
