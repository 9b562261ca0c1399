import json
import re

import pytest

from tests.conftest import run_python


# `make demo` runs it on Keras' default backend, whichever runs the suite (the
# training it starts is checked on every backend in tests/training).
@pytest.mark.backend_independent
@pytest.mark.slow
def test_demo_trains_on_fashion_mnist_and_predicts(tmp_path):
    out = run_python(
        "import sys; from keras_vit.cli import main; "
        f"sys.exit(main(['demo', '--limit', '2048', '--batch-size', '64', "
        f"'--output-dir', {str(tmp_path / 'demo')!r}]))",
        backend="tensorflow",
    )
    assert ", backend tensorflow\n" in out
    assert "ViT-B/16 at 224 px, 1000 classes: 86,567,656 parameters" in out
    # `train` with its defaults: the main job's model, on the first 2,048 images.
    assert "data: fashion_mnist (2048 training images, 10 classes) at 28x28x1" in out
    assert "model: small ViT" in out
    # 32 steps: the training batches are learnt (chance is 0.1); the test
    # accuracy is reported (a stem's BatchNorm averages lag after so few).
    train_accuracy = float(re.search(r"32/32 .* - accuracy: ([0-9.]+)", out)[1])
    assert train_accuracy > 0.25, out
    accuracy = float(re.search(r"test accuracy after 1 epoch\(s\): ([0-9.]+)", out)[1])
    recorded = json.load(open(tmp_path / "demo" / "metrics.json"))["test_accuracy"]
    assert accuracy == pytest.approx(recorded, abs=5e-4), out  # (the run's, as printed)
    # The prediction comes from the run's saved model.
    assert (tmp_path / "demo" / "model.keras").is_file()
    assert re.search(r"test image 0 \(true class: Ankle boot\), by .*model.keras:", out)
    assert len(re.findall(r"\n  \S.* 0\.\d{3}", out)) == 3, out


@pytest.mark.backend_independent
def test_no_command_prints_help(capsys):
    from keras_vit.cli import main

    assert main([]) == 2
    assert "usage: keras-vit" in capsys.readouterr().out
