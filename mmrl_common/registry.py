"""The name -> object registry behind every extension point of mmrl.

GRPO families (advantages, losses, aggregations, KL estimators, token shapers), rollout backends,
environments, samplers, plug-ins, rewards, answer scorers, problem types, toy tasks, video sampling
policies, benchmark readers, record importers and prompt templates each keep one :class:`Registry`. Methods
plug in without editing mmrl: ``@register_policy_loss("my-loss")`` on a function in their own module is
enough, and the name becomes a valid config value.

One class, so every family behaves the same way:

* an unknown name raises one error (``error``, :class:`~mmrl_common.errors.ConfigError` by default) naming
  the family, the config key, the nearest registered name and all valid names;
* registering a taken name raises (``register_error``) unless ``overwrite=True``; ``duplicates`` says which
  re-registrations are harmless (see :class:`Registry`);
* entries may have aliases (other spellings that resolve to the name) and metadata (a small dict per entry);
* ``normalize`` makes look-ups tolerant of spelling (case, ``_`` vs ``-``) for the families that want it;
* an entry may be *declared* (:meth:`Registry.declare`) by name, with the module that registers its object and
  the metadata that checking a config needs, before that module is imported: the name is valid, listed and
  checked (:meth:`Registry.check`, :meth:`Registry.meta`) without importing the module (a light config schema
  need not import torch for the names of a torch module), and the first look-up of the object
  (:meth:`Registry.get`) imports it.
"""

from __future__ import annotations

import difflib
import importlib
from collections.abc import Callable, Iterable, Iterator, Mapping
from types import MappingProxyType
from typing import Any, Generic, Literal, TypeVar

from mmrl_common.errors import ConfigError

T = TypeVar("T")

Duplicates = Literal["error", "same-object", "same-qualname", "replace"]
_DUPLICATES = ("error", "same-object", "same-qualname", "replace")


def nearest(name: str, candidates: Iterable[str], n: int = 1, cutoff: float = 0.6) -> list[str]:
    """Up to ``n`` candidates closest to ``name`` (``difflib``), retrying without case when none is close."""
    cands = list(dict.fromkeys(str(c) for c in candidates))
    name = str(name)
    near = difflib.get_close_matches(name, cands, n=n, cutoff=cutoff)
    if not near:
        lowered: dict[str, str] = {}
        for c in cands:
            lowered.setdefault(c.lower(), c)
        near = [lowered[c] for c in difflib.get_close_matches(name.lower(), list(lowered), n=n, cutoff=cutoff)]
    return near


def did_you_mean(name: str, candidates: Iterable[str]) -> str:
    """``"did you mean 'x'? "`` for the nearest candidate, or ``""`` when none is close."""
    near = nearest(name, candidates)
    return f"did you mean {near[0]!r}? " if near else ""


def origin(obj: Any) -> str | None:
    """``module.qualname`` of a function or class, None for other objects."""
    module, qualname = getattr(obj, "__module__", None), getattr(obj, "__qualname__", None)
    if isinstance(module, str) and isinstance(qualname, str):
        return f"{module}.{qualname}"
    return None


class _Declared:
    """The place of a declared entry's object until ``module``, which registers it, is imported."""

    __slots__ = ("module",)

    def __init__(self, module: str) -> None:
        self.module = module

    def __repr__(self) -> str:
        return f"<declared, registered by {self.module}>"


