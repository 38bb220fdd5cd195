"""The typed, frozen sections a run's spec is made of (asyncrl/config.py `RunSpec`).

A config file stays a ConfigDict (`--config.x=` overrides, `:arg` variants); `resolve` turns
it once into frozen dataclasses whose fields are declared with their types, one class per
section, each defined beside the component that reads it and the registries its check names.
Conversion refuses a field the section does not declare, a declared field the config lacks
and a value of the wrong type, each naming the field; `check()` then holds the section's own
rules. What no single section can decide (a page size against a partial-rollout setting, a
batch against the trainer's mesh) is checked where the spec is assembled.

Import-light: validating a config loads no JAX (tests/test_layers.py).
"""

from __future__ import annotations

import dataclasses
import types
import typing
from collections.abc import Mapping
from typing import Any, ClassVar

from asyncrl.config_args import ConfigError, missing_field


def fail(field: str, value: Any, allowed: str) -> typing.NoReturn:
    raise ConfigError(f"config.{field} = {value!r} is not allowed: {allowed}")


class FrozenMapping(Mapping):
    """A read-only mapping (the coordinator's per-admission parameters): a spec shared by
    every component cannot be changed by one of them. Hashable, as a frozen field must be."""

    def __init__(self, items: Mapping[str, Any]):
        self._items = dict(items)

    def __getitem__(self, key: str) -> Any:
        return self._items[key]

    def __iter__(self):
        return iter(self._items)

    def __len__(self) -> int:
        return len(self._items)

    def __repr__(self) -> str:
        return repr(self._items)

    def __hash__(self) -> int:
        return hash(tuple(sorted(self._items.items(), key=lambda kv: kv[0])))


def section(cls):
    """A section class: frozen, keyword-only fields, converted by `Section.from_node`."""
    return dataclasses.dataclass(frozen=True, kw_only=True)(cls)


class Section:
    """Base of every section: `name` is its dotted place in the config (for messages)."""

    name: ClassVar[str] = ""
    # Fields added after run folders began recording their configs (run.json), with the value
    # that keeps what a config without them did: an older run's stored config, or a config
    # file written before them, still resolves. Every other field must be set.
    added: ClassVar[dict[str, Any]] = {}

    @classmethod
    def from_node(cls, node: Any, name: str | None = None):
        """The section from a ConfigDict (or mapping) node; `name` its dotted path."""
        name = name or cls.name
        if not isinstance(node, Mapping) and not hasattr(node, "keys"):
            fail(name, node, f"a section with fields {', '.join(_field_names(cls))}")
        hints = typing.get_type_hints(cls)
        declared = _field_names(cls)
        given = list(node.keys())
        check_keys(given, [k for k in declared if k not in cls.added], declared, name)
        return cls(**{k: typed(node[k] if k in given else cls.added[k], hints[k], f"{name}.{k}")
                      for k in declared})

    def check(self) -> None:
        """The section's own rules (overridden); conversion has checked the types."""


def check_keys(given, required, declared, name: str = "") -> None:
    """A key of `given` not `declared`, or a `required` one missing: a ConfigError naming it
    (`name`: the dotted place of the keys, '' at the top of the config)."""
    prefix = f"{name}." if name else ""
    unknown = [k for k in given if k not in declared]
    if unknown:
        raise missing_field(f"{prefix}{unknown[0]}", list(declared))
    missing = [k for k in required if k not in given]
    if missing:
        where = f"every field of config.{name}" if name else "every section"
        raise ConfigError(f"config.{prefix}{missing[0]} is missing: the config file must set "
                          f"{where} (experiments/grpo.py sets them all)")


def _field_names(cls) -> list[str]:
    return [f.name for f in dataclasses.fields(cls)]


def typed(value: Any, annotation: Any, field: str) -> Any:
    """`value` as `annotation` declares it, or a ConfigError naming `field`."""
    origin, args = typing.get_origin(annotation), typing.get_args(annotation)
    if origin in (typing.Union, types.UnionType):
        if value is None and type(None) in args:
            return None
        for option in (a for a in args if a is not type(None)):
            try:
                return typed(value, option, field)
            except ConfigError:
                pass  # the next one may take it; none did: the error below names them all
        fail(field, value, " or ".join(_describe(a) for a in args))
    if isinstance(annotation, type) and issubclass(annotation, Section):
        return annotation.from_node(value, field)
    if annotation is bool:
        if not isinstance(value, bool):
            fail(field, value, "expected True or False")
        return value
    if annotation is int:
        if not isinstance(value, int) or isinstance(value, bool):
            fail(field, value, "expected an int")
        return value
    if annotation is float:
        if not isinstance(value, (int, float)) or isinstance(value, bool):
            fail(field, value, "expected a number")
        return float(value)
    if annotation is str:
        if not isinstance(value, str):
            fail(field, value, "expected a string")
        return value
    if origin is tuple:
        if isinstance(value, (str, bytes)) or not isinstance(value, (list, tuple)):
            fail(field, value, f"expected a tuple, e.g. {field.split('.')[-1]}=(…,)")
        return tuple(typed(v, args[0], f"{field}[{i}]") for i, v in enumerate(value))
    if origin is Mapping or annotation is Mapping:
        if not hasattr(value, "keys"):
            fail(field, value, "expected a mapping of names to values")
        inner = args[1] if args else Any
        return FrozenMapping({str(k): typed(value[k], inner, f"{field}.{k}") for k in value.keys()})
    if annotation is Any:
        return FrozenMapping({k: typed(value[k], Any, f"{field}.{k}") for k in value.keys()}) \
            if hasattr(value, "keys") else value
    raise TypeError(f"{field}: a section field of type {annotation!r} has no conversion")


def _describe(annotation: Any) -> str:
    return "None" if annotation is type(None) else getattr(annotation, "__name__", str(annotation))


# The checks sections share: each names the field, the value and what is allowed.
def int_at_least(field: str, value: int, minimum: int) -> None:
    if value < minimum:
        fail(field, value, f"expected an int ≥ {minimum}")


def positive(field: str, value: float) -> None:
    if not value > 0:
        fail(field, value, "expected a number > 0")


def registered(field: str, value: str, registry) -> None:
    if value not in registry:
        fail(field, value, f"registered: {', '.join(registry.names())}")
