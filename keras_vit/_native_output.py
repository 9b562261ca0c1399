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
    sys.stderr.flush()
    saved = os.dup(2)
    with tempfile.TemporaryFile() as captured:
        os.dup2(captured.fileno(), 2)
        try:
            yield
        except BaseException:
            os.dup2(saved, 2)
            captured.seek(0)
            sys.stderr.write(captured.read().decode(errors="replace"))
            raise
        finally:
            os.dup2(saved, 2)
            os.close(saved)
