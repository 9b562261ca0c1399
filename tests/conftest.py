"""Shared fixtures and markers. The suite runs once per backend (KERAS_BACKEND).

Markers (`pytest -m`):
- `backend_independent`: the test's outcome cannot depend on the backend
  of the suite (files, docs, argument parsing, arithmetic, fresh
  interpreters of a backend of their own). `make test` runs the suite once
  per backend (naming them all in `KERAS_VIT_SUITE_BACKENDS`), its
  processes side by side: each of these tests runs once, in whichever
  process claims it first (`work_groups`). Without the variable they run
  under whichever backend runs the suite.
- `slow`: over a few seconds (a training, a fresh interpreter, an export).
  `make test-quick` leaves them out.
"""

import atexit
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
import time
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


def keep_jax_compilations_for_the_session():
    """JAX's persistent compilation cache, one folder for every JAX process of the run.

    Most tests build a model of a size other tests built before it, and each
    new model's functions (and each operation called eagerly on new shapes)
    are compiled again, to the same executables: read back from the cache
    instead, a JAX module spends a quarter to a half less CPU. Under `make
    test` the folder is the suites' shared cache (`KERAS_VIT_TEST_CACHE`):
    both JAX parts and every fresh interpreter the tests start under JAX
    (which inherit it through the environment) read what any of them
    compiled. JAX writes an entry in place, so a process could read one
    half-written: the suites' own writes are made whole first
    (`write_compilations_whole`), and the children's are read by their
    parent after they end. A child killed in a write would leave an entry
    truncated for good: tests that kill JAX processes give them a folder
    of their own (`own_jax_compilations`).
    """
    shared = os.environ.get("KERAS_VIT_TEST_CACHE")
    if shared:
        folder = os.path.join(shared, "jax_compilations")
        os.makedirs(folder, exist_ok=True)
    else:
        folder = tempfile.mkdtemp(prefix="keras_vit_jax_compilations_")
        atexit.register(shutil.rmtree, folder, ignore_errors=True)
    os.environ.update(own_jax_compilations(folder))
    if BACKEND == "jax":
        import jax

        jax.config.update("jax_compilation_cache_dir", folder)
        jax.config.update("jax_persistent_cache_min_compile_time_secs", 0)
        jax.config.update("jax_persistent_cache_min_entry_size_bytes", 0)
        write_compilations_whole()


def write_compilations_whole():
    """This process's cache entries appear whole (written aside, then renamed)."""
    from jax._src import lru_cache

    def put(cache, key, value):
        path = cache.path / f"{key}{lru_cache._CACHE_SUFFIX}"
        if not path.exists():
            partial = path.with_name(f".{path.name}.{os.getpid()}.partial")
            partial.write_bytes(value)
            os.replace(partial, path)

    lru_cache.LRUCache.put = put


def own_jax_compilations(folder):
    """The environment that gives a JAX process `folder` as its compilation cache."""
    return {
        "JAX_COMPILATION_CACHE_DIR": str(folder),
        "JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS": "0",
        "JAX_PERSISTENT_CACHE_MIN_ENTRY_SIZE_BYTES": "0",
    }


keep_jax_compilations_for_the_session()


def compile_for_tiny_models():
    """XLA compiles with less optimisation of the code it emits, here and in every child.

    The tests' models and eagerly called operations are tiny, so a JAX test
    spends its time compiling, not running (a one-op function: ~50 ms of
    XLA's compile on this 2-core machine). Two settings cut that: LLVM at
    level 1 without its costly passes, and XLA CPU's older elemental
    emitters in place of its fusion emitters. Three JAX layer modules
    (position embedding, token merging, attention pooling): 80 CPU-s by
    default, 71 with the first, 67 with the second, 56 with both. XLA's own
    HLO passes all run, and tests/layers, tests/ops and the checkpoint
    parities (1e-5 against the references) pass under them on JAX and
    TensorFlow; LLVM's level 0 went further but moved an approximate GELU's
    gradient by 1.3e-5 at one point, past tests/layers/test_gelu_dense.py's
    bound. Set before any backend starts XLA (it reads the flags once); a
    user's own `XLA_FLAGS` are kept, and a flag of theirs wins.
    """
    flags = os.environ.get("XLA_FLAGS", "")
    ours = [
        "--xla_backend_optimization_level=1",
        "--xla_llvm_disable_expensive_passes=true",
        "--xla_cpu_use_fusion_emitters=false",
    ]
    names = {flag.split("=")[0] for flag in flags.split()}
    os.environ["XLA_FLAGS"] = " ".join(
        [flag for flag in ours if flag.split("=")[0] not in names] + flags.split()
    )


compile_for_tiny_models()


