"""The `keras-vit` console script as a user runs it: quiet, with progress, the backend asked for."""

import json
import os
import pty
import re
import subprocess
import sys

import pytest

from tests.conftest import BACKEND, run_python
from tests.training.test_train_command import write_dataset

# Lines that TensorFlow, absl, XLA or CUDA look-ups write on their own.
NATIVE_LOG_LINE = re.compile(
    r"^([IWEF]\d{4} |WARNING: All log messages|WARNING:tensorflow|WARNING:absl|"
    r".*(cuInit|cudart_stub|cpu_feature_guard|oneDNN custom operations))"
)


def console_environment(**extra):
    """The user's environment: no TF_CPP_MIN_LOG_LEVEL of their own."""
    environment = {k: v for k, v in os.environ.items() if k != "TF_CPP_MIN_LOG_LEVEL"}
    environment.update(KERAS_BACKEND=BACKEND, **extra)
    return environment


def keras_vit(*args, environment=None, terminal=False, timeout=300):
    """Runs `keras-vit ARGS` (the launcher module, as the console script does); (code, output)."""
    command = [sys.executable, "-m", "keras_vit_launcher", *args]
    environment = environment or console_environment()
    if not terminal:
        done = subprocess.run(command, env=environment, capture_output=True, text=True,
                              timeout=timeout)
        return done.returncode, done.stdout + done.stderr
    leader, follower = pty.openpty()
    process = subprocess.Popen(command, env=environment, stdin=follower, stdout=follower,
                               stderr=follower)
    os.close(follower)
    chunks = []
    while True:
        try:
            chunk = os.read(leader, 65536)
        except OSError:  # the terminal closed: the process is done
            break
        if not chunk:
            break
        chunks.append(chunk)
    os.close(leader)
    return process.wait(timeout=timeout), b"".join(chunks).decode(errors="replace")


def native_log_lines(output):
    return [line for line in output.splitlines() if NATIVE_LOG_LINE.match(line.strip("\r"))]


@pytest.fixture(scope="module")
def dataset(tmp_path_factory):
    return write_dataset(tmp_path_factory.mktemp("data"), per_class=16)


# Runs each command line through the launcher in one fresh interpreter, as the
# console script would, and captures what each one writes to file descriptors
# 1 and 2 (native code's lines included) on its own. An exit with a message is
# what Python does with it at the top level: the message on stderr, status 1.
CONSOLE_RUNS = """
import json, os, sys, tempfile
import keras_vit_launcher

def run(args):
    sys.stdout.flush(); sys.stderr.flush()
    saved = os.dup(1), os.dup(2)
    with tempfile.TemporaryFile() as captured:
        os.dup2(captured.fileno(), 1); os.dup2(captured.fileno(), 2)
        try:
            code = keras_vit_launcher.main(args)
        except SystemExit as exit:
            code = exit.code
            if code is not None and not isinstance(code, int):
                print(code, file=sys.stderr)
                code = 1
        finally:
            sys.stdout.flush(); sys.stderr.flush()
            os.dup2(saved[0], 1); os.dup2(saved[1], 2)
        captured.seek(0)
        return code or 0, captured.read().decode(errors="replace")

print(json.dumps([run(args) for args in json.loads(sys.argv[1])]))
"""


def keras_vit_runs(*commands, environment=None, timeout=300):
    """`(code, output)` of each `keras-vit ARGS`, run one after another in one interpreter."""
    done = subprocess.run(
        [sys.executable, "-c", CONSOLE_RUNS, json.dumps([list(args) for args in commands])],
        env=environment or console_environment(), capture_output=True, text=True,
        timeout=timeout)
    assert done.returncode == 0, done.stderr[-3000:]
    # What the interpreter wrote outside the commands (at exit) counts too.
    assert native_log_lines(done.stderr) == [], done.stderr
    return [tuple(run) for run in json.loads(done.stdout.strip().splitlines()[-1])]


@pytest.mark.slow
def test_help_version_and_errors_print_only_the_commands_own_lines(tmp_path):
    commands = (["--help"], ["train", "--help"], ["--version"],
                ["predict", str(tmp_path / "missing.png")])
    runs = {}
    for args, (code, output) in zip(commands, keras_vit_runs(*commands)):
        runs[args[0]] = code, output
        assert native_log_lines(output) == [], (args, output)
    assert re.fullmatch(r"keras-vit \d+\.\d+\.\d+\S*\n", runs["--version"][1])
    code, output = runs["predict"]
    assert code == 1 and output.strip() == (
        f"keras-vit predict: no such image file(s): [{str(tmp_path / 'missing.png')!r}]")


