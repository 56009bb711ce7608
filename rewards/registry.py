"""The reward registry and the weighted combination of rewards.

A reward function has TRL's signature::

    fn(completions, **columns) -> list[float | None]

``completions`` is a list of strings or TRL's conversational form (one list of message dicts per completion);
:func:`completion_to_text` turns either into a string. ``columns`` are per-completion lists (``id``,
``problem_type``, ``options``, ``answer``, ``meta``, and each extra dataset column by its own name) and the
other keyword arguments TRL's ``GRPOTrainer`` passes (``prompts``, ``completion_ids``, ``trainer_state``,
``log_extra``, ``log_metric``); a reward must accept unknown keyword arguments. ``None`` for a sample means
"not applicable" (TRL's convention).

Calls follow TRL: ``fn(prompts=..., completions=..., completion_ids=..., **columns)`` by keyword when the
function takes them that way (TRL's ``get_soft_overlong_punishment`` reads only ``completion_ids``), else
with the completions first (``fn(completions, **columns)``). Each reward gets completions in one of two
forms: ``"text"`` (strings, mmrl's own rewards) or ``"messages"`` (TRL's form for chat models, which is what
TRL passes for vision-language prompts: ``[{"role": "assistant", "content": text}]`` per completion).

A config names a reward by its registered name, by ``trl:NAME`` (a function of ``trl.rewards``, e.g.
``trl:think_format_reward``), or by an import path (``my_pkg.rewards.my_fn`` or ``my_pkg.rewards:my_fn``);
the last two get the ``messages`` form. ``init`` builds a reward from a factory (``{name:
trl:get_soft_overlong_punishment, init: {max_completion_len: 64, soft_punish_cache: 16}}``).

Users register their own reward functions::

    @register_reward("my_len")
    def my_len(completions, **kwargs):
        return [min(len(c) / 100, 1.0) for c in completions]

and TRL-style ones (reading ``completion[0]["content"]``) with ``completions="messages"`` (functions from the
``trl`` package get it without asking)::

    register_reward("think", think_format_reward)

and combine rewards from a config list of ``{name, weight, kwargs}``::

    total, components = compute_rewards([{"name": "format", "weight": 0.5}, "accuracy"], completions, columns)
"""

from __future__ import annotations

import importlib
import inspect
import math
import numbers
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from mmrl_common.errors import ConfigError, MmrlError
from mmrl_common.registry import Registry, did_you_mean

__all__ = [
    "REWARDS",
    "CombinedReward",
    "RewardBreakdown",
    "RewardError",
    "RewardSpec",
    "available_rewards",
    "completion_to_text",
    "compute_rewards",
    "get_reward",
    "normalize_completions",
    "register_reward",
    "unregister_reward",
]

RewardFn = Callable[..., Sequence[Any]]


class RewardError(MmrlError):
    """A reward function failed or returned something unusable.

    The message names the reward and, where it can be found, the sample id and index. The original
    exception, if any, is kept as ``__cause__``.
    """

    def __init__(self, message: str, *, reward: str, index: int | None = None, sample_id: Any = None):
        super().__init__(message)
        self.reward = reward
        self.index = index
        self.sample_id = sample_id


# --------------------------------------------------------------------------------------------------------
# Completions
# --------------------------------------------------------------------------------------------------------


def _content_to_text(content: Any) -> str:
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if isinstance(content, Mapping):
        # a single content part
        if content.get("type", "text") == "text":
            return str(content.get("text", ""))
        return ""
    if isinstance(content, Iterable):
        parts = []
        for part in content:
            if isinstance(part, str):
                parts.append(part)
            elif isinstance(part, Mapping):
                if part.get("type", "text") == "text" and part.get("text") is not None:
                    parts.append(str(part["text"]))
            else:
                raise TypeError(f"unsupported message content part {type(part).__name__}: {part!r}")
        return "".join(parts)
    raise TypeError(f"unsupported message content {type(content).__name__}: {content!r}")