def pytest_configure(config):
    config.addinivalue_line(
        "markers",
        "backend_independent: `make test` runs it once, under any backend",
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


# Under `make test` the run's processes (one or more per backend, side by
# side) share the work as they go: each claims a group of tests before it
# runs them (a file created in the run's cache, first come first served),
# so a process that ends its share early takes over what is left instead
# of waiting for the others.
CLAIMS = (
    os.path.join(os.environ["KERAS_VIT_TEST_CACHE"], "claims")
    if os.environ.get("KERAS_VIT_SUITE_BACKENDS") and os.environ.get("KERAS_VIT_TEST_CACHE")
    else None
)


def work_groups(items):
    """`(key, items)` of each group of `items` this process may claim, in the order it tries them.

    Its backend's tests go by module (a module's fixtures are made once),
    heaviest first (a test weighs 1, a slow one 10); then the tests that
    any process may run (`backend_independent`: their outcome is the same
    under every backend, or their work is fresh interpreters of a backend
    of their own) one by one, heaviest first. The tests that read a shared
    artifact come last in each kind, by when it is made
    (`start_making_shared_artifacts`).
    """
    groups = {}
    for item in items:
        # A key is unique in the run: who may claim the group, and what it holds.
        if item.get_closest_marker("backend_independent"):
            key = f"any:{item.nodeid}"
        else:
            key = f"{BACKEND}:{item.path}"
        groups.setdefault(key, []).append(item)
    readers = artifact_readers()

    def order(group):
        key, members = group
        weight = sum(10 if item.get_closest_marker("slow") else 1 for item in members)
        return key.startswith("any:"), str(members[0].path) in readers, -weight

    return sorted(groups.items(), key=order)


def claim(key):
    """Whether this process is the first to ask for the group `key` (then it runs it)."""
    import hashlib

    os.makedirs(CLAIMS, exist_ok=True)
    path = os.path.join(CLAIMS, hashlib.sha1(key.encode()).hexdigest())
    try:
        os.close(os.open(path, os.O_CREAT | os.O_EXCL | os.O_WRONLY))
    except FileExistsError:
        return False
    return True


@pytest.hookimpl(tryfirst=True)
def pytest_runtestloop(session):
    if CLAIMS is None or session.config.option.collectonly:
        return None  # pytest's own loop: every collected test
    if session.testsfailed and not session.config.option.continue_on_collection_errors:
        raise session.Interrupted(f"{session.testsfailed} error(s) during collection")
    claimed = (members for key, members in work_groups(session.items) if claim(key))
    group = next(claimed, None)
    while group is not None:
        following = None
        for index, item in enumerate(group):
            if index + 1 < len(group):
                next_item = group[index + 1]
            else:  # the next group is claimed now, so fixtures it shares stay up
                following = next(claimed, None)
                next_item = following[0] if following else None
            item.config.hook.pytest_runtest_protocol(item=item, nextitem=next_item)
            if session.shouldfail:
                raise session.Failed(session.shouldfail)
            if session.shouldstop:
                raise session.Interrupted(session.shouldstop)
        group = following
    return True


def pytest_collection_modifyitems(config, items):
    # The tests that read a shared artifact run last, by when the first suite
    # has made it (`start_making_shared_artifacts`); each module stays whole.
    readers = artifact_readers()
    items.sort(key=lambda item: str(item.path) in readers)


def on_one_backend(backend, why):
    """A mark: the test runs under `backend` alone (or the run's first, if it has not that one).

    For what is the same code whatever the backend: a command's own work
    (the files it writes, its lines, its resumes and refusals), a file that
    TensorFlow converts from any backend's model. What differs by backend,
    the model's arithmetic, a training step, a run end to end through the
    command (tests/test_console.py, crash safety's killed runs), is tested
    under each; the tests marked so are dealt among the backends, so each
    runs some of every kind.
    """
    home = backend if backend in SUITE_BACKENDS else SUITE_BACKENDS[0]
    return pytest.mark.skipif(BACKEND != home, reason=f"one backend is enough ({why}): {home}")


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item, nextitem):
    """With `KERAS_VIT_TEST_CPU=FOLDER`: each test's CPU seconds, to aim the suite's cuts.

    Wall time misleads on a machine that five suites share; CPU does not. Each
    process appends `{"id", "backend", "own", "children", "wall"}` lines to
    `FOLDER/cpu-PID.jsonl`: its own CPU and that of the interpreters it
    started and reaped during the test (setup and teardown included).
    """
    folder = os.environ.get("KERAS_VIT_TEST_CPU")
    if not folder:
        yield
        return
    import resource

    from tests import warm_interpreters

    def used():
        own = resource.getrusage(resource.RUSAGE_SELF)
        children = resource.getrusage(resource.RUSAGE_CHILDREN)
        forks = warm_interpreters.CHILDREN_CPU[0]
        return (
            own.ru_utime + own.ru_stime,
            children.ru_utime + children.ru_stime + forks,
            time.time(),
        )

    before = used()
    yield
    own, children, wall = (a - b for a, b in zip(used(), before))
    os.makedirs(folder, exist_ok=True)
    line = {"id": item.nodeid, "backend": BACKEND, "own": own, "children": children}
    with open(os.path.join(folder, f"cpu-{os.getpid()}.jsonl"), "a") as f:
        f.write(json.dumps({**line, "wall": wall}) + "\n")


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


def artifact_readers():
    """The test modules that read a shared artifact (`artifact_maker`)."""
    return {module for module, _ in ARTIFACT_MAKERS.values()}


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


def run_python(code, backend=BACKEND, timeout=900, cold=False):
    """Runs `code` in a fresh interpreter under `backend`; returns stdout.

    The interpreter is forked from one that has imported the package and its
    jobs (`tests.warm_interpreters`), unless `cold`: where the interpreter's
    start is what the test checks (what an import does or leaves out).
    """
    from tests import warm_interpreters

    env = dict(os.environ, KERAS_BACKEND=backend, TF_CPP_MIN_LOG_LEVEL="3")
    result = (subprocess if cold else warm_interpreters).run(
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
