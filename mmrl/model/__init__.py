"""The model package: a Qwen-VL policy behind one front (:class:`Policy`), its plain types, options, loading,
media encoding and vision cache, input building, log-prob passes, generation, LoRA, RoPE and packing.

It imports nothing of the engine (the trainer, rollouts, the run): ``tests/test_layers.py`` checks it.

A lazy front: importing the package imports no torch. The torch-free names (:data:`FAMILIES` of
:mod:`mmrl.model.families`, the options of :mod:`mmrl.model.options`) are bound at once; the others are imported
from their module on first use (``from mmrl.model import Policy`` imports :mod:`mmrl.model.policy`).
"""

from __future__ import annotations

from typing import Any

from mmrl_common.lazy_front import lazy_front

from .families import FAMILIES
from .options import PolicyOptions, RankBinding

# the module of the package that defines each name imported on first use
_HOMES: dict[str, tuple[str, ...]] = {
    "folder": ("adapter_base", "check_model_dir"),
    "loading": ("load_policy", "resolve_device", "warn_cpu_fallback"),
    "policy": ("Policy", "checkpointing_switch"),
    "types": ("IMAGE", "TEXT", "VIDEO", "EncodedMedia", "Generation", "MediaInput", "MediaStore", "TokenSeq"),
}

__all__ = [
    "FAMILIES", "IMAGE", "TEXT", "VIDEO", "EncodedMedia", "Generation", "MediaInput", "MediaStore", "Policy",
    "PolicyOptions", "RankBinding", "TokenSeq", "adapter_base", "check_model_dir", "checkpointing_switch",
    "load_policy", "resolve_device", "warn_cpu_fallback",
]


def _load(home: str) -> dict[str, Any]:
    """The names of the package's module ``home`` (import statements: ``tests/test_layers.py`` reads them)."""
    if home == "folder":
        from .folder import adapter_base, check_model_dir  # noqa: F401
    elif home == "loading":
        from .loading import load_policy, resolve_device, warn_cpu_fallback  # noqa: F401
    elif home == "policy":
        from .policy import Policy, checkpointing_switch  # noqa: F401
    elif home == "types":
        from .types import (  # noqa: F401  (the names are returned by locals())
            IMAGE,
            TEXT,
            VIDEO,
            EncodedMedia,
            Generation,
            MediaInput,
            MediaStore,
            TokenSeq,
        )
    return {k: v for k, v in locals().items() if k != "home"}


__getattr__, __dir__ = lazy_front(globals(), _HOMES, _load)
