"""Video-MME (lmms-lab/Video-MME): 2,700 four-option questions on 900 videos.

Layout as downloaded from the Hub: ``videomme/test-*.parquet`` (columns ``video_id``, ``duration``
short/medium/long, ``domain``, ``sub_category``, ``videoID``, ``question_id``, ``task_type``, ``question``,
``options`` — four strings already labelled ``"A. …"`` — and ``answer``, a letter), the videos unzipped from
``videos_chunked_*.zip`` into ``data/<videoID>.mp4`` (any case of the extension: some are ``.MP4``; ``.mkv`` too),
and optionally ``subtitle/<videoID>.srt`` from ``subtitle.zip``. A question whose video is not there is kept and
marked (``meta["missing_media"]``, listed in ``info["missing_media"]``); when no video at all is found the folder
is wrong and a :class:`LayoutError` says so. Data: the dataset card of lmms-lab/Video-MME and the benchmark's README
(MME-Benchmarks/Video-MME; Video-MME, arXiv 2405.21075).

Protocol: the official prompt is the README's "Evaluation Pipeline" one (with subtitles, only the lines shown at
the sampled frames' times); the frames are model-defined there, so the official protocol takes lmms-eval's
Qwen2.5-VL default of 32 frames spread evenly over the video, and 16 new tokens (``lmms_eval/tasks/videomme``
yaml files). The headline counts every question, an unparsed answer as wrong (papers and lmms-eval); the
official scorer (``evaluation/eval_your_results.py``) leaves unparsed answers out, reported beside it.

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
    LMMS_SYSTEM,
    Benchmark,
    BenchmarkData,
    MediaIndex,
    check_root,
    copy_media,
    expected_media_path,
    find_media,
    layout_error,
    mark_missing,
    missing_media,
    read_parquet,
    register_benchmark,
    toy_questions,
)
from data_pipelines.schema import MediaItem, Sample
from mmrl_common.errors import DataError
from rewards.answers import normalize_gold_choice

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
        try:
            answer = normalize_gold_choice(str(row["answer"]), options) if len(options) >= 2 else None
        except ValueError:
            answer = None
        if answer is None:
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


def subtitle_cues(sample: Sample) -> list[tuple[float, float, str]]:
    """The cues of a Video-MME sample's ``.srt`` file (``[]`` when it has none)."""
    path = sample.meta.get("subtitle_path")
    return parse_srt(Path(path)) if path else []


# ------------------------------------------------------------------------------------------------ prompts
INSTRUCTION = (
    "Select the best answer to the following multiple-choice question based on the video. Respond with only "
    "the letter (A, B, C, or D) of the correct option."
)
LMMS_INSTRUCTION = ("Select the best answer to the following multiple-choice question based on the video and the "
                    "subtitles. Respond with only the letter (A, B, C, or D) of the correct option.")


def official_prompt(sample: Sample, subtitles: str | None = None) -> tuple[str | None, str, str]:
    """The README's prompt; the options are stored labelled (``"A. …"``) and shown as they are."""
    head = f"This video's subtitles are listed below:\n{subtitles}\n" if subtitles is not None else ""
    body = "\n".join(sample.options or [])
    return None, f"{head}{INSTRUCTION}\n{sample.question.strip()}\n{body}\nThe best answer is:", ""


def lmms_prompt(sample: Sample, subtitles: str | None = None) -> tuple[str | None, str, str]:
    """lmms-eval's ``videomme_doc_to_text`` (and ``_subtitle``) with the default post-prompt."""
    body = f"{LMMS_INSTRUCTION}\n{sample.question.strip()}\n" + "\n".join(sample.options or [])
    if subtitles is not None:
        return LMMS_SYSTEM, f"This video's subtitles are listed below: \n{subtitles}\n{body}\nThe best answer is:", ""
    return LMMS_SYSTEM, f"{body}\n\nAnswer with the option's letter from the given choices directly.", ""


# ------------------------------------------------------------------------------------------------ fixture
def videomme_fixture(out: Path, *, n: int, seed: int, **_: Any) -> None:
    """Two questions per video (the first video stored as ``.MP4``), a ``.srt`` with ``<font>`` and ``{\\an8}``
    markup, and one question whose video is missing (the last row)."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    rows = []
    durations = ["short", "medium", "long"]
    with toy_questions("color", n, seed) as recs:
        for j, r in enumerate(recs):
            vid = f"vid{j // 2:03d}xyz"
            copy_media(r["file"], out / "data" / f"{vid}.{'MP4' if j // 2 == 0 else 'mp4'}")  # vid000xyz.MP4
            rows.append({"video_id": f"{j // 2 + 1:03d}", "duration": durations[(j // 2) % 3],
                         "domain": ["Knowledge", "Sports Competition"][(j // 2) % 2], "sub_category": "Toy",
                         "url": f"https://www.youtube.com/watch?v={vid}", "videoID": vid,
                         "question_id": f"{j // 2 + 1:03d}-{j % 2 + 1}",
                         "task_type": ["Attribute Perception", "Object Recognition"][j % 2],
                         "question": r["question"],
                         "options": [f"{'ABCD'[i]}. {o}" for i, o in enumerate(r["options"])], "answer": r["answer"]})
    # the extra question, last: its video vidmissing.mp4 is not in data/
    rows.append(dict(rows[0], video_id="999", videoID="vidmissing", url="https://www.youtube.com/watch?v=vidmissing",
                     question_id="999-1"))
    (out / "videomme").mkdir(parents=True, exist_ok=True)
    pq.write_table(pa.Table.from_pylist(rows), out / "videomme" / "test-00000-of-00001.parquet")
    (out / "subtitle").mkdir(exist_ok=True)
    # as the Video-MME .srt files are: YouTube captions in <font color="white" size=".72c">; plus other markup
    (out / "subtitle" / "vid000xyz.srt").write_text(
        '1\n00:00:00,000 --> 00:00:00,900\n<font color="white" size=".72c">Look at the moving object.</font>\n\n'
        '2\n00:00:01,000 --> 00:00:01,900\n{\\an8}<font color="#ffffff">It keeps its</font>\n<i>colour.</i>\n',
        encoding="utf-8")


VIDEOMME = register_benchmark(Benchmark(
    name="videomme", title=TITLE, reader=load_videomme, aliases=("video-mme",), kind="video_mc",
    official={"video_policy": "uniform", "nframes": 32, "max_new_tokens": 16,
              "source": "Video-MME README prompt, lmms-eval frames (tasks/videomme)"},
    prompt=official_prompt,
    lmms_eval={"max_new_tokens": 16, "source": "lmms-eval tasks/videomme (videomme / videomme_w_subtitle)"},
    lmms_prompt=lmms_prompt, lmms_task="videomme", lmms_subtitle_task="videomme_w_subtitle",
    subtitles=subtitle_cues, subtitle_style="lines",
    breakdowns=("duration", "domain", "task_type", "sub_category"),
    headline=("accuracy", "papers and lmms-eval count every question, an unparsed answer as wrong"),
    fixture=videomme_fixture,
))
