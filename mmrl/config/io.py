"""Typed configuration from YAML and dotted command-line overrides.

Any tree of dataclasses can be filled from a plain dict (parsed YAML) with :func:`from_dict`. Values are
checked against the field's type annotation; an unknown key is rejected with the nearest valid key, and a
value of the wrong type names the dotted key, the expected type and the value received. Overrides use the
form ``section.key=value`` where the value is parsed as a YAML scalar or flow collection
(``train.lr=1e-5``, ``rollout.stop=["</answer>"]``).
"""

from __future__ import annotations

import dataclasses
import difflib
import types
import typing
from pathlib import Path
from typing import Any, Literal, TypeVar, Union, get_args, get_origin, get_type_hints

import yaml

from mmrl_common.errors import ConfigError

T = TypeVar("T")


BOOL_WORDS = {"true": "true", "false": "false", "yes": "true", "no": "false", "on": "true", "off": "false"}
"""Strings a quoted YAML or JSON boolean arrives as, and the value they spell."""


def _type_name(tp: Any) -> str:
    if get_origin(tp) is Literal:
        return " | ".join(repr(a) for a in get_args(tp))
    if get_origin(tp) in (Union, types.UnionType):
        return " | ".join(_type_name(a) for a in get_args(tp))
    if tp is type(None):
        return "null"
    if dataclasses.is_dataclass(tp):
        return f"a mapping ({tp.__name__})"
    return getattr(tp, "__name__", str(tp))


def _nearest(key: str, valid: list[str], prefix: str = "") -> str:
    """A hint naming the closest valid key in full (``train.steps``), or listing the valid ones."""
    close = difflib.get_close_matches(key, valid, n=1, cutoff=0.5)
    dotted = f"{prefix}." if prefix else ""
    if close:
        return f"did you mean '{dotted}{close[0]}'?"
    return "valid keys: " + ", ".join(dotted + k for k in sorted(valid))


def _convert(value: Any, tp: Any, key: str) -> Any:
    """Check (and lightly coerce) one value against an annotation; raise ConfigError naming the key."""
    origin = get_origin(tp)
    if tp is Any:
        return value
    if origin in (Union, types.UnionType):
        options = get_args(tp)
        if value is None and type(None) in options:
            return None
        errors = []
        for option in options:
            if option is type(None):
                continue
            try:
                return _convert(value, option, key)
            except ConfigError as exc:
                errors.append(exc)
        sections = [o for o in options if dataclasses.is_dataclass(o)]
        if isinstance(value, bool) and sections:  # `lora: true`: a section is switched on by its settings
            fields = ", ".join(f.name for f in dataclasses.fields(sections[0]) if f.init)
            raise ConfigError(f"{key}: {str(value).lower()} does not switch this section on or off: give a "
                              f"mapping of its settings ({fields}); {key}={{}} (in YAML `{key.rsplit('.', 1)[-1]}: {{}}`) "
                              "takes the defaults, null or leaving it out turns it off")
        raise ConfigError(f"{key}: expected {_type_name(tp)}, got {value!r}")
    if origin is Literal:
        if value in get_args(tp):
            return value
        raise ConfigError(f"{key}: expected one of {_type_name(tp)}, got {value!r}")
    if dataclasses.is_dataclass(tp):
        if isinstance(value, tp):
            return value
        if not isinstance(value, dict):
            raise ConfigError(f"{key}: expected {_type_name(tp)}, got {value!r}")
        return from_dict(tp, value, prefix=key)
    if origin in (list, tuple, typing.Sequence) or tp in (list, tuple):
        if isinstance(value, tuple):
            value = list(value)
        if not isinstance(value, list):
            raise ConfigError(f"{key}: expected a list, got {value!r}")
        args = get_args(tp)
        item_tp = args[0] if args else Any
        return [_convert(v, item_tp, f"{key}[{i}]") for i, v in enumerate(value)]
    if origin is dict or tp is dict:
        if not isinstance(value, dict):
            raise ConfigError(f"{key}: expected a mapping, got {value!r}")
        args = get_args(tp)
        val_tp = args[1] if len(args) == 2 else Any
        return {str(k): _convert(v, val_tp, f"{key}.{k}") for k, v in value.items()}
    if tp is bool:
        if isinstance(value, bool):
            return value
        if isinstance(value, str) and value.strip().lower() in BOOL_WORDS:  # `"false"`, quoted in YAML
            raise ConfigError(f"{key}: expected true or false, got the string {value!r} (quoted); write it "
                              f"without quotes: {key.rsplit('.', 1)[-1]}: {BOOL_WORDS[value.strip().lower()]}")
        raise ConfigError(f"{key}: expected true or false, got {value!r}")
    if tp is int:
        if isinstance(value, int) and not isinstance(value, bool):
            return value
        if isinstance(value, float) and value.is_integer():
            return int(value)
        raise ConfigError(f"{key}: expected an integer, got {value!r}")
    if tp is float:
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            return float(value)
        if isinstance(value, str):  # YAML 1.1 reads "1e-5" as a string
            try:
                return float(value)
            except ValueError:
                pass
        raise ConfigError(f"{key}: expected a number, got {value!r}")
    if tp is str:
        if isinstance(value, str):
            return value
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            return str(value)
        raise ConfigError(f"{key}: expected a string, got {value!r}")
    if tp is Path:
        if isinstance(value, (str, Path)):
            return Path(value)
        raise ConfigError(f"{key}: expected a path, got {value!r}")
    return value