def completion_to_text(completion: Any) -> str:
    """One completion as a string.

    Accepts a string, one message dict (``{"role": "assistant", "content": ...}``) or a list of message dicts
    (TRL's conversational form). ``content`` may be a string or a list of parts ``{"type": "text", "text": ...}``;
    non-text parts (images) are skipped. When a list holds assistant messages, only those are kept (a
    multi-turn rollout may carry environment/user turns), joined by newlines; messages without a role count
    as assistant messages.
    """
    if isinstance(completion, str):
        return completion
    if completion is None:
        return ""
    if isinstance(completion, Mapping):
        return _content_to_text(completion.get("content"))
    if isinstance(completion, Sequence):
        messages = list(completion)
        if not messages:
            return ""
        if all(isinstance(m, str) for m in messages):
            return "".join(messages)
        for m in messages:
            if not isinstance(m, Mapping):
                raise TypeError(f"a conversational completion must be a list of message dicts, got {m!r}")
        mine = [m for m in messages if m.get("role", "assistant") == "assistant"]
        if not mine:
            mine = messages
        return "\n".join(_content_to_text(m.get("content")) for m in mine)
    raise TypeError(f"unsupported completion type {type(completion).__name__}: {completion!r}")


def normalize_completions(completions: Iterable[Any]) -> list[str]:
    """Strings for a batch of completions in either of TRL's forms (see :func:`completion_to_text`)."""
    if isinstance(completions, str):
        raise TypeError("completions must be a list of completions, not a single string")
    return [completion_to_text(c) for c in completions]


# --------------------------------------------------------------------------------------------------------
# Registry
# --------------------------------------------------------------------------------------------------------


REWARDS: Registry[RewardFn] = Registry("reward", "rewards", register_error=ConfigError, duplicates="same-qualname")
"""Every reward function by name; an entry's metadata holds ``locate_errors``."""


def _suggest(name: str, candidates: Iterable[str]) -> str:
    """``did you mean 'x'?`` for the nearest of ``candidates``, else the list of them."""
    hint = did_you_mean(str(name), candidates)
    return hint.strip() if hint else "valid: " + ", ".join(sorted(candidates))


def register_reward(
    name: str,
    fn: RewardFn | None = None,
    *,
    overwrite: bool = False,
    locate_errors: bool = True,
    completions: str | None = None,
):
    """Register a reward function under ``name``; use as ``@register_reward("name")`` or call directly.

    ``completions``: the form the function reads, ``"text"`` (strings) or ``"messages"`` (TRL's
    conversational form); default ``"messages"`` for functions of the ``trl`` package, else ``"text"``.

    ``fn`` keeps its TRL signature ``fn(completions, **columns)``; it is returned unchanged. Registering a
    different function under a taken name raises :class:`ConfigError` unless ``overwrite=True`` (a function
    with the same module and qualified name, e.g. a re-run notebook cell, replaces the old one silently).

    ``locate_errors``: when the function raises on a batch and does not say which sample failed, the
    combiner re-runs it one sample at a time to find the failing sample id. Set it to ``False`` for
    rewards that must see the whole group (group statistics) or that are expensive (policy re-queries).
    """
    if not isinstance(name, str) or not name.strip():
        raise ConfigError(f"a reward name must be a non-empty string, got {name!r}")

    def decorate(f: RewardFn) -> RewardFn:
        if not callable(f):
            raise ConfigError(f"reward {name!r}: {f!r} is not callable")
        form = completions or default_form(f)
        if form not in FORMS:
            raise ConfigError(f"reward {name!r}: completions={form!r}; use one of {', '.join(FORMS)}")
        return REWARDS.add(name, f, overwrite=overwrite, meta={"locate_errors": bool(locate_errors),
                                                               "completions": form})

    if fn is not None:
        return decorate(fn)
    return decorate


def unregister_reward(name: str) -> None:
    """Remove a registered reward (mainly for tests); unknown names raise :class:`ConfigError`."""
    REWARDS.unregister(name)


FORMS = ("text", "messages")


def default_form(fn: Any) -> str:
    """``"messages"`` for TRL's own reward functions (and callables of the ``trl`` package), else ``"text"``."""
    module = getattr(fn, "__module__", None) or getattr(type(fn), "__module__", "") or ""
    return "messages" if module == "trl" or module.startswith("trl.") else "text"


