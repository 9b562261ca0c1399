"""Shared fixtures and markers. The suite runs once per backend (KERAS_BACKEND).

Markers (`pytest -m`):
- `backend_independent`: the test's outcome cannot depend on the backend
  of the suite (files, docs, argument parsing, arithmetic, fresh
  interpreters of a backend of their own). `make test` runs the suite once
  per backend and names them all in `KERAS_VIT_SUITE_BACKENDS`: these tests
  run under the first one and are skipped under the others; one that
  exercises a backend whose suite runs in parts (`KERAS_VIT_SUITE_SPLIT`:
  the suite with room for more) runs in that suite instead, named by its
  `backend` parameter or the marker's `exercises=`. Without the variable
  they run under whichever backend runs the suite.
- `slow`: over a few seconds (a training, a fresh interpreter, an export).
  `make test-quick` leaves them out.
"""

import atexit
import collections
import contextlib
import fcntl
import gc
import importlib.util
import io
import json
import os
import shutil
import subprocess
import sys
import tempfile
import textwrap
import threading
import typing

import keras
import numpy as np
import pytest

BACKEND = keras.backend.backend()
ALL_BACKENDS = ("tensorflow", "jax", "torch")
INSTALLED_BACKENDS = tuple(b for b in ALL_BACKENDS if importlib.util.find_spec(b) is not None)

# The backends that `make test` runs the suite under, side by side, in the
# order given; unset, this process's backend alone.
SUITE_BACKENDS = tuple(os.environ.get("KERAS_VIT_SUITE_BACKENDS", BACKEND).split())
SPLIT_SUITES = tuple(os.environ.get("KERAS_VIT_SUITE_SPLIT", "").split())


def keep_jax_compilations_for_the_session():
    """JAX's persistent compilation cache, in a folder of this process and its children.

    Most tests build a model of a size other tests built before it, and each
    new model's functions are compiled again, to the same executables: read
    back from the cache instead, the JAX suite spends a sixth less CPU. The
    fresh interpreters the tests start under JAX (any suite's) inherit the
    folder through the environment, so a child reads what its suite or an
    earlier child compiled. The suites' folders are apart: a cache shared
    between processes that run at once can be read while another writes it
    (JAX's writes are not atomic; a child killed in one leaves a truncated
    entry, so tests that kill JAX processes give them a folder of their own:
    `own_jax_compilations`).
    """
    folder = tempfile.mkdtemp(prefix="keras_vit_jax_compilations_")
    atexit.register(shutil.rmtree, folder, ignore_errors=True)
    os.environ.update(own_jax_compilations(folder))
    if BACKEND == "jax":
        import jax

        jax.config.update("jax_compilation_cache_dir", folder)
        jax.config.update("jax_persistent_cache_min_compile_time_secs", 0)
        jax.config.update("jax_persistent_cache_min_entry_size_bytes", 0)


def own_jax_compilations(folder):
    """The environment that gives a JAX process `folder` as its compilation cache."""
    return {
        "JAX_COMPILATION_CACHE_DIR": str(folder),
        "JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS": "0",
        "JAX_PERSISTENT_CACHE_MIN_ENTRY_SIZE_BYTES": "0",
    }


keep_jax_compilations_for_the_session()


def pytest_configure(config):
    config.addinivalue_line(
        "markers",
        "backend_independent: runs under the first backend of KERAS_VIT_SUITE_BACKENDS only",
    )
    config.addinivalue_line(
        "markers", "slow: takes more than a few seconds; `make test-quick` skips it"
    )


def pytest_collection_finish(session):
    # Every test module is imported, and with them TensorFlow, JAX or torch:
    # hundreds of thousands of long-lived objects. Frozen, the collector
    # leaves them alone: its collections (Python's own, and the one after
    # each module) walk only what tests made (0.2-4 s a test before).
    gc.collect()
    gc.freeze()
    start_making_shared_artifacts(session.items)


def start_making_shared_artifacts(items):
    """Under `make test`, the first suite starts making the selected tests' artifacts at once.

    In the background: a suite that reaches a test needing one later finds it
    made, or waits for the rest of it, instead of stopping there for all of it.
    """
    if not os.environ.get("KERAS_VIT_TEST_CACHE") or BACKEND != SUITE_BACKENDS[0]:
        return
    modules = {str(item.path) for item in items}
    for name, (module, make) in ARTIFACT_MAKERS.items():
        if module in modules:
            threading.Thread(
                target=shared_artifact, args=(name, make, None), daemon=True, name=f"making {name}"
            ).start()


