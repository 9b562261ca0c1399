"""The commands' options: the settings' fields as argparse options, and what messages call them.

`keras-vit train`, `finetune` and `pretrain` take their options from the
fields of their settings (`add_settings`: option, help, type and choices
live beside each field); every command's parser records which option each
argument came through (`CommandParser.options`), which `keras-vit` hands to
the library's messages (`keras_vit._options.options_named`).
"""

import argparse
import dataclasses
import sys

from keras_vit._options import (  # noqa: F401 (the commands' value types)
    decay_factor,
    fraction,
    non_negative_int,
    positive_float,
    positive_int,
)


class CommandParser(argparse.ArgumentParser):
    """An argument parser that keeps `{argument: option}` of what it adds (`options`).

    A positional argument is named by its metavar (`CHECKPOINT`).
    """

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.options = {}

    def add_argument(self, *args, **kwargs):
        action = super().add_argument(*args, **kwargs)
        if action.dest != "help":
            strings = action.option_strings
            self.options[action.dest] = strings[-1] if strings else (action.metavar or action.dest)
        return action


def add_settings(parser, settings_class, command, defaults=None):
    """Adds the options of `command` from the fields of `settings_class`.

    Each field's metadata (`keras_vit.training.settings.setting`) gives its
    option (a name in capitals: a positional argument), help, type, metavar
    and choices; a bool field is a flag; `defaults` are the command's where
    they differ from Python's.
    """
    defaults = defaults or {}
    for field in dataclasses.fields(settings_class):
        meta = field.metadata
        commands = meta.get("commands")
        if meta.get("option") is False or (commands and command not in commands):
            continue
        option = meta.get("option") or "--" + field.name.replace("_", "-")
        if option.isupper():
            parser.add_argument(field.name, metavar=option, help=meta["help"])
            continue
        if isinstance(field.default, bool):
            parser.add_argument(option, dest=field.name, action="store_true", help=meta["help"])
            continue
        arguments = {
            key: meta[key] for key in ("type", "metavar", "choices") if meta.get(key) is not None
        }
        default = defaults.get(field.name, field.default)
        parser.add_argument(
            option, dest=field.name, default=default, help=meta["help"], **arguments
        )


def settings_from(args, settings_class):
    """The `settings_class` of parsed arguments: each field the command offers."""
    fields = (field.name for field in dataclasses.fields(settings_class))
    return settings_class(**{name: getattr(args, name) for name in fields if hasattr(args, name)})


def progress():
    """Keras' verbosity for long work: a live bar on a terminal, one line per epoch otherwise."""
    return 1 if sys.stdout.isatty() else 2


def live_bar():
    """Keras' verbosity for a short pass (an export's check): a live bar on a terminal only.

    Piped, Keras' one line per pass (`2/2 - 2s - 884ms/step`) would sit
    among the command's own lines, saying nothing the report does not.
    """
    return 1 if sys.stdout.isatty() else 0


class HelpFormatter(argparse.ArgumentDefaultsHelpFormatter):
    """Shows every option's default (but not `None` or `False`)."""

    def _get_help_string(self, action):
        if action.default in (None, False, argparse.SUPPRESS) or "%(default)" in (
            action.help or ""
        ):
            return action.help
        return super()._get_help_string(action)


def installed_version():
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("keras-vit")
    except PackageNotFoundError:  # run from a source tree that is not installed
        return "unknown (not installed)"


def add_image_limit(parser):
    from keras_vit.data import image_limits

    parser.add_argument(
        "--max-image-pixels",
        type=positive_int,
        default=image_limits.MAX_PIXELS,
        help="refuse images whose header declares more pixels, before decoding them",
    )