def resolve_reward(name: str, where: str = "rewards") -> tuple[RewardFn, dict[str, Any]]:
    """The function for a config name and its metadata (``locate_errors``, ``completions``): a registered
    name, ``trl:NAME`` (``trl.rewards.NAME``) or an import path (``pkg.module.fn`` / ``pkg.module:fn``; the
    module is looked up in the working folder too, as ``python -m`` would)."""
    canonical = REWARDS.canonical(name)
    if canonical is not None:
        return REWARDS.get(canonical), dict(REWARDS.meta(canonical))
    if name.startswith("trl:"):
        attr = name[4:]
        try:
            module = importlib.import_module("trl.rewards")
        except ImportError as exc:
            raise ConfigError(f"{where}: {name!r} needs TRL: pip install trl ({exc})") from None
        known = list(getattr(module, "__all__", None) or [k for k in dir(module) if not k.startswith("_")])
        try:
            fn = getattr(module, attr)
        except (AttributeError, ImportError) as exc:
            if isinstance(exc, ImportError):
                raise ConfigError(f"{where}: {name!r} cannot be imported: {exc}") from None
            raise ConfigError(f"{where}: trl.rewards has no {attr!r}; {_suggest(attr, known)}") from None
        return fn, {"locate_errors": True, "completions": "messages"}
    if "." in name or ":" in name:
        from mmrl_common.user_modules import import_user_module

        module_name, _, attr = name.rpartition(":") if ":" in name else name.rpartition(".")
        module = import_user_module(module_name, what=f"{where}: reward {name!r}")  # the working folder searched too
        fn = getattr(module, attr, None)
        if fn is None:
            public = [k for k in dir(module) if not k.startswith("_") and callable(getattr(module, k))]
            raise ConfigError(f"{where}: reward {name!r}: module {module_name} ({getattr(module, '__file__', '?')}) "
                              f"has no {attr!r}; {_suggest(attr, public)}")
        if not callable(fn):
            raise ConfigError(f"{where}: {name!r} is not callable")
        return fn, {"locate_errors": True, "completions": "messages"}
    raise REWARDS.unknown(name, where=where)


def as_messages(completions: Sequence[Any]) -> list[Any]:
    """TRL's conversational form of completions given as strings (others are returned as they are)."""
    return [[{"role": "assistant", "content": c}] if isinstance(c, str) else c for c in completions]


def call_reward(fn: RewardFn, completions: Sequence[Any], kwargs: Mapping[str, Any]) -> Any:
    """Call ``fn`` the way TRL's trainer does (every argument by keyword) when its signature takes that,
    else with the completions first (mmrl's older convention, e.g. ``lambda c, **kw: ...``)."""
    try:
        inspect.signature(fn).bind(completions=completions, **kwargs)
    except (TypeError, ValueError):
        return fn(completions, **kwargs)
    return fn(completions=completions, **kwargs)


def get_reward(name: str) -> RewardFn:
    """The function registered under ``name``; an unknown name raises :class:`ConfigError` with suggestions."""
    return REWARDS.get(name)


def available_rewards() -> list[str]:
    """Sorted names of all registered rewards."""
    return REWARDS.names()


# --------------------------------------------------------------------------------------------------------
# Combination
# --------------------------------------------------------------------------------------------------------

_SPEC_KEYS = ("name", "weight", "kwargs", "label", "init", "completions")


