"""Readers for evaluation benchmarks, in the file layouts their publishers ship.

``load_benchmark(name, root)`` returns a :class:`BenchmarkData` whose samples are ordinary
:class:`~data_pipelines.schema.Sample` records (multiple choice with an option letter as the answer, or
yes/no and open questions for the medical sets), with the fields each benchmark's breakdowns need in
``meta`` (MVBench ``task``; Video-MME ``duration``, ``domain``, ``sub_category``, ``task_type``; ...).
A missing or mis-laid-out folder raises :class:`LayoutError` saying what was expected where.

| name | layout read |
| --- | --- |
| ``mvbench`` | ``json/<task>.json`` + videos under ``video/<folder>/`` (main branch) or ``<folder>/`` (video branch) |
| ``videomme`` | ``videomme/test-*.parquet`` + ``data/<videoID>.mp4`` (+ ``subtitle/<videoID>.srt``) |
| ``longvideobench`` | ``lvb_val.json`` + ``videos/<video_path>`` |
| ``mmvu`` | ``validation.json`` + ``videos/<subject>/<n>.mp4``, or lmms-eval's ``data/validation-*.parquet`` (``video_path``) (multiple-choice questions) |
| ``vqa-rad``, ``pathvqa`` | ``data/<split>-*.parquet`` (image bytes, question, answer) |
| ``slake`` | ``<split>.json`` + ``imgs/<img_name>`` |
| ``toy`` | the toy world (``test.jsonl`` + ``media/``), as ``mmrl data make-toy`` writes it |

Each benchmark is one :class:`Benchmark` spec registered from its own module (``mvbench.py``, ...): its reader,
protocols and prompts, frame rule, headline metric and conventions, breakdowns, lmms-eval task names and
fixture; the evaluator (:mod:`mmrl.benchmarks`) and the lmms-eval bridge read the spec and nothing else.
Add one with :func:`register_benchmark` (README, "Adding a benchmark").
"""

from __future__ import annotations

import os
from typing import Any

from data_pipelines.benchmarks._common import (
    BENCHMARKS,
    Benchmark,
    BenchmarkData,
    LayoutError,
    copy_media,
    option_lines,
    plain_options,
    read_with,
    register_benchmark,
    toy_questions,
)

__all__ = ["Benchmark", "BenchmarkData", "LayoutError", "available_benchmarks", "benchmarks", "copy_media",
           "find_benchmark", "get_benchmark", "load_benchmark", "option_lines", "plain_options",
           "register_benchmark", "toy_questions"]


def _builtins() -> None:
    from data_pipelines.benchmarks import (  # noqa: F401  (readers register on import)
        lvb,
        medical,
        mmvu,
        mvbench,
        toy,
        videomme,
    )


def available_benchmarks() -> list[str]:
    _builtins()
    return BENCHMARKS.names()


def get_benchmark(name: str) -> Benchmark:
    """The spec of benchmark ``name`` (any spelling or alias); :class:`ConfigError` naming the valid ones."""
    _builtins()
    return BENCHMARKS.get(name)


def find_benchmark(name: str) -> Benchmark | None:
    """The spec of benchmark ``name`` (any spelling or alias), None when no benchmark has that name."""
    _builtins()
    return BENCHMARKS.find(name)


def benchmarks() -> list[Benchmark]:
    """Every registered spec, in registration order."""
    _builtins()
    return BENCHMARKS.values()


def load_benchmark(name: str, root: str | os.PathLike[str], *, split: str | None = None,
                   media_cache: str | os.PathLike[str] | None = None, **options: Any) -> BenchmarkData:
    """Read benchmark ``name`` from ``root``. ``split`` defaults to the benchmark's evaluation split;
    ``media_cache`` is where images embedded in Parquet files are written (default: the mmrl cache)."""
    return read_with(get_benchmark(name), root, split=split, media_cache=media_cache, **options)
