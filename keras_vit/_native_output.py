"""What native libraries write to standard error, kept out of the terminal (standard library only).

The console script (`keras_vit_launcher`) loads this module by its path
before anything imports Keras or TensorFlow, without importing the
`keras_vit` package (whose import loads Keras); `keras_vit.export` uses it
for TFLite's converter, which prints its settings on every quantised
conversion. Nothing here may import beyond the standard library.
"""

import contextlib
import os
import sys
import tempfile


@contextlib.contextmanager
def native_stderr_captured():
    """Keeps what native code writes to standard error (fd 2) out of the terminal.

    What was written is shown if the block fails, so an error keeps its
    context.

    Example:

    >>> with native_stderr_captured():
    ...     _ = os.write(2, b"a native library's log line")
    """
    with _fd2_to_a_file():
        yield


@contextlib.contextmanager
def native_stderr_kept_out():
    """A command's block: native code's standard error kept out, Python's lines kept in.

    What native libraries write to fd 2 while a command works (libjpeg's
    "Corrupt JPEG data" for a photo it still decodes, TensorFlow's C++
    warnings) goes to a temporary file; Python's own standard error (the
    command's lines, logging's) is moved onto a copy of the terminal's fd
    first, so it still shows. What native code wrote is shown if the block
    fails with anything but a command's own exit (`SystemExit`).
    """
    python_stderr = sys.stderr
    try:
        python_fd = python_stderr.fileno()
    except (AttributeError, OSError, ValueError):  # (a test's capture: not fd 2)
        python_fd = None
    with _fd2_to_a_file(kept_from=SystemExit) as terminal:
        if python_fd != 2:
            yield
            return
        moved = os.fdopen(os.dup(terminal), "w", buffering=1, errors="backslashreplace")
        sys.stderr = moved
        try:
            yield
        finally:
            sys.stderr = python_stderr
            moved.close()


@contextlib.contextmanager
def _fd2_to_a_file(kept_from=()):
    """Points fd 2 at a temporary file in the block; yields a copy of the original fd 2.

    What was written is shown on the original standard error if the block
    raises anything but a `kept_from` exception.
    """
    sys.stderr.flush()
    saved = os.dup(2)
    with tempfile.TemporaryFile() as captured:
        os.dup2(captured.fileno(), 2)
        try:
            yield saved
        except BaseException as error:
            os.dup2(saved, 2)
            if not isinstance(error, kept_from):
                captured.seek(0)
                sys.stderr.write(captured.read().decode(errors="replace"))
            raise
        finally:
            os.dup2(saved, 2)
            os.close(saved)
