"""The `keras-vit` console script as a user runs it: quiet, with progress, the backend asked for."""

import json
import os
import pty
import re
import subprocess
import sys
import tempfile

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


def keras_vit(*args, environment=None, timeout=900):
    """Runs `keras-vit ARGS` (the launcher module, as the console script does); (code, output)."""
    done = subprocess.run(
        [sys.executable, "-m", "keras_vit_launcher", *args],
        env=environment or console_environment(),
        capture_output=True,
        text=True,
        timeout=timeout,
    )
    return done.returncode, done.stdout + done.stderr


def on_a_terminal(command, environment, timeout):
    """Runs `command` with a pseudo-terminal for stdin, stdout and stderr; (code, output)."""
    leader, follower = pty.openpty()
    process = subprocess.Popen(
        command, env=environment, stdin=follower, stdout=follower, stderr=follower
    )
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
# 1 and 2 (native code's lines included) on its own; then the last command, if
# any, on the interpreter's own descriptors. An exit with a message is what
# Python does with it at the top level: the message on stderr, status 1.
CONSOLE_RUNS = """
import json, os, sys, tempfile
import keras_vit_launcher

def launch(args):
    try:
        code = keras_vit_launcher.main(args)
    except SystemExit as exit:
        code = exit.code
        if code is not None and not isinstance(code, int):
            print(code, file=sys.stderr)
            code = 1
    sys.stdout.flush(); sys.stderr.flush()
    return code or 0

def captured(args):
    sys.stdout.flush(); sys.stderr.flush()
    saved = os.dup(1), os.dup(2)
    with tempfile.TemporaryFile() as output:
        os.dup2(output.fileno(), 1); os.dup2(output.fileno(), 2)
        try:
            code = launch(args)
        finally:
            os.dup2(saved[0], 1); os.dup2(saved[1], 2)
        output.seek(0)
        return code, output.read().decode(errors="replace")

commands, last, answers = json.loads(sys.argv[1]), json.loads(sys.argv[2]), sys.argv[3]
runs = [captured(args) for args in commands]
if last:
    runs.append((launch(last), None))
with open(answers, "w") as f:
    json.dump(runs, f)
"""


def keras_vit_runs(*commands, on_terminal=None, environment=None, timeout=900):
    """`(code, output)` of each `keras-vit ARGS`, run one after another in one interpreter.

    `on_terminal`: the arguments of one more command, run last with the
    interpreter's stdout and stderr on a terminal; its output is what the
    terminal showed.
    """
    environment = environment or console_environment()
    with tempfile.TemporaryDirectory() as directory:
        answers = os.path.join(directory, "runs.json")
        command = [
            sys.executable,
            "-c",
            CONSOLE_RUNS,
            json.dumps([list(a) for a in commands]),
            json.dumps(on_terminal and list(on_terminal)),
            answers,
        ]
        if on_terminal:
            code, outside = on_a_terminal(command, environment, timeout)
        else:
            done = subprocess.run(
                command, env=environment, capture_output=True, text=True, timeout=timeout
            )
            code, outside = done.returncode, done.stdout + done.stderr
        assert code == 0, outside[-3000:]
        # What the interpreter wrote outside the captured commands (at exit) counts too.
        assert native_log_lines(outside) == [], outside
        with open(answers) as f:
            runs = [tuple(run) for run in json.load(f)]
    if on_terminal:
        runs[-1] = (runs[-1][0], outside)
    return runs


def corrupt_jpeg(folder):
    """A JPEG with junk bytes before its end marker: decoded, with libjpeg's warning."""
    import numpy as np
    import tensorflow as tf

    path = os.path.join(folder, "corrupt.jpg")
    pixels = np.random.default_rng(0).integers(0, 256, (16, 16, 3)).astype("uint8")
    encoded = tf.io.encode_jpeg(pixels).numpy()
    with open(path, "wb") as f:
        f.write(encoded[:-2] + b"\x00" * 39 + encoded[-2:])
    return path


# The console checks that need a fresh interpreter on each backend share one,
# on a terminal: the help, version and error lines, a run and `evaluate` of its
# model with their output piped (to files), then a run on the terminal.
@pytest.fixture(scope="module")
def console(dataset, tmp_path_factory):
    folder = tmp_path_factory.mktemp("console")
    train = [
        "train",
        "--dataset",
        dataset,
        "--image-size",
        "16",
        "--epochs",
        "2",
        "--batch-size",
        "8",
        "--backend",
        BACKEND,
    ]
    commands = {
        "--help": ["--help"],
        "train --help": ["train", "--help"],
        "--version": ["--version"],
        "predict": ["predict", str(folder / "missing.png")],
        "piped run": [*train, "--output-dir", str(folder / "piped")],
        "evaluate": [
            "evaluate",
            "--model",
            str(folder / "piped" / "model.keras"),
            "--dataset",
            os.path.join(dataset, "test"),
        ],
        # A photo that libjpeg decodes while it warns on fd 2 ("Corrupt JPEG data").
        "predict corrupt": [
            "predict",
            corrupt_jpeg(folder),
            "--model",
            str(folder / "piped" / "model.keras"),
        ],
        "predict corrupt --verbose": [
            "predict",
            corrupt_jpeg(folder),
            "--model",
            str(folder / "piped" / "model.keras"),
            "--verbose",
        ],
    }
    runs = keras_vit_runs(
        *commands.values(),
        # One epoch is enough to see the bar redrawn in place (the piped run has two).
        on_terminal=[*train, "--epochs", "1", "--output-dir", str(folder / "terminal")],
    )
    return {"missing": str(folder / "missing.png"), **dict(zip([*commands, "terminal run"], runs))}


