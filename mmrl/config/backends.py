"""The rollout backends by name (``rollout.backend``): the registry alone, apart from :mod:`mmrl.engine.rollout` (which
registers ``hf`` and ``vllm`` in it), so that the configuration can check a backend's name without importing the
engines (and the engines may read the configuration's helpers without an import cycle)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from mmrl_common.registry import Registry

BACKENDS: Registry[Callable[..., Any]] = Registry("rollout backend", "rollout.backend")
"""``name -> fn(policy, **kwargs) -> RolloutBackend`` (:class:`mmrl.engine.rollout.RolloutBackend`)."""
register_backend = BACKENDS.register
