"""Parsing the argument of a config file's `get_config(arg)`: "tiny,eta=2" style; a config
as JSON data and back (run.json, --print_config).

Kept free of heavy imports so configs that must not load JAX (the simulator's) can use it.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

import ml_collections

from asyncrl.errors import UserError


class ConfigError(UserError, ValueError):
    """A config value that cannot work; the message names the field."""


# Fields that moved, old dotted path -> new: an override of the old one says where to go.
MOVED_FIELDS = {
    "schedule": "coordinator.admission",
}


def missing_field(dotted: str, have: list[str]) -> ConfigError:
    """The error for an override of `dotted`, a field the config does not have."""
    if dotted in MOVED_FIELDS:
        return ConfigError(f"config.{dotted} has moved: set config.{MOVED_FIELDS[dotted]} instead")
    return ConfigError(f"config.{dotted}: no such field (have: {', '.join(sorted(have))})")


def parse_arg(arg: str | None, **defaults: Any) -> ml_collections.ConfigDict:
    """Parses "tiny,eta=2" against typed defaults: a bare word sets a bool default to True."""
    parsed = ml_collections.ConfigDict(defaults)
    for item in filter(None, (arg or "").split(",")):
        key, _, value = item.partition("=")
        if key not in defaults:
            raise ConfigError(f"config argument {key!r} is unknown; known: {', '.join(sorted(defaults))}")
        default = defaults[key]
        if not value:
            if not isinstance(default, bool):
                raise ConfigError(f"config argument {key!r} needs a value ({key}=...)")
            parsed[key] = True
        elif isinstance(default, bool):
            parsed[key] = value.lower() in ("1", "true", "yes")
        else:
            try:
                parsed[key] = type(default)(value)
            except ValueError:
                raise ConfigError(f"config argument {key}={value!r}: expected {type(default).__name__}") from None
    return parsed


def config_json(config) -> dict[str, Any]:
    """`config` (a ConfigDict, or the RunSpec resolved from one) as JSON data, as a run
    folder's run.json records it and --print_config prints it: tuples as lists, anything not
    JSON as its repr."""
    return _plain(config if dataclasses.is_dataclass(config) else config.to_dict())


def _plain(value: Any) -> Any:
    if dataclasses.is_dataclass(value):  # a RunSpec and its sections
        return {f.name: _plain(getattr(value, f.name)) for f in dataclasses.fields(value)}
    if isinstance(value, Mapping):
        return {str(k): _plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    return repr(value)


def config_from_json(data: dict[str, Any]) -> ml_collections.ConfigDict:
    """The config `config_json` wrote: sequences as tuples, as config files write them."""
    return ml_collections.ConfigDict(_tuples(data))


def _tuples(value: Any) -> Any:
    if isinstance(value, dict):
        return {k: _tuples(v) for k, v in value.items()}
    if isinstance(value, list):
        return tuple(_tuples(v) for v in value)
    return value
