"""Tiny copies of each benchmark in its exact public layout, built from toy-world media.

``write_fixture("mvbench", out)`` writes a handful of questions with real MP4 videos (and, for MVBench's
Episodic Reasoning, a 3-fps JPEG frame folder; for the medical sets, PNG scans embedded in Parquet files or
in an ``imgs/`` folder) so the readers and the evaluator can be exercised end to end without downloads. The
questions are the toy world's (colour of the moving object, lesion presence and location), so a trained
model can actually answer them.

The four video benchmarks (MVBench, Video-MME, LongVideoBench, MMVU) also carry what real downloads have: one
video stored with an upper-case ``.MP4`` extension, ``n`` answerable questions plus ONE extra question whose video
is missing (always the last question read; ``n + 1`` in all), and subtitles where the benchmark has them (a
Video-MME ``.srt`` with ``<font>`` / ``{\\an8}`` markup, LongVideoBench subtitle JSON files in both of its formats).
``write_fixture("mmvu", out, layout="lmms-eval")`` writes MMVU as lmms-eval downloads it (``lmms-eval/MMVU``:
``data/validation-00000-of-00001.parquet`` with ``video_path``) instead of the yale-nlp layout.

Each benchmark writes its own copy: the ``fixture`` of its :class:`~data_pipelines.benchmarks.Benchmark` spec, a
function in its module (``mvbench.mvbench_fixture``, ...) built on :func:`~data_pipelines.benchmarks._common.
toy_questions`; :func:`write_fixture` looks it up by name.
"""

from __future__ import annotations

from pathlib import Path

from data_pipelines.benchmarks import benchmarks, find_benchmark


def fixture_names() -> list[str]:
    """The benchmarks that can write a fixture, in registration order."""
    return [b.name for b in benchmarks() if b.fixture is not None]


def write_fixture(name: str, out: str | Path, *, seed: int = 0, n: int = 4, layout: str | None = None) -> Path:
    """Write a ``n``-question copy of benchmark ``name`` in its public layout into ``out`` (the video benchmarks:
    ``n`` answerable questions and one more whose video is missing). ``layout`` picks another layout the
    benchmark's fixture can write (``fixture_layouts``: MMVU's ``"lmms-eval"``); returns the folder."""
    spec = find_benchmark(name)
    if spec is None or spec.fixture is None:
        raise ValueError(f"no fixture for {name!r}; fixtures: {', '.join(fixture_names())}")
    if layout is not None and layout not in spec.fixture_layouts:
        other = f" ({spec.title} has {', '.join(repr(x) for x in spec.fixture_layouts)})" if spec.fixture_layouts \
            else ""
        raise ValueError(f"no layout {layout!r} for the {name!r} fixture{other}")
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    got = spec.fixture(out, n=n, seed=seed, **({"layout": layout} if layout is not None else {}))
    return Path(got) if got is not None else out
