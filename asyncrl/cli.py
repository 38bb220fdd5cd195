"""How the entry points end on a user error: `error: <message>` on stderr and exit status 2,
no traceback (see asyncrl.errors.UserError). Any other exception is a bug and keeps its
traceback.

    _CONFIG = define_config_flag("experiments/grpo.py", "Experiment config file.")
    # or define_config_flag(..., print_flag=True): --print_config prints it and exits
    if __name__ == "__main__":
        run_main(main)              # absl entry points: python -m asyncrl.main, .eval, .sim
        exit_on_user_error(main)    # argparse scripts (benchmarks/); see int_at_least

absl parses the flags inside app.run, where a refused flag ends the process its own way and
ml_collections' refusal of a misspelt `--config.<field>` is an AttributeError from deep in
that parsing; `run_main` and `define_config_flag` make both user errors like any other.
Import-light: entry points import this before JAX, to split the host first.
"""

from __future__ import annotations

import argparse
import difflib
import json
import os
import re
import sys
import traceback
from collections.abc import Callable
from typing import Any, NoReturn

import ml_collections
from absl import app, flags, logging
from ml_collections import config_flags
from ml_collections.config_flags.config_flags import ConfigFileFlagParser

from asyncrl.config_args import MOVED_FIELDS, ConfigError, config_json
from asyncrl.errors import UserError

EXIT_USER_ERROR = 2  # as argparse's usage errors; a crash exits 1

# The flags this module defines for an entry point (--config, --print_config) belong to that
# entry point: absl's --help lists only the main module's flags.
flags.disclaim_key_flags()
# (--print_<name> flag, its config flag): run_main prints the config instead of running main.
_PRINT_FLAGS: list[tuple[flags.FlagHolder, flags.FlagHolder]] = []

def run_main(main: Callable[[list[str]], Any], optional_config: str | None = None) -> None:
    """absl's `app.run(main)`, with a user error, a refused flag included, ended as one line.

    `optional_config`: a config flag (`define_config_flag(None, ...)`) the command can do
    without, finding the config itself (a run folder's run.json). When it is not given, its
    `--<name>.<field>` overrides are set aside for `with_flag_overrides`, not refused as
    flags absl does not know (ml_collections defines them only once a config file is read).
    """
    parser = parse_flags if optional_config is None else (
        lambda argv: _parse_setting_overrides_aside(argv, optional_config))
    exit_on_user_error(lambda: app.run(_unless_printing(main), flags_parser=parser))


def _unless_printing(main: Callable[[list[str]], Any]) -> Callable[[list[str]], Any]:
    def run(argv: list[str]) -> Any:
        for printing, config in _PRINT_FLAGS:
            if printing.value:
                # JSON, as run.json records a run's config: what a rerun or a diff reads back.
                print(json.dumps(config_json(config.value), indent=2))
                return None
        return main(argv)

    return run


def quiet_libraries() -> None:
    """The console shows what the command itself says (a progress bar, evaluations, files
    written); the libraries' INFO lines (Orbax writes a dozen per checkpoint) appear with
    --verbosity=0."""
    if not flags.FLAGS["verbosity"].present:
        logging.set_verbosity(logging.WARNING)


def exit_on_user_error(entry: Callable[[], Any]) -> Any:
    """`entry()`; a UserError it raises ends the process with its message and status 2."""
    try:
        return entry()
    except UserError as error:
        _exit_with(error)


def _exit_with(error: UserError) -> NoReturn:
    print(f"error: {error}", file=sys.stderr, flush=True)
    sys.exit(EXIT_USER_ERROR)


def parse_flags(argv: list[str]) -> list[str]:
    """app.run's flags_parser: absl's own parsing, a flag it refuses raised as a UserError."""
    try:
        return flags.FLAGS(argv)
    except flags.Error as error:
        raise UserError(_flag_error_message(error)) from error


_SET_ASIDE: dict[str, list[str]] = {}  # config flag name -> its overrides, as given