class Registry(Generic[T]):
    """Maps names to objects of one family; ``kind`` names the family in error messages.

    ``config_key``: the config key whose values are names from this registry (shown in errors).
    ``error``: exception class for an unknown name. ``register_error``: exception class for a bad
    registration (empty name, taken name, clashing alias).
    ``duplicates``: what registering a taken name without ``overwrite=True`` does:

    * ``"error"``: always an error;
    * ``"same-object"`` (default): registering the very same object again is a no-op, anything else an error;
    * ``"same-qualname"``: as ``"same-object"``, and an object with the same module and qualified name (a
      re-run notebook cell, a reloaded module) replaces the old one silently;
    * ``"replace"``: the new object replaces the old one silently.

    ``normalize``: a function mapping a spelling to a look-up key (e.g. lower case, ``_`` -> ``-``); names
    and aliases are then matched by key. Without it look-ups are exact.

    Declared entries (:meth:`declare`): the name with the module that registers its object. Until the object
    is registered the name counts as registered for everything but the object: ``in``, :meth:`names`,
    :meth:`canonical`, :meth:`check`, :meth:`meta` and the unknown-name error see it; :meth:`get`,
    :meth:`find`, :meth:`items`, :meth:`values` and :meth:`unregister` import the module first. The module's
    own registration of the name fills the entry (its metadata updating the declared one); a registration of
    the name from anywhere else imports the declaring module first, so it meets the declared object as a taken
    name exactly as if that module had been imported before.
    """

    def __init__(self, kind: str, config_key: str | None = None, *, error: type[Exception] = ConfigError,
                 register_error: type[Exception] = ValueError, duplicates: Duplicates = "same-object",
                 normalize: Callable[[str], str] | None = None) -> None:
        if duplicates not in _DUPLICATES:
            raise ValueError(f"duplicates must be one of {', '.join(_DUPLICATES)}, got {duplicates!r}")
        self.kind = kind
        self.config_key = config_key
        self.error = error
        self.register_error = register_error
        self.duplicates = duplicates
        self._normalize = normalize
        self._items: dict[str, Any] = {}  # canonical name -> object (or _Declared), in registration order
        self._declared: dict[str, str] = {}  # declared name -> the module that registers its object
        self._meta: dict[str, dict[str, Any]] = {}
        self._aliases: dict[str, str] = {}  # look-up key of an alias -> canonical name

    # ------------------------------------------------------------------------------------ registering
    def register(self, name: str, *, overwrite: bool = False, aliases: Iterable[str] = (),
                 meta: Mapping[str, Any] | None = None) -> Callable[[T], T]:
        """Decorator registering ``obj`` under ``name`` (see :meth:`add`); returns ``obj`` unchanged."""
        self._check_name(name)

        def deco(obj: T) -> T:
            return self.add(name, obj, overwrite=overwrite, aliases=aliases, meta=meta)

        return deco

    def add(self, name: str, obj: T, *, overwrite: bool = False, aliases: Iterable[str] = (),
            meta: Mapping[str, Any] | None = None) -> T:
        """Register ``obj`` under ``name`` with optional ``aliases`` and ``meta``; returns ``obj``."""
        self._check_name(name)
        aliases = [aliases] if isinstance(aliases, str) else list(aliases)
        pending = self._items.get(name)
        if isinstance(pending, _Declared):
            if getattr(obj, "__module__", None) != pending.module:  # not its own module: that one comes first
                importlib.import_module(pending.module)
            if isinstance(self._items.get(name), _Declared):  # the declaring module registers its object
                for alias in aliases:
                    self._check_alias(alias, name, overwrite)
                self._items[name] = obj
                self._meta[name] = {**self._meta.get(name, {}), **(meta or {})}
                for alias in aliases:
                    self._aliases[self._key(alias)] = name
                return obj
        if name in self._items and not overwrite and not self._harmless(self._items[name], obj):
            where = origin(self._items[name])
            raise self.register_error(
                f"{self.kind} {name!r} is already registered{f' ({where})' if where else ''}; "
                "pass overwrite=True to replace it or pick another name")
        for alias in aliases:
            self._check_alias(alias, name, overwrite)
        if self._items.get(name, obj) is not obj:  # replaced: no longer the declaring module's object
            self._declared.pop(name, None)
        self._items[name] = obj
        self._meta[name] = dict(meta or {})
        for alias in aliases:
            self._aliases[self._key(alias)] = name
        return obj

    def declare(self, name: str, module: str, *, aliases: Iterable[str] = (),
                meta: Mapping[str, Any] | None = None) -> None:
        """Declare ``name`` as an entry whose object ``module`` registers when it is imported, with ``aliases``
        and ``meta`` known now (see the class). Declaring a name twice from the same module is harmless;
        a name taken otherwise is an error (``register_error``)."""
        self._check_name(name)
        if not isinstance(module, str) or not module.strip():
            raise self.register_error(f"{self.kind} {name!r}: the declaring module must be a module name, "
                                      f"got {module!r}")
        aliases = [aliases] if isinstance(aliases, str) else list(aliases)
        if name in self._items:
            if self._declared.get(name) == module:
                return
            where = self._declared.get(name) or origin(self._items[name])
            raise self.register_error(f"{self.kind} {name!r} is already registered{f' ({where})' if where else ''}")
        for alias in aliases:
            self._check_alias(alias, name, False)
        self._items[name] = _Declared(module)
        self._declared[name] = module
        self._meta[name] = dict(meta or {})
        for alias in aliases:
            self._aliases[self._key(alias)] = name

    def declared(self) -> dict[str, str]:
        """The declared names (their objects registered or not) -> the module that registers each, in
        declaration order (a name whose object was since replaced from elsewhere is no longer declared)."""
        return dict(self._declared)

    def loaded(self, name: str) -> bool:
        """Whether the object of the entry ``name`` (or an alias) is registered (False only for a declared
        entry whose module has not registered it yet); ``error`` for an unknown name."""
        return not isinstance(self._items[self.check(name)], _Declared)

    def alias(self, alias: str, name: str, *, overwrite: bool = False) -> None:
        """Make ``alias`` another spelling of the registered ``name``."""
        canonical = self.canonical(name)
        if canonical is None:
            raise self.unknown(name)
        self._check_alias(alias, canonical, overwrite)
        self._aliases[self._key(alias)] = canonical

    def unregister(self, name: str) -> T:
        """Remove ``name`` (or the entry an alias names) with its aliases and metadata; returns its object."""
        canonical = self.check(name)
        obj = self._load(canonical)
        self._meta.pop(canonical, None)
        self._declared.pop(canonical, None)
        self._aliases = {k: v for k, v in self._aliases.items() if v != canonical}
        del self._items[canonical]
        return obj

    def _check_name(self, name: object) -> None:
        if not isinstance(name, str) or not name.strip():
            raise self.register_error(f"a {self.kind} name must be a non-empty string, got {name!r}")

    def _check_alias(self, alias: object, name: str, overwrite: bool) -> None:
        if not isinstance(alias, str) or not alias.strip():
            raise self.register_error(f"a {self.kind} alias must be a non-empty string, got {alias!r}")
        taken = self._aliases.get(self._key(alias))
        if taken is not None and taken != name and taken in self._items and not overwrite:
            raise self.register_error(f"{self.kind} alias {alias!r} already names {taken!r}; "
                                      "pass overwrite=True to move it")

    def _harmless(self, old: T, new: T) -> bool:
        if self.duplicates == "replace":
            return True
        if self.duplicates == "error":
            return False
        if old is new:
            return True
        return self.duplicates == "same-qualname" and origin(old) is not None and origin(old) == origin(new)

    # --------------------------------------------------------------------------------------- look-ups
    def _key(self, name: str) -> str:
        return self._normalize(name) if self._normalize is not None else name

    def canonical(self, name: object) -> str | None:
        """The registered name that ``name`` (a name, an alias, or, with ``normalize``, another spelling of
        either) stands for; None when it names nothing."""
        if not isinstance(name, str):
            return None
        if name in self._items:
            return name
        key = self._key(name)
        target = self._aliases.get(key)
        if target is not None and target in self._items:
            return target
        if self._normalize is not None:
            for registered in self._items:
                if self._key(registered) == key:
                    return registered
        return None

    def check(self, name: object) -> str:
        """The canonical name of ``name`` (see :meth:`canonical`), the unknown-name error (``error``) when it
        names nothing; imports nothing (a declared entry's module stays unimported)."""
        canonical = self.canonical(name)
        if canonical is None:
            raise self.unknown(name)
        return canonical

    def _load(self, canonical: str) -> T:
        """The object of the entry ``canonical``, importing the module of a declared one first."""
        obj = self._items[canonical]
        if isinstance(obj, _Declared):
            importlib.import_module(obj.module)
            obj = self._items.get(canonical)
            if isinstance(obj, _Declared) or canonical not in self._items:
                raise self.register_error(f"{self.kind} {canonical!r} is declared to be registered by module "
                                          f"{self._declared.get(canonical)!r}, which did not register it")
        return obj

    def get(self, name: str) -> T:
        """The object registered under ``name`` (or an alias); ``error`` naming the valid ones otherwise."""
        return self._load(self.check(name))

    def find(self, name: object) -> T | None:
        """The object registered under ``name`` (or an alias), None when it names nothing."""
        canonical = self.canonical(name)
        return None if canonical is None else self._load(canonical)

    def meta(self, name: str) -> Mapping[str, Any]:
        """The metadata registered with ``name`` (read-only; empty when none was given); for a declared entry
        the declared metadata, without importing its module."""
        return MappingProxyType(self._meta.get(self.check(name), {}))

    def unknown(self, name: object, *, where: str | None = None) -> Exception:
        """The error for an unknown ``name``: the family, where the name came from (``where``, default the
        config key), the nearest registered name and all valid names."""
        where = where if where is not None else (f"config key {self.config_key!r}" if self.config_key else "")
        spellings = {n: n for n in self._items}
        spellings.update({a: t for a, t in self._aliases.items() if t in self._items})
        near = nearest(str(name), spellings)
        hint = f"did you mean {spellings[near[0]]!r}? " if near else ""
        return self.error(f"unknown {self.kind} {name!r}{f' ({where})' if where else ''}; {hint}"
                          f"valid: {', '.join(self.names()) or '(none)'}")

    def names(self) -> list[str]:
        """Registered names, sorted."""
        return sorted(self._items)

    def items(self) -> list[tuple[str, T]]:
        """``(name, object)`` pairs in registration order (importing the modules of declared entries)."""
        return [(name, self._load(name)) for name in list(self._items)]

    def values(self) -> list[T]:
        """Registered objects in registration order (importing the modules of declared entries)."""
        return [obj for _, obj in self.items()]

    def __iter__(self) -> Iterator[str]:
        """Registered names in registration order."""
        return iter(list(self._items))

    def __len__(self) -> int:
        return len(self._items)

    def __contains__(self, name: object) -> bool:
        return self.canonical(name) is not None

    def __repr__(self) -> str:
        return f"Registry({self.kind!r}, {len(self)} entries)"
