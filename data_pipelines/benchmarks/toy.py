"""The toy world as a benchmark: ``<root>/test.jsonl`` (or ``val.jsonl``) with its ``media/`` folder."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from data_pipelines.benchmarks._common import BenchmarkData, check_root, layout_error, register_benchmark

EXPECTED = ("test.jsonl, val.jsonl              records of the split (mmrl data make-toy --out DIR)",
            "media/<split>/<task>/...           the videos and scans")


@register_benchmark("toy", title="toy world", kind="toy", splits=("test", "val"))
def load_toy(root: Path, *, split: str, media_cache: Path, **_: Any) -> BenchmarkData:
    from data_pipelines.loaders import load_samples

    root = check_root("toy world", root, EXPECTED)
    path = root / f"{split}.jsonl"
    if not path.is_file():
        raise layout_error("toy world", root, f"no {split}.jsonl", EXPECTED)
    result = load_samples(path, check_media=True)
    return BenchmarkData("toy", root, result.samples, {"split": split, "file": str(path)})
