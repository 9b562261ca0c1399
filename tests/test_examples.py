"""The examples a user copies from keep running."""

import os
import re

import pytest

from tests.conftest import run_python

# Each example runs in a fresh interpreter and trains, under one backend each:
# what they call is tested on every backend in the modules of its parts.
pytestmark = [pytest.mark.slow, pytest.mark.backend_independent]

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def test_quickstart_example_trains_and_takes_the_model_apart():
    path = os.path.join(ROOT, "examples", "quickstart.py")
    # The script as a user runs it, on the first 4,096 training and 1,000
    # test images of the real data (the script takes 10,000 of 60,000).
    out = run_python(
        "import keras_vit.data\n"
        "load = keras_vit.data.load_fashion_mnist\n"
        "def first(split):\n"
        "    images, labels = load(split)\n"
        "    count = 4096 if split == 'train' else 1000\n"
        "    return images[:count], labels[:count]\n"
        "keras_vit.data.load_fashion_mnist = first\n"
        f"exec(open({path!r}).read())",
        backend="tensorflow",  # a new user's default
    )
    assert "32/32 - " in out, out  # 4,096 images in batches of 128
    accuracy = float(re.search(r"test accuracy: ([0-9.]+)", out)[1])
    assert accuracy > 0.4, out  # 2 epochs of 32 steps; chance is 0.1
    assert "encoderblock_3: (2, 17, 64)" in out
    assert "attention of block 1: (2, 4, 17, 17) rows sum to 1.00000" in out


def test_inspect_example_trains_a_plain_vit_and_writes_the_figures(tmp_path):
    path = os.path.join(ROOT, "examples", "inspect_vit.py")
    out = run_python(
        f"import sys; sys.argv = ['inspect_vit.py', '--model', {str(tmp_path / 'none.keras')!r}, "
        f"'--out', {str(tmp_path / 'figures')!r}, '--epochs', '1', '--limit', '2048']; "
        f"exec(open({path!r}).read())",
        backend="jax",
    )
    assert "1 prefix token(s), 7x7 patches of 4x4 px" in out
    rows = re.findall(r"layer \d: +([0-9. ]+)", out)
    assert len(rows) == 4 and all(len(row.split()) == 4 for row in rows)
    for name in (
        "attention_rollout",
        "attention_distance",
        "position_similarity",
        "embedding_filters",
    ):
        assert os.path.getsize(tmp_path / "figures" / f"{name}.png") > 2000


# The script that draws the docs' figures: its maps are tests/inspect's on every backend.
def test_the_docs_figures_script_trains_and_draws_every_figure(tmp_path):
    path = os.path.join(ROOT, "examples", "make_figures.py")
    out = run_python(
        f"import sys; sys.argv = ['make_figures.py', '--out', {str(tmp_path)!r}, "
        f"'--epochs', '1', '--limit', '256', '--test-images', '128', '--patch-size', '4']; "
        f"exec(open({path!r}).read())",
        backend="torch",
    )
    rows = re.findall(r"layer +\d+: +([0-9. ]+)", out)
    assert len(rows) == 12 and all(len(row.split()) == 4 for row in rows)
    for name in ("attention_rollout", "attention_distance", "position_similarity"):
        assert os.path.getsize(tmp_path / f"{name}.png") > 2000