def _parse_setting_overrides_aside(argv: list[str], name: str) -> list[str]:
    argv = flags.FLAGS.read_flags_from_files(argv, force_gnu=False)
    if _config_file_given(name, argv):
        return parse_flags(argv)  # ml_collections reads the overrides with the file
    override = re.compile(rf"-{{1,2}}(no)?{re.escape(name)}\.")
    kept, aside, value_next = argv[:1], [], False
    for arg in argv[1:]:
        if override.match(arg):
            aside.append(arg)
            # `--config.x value`, unless a bare boolean (`--config.x`) before the next flag
            value_next = "=" not in arg
        elif value_next and not arg.startswith("-"):
            aside.append(arg)
            value_next = False
        else:
            kept.append(arg)
            value_next = False
    _SET_ASIDE[name] = aside
    return parse_flags(kept)


def with_flag_overrides(config: ml_collections.ConfigDict,
                        name: str = "config") -> ml_collections.ConfigDict:
    """`config` (one the command found itself, e.g. `run_folder.stored_config`) with the
    `--<name>.<field>` overrides `run_main` set aside, applied as ml_collections applies them
    to a config file's: each value parsed as its field's type, a field that does not exist a
    ConfigError naming it and the fields near it."""
    args = _SET_ASIDE.get(name, [])
    for dotted in _overrides(name, args):
        if _check_field(config, name, dotted) is None:
            # ml_collections types an override by the field's value; a config file can give
            # a None field its type (a placeholder), a stored config cannot.
            raise ConfigError(f"--{name}.{dotted}: the stored config holds None there, so "
                              f"its type is unknown and the value cannot be read; pass "
                              f"--{name}=<a config file that sets it> instead")
    holder = flags.FlagValues()  # the flags of this config alone, apart from the command's
    try:
        # Defining parses the overrides' values already (ml_collections reads sys_argv).
        config_flags.DEFINE_config_dict(name, config, flag_values=holder, sys_argv=["", *args])
        holder(["", *args])
    except flags.Error as error:
        raise UserError(_flag_error_message(error)) from error
    return holder[name].value


def _flag_error_message(error: flags.Error) -> str:
    # absl wraps what a flag's parser raises in a flags.Error whose message quotes it whole,
    # with ml_collections' traceback text when get_config raised: a UserError in that chain
    # (a config argument get_config refuses, a misspelt field) is the message to show.
    cause, innermost = error, None
    while cause is not None:
        if isinstance(cause, UserError):
            innermost = cause
        cause = cause.__cause__ or cause.__context__
    return str(innermost) if innermost else f"{error} (--helpfull lists the flags)"


def int_at_least(minimum: int) -> Callable[[str], int]:
    """An argparse `type`: an int ≥ minimum, else argparse's usage error naming the flag."""
    def parse(text: str) -> int:
        value = int(text)
        if value < minimum:
            raise argparse.ArgumentTypeError(f"expected an int ≥ {minimum}, got {value}")
        return value

    parse.__name__ = "int"  # argparse names the type so in "invalid int value: 'x'"
    return parse


def define_config_flag(default: str | None, help_string: str, name: str = "config",
                       print_flag: bool = False):
    """`config_flags.DEFINE_config_file(name, default, help_string, lock_config=True)`, but a
    missing config file or an override naming no field (`--config.train.stepz=3`) is a
    ConfigError naming it and the fields near it. `print_flag`: also --print_<name>, which
    prints the resolved config (overrides applied) as JSON and exits 0 before the entry
    point's main runs: nothing is loaded or written."""
    parser = _CheckedConfigFileParser(name)
    if default is not None and not _config_file_given(name, sys.argv):
        # ml_collections then loads the default file and applies the overrides right here, at
        # import, before any entry point could catch what it raises: check them first.
        exit_on_user_error(lambda: parser.parse(default))
    holder = config_flags.DEFINE_config_file(
        name, default, f"{help_string.rstrip('.')}. Given as path[:arg]; set any field with "
        f"--{name}.<section>.<field>=<value> (e.g. --{name}.train.steps=30); a misspelt "
        f"field is an error.", lock_config=True)
    flags.FLAGS[name].parser = parser  # parses the --config given on the command line
    if print_flag:
        _PRINT_FLAGS.append((flags.DEFINE_bool(
            f"print_{name}", False, f"Print the resolved --{name}, its overrides applied, as "
            f"JSON and exit (nothing is loaded or written)."), holder))
    return holder


