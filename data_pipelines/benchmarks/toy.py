"""The toy world as a benchmark: ``<root>/test.jsonl`` (or ``val.jsonl``) with its ``media/`` folder."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from data_pipelines.benchmarks._common import (
    Benchmark,
    BenchmarkData,
    check_root,
    layout_error,
    register_benchmark,
)

EXPECTED = ("test.jsonl, val.jsonl              records of the split (mmrl data make-toy --out DIR)",
            "media/<split>/<task>/...           the videos and scans")


def load_toy(root: Path, *, split: str, media_cache: Path, **_: Any) -> BenchmarkData:
    from data_pipelines.loaders import load_samples

    root = check_root("toy world", root, EXPECTED)
    path = root / f"{split}.jsonl"
    if not path.is_file():
        raise layout_error("toy world", root, f"no {split}.jsonl", EXPECTED)
    result = load_samples(path, check_media=True)
    return BenchmarkData("toy", root, result.samples, {"split": split, "file": str(path)})


def toy_fixture(out: Path, *, n: int, seed: int, **_: Any) -> Path:
    """A toy world with ``n`` test questions of the colour (video) and scan (image) tasks."""
    from data_pipelines.toy import make_toy

    return make_toy(out, seed, size={"train": 0, "val": 0, "test": n}, tasks=["color", "scan"], progress=False)


TOY = register_benchmark(Benchmark(
    name="toy", title="toy world", reader=load_toy, splits=("test", "val"), kind="toy",
    # the training recipe's media settings and prompt (mmrl.config defaults), whatever --protocol qwen asks
    official={"video_policy": "qwen", "max_frames": 16, "video_max_pixels": 64 * 28 * 28,
              "image_max_pixels": 256 * 28 * 28, "template": "reasoning", "max_new_tokens": 64,
              "source": "mmrl video-qa recipe defaults"},
    fixed_protocol=True, breakdowns=("task", "problem_type"), fixture=toy_fixture,
))
