"""The suite's warm interpreters behave as the fresh ones they stand for."""

import json
import os
import signal
import subprocess
import sys
import time

import pytest

from tests import warm_interpreters

# Forks of the backend each names (the server of the suite's other children):
# the same under every suite.
pytestmark = [pytest.mark.slow, pytest.mark.backend_independent]


def environment(backend="tensorflow", **extra):
    return dict(os.environ, KERAS_BACKEND=backend, TF_CPP_MIN_LOG_LEVEL="3", **extra)


WHAT_IT_SEES = """
import json, os, sys
modules = ("keras", "keras_vit.training.train_job")
print(json.dumps({
    "argv": sys.argv, "cwd": os.getcwd(), "pid": os.getpid(), "path0": sys.path[0],
    "variable": os.environ.get("KERAS_VIT_WARM_TEST"), "stdin": sys.stdin.read(),
    "imported": [name in sys.modules for name in modules],
}))
sys.stderr.write("to stderr\\n")
sys.exit(3)
"""


def test_a_fork_runs_its_command_in_its_own_process_with_its_streams_and_exit_code(tmp_path):
    done = warm_interpreters.run(
        [sys.executable, "-c", WHAT_IT_SEES, "one", "two"],
        env=environment(KERAS_VIT_WARM_TEST="given"),
        cwd=tmp_path,
        input="from stdin",
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert done.returncode == 3 and done.stderr == "to stderr\n", done
    seen = json.loads(done.stdout)
    assert seen["argv"] == ["-c", "one", "two"] and seen["path0"] == ""
    assert seen["cwd"] == str(tmp_path) and seen["variable"] == "given"
    assert seen["stdin"] == "from stdin" and seen["pid"] != os.getpid()
    # What makes it warm: the server's imports are there before its code runs.
    assert seen["imported"] == [True, True]
    # A module runs as `python -m` runs it.
    module = warm_interpreters.run(
        [sys.executable, "-m", "keras_vit.cli", "--version"],
        env=environment(),
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert module.returncode == 0 and module.stdout.startswith("keras-vit "), module


def test_a_fork_can_be_killed_and_interrupted_as_a_process():
    sleeper = warm_interpreters.Popen(
        [
            sys.executable,
            "-c",
            "import time\ntry:\n    time.sleep(600)\nexcept KeyboardInterrupt:\n"
            "    raise SystemExit(130)",
        ],  # fmt: skip
        env=environment(),
        stdout=subprocess.DEVNULL,
    )
    assert sleeper.poll() is None
    with pytest.raises(subprocess.TimeoutExpired):
        sleeper.wait(timeout=0.2)
    time.sleep(0.5)  # (into its sleep)
    sleeper.send_signal(signal.SIGINT)  # Python's own handler, as in a fresh interpreter
    assert sleeper.wait(timeout=60) == 130
    killed = warm_interpreters.Popen(
        [sys.executable, "-c", "import time; time.sleep(600)"], env=environment()
    )
    killed.kill()
    assert killed.wait(timeout=60) == -signal.SIGKILL


def test_the_server_starts_no_backend_and_only_import_time_variables_choose_it():
    # Read only when a backend starts: a request's own; read at import: another server.
    same = warm_interpreters._key(environment(XLA_FLAGS="--x", TF_CONFIG="{}"))
    assert same == warm_interpreters._key(environment())
    assert warm_interpreters._key(environment(KERAS_VIT_FAST_KERNELS="0")) != same
    # A fork's JAX device count and TensorFlow's logical devices are still its own to set.
    count = {
        "jax": "import jax; count = len(jax.devices())",
        "tensorflow": "import tensorflow as tf; count = len(tf.config.list_logical_devices('CPU'))",
    }
    for backend in ("jax", "tensorflow"):
        code = (
            "import json\n"
            "from keras_vit.distribution import simulate_cpu_devices\n"
            f"simulate_cpu_devices(3)\n{count[backend]}\n"
            "print(json.dumps(count))\n"
        )
        done = warm_interpreters.run(
            [sys.executable, "-c", code],
            env=environment(backend),
            capture_output=True,
            text=True,
            timeout=900,
        )
        assert done.returncode == 0, done.stderr[-3000:]
        assert json.loads(done.stdout.splitlines()[-1]) == 3, backend
