"""User code named by the run config (``imports:``), imported before any registry is read.

Each entry is a module name (``my_pkg.my_method``, importable from the current environment or the working
directory, as with ``python -m``) or a Python file (``./methods/acre_variant.py``; relative paths resolve against
the folder of the config file that named them, else the working directory; the file's own folder is importable
while it loads, so it may import a module beside it). Importing is what registers the file's rewards, samplers, environments,
plug-ins, shapers, losses and estimators, so their names become valid config values with no engine edit.
A file is imported once per process, under a module name derived from its absolute path.
"""

from __future__ import annotations

import hashlib
import importlib
import importlib.util
import sys
from collections.abc import Iterable
from pathlib import Path
from types import ModuleType

from mmrl_common.errors import ConfigError
from mmrl_common.user_modules import first_on_path, import_user_module, missing_module_hint


def is_file_entry(entry: str) -> bool:
    return entry.endswith(".py") or "/" in entry or "\\" in entry


def resolve_entries(entries: Iterable[str], base: str | Path | None = None) -> list[str]:
    """File entries made absolute (against ``base``, else the working directory); module names unchanged."""
    out: list[str] = []
    for entry in entries or []:
        if not isinstance(entry, str) or not entry.strip():
            raise ConfigError(f"imports: each entry must be a module name or a .py file, got {entry!r}")
        entry = entry.strip()
        if is_file_entry(entry):
            path = Path(entry).expanduser()
            if not path.is_absolute():
                path = (Path(base) if base else Path.cwd()) / path
            entry = str(path.resolve())
        out.append(entry)
    return out


def import_entry(entry: str) -> ModuleType:
    """Import one ``imports:`` entry; a :class:`ConfigError` names the entry and what went wrong."""
    if is_file_entry(entry):
        path = Path(entry)
        if not path.is_file():
            raise ConfigError(f"imports: file not found: {entry}")
        name = f"mmrl_user.{path.stem}_{hashlib.sha1(str(path).encode()).hexdigest()[:10]}"
        if name in sys.modules:
            return sys.modules[name]
        spec = importlib.util.spec_from_file_location(name, path)
        if spec is None or spec.loader is None:
            raise ConfigError(f"imports: {entry} cannot be imported as a Python file")
        module = importlib.util.module_from_spec(spec)
        sys.modules[name] = module
        try:
            with first_on_path(path.parent):  # as `python file.py`: a module beside the file is importable
                spec.loader.exec_module(module)
        except ModuleNotFoundError as exc:
            del sys.modules[name]
            raise ConfigError(f"imports: {entry} failed to import: {missing_module_hint(exc, path.parent)}") from None
        except Exception as exc:
            del sys.modules[name]
            raise ConfigError(f"imports: {entry} failed to import: {type(exc).__name__}: {exc}") from exc
        return module
    return import_user_module(entry, what="imports")


def import_all(entries: Iterable[str], base: str | Path | None = None) -> list[str]:
    """Import every entry (resolved as :func:`resolve_entries` does); returns the resolved entries."""
    resolved = resolve_entries(entries, base)
    for entry in resolved:
        import_entry(entry)
    return resolved