class _CheckedConfigFileParser(ConfigFileFlagParser):
    """Loads a config file as ml_collections does, then checks the overrides against it."""

    def __init__(self, name: str):
        super().__init__(name, lock_config=True)

    def parse(self, path: str):
        file = path.split(":", 1)[0]
        if not os.path.isfile(file):
            # ml_collections would defer this to the config's first use, as an OSError.
            raise ConfigError(f"--{self.name}={path}: no such config file {file!r}")
        config = _load_config_file(lambda: super(_CheckedConfigFileParser, self).parse(path),
                                   f"--{self.name}={path}", file)
        # Read as ml_collections reads them (it too looks in sys.argv, flag files expanded).
        argv = flags.FLAGS.read_flags_from_files(sys.argv, force_gnu=False)
        for dotted in _overrides(self.name, argv):
            _check_field(config, self.name, dotted)
        return config


def _load_config_file(load: Callable[[], Any], flag: str, file: str):
    """`load()`; a config file that does not run, or has no get_config, is a ConfigError
    naming the file, the line and the error instead of a traceback through ml_collections.
    A UserError get_config raises (an argument it refuses) passes as it is."""
    try:
        return load()
    except UserError:
        raise
    except SyntaxError as error:
        raise ConfigError(f"{flag}: {error.filename or file}, line {error.lineno}: "
                          f"SyntaxError: {error.msg}") from error
    except Exception as error:  # noqa: BLE001 - any error of the user's file, reported whole
        if isinstance(error, AttributeError) and getattr(error, "name", None) == "get_config":
            raise ConfigError(f"{flag}: {file} defines no get_config(); a config file defines "
                              f"get_config(arg=None) returning an ml_collections "
                              f"ConfigDict") from error
        frames = [f for f in traceback.extract_tb(error.__traceback__)
                  if os.path.abspath(f.filename) == os.path.abspath(file)]
        where = f"{file}, line {frames[-1].lineno}" if frames else file
        raise ConfigError(f"{flag}: {where}: {type(error).__name__}: {error}") from error


def _config_file_given(name: str, argv: list[str]) -> bool:
    return any(re.match(rf"-{{1,2}}{re.escape(name)}(=|$)", arg) for arg in argv)


def _overrides(name: str, argv: list[str]) -> list[str]:
    """The dotted fields of the `--<name>.<field>=value` (or `--no<name>.<field>`) flags."""
    pattern = re.compile(rf"-{{1,2}}(no)?{re.escape(name)}\.([^=]+)")
    return [match[2] for match in map(pattern.match, argv) if match]


_INSIDE = object()  # what _check_field reached: a field inside a list, a dict or a dataclass


def _check_field(config, name: str, dotted: str) -> Any:
    """The value of the field `dotted` names, or _INSIDE; a moved or missing field is a
    ConfigError naming it."""
    if dotted in MOVED_FIELDS:
        raise ConfigError(f"--{name}.{dotted} has moved: use --{name}.{MOVED_FIELDS[dotted]}")
    node, where = config, name
    for part in dotted.split("."):
        if not isinstance(node, ml_collections.ConfigDict) or "[" in part:
            return _INSIDE  # ml_collections checks those, and types them itself
        if part not in node:
            raise ConfigError(f"--{name}.{dotted}: {where} has no field {part!r}; "
                              f"{_near(part, list(node.keys()))}")
        node, where = node[part], f"{where}.{part}"
    return node


def _near(field: str, fields: list[str]) -> str:
    listed = f"fields: {', '.join(sorted(fields))}"
    close = difflib.get_close_matches(field, fields, n=3)
    return f"did you mean {' or '.join(map(repr, close))}? ({listed})" if close else listed
