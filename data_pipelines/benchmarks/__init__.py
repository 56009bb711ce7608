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

Register more with :func:`register_benchmark`.
"""

from __future__ import annotations

import os
from typing import Any

from data_pipelines.benchmarks._common import (
    READERS,
    BenchmarkData,
    BenchmarkReader,
    LayoutError,
    read_with,
    register_benchmark,
)

__all__ = ["BenchmarkData", "LayoutError", "available_benchmarks", "get_benchmark", "load_benchmark",
           "register_benchmark"]


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
    return READERS.names()


def get_benchmark(name: str) -> BenchmarkReader:
    """The reader of benchmark ``name`` (any spelling or alias); :class:`ConfigError` naming the valid ones."""
    _builtins()
    return READERS.get(name)


def load_benchmark(name: str, root: str | os.PathLike[str], *, split: str | None = None,
                   media_cache: str | os.PathLike[str] | None = None, **options: Any) -> BenchmarkData:
    """Read benchmark ``name`` from ``root``. ``split`` defaults to the benchmark's evaluation split;
    ``media_cache`` is where images embedded in Parquet files are written (default: the mmrl cache)."""
    return read_with(get_benchmark(name), root, split=split, media_cache=media_cache, **options)