@pytest.mark.slow
def test_help_version_and_errors_print_only_the_commands_own_lines(console):
    for name in ("--help", "train --help", "--version", "predict"):
        assert native_log_lines(console[name][1]) == [], (name, console[name])
    assert re.fullmatch(r"keras-vit \d+\.\d+\.\d+\S*\n", console["--version"][1])
    code, output = console["predict"]
    assert code == 1 and output.strip() == (
        f"keras-vit predict: no such image file(s): [{console['missing']!r}]"
    )


@pytest.mark.slow
def test_other_libraries_lines_are_kept_out_unless_verbose(console):
    code, output = console["predict corrupt"]
    assert code == 0 and "corrupt.jpg" in output, output
    assert "Corrupt JPEG data" not in output and "Warning" not in output, output
    code, output = console["predict corrupt --verbose"]
    assert code == 0 and re.search(r"Corrupt JPEG data: \d+ extraneous bytes", output), output


@pytest.mark.backend_independent
def test_every_option_of_every_command_is_described_with_its_default():
    from keras_vit.cli import build_parser

    parser = build_parser()
    commands = parser._subparsers._group_actions[0].choices  # argparse keeps them only here
    assert set(commands) == {
        "demo",
        "convert",
        "train",
        "finetune",
        "pretrain",
        "evaluate",
        "export",
        "inspect",
        "predict",
    }
    for name, command in commands.items():
        for action in command._actions:
            assert action.help, f"keras-vit {name} {action.option_strings or action.dest}"
    shown = commands["evaluate"].format_help()
    assert "(default: keras_vit_run/model.keras)" in shown and "(default: 500)" in shown
    # evaluate takes no --validation-split: it says whose split it uses.
    assert "held-out split" in " ".join(shown.split())


@pytest.mark.skipif(BACKEND != "tensorflow", reason="TensorFlow's own log lines")
@pytest.mark.slow
def test_verbose_shows_the_native_log_lines_that_are_hidden_by_default(tmp_path):
    # The check above could pass by TensorFlow printing nothing at all: it does not.
    code, output = keras_vit("predict", str(tmp_path / "missing.png"), "--verbose")
    assert code == 1 and native_log_lines(output), output


@pytest.mark.slow
def test_a_run_shows_a_live_bar_on_a_terminal_and_one_line_per_epoch_otherwise(console):
    # Not a terminal: the run, then `evaluate` of its model.
    code, piped = console["piped run"]
    assert code == 0, piped
    assert native_log_lines(piped) == [], piped
    epoch_lines = re.findall(r"^4/4 - .*accuracy: [0-9.]+.*$", piped, re.MULTILINE)
    assert len(epoch_lines) == 2 and "\r" not in piped and "━" not in piped, piped
    assert "test accuracy:" in piped
    evaluate_code, evaluated = console["evaluate"]
    assert evaluate_code == 0, evaluated
    assert re.search(r"^\d+/\d+ - .*accuracy", evaluated, re.MULTILINE), evaluated

    code, shown = console["terminal run"]
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
        "import keras; print(keras.backend.backend()); print(code)",
        cold=True,  # (a warm interpreter has imported Keras, and with it a backend)
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
        "                                  for n in ('tensorflow', 'absl')])",
        cold=True,  # (what the import does is the subject)
    )
    assert out.strip().splitlines()[-1] == "[] True"


@pytest.mark.backend_independent
def test_a_command_shows_the_packages_warnings_as_its_lines_and_not_other_libraries(
    recwarn, capsys
):
    import warnings

    from keras_vit.cli import _own_lines_only

    def keras_warns():  # as if Keras' or torch's own code warned
        warnings.warn_explicit("foreign", UserWarning, "keras/src/x.py", 1, module="keras.src.x")

    def package_warns():
        warnings.warn_explicit("ours", UserWarning, "keras_vit/export/litert.py", 1,
                               module="keras_vit.export.litert")  # fmt: skip

    with _own_lines_only("export", verbose=False):
        keras_warns()
        package_warns()
    # The command's line, not Python's file, line and source line.
    assert capsys.readouterr().err == "keras-vit export: warning: ours\n"
    assert list(recwarn) == []
    with _own_lines_only("export", verbose=True):
        keras_warns()
    assert [str(w.message) for w in recwarn] == ["foreign"]