def from_dict(cls: type[T], data: dict[str, Any] | None, prefix: str = "") -> T:
    """Build dataclass ``cls`` from ``data``; unknown keys and wrong types raise :class:`ConfigError`."""
    data = dict(data or {})
    hints = get_type_hints(cls)
    fields = {f.name: f for f in dataclasses.fields(cls) if f.init}
    kwargs = {}
    for key, value in data.items():
        dotted = f"{prefix}.{key}" if prefix else str(key)
        if key not in fields:
            head, _, rest = str(key).partition(".")
            if rest and head in fields:  # `train.lr: 1e-3` in a YAML file: a KEY=VALUE override's spelling
                inner = yaml.safe_dump({rest: value}, default_flow_style=True, width=10_000).strip()
                raise ConfigError(f"unknown config key '{dotted}': a YAML config nests its sections, a dotted key "
                                  f"is for KEY=VALUE on the command line; nest it: {head}: {inner}")
            raise ConfigError(f"unknown config key '{dotted}': {_nearest(str(key), list(fields), prefix)}")
        kwargs[key] = _convert(value, hints[key], dotted)
    try:
        return cls(**kwargs)
    except (TypeError, ValueError) as exc:
        where = prefix or cls.__name__
        raise ConfigError(f"{where}: {exc}") from exc


def to_dict(obj: Any) -> Any:
    """Plain-data view of a dataclass tree (for YAML dumps and logs)."""
    if dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        return {f.name: to_dict(getattr(obj, f.name)) for f in dataclasses.fields(obj)}
    if isinstance(obj, (list, tuple)):
        return [to_dict(v) for v in obj]
    if isinstance(obj, dict):
        return {k: to_dict(v) for k, v in obj.items()}
    if isinstance(obj, Path):
        return str(obj)
    return obj


def field_docs(cls: type) -> dict[str, str]:
    """The meaning of each field of dataclass ``cls``: its docstring (the string literal under the field), else
    the module docstring's bullet that names it (``* ``name=...`` -- text``), else the comment heading the
    group of fields it belongs to; "" when there is none."""
    import ast
    import inspect
    import re
    import sys
    import textwrap

    try:
        source = textwrap.dedent(inspect.getsource(cls))
    except (OSError, TypeError):
        return {}
    body = ast.parse(source).body[0].body
    lines = source.splitlines()
    module_doc = (sys.modules[cls.__module__].__doc__ or "") if cls.__module__ in sys.modules else ""
    bullets = [b.replace("\n", " ") for b in re.split(r"\n\s*\* ", module_doc)]
    docs: dict[str, str] = {}
    section, last_line = "", 0
    for i, node in enumerate(body):
        if not isinstance(node, ast.AnnAssign) or not isinstance(node.target, ast.Name):
            continue
        for text in lines[last_line:node.lineno - 1]:  # comments since the previous field
            if text.strip().startswith("#"):
                section = text.strip().lstrip("# ").strip()
        last_line = node.end_lineno or node.lineno
        name = node.target.id
        nxt = body[i + 1] if i + 1 < len(body) else None
        if isinstance(nxt, ast.Expr) and isinstance(nxt.value, ast.Constant) and isinstance(nxt.value.value, str):
            docs[name] = " ".join(nxt.value.value.split())
            last_line = nxt.end_lineno or last_line
            continue
        bullet = next((b for b in bullets if f"``{name}=" in b and " -- " in b), None)
        if bullet is not None:
            text = " ".join(bullet.replace("``", "").split())
            docs[name] = f"{section}: {text}" if section else text
        else:
            docs[name] = section
    return docs


