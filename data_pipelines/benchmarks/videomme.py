"""Video-MME (lmms-lab/Video-MME): 2,700 four-option questions on 900 videos.

Layout as downloaded from the Hub: ``videomme/test-*.parquet`` (columns ``video_id``, ``duration``
short/medium/long, ``domain``, ``sub_category``, ``videoID``, ``question_id``, ``task_type``, ``question``,
``options`` — four strings already labelled ``"A. …"`` — and ``answer``, a letter), the videos unzipped from
``videos_chunked_*.zip`` into ``data/<videoID>.mp4``, and optionally ``subtitle/<videoID>.srt`` from
``subtitle.zip``. Research notes: research/eval.md §2.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

from data_pipelines.benchmarks._common import (
    BenchmarkData,
    check_root,
    find_media,
    layout_error,
    read_parquet,
    register_benchmark,
)
from data_pipelines.schema import MediaItem, Sample
from mmrl_common.errors import DataError

TITLE = "Video-MME"
COLUMNS = ("video_id", "duration", "domain", "sub_category", "videoID", "question_id", "task_type", "question",
           "options", "answer")
EXPECTED = (
    "videomme/test-*.parquet          the question table (lmms-lab/Video-MME, config videomme)",
    "data/<videoID>.mp4               videos unzipped from videos_chunked_*.zip",
    "subtitle/<videoID>.srt           optional, unzipped from subtitle.zip (for --subtitles)",
)


def parse_srt(path: Path) -> list[tuple[float, float, str]]:
    """``(start, end, text)`` seconds for each cue of an SRT file (formatting tags removed)."""
    text = path.read_text(encoding="utf-8-sig", errors="replace")
    cues = []
    stamp = r"(\d+):(\d+):(\d+)[,.](\d+)"
    for block in re.split(r"\n\s*\n", text.replace("\r\n", "\n").strip()):
        lines = block.split("\n")
        for k, line in enumerate(lines):
            m = re.match(rf"\s*{stamp}\s*-->\s*{stamp}", line)
            if m:
                g = [int(x) for x in m.groups()]
                start = g[0] * 3600 + g[1] * 60 + g[2] + g[3] / 1000
                end = g[4] * 3600 + g[5] * 60 + g[6] + g[7] / 1000
                body = " ".join(x.strip() for x in lines[k + 1:] if x.strip())
                body = re.sub(r"<[^>]+>", "", body)
                if body:
                    cues.append((start, end, body))
                break
    return cues


@register_benchmark("videomme", title=TITLE, kind="video_mc", aliases=("video-mme",))
def load_videomme(root: Path, *, split: str, media_cache: Path, **_: Any) -> BenchmarkData:
    root = check_root(TITLE, root, EXPECTED)
    tables = sorted((root / "videomme").glob("*.parquet")) or sorted(root.glob("*.parquet"))
    if not tables:
        raise layout_error(TITLE, root, "no question table (*.parquet) found", EXPECTED)
    rows = read_parquet(tables, COLUMNS)
    video_dirs = [root / "data", root / "videos", root / "video", root]
    sub_dirs = [root / "subtitle", root / "subtitles"]
    samples: list[Sample] = []
    missing: list[str] = []
    for i, row in enumerate(rows):
        where = f"{tables[0].parent}/*.parquet row {i}"
        options = [str(o) for o in (row["options"] or [])]
        answer = str(row["answer"]).strip().upper()
        if len(options) < 2 or answer not in "ABCDEFGH"[: len(options)]:
            raise DataError(f"{where}: answer {row['answer']!r} does not name one of {len(options)} options")
        vid = str(row["videoID"])
        path, _ = find_media(video_dirs, f"{vid}.mp4")
        if path is None:
            missing.append(vid)
            continue
        subs, _ = find_media(sub_dirs, f"{vid}.srt", suffixes=(".srt",))
        samples.append(Sample(
            id=str(row["question_id"]), problem_type="multiple_choice", question=str(row["question"]),
            options=options, answer=answer, media=[MediaItem("video", str(path))],
            meta={"duration": str(row["duration"]), "domain": str(row["domain"]),
                  "sub_category": str(row["sub_category"]), "task_type": str(row["task_type"]),
                  "video_id": str(row["video_id"]), "videoID": vid,
                  "subtitle_path": str(subs) if subs else None, "source": "videomme"},
        ))
    if missing:
        shown = ", ".join(sorted(set(missing))[:5])
        raise layout_error(TITLE, root, f"{len(set(missing))} video(s) not found (e.g. {shown}); looked for "
                           f"<videoID>.mp4 in {', '.join(str(d) for d in video_dirs[:3])}", EXPECTED)
    return BenchmarkData("videomme", root, samples, {
        "split": split, "tables": [str(t) for t in tables],
        "with_subtitle_files": sum(1 for s in samples if s.meta["subtitle_path"]),
    })
