"""LongVideoBench (longvideobench/LongVideoBench), validation split (the test split has no answers).

Layout: ``lvb_val.json`` (items with ``id``, ``video_path``, ``question``, ``candidates`` — or
``option0..option4`` with ``"N/A"`` for unused ones, as in the Parquet copy — ``correct_choice`` (int),
``duration``, ``duration_group``, ``question_category``, ``topic_category``, ``subtitle_path``,
``starting_timestamp_for_subtitles``), the videos from ``videos.tar.part.*`` in ``videos/`` (any case of the
extension) and the subtitles from ``subtitles.tar`` in ``subtitles/<subtitle_path>``. A question whose video is
not there is kept and marked (``meta["missing_media"]``, listed in ``info["missing_media"]``); when no video at
all is found the folder is wrong and a :class:`LayoutError` says so. Data: the dataset card of
longvideobench/LongVideoBench (LongVideoBench, arXiv 2407.15754).

Protocol (``longvideobench/longvideobench_dataset.py`` in the benchmark's repository): ``min(16, int(duration))``
frames at a fixed stride (:func:`lvb_indices`, registered as the frame rule ``longvideobench``), "Question: …",
the options as ``A. …`` lines and "Answer with the option's letter from the given choices directly.";
with ``--subtitles`` the frames become images interleaved with the subtitles. The headline counts an unparsed
answer wrong; lmms-eval (``lmms_eval/tasks/longvideobench/utils.py``) gives it a random option instead, reported
beside it as its expected value.

Subtitle files (read by :func:`lvb_subtitles`, format from the official ``longvideobench/longvideobench_dataset.py``,
``insert_subtitles_into_frames``): a JSON list in file order of either

* ``{"timestamp": [start, end], "text": ...}`` — seconds of the source video; an ``end`` that is not a number
  (``null``, an unfinished last caption) is replaced by the question's ``duration`` before the shift below, as
  the official code does, or
* ``{"start": "HH:MM:SS.fff", "end": "HH:MM:SS.fff", "line": ...}``.

Both are shifted by the question's ``starting_timestamp_for_subtitles`` (the clip's start in the source video),
which puts them on the clip's clock, the one the sampled frames' timestamps (``index / fps``) use.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from data_pipelines.benchmarks._common import (
    DIRECT_MC,
    LMMS_SYSTEM,
    Benchmark,
    BenchmarkData,
    MediaIndex,
    check_root,
    copy_media,
    expected_media_path,
    find_media,
    first_existing,
    layout_error,
    mark_missing,
    missing_media,
    option_lines,
    plain_options,
    read_json,
    register_benchmark,
    toy_questions,
)
from data_pipelines.schema import MediaItem, Sample, option_letter
from mmrl_common.errors import DataError

TITLE = "LongVideoBench"
EXPECTED = (
    "lvb_val.json                     the validation questions (with correct_choice)",
    "videos/<video_path>              videos extracted from videos.tar.part.*",
    "subtitles/<subtitle_path>        subtitle JSON files extracted from subtitles.tar (for interleaved prompts)",
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


def _seconds(stamp: Any, where: str) -> float:
    """``"HH:MM:SS.fff"`` (or a number) in seconds."""
    if isinstance(stamp, (int, float)) and not isinstance(stamp, bool):
        return float(stamp)
    try:
        h, m, s = str(stamp).strip().split(":")
        return int(h) * 3600 + int(m) * 60 + float(s)
    except ValueError as exc:
        raise DataError(f"{where}: timestamp {stamp!r} is not HH:MM:SS.fff") from exc


def _number(x: Any) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool)


def read_lvb_subtitles(path: str | Path, *, offset: float = 0.0, duration: float = 0.0,
                       ) -> list[tuple[float, float, str]]:
    """``(start, end, text)`` of every entry of a LongVideoBench subtitle file, in file order, in seconds of the
    clip (``offset`` = ``starting_timestamp_for_subtitles`` subtracted; a ``null`` end is ``duration`` before
    that)."""
    path = Path(path)
    entries = read_json(path)
    if not isinstance(entries, list):
        raise DataError(f"{path}: expected a JSON list of subtitle entries, got {type(entries).__name__}")
    out = []
    for k, e in enumerate(entries):
        where = f"{path}: entry {k}"
        if not isinstance(e, dict):
            raise DataError(f"{where}: expected an object, got {type(e).__name__}")
        if "timestamp" in e:
            stamp = e["timestamp"]
            if not isinstance(stamp, (list, tuple)) or len(stamp) != 2 or not _number(stamp[0]):
                raise DataError(f"{where}: timestamp must be [start, end] seconds, got {stamp!r}")
            start = float(stamp[0])
            end = float(stamp[1]) if _number(stamp[1]) else float(duration)
            text = e.get("text", "")
        elif "start" in e and "end" in e:
            start, end = _seconds(e["start"], where), _seconds(e["end"], where)
            text = e.get("line", e.get("text", ""))
        else:
            raise DataError(f"{where}: expected 'timestamp' + 'text' or 'start', 'end' + 'line'; got {sorted(e)}")
        out.append((start - offset, end - offset, str(text or "")))
    return out


def lvb_subtitles(sample: Sample) -> list[tuple[float, float, str]]:
    """The subtitles of a LongVideoBench sample as ``(start, end, text)`` seconds of its clip, in file order
    (``[]`` when the sample has no subtitle file); see the module docstring for the format and the offset."""
    path = sample.meta.get("subtitle_path")
    if not path:
        return []
    return read_lvb_subtitles(path, offset=float(sample.meta.get("starting_timestamp_for_subtitles") or 0.0),
                              duration=float(sample.meta.get("duration") or 0.0))


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
    sub_bases = [root / "subtitles", root / "subtitle", root]
    index = MediaIndex()
    samples: list[Sample] = []
    for i, raw in enumerate(items):
        where = f"{path}: item {i}"
        options = _options(raw)
        choice = raw.get("correct_choice")
        if not isinstance(choice, int) or not 0 <= choice < len(options):
            raise DataError(f"{where}: correct_choice {choice!r} does not index one of {len(options)} options")
        name = str(raw.get("video_path") or f"{raw.get('video_id')}.mp4")
        video, _ = find_media(bases, name, index=index)
        sub_name = raw.get("subtitle_path")
        subs = find_media(sub_bases, str(sub_name), suffixes=(".json",), index=index)[0] if sub_name else None
        duration = float(raw.get("duration") or 0.0)
        offset = raw.get("starting_timestamp_for_subtitles")
        meta = {"duration_group": str(raw.get("duration_group")), "question_category":
                str(raw.get("question_category")), "topic_category": str(raw.get("topic_category")),
                "duration": duration, "subtitle_path": str(subs) if subs else None,
                "starting_timestamp_for_subtitles": float(offset) if _number(offset) else 0.0,
                "source": "longvideobench"}
        if video is None:
            video = expected_media_path(bases, name)
            mark_missing(meta, f"{where}: video '{name}' (any case of the extension) not found in "
                               f"{', '.join(str(b) for b in bases[:2])}")
        samples.append(Sample(
            id=str(raw.get("id", i)), problem_type="multiple_choice", question=str(raw["question"]),
            options=options, answer=option_letter(choice),
            media=[MediaItem("video", str(video), {"duration": duration} if duration > 0 else {})], meta=meta,
        ))
    return BenchmarkData("longvideobench", root, samples, {
        "split": split, "file": str(path),
        "with_subtitle_files": sum(1 for s in samples if s.meta["subtitle_path"]),
        "missing_media": missing_media(TITLE, root, samples, EXPECTED, "videos (videos/<video_path>)"),
    })


def lvb_indices(num_frames: int, fps: float, /, *, start: float | None = None, end: float | None = None,
                nframes: int = 16, duration: float | None = None) -> list[int]:
    """LongVideoBench's ``load_video``: ``n = min(nframes, int(duration))`` frames at stride
    ``int(int(duration·fps) / n)`` from the first frame (``duration`` from the question file)."""
    dur = float(duration) if duration else num_frames / fps
    valid = min(int(dur * fps), num_frames)
    n = max(1, min(int(nframes), int(dur)))
    stride = int(valid / n)
    return [min(stride * i, num_frames - 1) for i in range(n)]


# ------------------------------------------------------------------------------------------------ prompts
def official_prompt(sample: Sample, subtitles: str | None = None) -> tuple[str | None, str, str]:
    opts = option_lines(plain_options(sample.options), "{letter}. {text}")
    return None, f"Question: {sample.question.strip()}\n{opts}\n{DIRECT_MC}", ""


def lmms_prompt(sample: Sample, subtitles: str | None = None) -> tuple[str | None, str, str]:
    """lmms-eval's ``longvideobench_doc_to_text`` (the ``_val_v`` task)."""
    opts = option_lines(plain_options(sample.options), "{letter}. {text}")
    return LMMS_SYSTEM, f"{sample.question.strip()}\n{opts}\n{DIRECT_MC}\n", ""


