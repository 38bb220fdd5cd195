"""A name → factory registry, so configs pick policies by string and typos fail loudly.

Every swappable family (coordinator policies, simulator schedules and length distributions,
losses and advantage estimators, reward functions) keeps one `Registry`. The valid names
printed in an error are read from the registry itself, so they cannot drift.
"""

from __future__ import annotations

from typing import Any, Callable, TypeVar

# A factory: a class or a function that builds the policy from keyword arguments.
F = TypeVar("F", bound=Callable[..., Any])


class Registry:
    """Maps names to factories (classes or functions) of one kind of policy."""

    def __init__(self, kind: str):
        self.kind = kind
        self._factories: dict[str, Callable[..., Any]] = {}

    def register(self, name: str) -> Callable[[F], F]:
        """Decorator: `@ROUTERS.register("least_loaded")` above a class or function."""
        if not name or not isinstance(name, str):
            raise ValueError(f"{self.kind} registry: a name must be a non-empty str, got {name!r}")

        def decorate(factory: F) -> F:
            self.add(name, factory)
            return factory

        return decorate

    def add(self, name: str, entry: Any) -> None:
        """Registers `entry` (a factory, function or record) under `name`."""
        if name in self._factories:
            raise ValueError(
                f"{self.kind} registry: {name!r} registered twice "
                f"({self._factories[name]!r} and {entry!r})"
            )
        self._factories[name] = entry

    def remove(self, name: str) -> None:
        """Unregisters `name` (a plugin or test that registered something temporary)."""
        self.get(name)
        del self._factories[name]

    def names(self) -> tuple[str, ...]:
        return tuple(sorted(self._factories))

    def get(self, name: str) -> Callable[..., Any]:
        try:
            return self._factories[name]
        except (KeyError, TypeError):
            raise ValueError(
                f"unknown {self.kind} {name!r}; registered: {', '.join(self.names())}"
            ) from None

    def build(self, name: str, **kwargs: Any) -> Any:
        """Looks `name` up and calls its factory with `kwargs`."""
        return self.get(name)(**kwargs)

    def __contains__(self, name: object) -> bool:
        return name in self._factories

    def __repr__(self) -> str:
        return f"Registry({self.kind!r}, {list(self.names())})"
