"""What a command checks before any work: its packages installed, its outputs writable."""

import os
import tempfile


def check_writable(path, option, folder):
    """Refuses, before any work, an output `path` that the command could not write.

    Probes the folder the output goes in (or the nearest one that exists:
    the command makes the rest) by writing a temporary file there, so that a
    read-only folder or file system, or a full disk, is one line instead of
    a traceback after the work.

    Args:
        path: the output: a folder (`folder=True`) or a file, to be made or replaced.
        option: the command-line option that gave it, for the message.
        folder: whether `path` is a folder.

    Raises:
        ValueError: naming `option`, `path` and the system's reason.
    """
    target = os.path.abspath(path)
    if folder and os.path.exists(target) and not os.path.isdir(target):
        raise ValueError(f"{option} {path} is a file, not a folder")
    parent = target if folder else os.path.dirname(target)
    while not os.path.exists(parent):
        parent = os.path.dirname(parent)
    if not os.path.isdir(parent):
        raise ValueError(f"{option} {path}: {parent} is a file, not a folder")
    try:
        tempfile.TemporaryFile(dir=parent).close()
        if os.statvfs(parent).f_bavail == 0:
            raise OSError(28, os.strerror(28))  # ENOSPC: what the first write would meet
    except OSError as error:
        raise ValueError(
            f"{option} {path}: cannot write in {parent} ({error.strerror or error})"
        ) from None


def check_installed(command, needs):
    """Fails at once, naming the extra to install, when a sub-command's packages are missing.

    Args:
        command: the sub-command's name.
        needs: `None` (the library floor suffices) or `(extra, modules)`:
            the `pip install keras-vit[extra]` that brings `modules`.
    """
    import importlib.util

    if needs is None:
        return
    extra, modules = needs
    missing = [module for module in modules if importlib.util.find_spec(module) is None]
    if missing:
        listed = ", ".join(missing)
        are = "is" if len(missing) == 1 else "are"
        raise SystemExit(
            f"keras-vit {command}: needs {listed}, which {are} not installed; "
            f"install {'it' if len(missing) == 1 else 'them'} with: "
            f"pip install 'keras-vit[{extra}]'"
        )


# What the training jobs need beyond the library floor.
TRAINING = ("train", ("tensorflow", "tensorflow_datasets", "matplotlib"))


def fail(command, error):
    """Ends the command with one line: its name and the error (which names the options)."""
    raise SystemExit(f"keras-vit {command}: {error}")
