"""How a message names an argument: as the Python API spells it, or as the command line does.

A library message names the argument a value came through (`` `batch_size` ``,
``Received: batch_size=0``). Run from `keras-vit`, the same message names the
command's option (``--batch-size``, ``Received: --batch-size 0``): the command
says which option each argument is (`options_named`, read from its parser,
whose training options the settings' fields define), and nothing rewrites a
message afterwards. Also the command line's value types (`positive_int`, ...),
which the settings' fields name, and another library's error in one line
(`first_line`). Standard library only: every part may use it.
"""

import argparse
import contextlib
import contextvars

# {argument: option} of the command that runs, or None from Python.
_OPTIONS = contextvars.ContextVar("keras_vit_options", default=None)


def first_line(error, limit=300):
    """Another library's error (or message) in one line, for a message of ours.

    Its first line, cut at a word boundary past `limit` characters; an error
    without a message gives its type's name.

    Example:

    >>> first_line(OSError("Unable to open file\\n  (truncated: eof = 96)"))
    'Unable to open file'
    >>> first_line(KeyError())
    'KeyError'
    """
    message = str(error).strip()
    if not message:
        return type(error).__name__ if isinstance(error, BaseException) else ""
    line = message.splitlines()[0]
    if len(line) <= limit:
        return line
    return line[:limit].rsplit(" ", 1)[0] + " ..."


@contextlib.contextmanager
def options_named(options):
    """Within the block, messages name the arguments in `options` by their options.

    Args:
        options: `{argument: option}`, e.g. `{"batch_size": "--batch-size"}`.
    """
    token = _OPTIONS.set(dict(options))
    try:
        yield
    finally:
        _OPTIONS.reset(token)


def _option(argument):
    return (_OPTIONS.get() or {}).get(argument)


def name(argument):
    """`argument` as its caller spelled it: `` `batch_size` `` or ``--batch-size``."""
    return _option(argument) or f"`{argument}`"


def given(argument, value):
    """`argument` with its value: ``batch_size=0`` or ``--batch-size 0`` (a set flag: alone)."""
    option = _option(argument)
    if option is None:
        return f"{argument}={value!r}"
    if value is True:
        return option
    return f"{option} {value!r}"


def code(argument, value, typed=None):
    """`argument` set to `value` as its caller would write it, to quote in a message.

    From Python the assignment in backticks (image_size=(224, 224) quoted as
    code); from the command line the option as typed (--image-size 224:
    `typed`, else `value`; a flag alone).
    """
    option = _option(argument)
    if option is None:
        return f"`{argument}={value!r}`"
    if value is True:
        return option
    return f"{option} {value if typed is None else typed}"


# The command line's value types (argparse `type=`): a bad value is argparse's
# one-line error naming the option.


def _whole_number(text, smallest, what):
    try:
        value = int(text)
    except ValueError:
        value = None
    if value is None or value < smallest:
        raise argparse.ArgumentTypeError(f"must be {what}, not {text!r}")
    return value


def positive_int(text):
    return _whole_number(text, 1, "a positive whole number")


def non_negative_int(text):
    return _whole_number(text, 0, "a whole number, 0 or more")


def _real_number(text, accepts, what):
    try:
        value = float(text)
    except ValueError:
        value = None
    if value is None or not accepts(value):
        raise argparse.ArgumentTypeError(f"must be {what}, not {text!r}")
    return value


def fraction(text):
    return _real_number(text, lambda v: 0.0 < v < 1.0, "a number between 0 and 1")


def decay_factor(text):
    """A number in (0, 1]: `--layer-decay`'s."""
    return _real_number(text, lambda v: 0.0 < v <= 1.0, "a number in (0, 1]")


def positive_float(text):
    return _real_number(text, lambda v: 0.0 < v < float("inf"), "a positive number")