def describe(obj: Any, prefix: str = "", meaning: str = "") -> list[tuple[str, Any, str]]:
    """``(dotted key, value, meaning)`` for every leaf of a dataclass tree (list entries of dataclasses are
    described one by one, ``rewards[0].weight``)."""
    if dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        docs = field_docs(type(obj))
        out: list[tuple[str, Any, str]] = []
        for f in dataclasses.fields(obj):
            key = f"{prefix}.{f.name}" if prefix else f.name
            out += describe(getattr(obj, f.name), key, docs.get(f.name, ""))
        return out
    if isinstance(obj, list) and obj and all(dataclasses.is_dataclass(v) for v in obj):
        rows: list[tuple[str, Any, str]] = []
        for i, v in enumerate(obj):
            rows += describe(v, f"{prefix}[{i}]", meaning)
        return [(k, val, m or meaning) for k, val, m in rows]
    return [(prefix, to_dict(obj), meaning)]


def parse_override(text: str) -> tuple[list[str], Any]:
    """``"a.b.c=value"`` -> (["a", "b", "c"], parsed value)."""
    if "=" not in text:
        raise ConfigError(f"override '{text}' must look like section.key=value")
    key, raw = text.split("=", 1)
    key = key.strip().lstrip("-")
    if not key:
        raise ConfigError(f"override '{text}' has an empty key")
    try:
        value = yaml.safe_load(raw) if raw.strip() else ""
    except yaml.YAMLError:
        value = raw
    return key.split("."), value


def apply_overrides(cls: type, data: dict[str, Any], overrides: list[str]) -> dict[str, Any]:
    """Apply dotted overrides to a plain dict, checking every key path against dataclass ``cls``."""
    data = dict(data)
    for text in overrides:
        path, value = parse_override(text)
        node, tp = data, cls
        for depth, part in enumerate(path):
            dotted = ".".join(path[: depth + 1])
            if dataclasses.is_dataclass(tp):
                names = [f.name for f in dataclasses.fields(tp)]
                if part not in names:
                    raise ConfigError(f"unknown config key '{dotted}': {_nearest(part, names, '.'.join(path[:depth]))}")
                field_tp = _strip_optional(get_type_hints(tp)[part])
            else:
                field_tp = Any
            if depth == len(path) - 1:
                node[part] = value
            else:
                child = node.get(part)
                if not isinstance(child, dict):
                    child = {}
                node[part] = child = dict(child)
                node, tp = child, field_tp
    return data


def _strip_optional(tp: Any) -> Any:
    if get_origin(tp) in (Union, types.UnionType):
        args = [a for a in get_args(tp) if a is not type(None)]
        if len(args) == 1:
            return args[0]
    return tp


def load_yaml(path: str | Path, *, what: str = "config file", expected: str = "a mapping of sections"
              ) -> dict[str, Any]:
    """A YAML file whose top level is a mapping (empty: ``{}``); ``what`` and ``expected`` name the kind of
    file and its top level in the errors."""
    path = Path(path)
    if not path.is_file():
        raise ConfigError(f"{what} not found: {path}")
    try:
        data = yaml.safe_load(path.read_text()) or {}
    except yaml.YAMLError as exc:
        raise ConfigError(f"{path}: not valid YAML: {' '.join(str(exc).split())}") from None
    if not isinstance(data, dict):
        raise ConfigError(f"{what} {path}: the top level must be {expected}")
    return data


def deep_merge(base: dict[str, Any], extra: dict[str, Any]) -> dict[str, Any]:
    """Recursive dict merge; ``extra`` wins."""
    out = dict(base)
    for key, value in extra.items():
        if isinstance(value, dict) and isinstance(out.get(key), dict):
            out[key] = deep_merge(out[key], value)
        else:
            out[key] = value
    return out