@pytest.mark.backend_independent
def test_every_option_of_every_command_is_described_with_its_default():
    from keras_vit.cli import build_parser

    parser = build_parser()
    commands = parser._subparsers._group_actions[0].choices  # argparse keeps them only here
    assert set(commands) == {"demo", "convert", "train", "finetune", "pretrain", "evaluate",
                             "export", "inspect", "predict"}
    for name, command in commands.items():
        for action in command._actions:
            assert action.help, f"keras-vit {name} {action.option_strings or action.dest}"
    shown = commands["evaluate"].format_help()
    assert "(default: keras_vit_run/model.keras)" in shown and "(default: 500)" in shown


@pytest.mark.skipif(BACKEND != "tensorflow", reason="TensorFlow's own log lines")
@pytest.mark.slow
def test_verbose_shows_the_native_log_lines_that_are_hidden_by_default(tmp_path):
    # The check above could pass by TensorFlow printing nothing at all: it does not.
    code, output = keras_vit("predict", str(tmp_path / "missing.png"), "--verbose")
    assert code == 1 and native_log_lines(output), output


@pytest.mark.slow
def test_a_run_shows_a_live_bar_on_a_terminal_and_one_line_per_epoch_otherwise(dataset, tmp_path):
    args = ["train", "--dataset", dataset, "--image-size", "16", "--epochs", "2",
            "--batch-size", "8", "--backend", BACKEND]
    # Not a terminal: the run, then `evaluate` of its model, in one interpreter.
    (code, piped), (evaluate_code, evaluated) = keras_vit_runs(
        [*args, "--output-dir", str(tmp_path / "piped")],
        ["evaluate", "--model", str(tmp_path / "piped" / "model.keras"),
         "--dataset", os.path.join(dataset, "test")])
    assert code == 0, piped
    assert native_log_lines(piped) == [], piped
    epoch_lines = re.findall(r"^4/4 - .*accuracy: [0-9.]+.*$", piped, re.MULTILINE)
    assert len(epoch_lines) == 2 and "\r" not in piped and "━" not in piped, piped
    assert "test accuracy:" in piped
    assert evaluate_code == 0, evaluated
    assert re.search(r"^\d+/\d+ - .*accuracy", evaluated, re.MULTILINE), evaluated

    code, shown = keras_vit(*args, "--output-dir", str(tmp_path / "terminal"), terminal=True)
    assert code == 0, shown
    assert native_log_lines(shown) == [], shown
    # Keras' progress bar, redrawn in place within each epoch.
    plain = re.sub(r"\x1b\[[0-9;]*m", "", shown)
    assert re.search(r"\r\s*\d+/4 ━+", plain), shown
    assert "test accuracy:" in shown


@pytest.mark.slow
def test_backend_option_chooses_the_backend_of_the_whole_command(tmp_path):
    other = "jax" if BACKEND != "jax" else "tensorflow"
    out = run_python(
        "import sys, keras_vit_launcher;"
        f"sys.argv = ['keras-vit', 'convert', 'missing.npz', {str(tmp_path / 'x.keras')!r}, "
        f"'--backend', {other!r}];"
        "code = None\n"
        "try:\n    keras_vit_launcher.main()\n"
        "except SystemExit as e:\n    code = e.code\n"
        "import keras; print(keras.backend.backend()); print(code)"
    )
    assert out.splitlines()[-2] == other and "no such file" in out.splitlines()[-1]


@pytest.mark.slow
def test_importing_the_package_leaves_the_users_logging_settings_alone():
    out = run_python(
        "import logging, os\n"
        "environment = dict(os.environ)\n"
        "levels = [logging.getLogger(n).level for n in ('tensorflow', 'absl')]\n"
        "import keras_vit, keras_vit.cli\n"
        "changed = {k for k in set(environment) | set(os.environ)\n"
        "           if environment.get(k) != os.environ.get(k)}\n"
        "print(sorted(changed), levels == [logging.getLogger(n).level\n"
        "                                  for n in ('tensorflow', 'absl')])"
    )
    assert out.strip().splitlines()[-1] == "[] True"
