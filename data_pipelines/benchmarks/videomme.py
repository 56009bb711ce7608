"""Video-MME (lmms-lab/Video-MME): 2,700 four-option questions on 900 videos.

Layout as downloaded from the Hub: ``videomme/test-*.parquet`` (columns ``video_id``, ``duration``
short/medium/long, ``domain``, ``sub_category``, ``videoID``, ``question_id``, ``task_type``, ``question``,
``options`` — four strings already labelled ``"A. …"`` — and ``answer``, a letter), the videos unzipped from
``videos_chunked_*.zip`` into ``data/<videoID>.mp4`` (any case of the extension: some are ``.MP4``; ``.mkv`` too),
and optionally ``subtitle/<videoID>.srt`` from ``subtitle.zip``. A question whose video is not there is kept and
marked (``meta["missing_media"]``, listed in ``info["missing_media"]``); when no video at all is found the folder
is wrong and a :class:`LayoutError` says so. Research notes: research/eval.md §2.

Subtitles (:func:`parse_srt`): the .srt cues are YouTube captions wrapped in ``<font color="white" size=".72c">…
</font>``; lmms-eval (``tasks/videomme/utils.py``: ``load_subtitles`` splits the file on blank lines, takes line 2 as
``start --> end`` and joins the remaining lines with spaces, then keeps what is inside that ``<font>`` element)
gives the model the bare caption text. ``parse_srt`` strips every tag and ``{\\an8}``-style override code, which
gives the same text on those files and also handles other markup.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

from data_pipelines.benchmarks._common import (
    BenchmarkData,
    MediaIndex,
    check_root,
    expected_media_path,
    find_media,
    layout_error,
    mark_missing,
    missing_media,
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
    "data/<videoID>.mp4               videos unzipped from videos_chunked_*.zip (.mp4/.MP4/.mkv)",
    "subtitle/<videoID>.srt           optional, unzipped from subtitle.zip (for --subtitles)",
)
_STAMP = r"(\d+):(\d+):(\d+)[,.](\d+)"
_TIMING = re.compile(rf"\s*{_STAMP}\s*-->\s*{_STAMP}")
_TAG = re.compile(r"</?[A-Za-z][^<>]*>")  # <font color="white" size=".72c">, </font>, <i>, <b>, <u>, ...
_OVERRIDE = re.compile(r"\{\\[^{}]*\}")  # ASS/SSA override codes kept in SRT files: {\an8}, {\i1}, {\pos(..)}


def strip_markup(text: str) -> str:
    """Caption text without formatting tags and override codes, whitespace collapsed."""
    return " ".join(_OVERRIDE.sub("", _TAG.sub("", text)).split())


def parse_srt(path: Path) -> list[tuple[float, float, str]]:
    """``(start, end, text)`` seconds for each cue of an SRT file, in file order; the text is the cue's lines
    joined with spaces with the markup stripped (:func:`strip_markup`); cues left empty are dropped."""
    text = Path(path).read_text(encoding="utf-8-sig", errors="replace")
    cues = []
    for block in re.split(r"\n\s*\n", text.replace("\r\n", "\n").replace("\r", "\n").strip()):
        lines = block.split("\n")
        for k, line in enumerate(lines):
            m = _TIMING.match(line)
            if m:
                g = [int(x) for x in m.groups()]
                start = g[0] * 3600 + g[1] * 60 + g[2] + g[3] / 10 ** len(m.group(4))
                end = g[4] * 3600 + g[5] * 60 + g[6] + g[7] / 10 ** len(m.group(8))
                body = strip_markup(" ".join(lines[k + 1:]))
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
    index = MediaIndex()
    samples: list[Sample] = []
    for i, row in enumerate(rows):
        where = f"{tables[0].parent}/*.parquet row {i}"
        options = [str(o) for o in (row["options"] or [])]
        answer = str(row["answer"]).strip().upper()
        if len(options) < 2 or answer not in "ABCDEFGH"[: len(options)]:
            raise DataError(f"{where}: answer {row['answer']!r} does not name one of {len(options)} options")
        vid = str(row["videoID"])
        path, _ = find_media(video_dirs, f"{vid}.mp4", index=index)
        subs, _ = find_media(sub_dirs, f"{vid}.srt", suffixes=(".srt",), index=index)
        meta = {"duration": str(row["duration"]), "domain": str(row["domain"]),
                "sub_category": str(row["sub_category"]), "task_type": str(row["task_type"]),
                "video_id": str(row["video_id"]), "videoID": vid,
                "subtitle_path": str(subs) if subs else None, "source": "videomme"}
        if path is None:
            path = expected_media_path(video_dirs, f"{vid}.mp4")
            mark_missing(meta, f"video {vid}.mp4 (any case of .mp4/.mkv/.webm) not found in "
                               f"{', '.join(str(d) for d in video_dirs)}")
        samples.append(Sample(
            id=str(row["question_id"]), problem_type="multiple_choice", question=str(row["question"]),
            options=options, answer=answer, media=[MediaItem("video", str(path))], meta=meta,
        ))
    return BenchmarkData("videomme", root, samples, {
        "split": split, "tables": [str(t) for t in tables],
        "with_subtitle_files": sum(1 for s in samples if s.meta["subtitle_path"]),
        "missing_media": missing_media(TITLE, root, samples, EXPECTED, "videos (data/<videoID>.mp4)"),
    })
