"""Shared by the ``test_published_<method>.py`` tests: a recipe's value at a dotted path, checked against the
published setting (a float within pytest.approx), the failure naming the recipe file, the value and the source."""

from __future__ import annotations

from typing import Any

import pytest

from mmrl.config import load_run_config, value_at


def recipe_value(cfg: Any, path: str) -> Any:
    """``cfg``'s value at ``path`` (``train.lr``, ``data.sampler_kwargs.alpha``, ``rewards[0].kwargs.answer_from``:
    attributes, mapping keys and list entries, :func:`mmrl.config.value_at`)."""
    return value_at(cfg, path)


def assert_published(task: str, path: str, value: Any, source: str) -> None:
    got = recipe_value(load_run_config(task), path)
    assert got == pytest.approx(value) if isinstance(value, float) else got == value, (
        f"configs/{task}.yaml {path} = {got!r}, published {value!r} ({source})")