@pytest.fixture(autouse=True, scope="module")
def _collect_each_module_whole():
    """One collection of what each module made, after it; what survives is frozen.

    So the collections during a module walk only what it made, and its
    garbage (its fixtures' models, torn down before this) is freed when it
    ends. Not a collection of the whole heap: thawing the frozen objects to
    walk them again cost 2-6 s a module on a loaded machine (about 4% of a
    suite), for cycles that outlive a module only to die later (rare: what
    lives across modules lives for the session).
    """
    yield
    gc.collect()
    gc.freeze()


# `make test` may run a backend's suite as several processes: this one runs
# part `i` of `n` (`KERAS_VIT_SUITE_PART=i/n`), whole modules dealt by weight.
SUITE_PART = os.environ.get("KERAS_VIT_SUITE_PART")


def modules_of_part(items, part, parts):
    """The test modules of part `part` (1-based) of `parts`: modules dealt heaviest first.

    A module goes to the lightest part so far. A test weighs 1; a slow one
    10; a backend-independent one that this suite runs 20 (its work is
    fresh interpreters of this suite's backend: killed runs, several
    workers); one that this suite skips as backend-independent nothing.
    (Measured on JAX's two parts, these weights leave them within 5% of
    each other; slow tests alike at 10 left one a third longer.)
    """
    weights = collections.Counter()
    for item in items:
        if runs_in_another_suite(item):
            weight = 0
        elif item.get_closest_marker("backend_independent"):
            weight = 20
        else:
            weight = 10 if item.get_closest_marker("slow") else 1
        weights[str(item.path)] += weight
    loads = [0] * parts
    chosen = set()
    for module in sorted(weights, key=lambda module: (-weights[module], module)):
        lightest = loads.index(min(loads))
        loads[lightest] += weights[module]
        if lightest == part - 1:
            chosen.add(module)
    return chosen


def pytest_sessionfinish(session, exitstatus):
    # A part that a narrowed run (`-k`, a file) left without tests has passed.
    if SUITE_PART and exitstatus == pytest.ExitCode.NO_TESTS_COLLECTED:
        session.exitstatus = pytest.ExitCode.OK


def pytest_collection_modifyitems(config, items):
    if SUITE_PART:
        part, parts = (int(n) for n in SUITE_PART.split("/"))
        chosen = modules_of_part(items, part, parts)
        config.hook.pytest_deselected(items=[i for i in items if str(i.path) not in chosen])
        items[:] = [item for item in items if str(item.path) in chosen]
    # The tests that read a shared artifact run last, by when the first suite
    # has made it (`start_making_shared_artifacts`); each module stays whole.
    readers = {module for module, _ in ARTIFACT_MAKERS.values()}
    items.sort(key=lambda item: str(item.path) in readers)
    for item in items:
        if runs_in_another_suite(item):
            item.add_marker(
                pytest.mark.skip(
                    reason=f"backend-independent: run under KERAS_BACKEND={home_suite(item)}"
                )
            )


def home_suite(item):
    """The backend whose suite runs a backend-independent `item` (see the module's docstring)."""
    marker = item.get_closest_marker("backend_independent")
    exercised = (
        getattr(item, "callspec", None)
        and item.callspec.params.get("backend")
        or marker.kwargs.get("exercises")
    )
    return exercised if exercised in SPLIT_SUITES else SUITE_BACKENDS[0]


def runs_in_another_suite(item):
    """Whether `item` is backend-independent and this is not the suite that runs it."""
    return bool(item.get_closest_marker("backend_independent")) and BACKEND != home_suite(item)


# A ViT small enough to build and run in milliseconds.
TINY = dict(
    patch_size=4,
    hidden_dim=32,
    num_layers=2,
    num_heads=4,
    mlp_dim=64,
    input_shape=(16, 16, 3),
    classes=5,
)


# name -> (the file of the tests that read it, its `make`): `artifact_maker`.
ARTIFACT_MAKERS = {}


def artifact_maker(name, module):
    """Registers a `make(path)` of `shared_artifact(name, ...)`, read by the tests in `module`.

    `make test` then starts making it when its suites start (see
    `start_making_shared_artifacts`), if any of those tests is selected.
    """

    def register(make):
        ARTIFACT_MAKERS[name] = (os.path.abspath(module), make)
        return make

    return register


