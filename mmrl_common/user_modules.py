"""Importing the user's own Python code the way ``python`` would: a module named in a config (``imports:``
entries, a reward's ``module.fn``) is looked up in the working folder too, as ``python -m`` puts it first on
the import path (the ``mmrl`` console script does not), and a ``.py`` file's own folder is importable while the
file loads, as ``python file.py`` has it, so ``from helpers import x`` finds ``helpers.py`` beside it. A module
that cannot be found is a :class:`ConfigError` naming it, the folders searched and the fix.
"""

from __future__ import annotations

import contextlib
import importlib
import os
import sys
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType

from mmrl_common.errors import ConfigError


@contextlib.contextmanager
def first_on_path(folder: str | Path) -> Iterator[None]:
    """``folder`` first on ``sys.path`` for the duration (unless it is there already); the modules imported
    meanwhile stay imported."""
    folder = os.path.abspath(folder)
    if folder in (os.path.abspath(p or os.curdir) for p in sys.path):
        yield
        return
    sys.path.insert(0, folder)
    try:
        yield
    finally:
        with contextlib.suppress(ValueError):
            sys.path.remove(folder)


def missing_module_hint(exc: ModuleNotFoundError, folder: str | Path, *, own: str | None = None) -> str:
    """What to do about ``exc`` raised while importing with ``folder`` first on the path: the module ``own``
    itself missing, or a module it imports."""
    name = exc.name or str(exc)
    top = name.split(".")[0]
    if own is not None and (own == name or own.startswith(name + ".")):
        return (f"no module named {name!r} in {folder} (the working folder) or the installed packages; run mmrl "
                f"from the folder that holds {top}.py (or the package {top}/), add that folder to PYTHONPATH, or "
                f"name the file in imports: (imports: [path/to/{top}.py])")
    return (f"it imports {name!r}, which is neither beside it in {folder} nor installed: put {top}.py in {folder}, "
            "add its folder to PYTHONPATH, or pip install the package")


def import_user_module(name: str, *, what: str) -> ModuleType:
    """Import module ``name`` with the working folder first on the path (as ``python -m`` has it); ``what``
    begins the error (``imports``, ``rewards[0]: reward 'mod.fn'``)."""
    cwd = Path.cwd()
    try:
        with first_on_path(cwd):
            return importlib.import_module(name)
    except ModuleNotFoundError as exc:
        raise ConfigError(f"{what}: cannot import {name!r}: {missing_module_hint(exc, cwd, own=name)}") from None
    except ConfigError:
        raise
    except Exception as exc:
        raise ConfigError(f"{what}: {name} failed to import: {type(exc).__name__}: {exc}") from exc