@dataclass
class RewardSpec:
    """One entry of a reward config.

    ``name``: a registered reward name (or a callable, registered or not). ``weight``: its factor in the
    total. ``kwargs``: fixed keyword arguments passed to the function with the columns (a key that is also a
    column name is a :class:`ConfigError`). ``label``: the component name in logs; defaults to ``name``, and
    must be unique within a combination (use it to apply one reward twice with different kwargs). ``init``:
    the name is a factory (TRL's ``get_*`` rewards); it is called once with these keyword arguments and
    returns the reward function. ``completions``: the form the function reads, ``"text"`` or ``"messages"``
    (default: as registered; ``"messages"`` for ``trl:`` names and import paths).
    """

    name: str | RewardFn
    weight: float = 1.0
    kwargs: dict[str, Any] = field(default_factory=dict)
    label: str | None = None
    init: dict[str, Any] | None = None
    completions: str | None = None

    @classmethod
    def parse(cls, item: Any, where: str = "rewards") -> RewardSpec:
        if isinstance(item, RewardSpec):
            spec = RewardSpec(item.name, item.weight, dict(item.kwargs), item.label,
                              None if item.init is None else dict(item.init), item.completions)
        elif isinstance(item, str) or callable(item):
            spec = RewardSpec(item)
        elif isinstance(item, Mapping):
            unknown = [k for k in item if k not in _SPEC_KEYS]
            if unknown:
                k = unknown[0]
                raise ConfigError(
                    f"{where}: unknown key {k!r} in reward entry; {_suggest(str(k), _SPEC_KEYS)}"
                )
            if "name" not in item:
                raise ConfigError(f"{where}: a reward entry needs a 'name' (got keys {sorted(item)})")
            kwargs = item.get("kwargs") or {}
            if not isinstance(kwargs, Mapping):
                raise ConfigError(
                    f"{where}: kwargs of reward {item['name']!r} must be a mapping, got {kwargs!r}"
                )
            spec = RewardSpec(item["name"], item.get("weight", 1.0), dict(kwargs), item.get("label"),
                              item.get("init"), item.get("completions"))
        else:
            raise ConfigError(f"{where}: a reward entry must be a name or a mapping, got {item!r}")
        w = spec.weight
        if isinstance(w, bool) or not isinstance(w, numbers.Real) or not math.isfinite(float(w)):
            raise ConfigError(
                f"{where}: weight of reward {spec.display_name!r} must be a finite number, got {w!r}"
            )
        spec.weight = float(w)
        if not isinstance(spec.kwargs, dict) or not all(isinstance(k, str) for k in spec.kwargs):
            raise ConfigError(f"{where}: kwargs of reward {spec.display_name!r} must be a mapping of names")
        if spec.label is not None and not isinstance(spec.label, str):
            raise ConfigError(f"{where}: label of reward {spec.display_name!r} must be a string")
        if spec.init is not None and not (isinstance(spec.init, Mapping) and all(isinstance(k, str) for k in spec.init)):
            raise ConfigError(f"{where}: init of reward {spec.display_name!r} must be a mapping of names")
        if spec.completions not in (None, *FORMS):
            raise ConfigError(f"{where}: completions of reward {spec.display_name!r} must be one of "
                              f"{', '.join(FORMS)}, got {spec.completions!r}")
        return spec

    @property
    def display_name(self) -> str:
        if self.label:
            return self.label
        if isinstance(self.name, str):
            if REWARDS.canonical(self.name) is None and ("." in self.name or ":" in self.name):
                return self.name.rpartition(":")[2].rpartition(".")[2]  # trl:NAME, pkg.module.fn -> the function
            return self.name
        return getattr(self.name, "__name__", repr(self.name))


@dataclass
class RewardBreakdown:
    """The result of one combination.

    ``total[i]`` is ``sum_k weight_k * component_k[i]``. ``components[label][i]`` is the raw (unweighted)
    value, with ``0.0`` where the reward returned ``None``; ``applicable[label][i]`` is ``False`` there.
    """

    total: list[float]
    components: dict[str, list[float]]
    applicable: dict[str, list[bool]]
    weights: dict[str, float]

    def as_tuple(self) -> tuple[list[float], dict[str, list[float]]]:
        return self.total, self.components

    def means(self) -> dict[str, float]:
        """Per-component mean over applicable samples (NaN when none is), plus ``total``; for logging."""
        out: dict[str, float] = {}
        for k, vals in self.components.items():
            xs = [v for v, ok in zip(vals, self.applicable[k]) if ok]
            out[k] = sum(xs) / len(xs) if xs else float("nan")
        out["total"] = sum(self.total) / len(self.total) if self.total else float("nan")
        return out


def _sample_id(columns: Mapping[str, Any], i: int) -> Any:
    ids = columns.get("id")
    if isinstance(ids, Sequence) and not isinstance(ids, str) and i < len(ids):
        return ids[i]
    return None


def _where(columns: Mapping[str, Any], i: int | None) -> str:
    if i is None:
        return "the batch"
    sid = _sample_id(columns, i)
    if sid is None:
        return f"sample at index {i}"
    return f"sample id {sid!r} (index {i})"


def _is_column(value: Any, n: int) -> bool:
    return isinstance(value, (list, tuple)) and len(value) == n


def _slice_columns(columns: Mapping[str, Any], i: int, n: int) -> dict[str, Any]:
    return {k: ([v[i]] if _is_column(v, n) else v) for k, v in columns.items()}


def _to_list(result: Any) -> list[Any] | None:
    if isinstance(result, (list, tuple)):
        return list(result)
    tolist = getattr(result, "tolist", None)  # numpy arrays, torch tensors
    if callable(tolist):
        out = tolist()
        return out if isinstance(out, list) else None
    return None


