"""A run's folder: held while a run works in it, its settings (`run.json`), kept or removed.

A run works in one output folder. While it works there it holds the folder
(`.run.lock`): a second run there is refused. Its settings are recorded in
`run.json`, which a resumed run must match (its epochs may grow) and the
commands read to find a model's data. A run that fails before its first
checkpoint leaves no folder it made behind (`removed_if_failed`).
"""

import contextlib
import json
import os
import shutil

from keras_vit import _options

LOCK_FILE = ".run.lock"
RUN_FILE = "run.json"
# Settings a run can be resumed with other values of.
_MAY_CHANGE = ("epochs",)
# The output folders that runs of this process hold: {real path: open lock file}.
_HELD = {}


def hold_output_dir(output_dir):
    """Holds `output_dir` for this process's run; a folder another run holds is refused.

    The hold is an advisory lock (`flock`) on `output_dir/.run.lock`, which
    names the holder's process: the system drops it when the process ends,
    however it ends, so a killed run leaves no folder held. The job's
    `removed_if_failed` block lets it go when the job returns or raises
    (a `Run` used without a job holds its folder until the process ends). A
    folder this process holds already stays held: a run that follows another
    in one process takes it over.

    Raises:
        ValueError: another process's run holds the folder.
    """
    try:
        import fcntl
    except ImportError:  # not a POSIX system: no hold
        return
    path = os.path.realpath(output_dir)
    if path in _HELD:
        return
    lock = open(os.path.join(path, LOCK_FILE), "a+")
    try:
        fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        lock.seek(0)
        holder = lock.read().strip()
        lock.close()
        raise ValueError(
            f"{output_dir!r} is in use by another run"
            f"{f' (process {holder})' if holder.isdigit() else ''}; wait for it to end, "
            f"or pass another {_options.name('output_dir')}."
        ) from None
    lock.seek(0)
    lock.truncate()
    lock.write(str(os.getpid()))
    lock.flush()
    _HELD[path] = lock


def _let_go(paths):
    for path in paths:
        lock = _HELD.pop(path)
        try:
            os.remove(os.path.join(path, LOCK_FILE))
        except FileNotFoundError:  # the failed run's folder is gone
            pass
        lock.close()


@contextlib.contextmanager
def removed_if_failed(output_dir):
    """A job's block: a run that fails before its first checkpoint leaves no folder behind.

    When the job created `output_dir` (it did not exist before the block)
    and raises (bad data, divergence, Ctrl-C) before a complete checkpoint
    is in `output_dir/backup`, the folder is removed; otherwise it is kept,
    so the same command resumes. Either way the folders the job held
    (`hold_output_dir`) are let go.
    """
    from keras_vit.training.backup import latest_checkpoint

    output_dir = os.fspath(output_dir)
    existed = os.path.exists(output_dir)
    held_before = set(_HELD)
    try:
        yield
    except BaseException:
        if (
            not existed
            and os.path.isdir(output_dir)
            and (latest_checkpoint(os.path.join(output_dir, "backup")) is None)
        ):
            shutil.rmtree(output_dir, ignore_errors=True)
        raise
    finally:
        _let_go(set(_HELD) - held_before)


def check_output_dir(output_dir, overwrite, output_files=()):
    """Refuses to replace a finished run unless `overwrite`; `True` if resuming.

    Replacing one removes its `output_files` first.
    """
    backup = os.path.join(output_dir, "backup")
    if os.path.isdir(backup):
        return True
    finished = os.path.isfile(os.path.join(output_dir, "model.keras"))
    if finished and not overwrite:
        raise ValueError(
            f"{output_dir!r} already holds a finished run (model.keras); pass "
            f"another output folder, or {_options.given('overwrite', True)} to replace it."
        )
    if finished:
        for name in output_files:
            path = os.path.join(output_dir, name)
            if os.path.exists(path):
                os.remove(path)
    return False


def read_run(output_dir):
    """The settings recorded in `output_dir/run.json`, or None."""
    path = os.path.join(output_dir, RUN_FILE)
    if not os.path.isfile(path):
        return None
    with open(path) as f:
        return json.load(f)


def changed_settings(output_dir, settings):
    """The names of `settings` an unfinished run in `output_dir` cannot resume with.

    Every recorded setting must be the same, except that `epochs` may grow.
    """
    settings = json.loads(json.dumps(settings))  # tuples as lists, as read back
    recorded = read_run(output_dir)
    if recorded is None:
        return []
    changed = [
        key
        for key in sorted(set(settings) | set(recorded))
        if key not in _MAY_CHANGE and settings.get(key) != recorded.get(key)
    ]
    if recorded.get("epochs") is not None and settings.get("epochs", 0) < recorded["epochs"]:
        changed.append("epochs")
    return changed


def record_run(output_dir, resuming, settings):
    """Writes the run's settings; a resumed run must have the recorded ones.

    Raises:
        ValueError: resuming with other settings (more epochs are allowed),
            naming each difference, before anything is loaded.
    """
    from keras_vit.training.backup import replace_atomically

    settings = json.loads(json.dumps(settings))  # tuples as lists, as read back
    recorded = read_run(output_dir) if resuming else None
    if recorded is not None:
        changed = changed_settings(output_dir, settings)
        if changed:
            differences = ", ".join(
                f"{_options.given(key, settings.get(key))} (the run has {recorded.get(key)!r})"
                for key in changed
            )
            raise ValueError(
                f"{output_dir!r} holds an unfinished run with other settings: {differences}. "
                "Resume it with its own settings (epochs may grow), start it over with "
                f"{_options.given('overwrite', True)}, or choose another output folder."
            )

    def write(path):
        with open(path, "w") as f:
            json.dump(settings, f, indent=2)

    replace_atomically(os.path.join(output_dir, RUN_FILE), write)
