"""The documentation holds together: links resolve, the README stays a front page."""

import ast
import glob
import os
import re

import pytest

# Files and source text: the same under every backend.
pytestmark = pytest.mark.backend_independent

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
USER_DOCS = [
    "README.md",
    "CONTRIBUTING.md",
    "SECURITY.md",
    *sorted(os.path.relpath(p, ROOT) for p in glob.glob(os.path.join(ROOT, "docs", "*.md"))),
]
# [text](target) and ![alt](target), outside code spans.
LINK = re.compile(r"!?\[[^\]]*\]\(([^)\s]+)\)")


def links(path):
    with open(os.path.join(ROOT, path)) as f:
        text = re.sub(r"```.*?```|`[^`]*`", "", f.read(), flags=re.DOTALL)
    return LINK.findall(text)


@pytest.mark.parametrize("path", USER_DOCS)
def test_every_relative_link_resolves(path):
    for target in links(path):
        if re.match(r"[a-z]+:", target) or target.startswith("#"):
            continue  # a URL or an anchor in the same page
        resolved = os.path.normpath(os.path.join(ROOT, os.path.dirname(path), target.split("#")[0]))
        assert os.path.exists(resolved), f"{path}: link to {target!r} ({resolved}) is broken"


@pytest.mark.parametrize("path", USER_DOCS)
def test_user_documentation_names_no_issue_numbers(path):
    with open(os.path.join(ROOT, path)) as f:
        text = f.read()
    # Upstream projects' issues (keras#20585, keras-cv#2497) are cited; our own are not.
    found = re.findall(r"\bissues? #?\d+|\bissue's\b", text, flags=re.IGNORECASE)
    assert not found, f"{path}: {found}"


def test_the_readme_is_a_short_front_page_that_links_every_docs_page():
    with open(os.path.join(ROOT, "README.md")) as f:
        readme = f.read()
    assert len(readme.splitlines()) <= 300
    for page in glob.glob(os.path.join(ROOT, "docs", "*.md")):
        assert f"docs/{os.path.basename(page)}" in readme, page
    assert "../shared" not in open(os.path.join(ROOT, "CONTRIBUTING.md")).read()


def test_every_figure_in_the_docs_is_drawn_by_a_script_and_shown_somewhere():
    images = sorted(
        os.path.basename(p) for p in glob.glob(os.path.join(ROOT, "docs", "images", "*.png"))
    )
    assert images
    with open(os.path.join(ROOT, "examples", "make_figures.py")) as f:
        script = f.read()
    shown = " ".join(" ".join(links(path)) for path in USER_DOCS)
    for image in images:
        assert image in script, f"docs/images/{image} is drawn by no script"
        assert f"images/{image}" in shown, f"docs/images/{image} is shown on no page"


def python_snippets():
    """Every ```python block of the user documentation, as (path, index, code)."""
    for path in USER_DOCS:
        with open(os.path.join(ROOT, path)) as f:
            blocks = re.findall(r"```python\n(.*?)```", f.read(), flags=re.DOTALL)
        for index, code in enumerate(blocks):
            yield pytest.param(path, code, id=f"{path}#{index}")


def imported_names(tree):
    """What the snippet's imports bind: local name -> the keras_vit object, as Python binds it."""
    import importlib

    bound = {"keras_vit": importlib.import_module("keras_vit")}
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("keras_vit"):
            module = importlib.import_module(node.module)
            for alias in node.names:
                # `from package import name`: an attribute, else a submodule.
                if hasattr(module, alias.name):
                    bound[alias.asname or alias.name] = getattr(module, alias.name)
                else:
                    bound[alias.asname or alias.name] = importlib.import_module(
                        f"{node.module}.{alias.name}"
                    )
    return bound


def dotted(node):
    """`[a, b, c]` of an attribute chain `a.b.c` on a name, else None."""
    parts = []
    while isinstance(node, ast.Attribute):
        parts.append(node.attr)
        node = node.value
    if isinstance(node, ast.Name):
        return [node.id, *reversed(parts)]
    return None


def allowed_keywords(target):
    """The keywords `target` takes, or None when it takes any (`**kwargs` not checked)."""
    import inspect

    try:
        parameters = inspect.signature(target).parameters
    except (TypeError, ValueError):
        return None
    allowed = set(parameters)
    if any(p.kind is p.VAR_KEYWORD for p in parameters.values()):
        # The builders and `from_checkpoint` pass the rest on to
        # `VisionTransformer.from_arguments`; other `**kwargs` are not checked.
        if not getattr(target, "__module__", "").startswith(
            ("keras_vit.models", "keras_vit.weights")
        ):
            return None
        from keras_vit.models.vision_transformer import default_arguments

        allowed |= set(default_arguments())
    return allowed


