"""The module ``__getattr__`` and ``__dir__`` of a package front that imports its names on first use (PEP 562),
so that importing the package imports none of its heavy modules (torch).

The package keeps its own ``_load(home)``: explicit ``from .home import ...`` statements, which the layering
check (``tests/test_layers.py``) reads; this module only looks the name up, checks what ``_load`` gave against
the table and binds the names on the package (those not bound yet).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any


def lazy_front(namespace: dict[str, Any], homes: Mapping[str, tuple[str, ...]],
               load: Callable[[str], dict[str, Any]]) -> tuple[Callable[[str], Any], Callable[[], list[str]]]:
    """``(__getattr__, __dir__)`` for the package whose globals are ``namespace``: ``homes`` maps each module of
    the package to the names it gives, ``load(home)`` imports them (name -> object)."""
    home_of = {name: home for home, names in homes.items() for name in names}
    package = namespace["__name__"]

    def __getattr__(name: str) -> Any:
        home = home_of.get(name)
        if home is None:  # a submodule not imported yet is not an attribute (the import system then imports it)
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        found = load(home)
        assert set(found) == set(homes[home]), f"{package}: {home} gives {sorted(found)}, not {homes[home]}"
        for key, value in found.items():  # a name bound already (a test's monkeypatch, say) is kept
            namespace.setdefault(key, value)
        return namespace[name]

    def __dir__() -> list[str]:
        return sorted(set(namespace) | set(namespace.get("__all__", ())))

    return __getattr__, __dir__