def shared_artifact(name, make, tmp_path_factory):
    """The path of a file or folder that `make(path)` writes, made once and shared.

    For what takes long to make and is the same whatever backend asks
    (a model trained on TensorFlow, a reference implementation's outputs):
    `make test` points `KERAS_VIT_TEST_CACHE` at a folder it empties before
    the suites start, and the first suite to ask makes it under a lock while
    the others wait for it. Without the variable, it is made once for this
    pytest session. `make` gets a new folder to write into; it is renamed to
    `name` only when `make` returns.
    """
    root = os.environ.get("KERAS_VIT_TEST_CACHE") or str(tmp_path_factory.getbasetemp())
    os.makedirs(root, exist_ok=True)
    path = os.path.join(root, name)
    with open(path + ".lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not os.path.exists(path):
            partial = path + ".partial"
            shutil.rmtree(partial, ignore_errors=True)
            os.makedirs(partial)
            make(partial)
            os.rename(partial, path)
    return path


@pytest.fixture(scope="session")
def image_folder(tmp_path_factory):
    """A two-class train/test folder of 16-px PNGs: 16 training and 8 test images a class."""
    from tests.training.test_train_command import write_dataset

    return write_dataset(tmp_path_factory.mktemp("image_folder"), per_class=16)


class TrainedRun(typing.NamedTuple):
    folder: str  # model.keras, class_names.json, history.csv, metrics.json, run.json, ...
    printed: str  # what the command printed


@pytest.fixture(scope="session")
def trained_run(image_folder, tmp_path_factory):
    """One finished `keras-vit train` run on `image_folder` (2 epochs of 4 steps), in-process.

    Shared by the tests that read a run (its outputs, evaluate, predict,
    fine-tune from it): read its folder, write elsewhere.
    """
    from keras_vit.cli import main

    folder = str(tmp_path_factory.mktemp("trained_run") / "run")
    printed = io.StringIO()
    with contextlib.redirect_stdout(printed):
        code = main(
            [
                "train",
                "--dataset",
                image_folder,
                "--image-size",
                "16",
                "--epochs",
                "2",
                "--batch-size",
                "8",
                "--output-dir",
                folder,
            ]
        )
    assert code == 0, printed.getvalue()
    return TrainedRun(folder, printed.getvalue())


@pytest.fixture(autouse=True)
def _reset_keras_state():
    """Each test starts with float32, a fixed seed and a clean session.

    Without a full collection after each test: Python's own collections and
    the one after each module (`_collect_each_module_whole`) free what a
    test left; one after each test cost a JAX suite 4% of its CPU.
    """
    keras.config.set_dtype_policy("float32")
    keras.utils.set_random_seed(1234)
    yield
    keras.config.set_dtype_policy("float32")
    keras.backend.clear_session(free_memory=False)


@pytest.fixture
def images():
    """A small batch of 0..255 float images of TINY's input shape."""
    return np.random.default_rng(0).uniform(0, 255, (4, 16, 16, 3)).astype("float32")


def randomize_weights(model, seed=0, scale=0.2):
    """Sets every weight to random values, so no output is trivially zero."""
    rng = np.random.default_rng(seed)
    model.set_weights(
        [rng.normal(0, scale, w.shape).astype("float32") for w in model.get_weights()]
    )
    return model


def evaluated_accuracy(model_path):
    """What `keras-vit evaluate --model PATH` reports on the run's own test data."""
    import re

    from keras_vit.cli import main

    printed = io.StringIO()
    with contextlib.redirect_stdout(printed):
        assert main(["evaluate", "--model", str(model_path)]) == 0
    return float(re.search(r": accuracy ([0-9.]+),", printed.getvalue())[1])


def run_python(code, backend=BACKEND, timeout=300):
    """Runs `code` in a fresh interpreter under `backend`; returns stdout."""
    env = dict(os.environ, KERAS_BACKEND=backend, TF_CPP_MIN_LOG_LEVEL="3")
    result = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)],
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
    )
    if result.returncode:
        raise AssertionError(
            f"subprocess under {backend} failed ({result.returncode}):\n{result.stderr[-4000:]}"
        )
    return result.stdout


def last_json_line(stdout):
    return json.loads(stdout.strip().splitlines()[-1])


def load_benchmark(name):
    """A script of `benchmarks/` as a module (the folder is not a package).

    Its folder goes on the path, as running the script puts it: the scripts
    import `harness` (and each other) by name.
    """
    import importlib.util

    folder = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "benchmarks")
    if folder not in sys.path:
        sys.path.append(folder)
    spec = importlib.util.spec_from_file_location(name, os.path.join(folder, f"{name}.py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module
