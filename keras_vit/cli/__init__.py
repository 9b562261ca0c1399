"""The `keras-vit` command line: one module per sub-command.

Each module of `keras_vit.cli` (`demo`, `convert`, `train` for `train` and
`finetune`, `pretrain`, `evaluate`, `export`, `inspect`, `predict`) adds
its parser with `add_parser(command)`, runs with `run(args)`, and names in
`NEEDS` the extra and the packages it needs beyond the library floor;
`options` (the settings' fields as options, what messages call them),
`preflight` (checks before any work), `run_model` and `images` hold what
they share. Each sub-command imports its work when it runs.
"""

import argparse
import contextlib
import functools
import os
import sys
import warnings

from keras_vit._options import options_named
from keras_vit.cli import (
    convert,
    demo,
    evaluate,
    export,
    inspect,
    predict,
    pretrain,
    train,
)
from keras_vit.cli.options import CommandParser, HelpFormatter, installed_version
from keras_vit.cli.preflight import check_installed, fail

COMMANDS = (demo, convert, train, pretrain, evaluate, export, inspect, predict)
__all__ = ["build_parser", "main"]


def build_parser():
    parser = argparse.ArgumentParser(
        prog="keras-vit",
        description="The Vision Transformer for Keras 3.",
    )
    parser.add_argument("--version", action="version", version=f"keras-vit {installed_version()}")
    # The options of every sub-command.
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument(
        "--backend",
        choices=("tensorflow", "jax", "torch"),
        default=None,
        help="Keras backend (default: KERAS_BACKEND, else tensorflow)",
    )
    common.add_argument(
        "--verbose",
        action="store_true",
        help="show the log lines of TensorFlow and the other libraries",
    )
    commands = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=CommandParser)

    def command(name, **kwargs):
        subcommand = commands.add_parser(
            name, parents=[common], formatter_class=HelpFormatter, **kwargs
        )
        subcommand.set_defaults(options=subcommand.options)  # filled as options are added
        return subcommand

    for module in COMMANDS:
        module.add_parser(command)
    return parser


@contextlib.contextmanager
def _own_lines_only(command, verbose):
    """The command prints its own lines only; other libraries' with `--verbose`.

    Python warnings of other packages (Keras', torch's) are ignored, the
    package's own shown as the command's lines (`keras-vit export: warning:
    ...`, not Python's file, line and source); what native code writes to
    standard error (libjpeg's "Corrupt JPEG data" beside our line naming the
    file it skips) is kept out (`_native_output.native_stderr_kept_out`).
    """
    if verbose:
        yield
        return
    from keras_vit._native_output import native_stderr_kept_out

    with warnings.catch_warnings(), native_stderr_kept_out():
        warnings.simplefilter("ignore")
        warnings.filterwarnings("default", module=r"keras_vit(\.|$)")
        warnings.showwarning = functools.partial(_show_warning, command)
        yield


def _show_warning(command, message, category, filename, lineno, file=None, line=None):
    print(f"keras-vit {command}: warning: {message}", file=sys.stderr)


def _quiet_python_logs():
    """Keeps TensorFlow's and absl's Python loggers to errors (the CLI prints its own lines).

    The native (C++) log lines are kept out by the `keras-vit` launcher
    (`keras_vit_launcher`), before TensorFlow loads.
    """
    import logging

    for name in ("tensorflow", "absl", "jax._src.xla_bridge"):
        logging.getLogger(name).setLevel(logging.ERROR)


def main(argv=None):
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.command is None:
        parser.print_help()
        return 2
    check_installed(args.command, args.needs)
    if not args.verbose:
        _quiet_python_logs()
    backend = getattr(args, "backend", None)
    if backend:
        if "keras" in sys.modules and sys.modules["keras"].backend.backend() != backend:
            raise SystemExit(
                f"keras-vit: Keras is already loaded with another backend; set "
                f"KERAS_BACKEND={backend} instead of --backend."
            )
        os.environ["KERAS_BACKEND"] = backend
    if getattr(args, "cpu_devices", None) is not None:
        from keras_vit.distribution import simulate_cpu_devices

        try:
            simulate_cpu_devices(args.cpu_devices)
        except (ValueError, RuntimeError) as error:
            fail(args.command, error)
    try:
        # The library's messages name the options the command took its arguments from.
        with options_named(args.options), _own_lines_only(args.command, args.verbose):
            return args.run(args)
    except KeyboardInterrupt:
        print(_interrupted(args), file=sys.stderr)
        return 130


def _interrupted(args):
    """The one line for Ctrl-C: where the run stands and how to go on."""
    output_dir = getattr(args, "output_dir", None)
    if output_dir is None:
        return f"keras-vit {args.command}: interrupted."
    from keras_vit.training.backup import latest_checkpoint

    found = latest_checkpoint(os.path.join(output_dir, "backup"))
    if found is None:
        return (
            f"keras-vit {args.command}: interrupted before the first epoch ended; nothing was kept."
        )
    return (
        f"keras-vit {args.command}: interrupted after epoch {found[0]} (checkpoint in "
        f"{found[1]}); run the same command again to resume."
    )
