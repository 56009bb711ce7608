"""LongVideoBench (longvideobench/LongVideoBench), validation split (the test split has no answers).

Layout: ``lvb_val.json`` (items with ``id``, ``video_path``, ``question``, ``candidates`` — or
``option0..option4`` with ``"N/A"`` for unused ones, as in the Parquet copy — ``correct_choice`` (int),
``duration``, ``duration_group``, ``question_category``, ``topic_category``, ``subtitle_path``) and the videos
from ``videos.tar.part.*`` in ``videos/``. Research notes: research/eval.md §3.1.
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
from data_pipelines.schema import MediaItem, Sample, option_letter
from mmrl_common.errors import DataError

TITLE = "LongVideoBench"
EXPECTED = (
    "lvb_val.json                     the validation questions (with correct_choice)",
    "videos/<video_path>              videos extracted from videos.tar.part.*",
    "subtitles/<subtitle_path>        optional",
)


def _options(raw: dict[str, Any]) -> list[str]:
    if isinstance(raw.get("candidates"), list):
        return [str(c) for c in raw["candidates"]]
    out = []
    for k in range(5):
        v = raw.get(f"option{k}")
        if v is None or str(v) == "N/A":
            break
        out.append(str(v))
    return out


@register_benchmark("longvideobench", title=TITLE, kind="video_mc", splits=("val",),
                    aliases=("lvb", "long-video-bench"))
def load_lvb(root: Path, *, split: str, media_cache: Path, **_: Any) -> BenchmarkData:
    root = check_root(TITLE, root, EXPECTED)
    path = first_existing([root / "lvb_val.json", root / "val.json"])
    if path is None:
        hint = " (lvb_test_wo_gt.json has no answers; evaluate the validation split)" if (
            root / "lvb_test_wo_gt.json").exists() else ""
        raise layout_error(TITLE, root, "no lvb_val.json" + hint, EXPECTED)
    items = read_json(path)
    if not isinstance(items, list):
        raise DataError(f"{path}: expected a JSON list of questions")
    bases = [root / "videos", root / "video", root]
    samples: list[Sample] = []
    for i, raw in enumerate(items):
        where = f"{path}: item {i}"
        options = _options(raw)
        choice = raw.get("correct_choice")
        if not isinstance(choice, int) or not 0 <= choice < len(options):
            raise DataError(f"{where}: correct_choice {choice!r} does not index one of {len(options)} options")
        video, _ = find_media(bases, str(raw.get("video_path") or f"{raw.get('video_id')}.mp4"))
        if video is None:
            raise layout_error(TITLE, root, f"{where}: video '{raw.get('video_path')}' not found in "
                               f"{', '.join(str(b) for b in bases[:2])}", EXPECTED)
        duration = float(raw.get("duration") or 0.0)
        samples.append(Sample(
            id=str(raw.get("id", i)), problem_type="multiple_choice", question=str(raw["question"]),
            options=options, answer=option_letter(choice),
            media=[MediaItem("video", str(video), {"duration": duration} if duration > 0 else {})],
            meta={"duration_group": str(raw.get("duration_group")), "question_category":
                  str(raw.get("question_category")), "topic_category": str(raw.get("topic_category")),
                  "duration": duration, "source": "longvideobench"},
        ))
    return BenchmarkData("longvideobench", root, samples, {"split": split, "file": str(path)})
