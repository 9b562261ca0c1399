"""The examples a user copies from keep running."""

import os
import re

from tests.conftest import run_python

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def test_quickstart_example_trains_and_takes_the_model_apart():
    path = os.path.join(ROOT, "examples", "quickstart.py")
    out = run_python(f"exec(open({path!r}).read())")
    accuracy = float(re.search(r"test accuracy: ([0-9.]+)", out)[1])
    assert accuracy > 0.4, out  # 2 epochs on 10k images; chance is 0.1
    assert "encoderblock_3: (2, 17, 64)" in out
    assert "attention of block 1: (2, 4, 17, 17) rows sum to 1.00000" in out