def _coerce(value: Any) -> float | None:
    """A reward value as a float, ``None`` for "not applicable"; raises ``TypeError`` for non-numbers."""
    if value is None:
        return None
    if isinstance(value, bool):
        return float(value)
    if isinstance(value, numbers.Real):
        return float(value)
    item = getattr(value, "item", None)  # 0-d numpy / torch
    if callable(item):
        return _coerce(item())
    raise TypeError(f"{value!r} ({type(value).__name__}) is not a number")


class CombinedReward:
    """A weighted sum of registered rewards.

    ``specs`` is a list of reward entries: a name, a mapping ``{name, weight=1, kwargs={}, label=None}`` or a
    :class:`RewardSpec`. Names are resolved at construction, so a typo fails before training starts.

    Calling the object with TRL's signature returns the totals, so a combination is itself a reward function;
    :meth:`compute` returns the full :class:`RewardBreakdown`.
    """

    __name__ = "combined"

    def __init__(self, specs: Iterable[Any], *, where: str = "rewards"):
        if isinstance(specs, (str, Mapping)) or callable(specs):
            specs = [specs]
        self.specs: list[RewardSpec] = [RewardSpec.parse(s, f"{where}[{i}]") for i, s in enumerate(specs)]
        if not self.specs:
            raise ConfigError(f"{where}: no reward functions configured")
        self._fns: list[RewardFn] = []
        self._locate: list[bool] = []
        self._forms: list[str] = []
        seen: set[str] = set()
        for i, spec in enumerate(self.specs):
            if isinstance(spec.name, str):
                fn, meta = resolve_reward(spec.name, where=f"{where}[{i}]")
            else:
                fn, meta = spec.name, {"completions": default_form(spec.name)}
            if spec.init is not None:
                try:
                    fn = fn(**spec.init)
                except TypeError as exc:
                    raise ConfigError(f"{where}[{i}]: init of reward {spec.display_name!r}: {exc}") from None
                if not callable(fn):
                    raise ConfigError(f"{where}[{i}]: reward {spec.display_name!r} with init returned "
                                      f"{type(fn).__name__}, not a function")
            self._fns.append(fn)
            self._locate.append(bool(meta.get("locate_errors", True)))
            self._forms.append(spec.completions or meta.get("completions") or default_form(fn))
            label = spec.display_name
            if label in seen:
                raise ConfigError(
                    f"{where}[{i}]: reward {label!r} appears twice; give the entries distinct 'label's"
                )
            seen.add(label)

    @property
    def labels(self) -> list[str]:
        return [s.display_name for s in self.specs]

    def state_dict(self) -> dict[str, Any]:
        """The state of every stateful reward (one whose function has ``state_dict``/``load_state_dict``,
        e.g. a running-quantile remap built with ``init``), by label; plain data only. The trainer saves it
        with every checkpoint and hands it to the next combination after a curriculum stage switch."""
        return {label: fn.state_dict() for label, fn in zip(self.labels, self._fns)
                if callable(getattr(fn, "state_dict", None)) and callable(getattr(fn, "load_state_dict", None))}

    def load_state_dict(self, state: Mapping[str, Any]) -> list[str]:
        """Restore :meth:`state_dict` into the rewards of the same label; returns the labels restored
        (labels this combination does not have, or whose reward keeps no state, are left alone)."""
        done = []
        for label, fn in zip(self.labels, self._fns):
            if label in state and callable(getattr(fn, "load_state_dict", None)):
                fn.load_state_dict(state[label])
                done.append(label)
        return done

    def __call__(self, completions: Sequence[Any], **columns: Any) -> list[float]:
        return self.compute(completions, columns).total

    def compute(
        self, completions: Sequence[Any], columns: Mapping[str, Any] | None = None, *,
        messages: Sequence[Any] | None = None, dataset_columns: Mapping[str, Any] | None = None,
    ) -> RewardBreakdown:
        """The breakdown for ``completions`` (in the caller's form; ``messages``: the same completions in
        TRL's conversational form, built from strings when not given). ``dataset_columns`` are passed like
        ``columns``, except that a reward's ``kwargs`` of the same name replace them (extra dataset columns
        must not break a configured reward)."""
        columns = dict(columns or {})
        if isinstance(completions, str):
            raise TypeError("completions must be a list of completions, not a single string")
        completions = list(completions)
        n = len(completions)
        for key, value in columns.items():
            if isinstance(value, (list, tuple)) and len(value) != n:
                raise ConfigError(f"reward column {key!r} has {len(value)} values for {n} completions")
        total = [0.0] * n
        components: dict[str, list[float]] = {}
        applicable: dict[str, list[bool]] = {}
        weights: dict[str, float] = {}
        data_cols = {k: v for k, v in (dataset_columns or {}).items() if k not in columns and k != "completions"}
        for spec, fn, locate, form in zip(self.specs, self._fns, self._locate, self._forms):
            label = spec.display_name
            given = (list(messages) if messages is not None else as_messages(completions)) \
                if form == "messages" else completions
            cols = {**{k: v for k, v in data_cols.items() if k not in spec.kwargs}, **columns}
            values = self._run_one(spec, fn, locate, given, cols)
            comp = [0.0 if v is None else v for v in values]
            components[label] = comp
            applicable[label] = [v is not None for v in values]
            weights[label] = spec.weight
            if spec.weight != 0.0:
                for i, v in enumerate(comp):
                    total[i] += spec.weight * v
        return RewardBreakdown(total, components, applicable, weights)

    def _run_one(
        self,
        spec: RewardSpec,
        fn: RewardFn,
        locate: bool,
        completions: list[Any],
        columns: dict[str, Any],
    ) -> list[float | None]:
        label = spec.display_name
        clash = sorted(set(spec.kwargs) & (set(columns) | {"completions"}))
        if clash:
            raise ConfigError(
                f"reward {label!r}: kwargs {clash} clash with dataset columns of the same name; rename them"
            )
        n = len(completions)
        try:
            result = call_reward(fn, completions, {**columns, **spec.kwargs})
        except RewardError:
            raise
        except Exception as exc:
            index = getattr(exc, "mmrl_sample_index", None)
            if index is None and locate and n > 1:
                index = self._locate_failure(fn, spec, completions, columns)
            raise RewardError(
                f"reward {label!r} failed on {_where(columns, index)}: {type(exc).__name__}: {exc}",
                reward=label,
                index=index,
                sample_id=None if index is None else _sample_id(columns, index),
            ) from exc
        values = _to_list(result)
        if values is None:
            raise RewardError(
                f"reward {label!r} returned {type(result).__name__}, expected a list of {n} floats",
                reward=label,
            )
        if len(values) != n:
            raise RewardError(
                f"reward {label!r} returned {len(values)} values for {n} completions",
                reward=label,
            )
        out: list[float | None] = []
        for i, v in enumerate(values):
            try:
                f = _coerce(v)
            except TypeError as exc:
                raise RewardError(
                    f"reward {label!r} returned a non-number for {_where(columns, i)}: {exc}",
                    reward=label,
                    index=i,
                    sample_id=_sample_id(columns, i),
                ) from exc
            if f is not None and not math.isfinite(f):
                raise RewardError(
                    f"reward {label!r} returned a non-finite value {f!r} for {_where(columns, i)}",
                    reward=label,
                    index=i,
                    sample_id=_sample_id(columns, i),
                )
            out.append(f)
        return out

    @staticmethod
    def _locate_failure(fn: RewardFn, spec: RewardSpec, completions: list[Any], columns: dict[str, Any]):
        n = len(completions)
        for i in range(n):
            try:
                call_reward(fn, [completions[i]], {**_slice_columns(columns, i, n), **spec.kwargs})
            except Exception:  # noqa: BLE001 - we only want to know which sample fails
                return i
        return None


def compute_rewards(
    specs: Iterable[Any],
    completions: Sequence[Any],
    columns: Mapping[str, Any] | None = None,
) -> tuple[list[float], dict[str, list[float]]]:
    """``(total, components)`` for a reward config; see :class:`CombinedReward` for the semantics."""
    return CombinedReward(specs).compute(completions, columns).as_tuple()


def per_sample_error(index: int, exc: BaseException) -> BaseException:
    """Tag ``exc`` with the index of the sample that caused it, for the combiner's error message."""
    try:
        exc.mmrl_sample_index = index  # type: ignore[attr-defined]
    except AttributeError:  # pragma: no cover - exceptions without __dict__
        pass
    return exc
