"""The `keras-vit` console script: sets the backend, quiets native logs, runs `keras_vit.cli`.

TensorFlow's C++ libraries write log lines to the process's standard error
while they load ("All log messages before absl::InitializeLog()", oneDNN,
CUDA driver look-ups, CPU instruction sets), before any Python logging
setting applies and whatever `TF_CPP_MIN_LOG_LEVEL` says. A new user reads
them as errors. This module runs before anything imports TensorFlow or
Keras (it lives outside the `keras_vit` package, whose import loads Keras,
which fixes its backend and loads TensorFlow). It applies `--backend`;
unless the user asked for the log lines (`--verbose`, or their own
`TF_CPP_MIN_LOG_LEVEL`), it loads TensorFlow with standard error pointed
away, then sets the C++ log level so later native INFO/WARNING/ERROR lines
stay out too. Errors still reach the user as Python exceptions, and what
the libraries wrote is shown if loading them fails.

`import keras_vit` from Python changes none of these settings.
"""

import importlib.util
import os
import sys


def wants_native_logs(argv, environ=os.environ):
    """True when the user asked for the libraries' own log lines."""
    return "--verbose" in argv or "TF_CPP_MIN_LOG_LEVEL" in environ


def _native_output():
    """`keras_vit._native_output`, loaded from its file without importing `keras_vit`.

    Importing the package imports Keras, which fixes its backend and loads
    TensorFlow: this module must act first. The module is registered under
    its own name, so the package's later imports of it get this one.
    """
    name = "keras_vit._native_output"
    if name not in sys.modules:
        package = importlib.util.find_spec("keras_vit")
        location = os.path.join(list(package.submodule_search_locations)[0], "_native_output.py")
        spec = importlib.util.spec_from_file_location(name, location)
        module = importlib.util.module_from_spec(spec)
        sys.modules[name] = module
        spec.loader.exec_module(module)
    return sys.modules[name]


def load_tensorflow_quietly():
    """Imports TensorFlow (if installed) with its start-up log lines kept out.

    Device discovery runs too, since it logs (CUDA driver look-ups) on its
    first call.
    """
    if importlib.util.find_spec("tensorflow") is None:
        return
    with _native_output().native_stderr_captured():
        import tensorflow as tf

        tf.config.list_physical_devices()


def requested_backend(argv):
    """The value of `--backend NAME` / `--backend=NAME` in `argv`, or None."""
    for index, arg in enumerate(argv):
        if arg == "--backend" and index + 1 < len(argv):
            return argv[index + 1]
        if arg.startswith("--backend="):
            return arg.split("=", 1)[1]
    return None


def main(argv=None):
    argv = sys.argv[1:] if argv is None else list(argv)
    backend = requested_backend(argv)
    if backend in ("tensorflow", "jax", "torch"):
        # Keras reads its backend once, when it is first imported, and
        # importing keras_vit imports Keras: the choice has to be made here.
        os.environ["KERAS_BACKEND"] = backend
    if not wants_native_logs(argv):
        # Level 3: C++ INFO, WARNING and ERROR lines after start-up are dropped too.
        os.environ["TF_CPP_MIN_LOG_LEVEL"] = "3"
        load_tensorflow_quietly()
    from keras_vit.cli import main as run

    return run(argv)


if __name__ == "__main__":
    sys.exit(main())
