"""The name -> object registry behind every extension point of the engine.

GRPO families (advantages, losses, aggregations, KL estimators, token shapers), rollout backends,
environments, samplers and plug-ins each keep one :class:`Registry`. Methods plug in without editing mmrl:
``@register_policy_loss("my-loss")`` on a function in their own module is enough, and the name becomes a
valid config value.
"""

from __future__ import annotations

import difflib
from collections.abc import Callable
from typing import Generic, TypeVar

from mmrl_common.errors import ConfigError

T = TypeVar("T")


class Registry(Generic[T]):
    """Maps names to objects of one family; ``kind`` names the family in error messages."""

    def __init__(self, kind: str, config_key: str | None = None) -> None:
        self.kind = kind
        self.config_key = config_key
        self._items: dict[str, T] = {}

    def register(self, name: str, *, overwrite: bool = False) -> Callable[[T], T]:
        """Decorator registering ``obj`` under ``name``; a duplicate name is an error unless ``overwrite``."""
        if not isinstance(name, str) or not name:
            raise ValueError(f"{self.kind} name must be a non-empty string, got {name!r}")

        def deco(obj: T) -> T:
            if name in self._items and not overwrite and self._items[name] is not obj:
                raise ValueError(f"{self.kind} {name!r} is already registered (pass overwrite=True)")
            self._items[name] = obj
            return obj

        return deco

    def get(self, name: str) -> T:
        """The object registered under ``name``; :class:`ConfigError` naming the valid ones otherwise."""
        try:
            return self._items[name]
        except (KeyError, TypeError):
            where = f" (config key {self.config_key!r})" if self.config_key else ""
            close = difflib.get_close_matches(str(name), list(self._items), n=1, cutoff=0.6)
            hint = f"did you mean {close[0]!r}? " if close else ""
            raise ConfigError(
                f"unknown {self.kind} {name!r}{where}; {hint}valid: {', '.join(sorted(self._items)) or '(none)'}"
            ) from None

    def names(self) -> list[str]:
        return sorted(self._items)

    def __contains__(self, name: object) -> bool:
        return name in self._items
