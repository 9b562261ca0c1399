"""The documentation holds together: links resolve, the README stays a front page."""

import glob
import os
import re

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
USER_DOCS = ["README.md", "CONTRIBUTING.md", "SECURITY.md",
             *sorted(os.path.relpath(p, ROOT) for p in glob.glob(os.path.join(ROOT, "docs", "*.md")))]
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
    images = sorted(os.path.basename(p) for p in glob.glob(os.path.join(ROOT, "docs", "images", "*.png")))
    assert images
    with open(os.path.join(ROOT, "examples", "make_figures.py")) as f:
        script = f.read()
    shown = " ".join(" ".join(links(path)) for path in USER_DOCS)
    for image in images:
        assert image in script, f"docs/images/{image} is drawn by no script"
        assert f"images/{image}" in shown, f"docs/images/{image} is shown on no page"