# ------------------------------------------------------------------------------------------------ fixture
# LongVideoBench subtitle files (the two formats longvideobench_dataset.py reads), by video:
# lvb0 in the clip's own clock ("timestamp" seconds, a null end = the clip's end), lvb1 cut from a source video
# at 100 s ("start"/"end" strings, starting_timestamp_for_subtitles = 100).
FIXTURE_SUBTITLES: dict[str, tuple[float, list[dict[str, Any]]]] = {
    "lvb0": (0.0, [{"timestamp": [0.0, 0.9], "text": "Look at the moving object."},
                   {"timestamp": [1.2, None], "text": "It keeps its colour."}]),
    "lvb1": (100.0, [{"start": "00:01:40.250", "end": "00:01:41.000", "line": "Here it comes."},
                     {"start": "00:01:41.000", "end": "00:01:41.750", "line": "There it goes."}]),
}


def lvb_fixture(out: Path, *, n: int, seed: int, **_: Any) -> None:
    """``lvb_val.json`` with the videos (the first stored as ``.MP4``), subtitle files in both formats and one
    question whose video is missing (the last item)."""
    items = []
    with toy_questions("color", n, seed) as recs:
        for j, r in enumerate(recs):
            copy_media(r["file"], out / "videos" / f"lvb{j}.{'MP4' if j == 0 else 'mp4'}")  # lvb0.MP4
            offset, subs = FIXTURE_SUBTITLES.get(f"lvb{j}", (0.0, None))
            if subs is not None:
                (out / "subtitles").mkdir(parents=True, exist_ok=True)
                (out / "subtitles" / f"lvb{j}_en.json").write_text(json.dumps(subs))
            items.append({"id": f"lvb{j}_0", "video_id": f"lvb{j}", "video_path": f"lvb{j}.mp4",
                          "subtitle_path": f"lvb{j}_en.json", "question": r["question"],
                          "candidates": list(r["options"]), "correct_choice": "ABCD".index(r["answer"]),
                          "duration": 2.0, "duration_group": [15, 60][j % 2],
                          "question_category": ["S2E", "T3O"][j % 2], "topic_category": "TOY",
                          "starting_timestamp_for_subtitles": offset})
    # the extra question, last: its video lvbmissing.mp4 is not in videos/
    items.append(dict(items[0], id="lvbmissing_0", video_id="lvbmissing", video_path="lvbmissing.mp4",
                      subtitle_path="lvbmissing_en.json", starting_timestamp_for_subtitles=0.0))
    (out / "lvb_val.json").write_text(json.dumps(items, indent=1))


LONGVIDEOBENCH = register_benchmark(Benchmark(
    name="longvideobench", title=TITLE, reader=load_lvb, splits=("val",), aliases=("lvb", "long-video-bench"),
    kind="video_mc",
    # min(max_frames, int(duration)) frames at a fixed stride; 16 frames as lmms-eval's _val_i task
    official={"video_policy": "longvideobench", "nframes": 16, "max_new_tokens": 16,
              "source": "longvideobench_dataset.py (LongVideoBench repository)"},
    prompt=official_prompt, frame_rule=lvb_indices,
    lmms_eval={"max_new_tokens": 32, "source": "lmms-eval tasks/longvideobench (longvideobench_val_v)"},
    lmms_prompt=lmms_prompt, lmms_task="longvideobench_val_v", lmms_subtitle_task="longvideobench_val_i",
    subtitles=lvb_subtitles, subtitle_style="interleaved",
    breakdowns=("duration_group", "question_category"),
    headline=("accuracy", ("every question, unparsed counted wrong; papers that used lmms-eval gave an "
                           "unparsed answer a random option (random_unparsed beside it)")),
    beside=("random_unparsed", "accuracy_answered"),
    fixture=lvb_fixture,
))
