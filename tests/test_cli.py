import re

from tests.conftest import run_python


def test_demo_trains_on_fashion_mnist_and_predicts():
    out = run_python(
        "import sys; from keras_vit.cli import main; "
        "sys.exit(main(['demo', '--limit', '1024', '--batch-size', '64']))"
    )
    assert "ViT-B/16 at 224 px, 1000 classes: 86,567,656 parameters" in out
    accuracy = float(re.search(r"test accuracy after 1 epoch\(s\): ([0-9.]+)", out)[1])
    assert 0.2 < accuracy <= 1.0, out  # 16 steps; chance is 0.1
    assert re.search(r"test image 0 \(true class: Ankle boot\)", out)


def test_no_command_prints_help():
    out = run_python(
        "from keras_vit.cli import main; print('exit', main([]))"
    )
    assert "usage: keras-vit" in out and "exit 2" in out