def snippet_problems(path, code):
    """Names and keywords of keras_vit that a snippet uses but that do not exist."""
    tree = ast.parse(code, path)
    try:
        bound = imported_names(tree)
    except ImportError as error:
        return [f"import: {error}"]
    calls = {id(node.func): node for node in ast.walk(tree) if isinstance(node, ast.Call)}
    # `a.b` inside `a.b.c` is checked with the whole chain.
    inner = {id(node.value) for node in ast.walk(tree) if isinstance(node, ast.Attribute)}
    problems = []
    for node in ast.walk(tree):
        chain = dotted(node) if isinstance(node, (ast.Attribute, ast.Name)) else None
        if chain is None or chain[0] not in bound or id(node) in inner:
            continue
        target = bound[chain[0]]
        for depth, part in enumerate(chain[1:], start=1):
            if not hasattr(target, part):
                problems.append(f"{'.'.join(chain)}: {'.'.join(chain[:depth])} has no {part!r}")
                break
            target = getattr(target, part)
        else:
            call = calls.get(id(node))
            allowed = allowed_keywords(target) if call is not None else None
            if allowed is not None:
                unknown = {k.arg for k in call.keywords if k.arg} - allowed
                problems += [
                    f"{'.'.join(chain)}({name}=...): no such argument" for name in sorted(unknown)
                ]
    return problems


@pytest.mark.parametrize("path, code", list(python_snippets()))
def test_every_documented_name_and_keyword_exists(path, code):
    # What a reader copies must exist as written: every keras_vit name a
    # snippet imports, every attribute chain it calls, and every keyword it
    # passes to a keras_vit callable. (The snippets themselves download
    # checkpoints or train full models, so they are checked, not run. That
    # `import keras_vit` alone reaches every subpackage is checked in a
    # fresh interpreter by tests/test_library_floor.py: here other tests
    # have imported them already.)
    problems = snippet_problems(path, code)
    assert not problems, f"{path}:\n" + "\n".join(problems)


def test_the_snippet_check_finds_a_missing_name_and_a_wrong_keyword():
    code = (
        "import keras_vit\n"
        "from keras_vit import inspect as vit_inspect\n"
        "keras_vit.from_checkpoint('x.npz', input_size=224)\n"
        "vit_inspect.attention_map(model, images)\n"
        "keras_vit.export.saved_model(model, 'out')\n"
        "from keras_vit import ViTB16\n"
        "ViTB16(weights=None, clases=3)\n"
    )
    problems = snippet_problems("probe.md", code)
    assert len(problems) == 3, problems
    assert "ViTB16(clases=...): no such argument" in problems
    assert problems[0].startswith("vit_inspect.attention_map:") or problems[1].startswith(
        "vit_inspect.attention_map:"
    )
    assert any("input_size=...): no such argument" in p for p in problems)


PACKAGE = os.path.join(ROOT, "keras_vit")
# keras_vit's sub-packages and modules: a name in the docs may start from one.
PARTS = sorted(
    name.removesuffix(".py")
    for name in os.listdir(PACKAGE)
    if not name.startswith("__")
    and (name.endswith(".py") or os.path.isdir(os.path.join(PACKAGE, name)))
)
# `keras_vit.a.b`, `tests.a.b`, or `part.a.b` in a code span (a call's parentheses may follow).
DOTTED_NAME = re.compile(
    r"`((?:keras_vit|tests|" + "|".join(map(re.escape, PARTS)) + r")(?:\.[A-Za-z_]\w*)+)[`(]"
)


def resolves(name):
    """Whether `a.b.c` names something: the longest importable module, then attributes."""
    import importlib

    parts = name.split(".")
    for split in range(len(parts), 0, -1):
        try:
            target = importlib.import_module(".".join(parts[:split]))
        except ImportError:
            continue
        for part in parts[split:]:
            if not hasattr(target, part):
                return False
            target = getattr(target, part)
        return True
    return False


def unresolved_names(text):
    """The dotted names of keras_vit (or its tests) in a page's code spans that do not exist.

    A name may start from a part of the package (`cli.options.progress` is
    `keras_vit.cli.options.progress`); `ops.x` may also be Keras' own.
    """
    missing = []
    for name in sorted(set(DOTTED_NAME.findall(text))):
        candidates = [name] if name.startswith(("keras_vit.", "tests.")) else [f"keras_vit.{name}"]
        if name.startswith("ops."):
            candidates.append(f"keras.{name}")
        if not any(resolves(candidate) for candidate in candidates):
            missing.append(name)
    return missing


@pytest.mark.parametrize("path", USER_DOCS)
def test_every_dotted_name_the_docs_mention_exists(path):
    with open(os.path.join(ROOT, path)) as f:
        missing = unresolved_names(f.read())
    assert not missing, f"{path} names what does not exist: {missing}"


def test_the_dotted_name_check_finds_a_renamed_function():
    text = "`cli.options.progress` and `keras_vit.models.flop_count()` and `cli._progress`."
    assert unresolved_names(text) == ["cli._progress"]
    assert unresolved_names("`ops.split` is Keras'; `keras_vit.nothing.here`") == [
        "keras_vit.nothing.here"
    ]
