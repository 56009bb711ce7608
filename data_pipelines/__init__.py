"""Datasets for mmrl: the sample schema, loaders, importers, validation, inspection and the toy world.

The light pieces import eagerly; the toy world, validation and inspection (which pull in the video and
image decoders) load on first use.
"""

from __future__ import annotations

from typing import Any

from .importers import detect_record_format, register_importer
from .loaders import LoadResult, load_samples, write_jsonl
from .schema import (
    MediaItem,
    Problem,
    Sample,
    check_record,
    normalize_problem_type,
    problem_types,
    register_problem_type,
    validate_sample,
)

_LAZY = {
    "make_toy": ("data_pipelines.toy", "make_toy"),
    "ensure_toy": ("data_pipelines.toy", "ensure_toy"),
    "validate_dataset": ("data_pipelines.validate", "validate_dataset"),
    "ValidationReport": ("data_pipelines.validate", "ValidationReport"),
    "inspect_dataset": ("data_pipelines.inspect", "inspect_dataset"),
}


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        import importlib

        module, attr = _LAZY[name]
        return getattr(importlib.import_module(module), attr)
    raise AttributeError(f"module 'data_pipelines' has no attribute {name!r}")


__all__ = [
    "LoadResult", "MediaItem", "Problem", "Sample", "ValidationReport", "check_record", "detect_record_format",
    "ensure_toy", "inspect_dataset", "load_samples", "make_toy", "normalize_problem_type", "problem_types",
    "register_importer", "register_problem_type", "validate_dataset", "validate_sample", "write_jsonl",
]
