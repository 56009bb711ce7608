"""MMVU (yale-nlp/MMVU), validation split, multiple-choice part.

Layout: ``validation.json`` (items with ``id``, ``video`` — a Hub URL ending in ``…/resolve/main/videos/<subject>/<n>.mp4``
or a relative path —, ``question_type`` ``multiple-choice``/``open-ended``, ``metadata.subject``, ``question``,
``choices`` ``{"A": …, "E": …}`` with empty strings for unused letters, ``answer``) and ``videos/<subject>/<n>.mp4``.
Open-ended questions need an LLM judge and are left out (counted in the info). Research notes: research/eval.md §3.2.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from data_pipelines.benchmarks._common import (
    BenchmarkData,
    check_root,
    find_media,
    first_existing,
    layout_error,
    read_json,
    register_benchmark,
)
from data_pipelines.schema import MediaItem, Sample
from mmrl_common.errors import DataError

TITLE = "MMVU"
EXPECTED = (
    "validation.json                  the validation questions (or data/validation.json)",
    "videos/<subject>/<n>.mp4         the videos, as in the dataset repository",
)


def _relative(video: str) -> str:
    for marker in ("/resolve/main/", "/blob/main/"):
        if marker in video:
            return video.split(marker, 1)[1]
    return video


@register_benchmark("mmvu", title=TITLE, kind="video_mc", splits=("val",))
def load_mmvu(root: Path, *, split: str, media_cache: Path, **_: Any) -> BenchmarkData:
    root = check_root(TITLE, root, EXPECTED)
    path = first_existing([root / "validation.json", root / "data" / "validation.json"])
    if path is None:
        raise layout_error(TITLE, root, "no validation.json", EXPECTED)
    items = read_json(path)
    if not isinstance(items, list):
        raise DataError(f"{path}: expected a JSON list of questions")
    samples: list[Sample] = []
    open_ended = 0
    for i, raw in enumerate(items):
        where = f"{path}: item {i}"
        if raw.get("question_type") != "multiple-choice":
            open_ended += 1
            continue
        choices = raw.get("choices") or {}
        letters = sorted(k for k, v in choices.items() if str(v).strip())
        if letters != list("ABCDEFGH"[: len(letters)]) or len(letters) < 2:
            raise DataError(f"{where}: choices must fill the letters A.. in order, got {sorted(choices)}")
        answer = str(raw.get("answer", "")).strip().upper()
        if answer not in letters:
            raise DataError(f"{where}: answer {raw.get('answer')!r} is not one of {letters}")
        rel = _relative(str(raw.get("video", "")))
        video, _ = find_media([root, root / "videos"], rel)
        if video is None:
            raise layout_error(TITLE, root, f"{where}: video '{rel}' not found", EXPECTED)
        meta = raw.get("metadata") or {}
        samples.append(Sample(
            id=str(raw.get("id", i)), problem_type="multiple_choice", question=str(raw["question"]),
            options=[str(choices[k]) for k in letters], answer=answer, media=[MediaItem("video", str(video))],
            meta={"subject": str(meta.get("subject")), "source": "mmvu"},
        ))
    return BenchmarkData("mmvu", root, samples, {"split": split, "file": str(path),
                                                  "open_ended_skipped": open_ended})
