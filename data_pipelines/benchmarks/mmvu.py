"""MMVU, validation split, multiple-choice part — in either of the layouts users download.

* **yale-nlp** (``yale-nlp/MMVU``, the authors' copy): ``validation.json`` (or ``data/validation.json``), items with
  ``id``, ``video`` — a Hub URL ending in ``…/resolve/main/videos/<subject>/<n>.mp4`` or a relative path —,
  ``question_type`` ``multiple-choice``/``open-ended``, ``metadata.subject``, ``question``, ``choices``
  ``{"A": …, "E": …}`` with empty strings for unused letters, ``answer``; videos in ``videos/<subject>/<n>.mp4``.
* **lmms-eval** (``lmms-eval/MMVU``, earlier ``lmms-lab/MMVU``, what lmms-eval's ``mmvu_val`` task downloads; read
  from ``tasks/mmvu/mmvu_val.yaml`` and ``utils.py``): the folder ``huggingface-cli download lmms-eval/MMVU
  --repo-type dataset --local-dir <root>`` fills, with ``videos.zip`` unzipped in it (lmms-eval unzips it into
  its ``mmvu`` cache folder and joins each row's ``video_path`` to that folder). The question table is the
  Hub's Parquet export ``data/validation-*.parquet`` (a ``validation*.jsonl`` or a JSON list is read too), rows
  with ``id``, ``video_path`` (relative, ``…/<subject>/<n>.mp4``: lmms-eval takes the subject from its
  folder), ``question_type``, ``question``, ``choices`` (a struct ``{"A": …, "E": …}``, a JSON string of one,
  or a list) and ``answer``; ``metadata.subject`` is used when present.

Videos are found whatever the case of their extension. A question whose video is not there is kept and marked
(``meta["missing_media"]``, listed in ``info["missing_media"]``); when no video at all is found the folder is
wrong and a :class:`LayoutError` says so. Open-ended questions need an LLM judge and are left out (counted in the
info). Data: the yale-nlp/MMVU repository (README, ``data/validation.json``; MMVU, arXiv 2501.12380).

Protocol: the official direct-output prompt and 10 frames of the repository's ``main.py``, its ``MAX_TOKENS``
1024. Papers report "MMVU (mc)", the multiple-choice questions only, every one counted; the official scorer
judges with GPT-4o, lmms-eval's ``mmvu_val`` (``lmms_eval/tasks/mmvu/utils.py``) matches the letter, as here.
"""

from __future__ import annotations

import ast
import json
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
    first_existing,
    layout_error,
    mark_missing,
    missing_media,
    option_lines,
    plain_options,
    read_json,
    read_parquet,
    register_benchmark,
    toy_questions,
)
from data_pipelines.schema import MediaItem, Sample
from mmrl_common.errors import DataError
from rewards.answers import normalize_gold_choice

TITLE = "MMVU"
EXPECTED = (
    "validation.json                  yale-nlp/MMVU: the validation questions (or data/validation.json)",
    "videos/<subject>/<n>.mp4         the videos, as in the dataset repository",
    "(or, as lmms-eval downloads lmms-eval/MMVU: data/validation-*.parquet with video_path + videos.zip unzipped)",
)
LMMS_COLUMNS = ("id", "video_path", "question_type", "question", "choices", "answer")


def _relative(video: str) -> str:
    for marker in ("/resolve/main/", "/blob/main/"):
        if marker in video:
            return video.split(marker, 1)[1]
    return video


def _parse(value: Any) -> Any:
    """A JSON (or Python-literal) string as the object it spells; anything else unchanged."""
    if not isinstance(value, str):
        return value
    try:
        return json.loads(value)
    except json.JSONDecodeError:
        try:
            return ast.literal_eval(value)
        except (ValueError, SyntaxError):
            return value


def _choices(raw: Any, where: str) -> dict[str, str]:
    value = _parse(raw)
    if value is None:
        return {}
    if isinstance(value, (list, tuple)):
        value = dict(zip("ABCDEFGH", value))
    if not isinstance(value, dict):
        raise DataError(f"{where}: choices must be an object {{'A': ..}}, a list or a JSON string; got {raw!r}")
    return {str(k).strip().upper(): "" if v is None else str(v) for k, v in value.items()}


def _read_table(root: Path) -> tuple[list[dict[str, Any]], list[Path], str] | None:
    """The question rows, the files they came from and the layout's name, or None when there is no table."""
    path = first_existing([root / "validation.json", root / "data" / "validation.json"])
    if path is not None:
        items = read_json(path)
        if not isinstance(items, list):
            raise DataError(f"{path}: expected a JSON list of questions")
        lmms = bool(items) and isinstance(items[0], dict) and "video_path" in items[0] and "video" not in items[0]
        return items, [path], "lmms-eval" if lmms else "yale-nlp"
    tables = sorted((root / "data").glob("validation-*.parquet")) or sorted(root.glob("validation-*.parquet"))
    if tables:
        return read_parquet(tables, LMMS_COLUMNS), tables, "lmms-eval"
    lines = sorted((root / "data").glob("validation*.jsonl")) or sorted(root.glob("validation*.jsonl"))
    if lines:
        rows = []
        for p in lines:
            for n, line in enumerate(p.read_text(encoding="utf-8").splitlines(), start=1):
                if line.strip():
                    try:
                        rows.append(json.loads(line))
                    except json.JSONDecodeError as exc:
                        raise DataError(f"{p}: line {n} is not valid JSON ({exc})") from exc
        return rows, lines, "lmms-eval"
    return None


def load_mmvu(root: Path, *, split: str, media_cache: Path, open_ended: bool = False, **_: Any) -> BenchmarkData:
    """``open_ended``: keep the open-ended questions too (problem type ``open``, the reference answer as text), for
    a judge model to score (``mmrl eval --judge``); without it they are left out and counted."""
    root = check_root(TITLE, root, EXPECTED)
    table = _read_table(root)
    if table is None:
        raise layout_error(TITLE, root, "no validation.json (nor data/validation-*.parquet)", EXPECTED)
    items, files, layout = table
    bases = [root, root / "videos"]
    index = MediaIndex()
    samples: list[Sample] = []
    skipped = 0
    for i, raw in enumerate(items):
        where = f"{files[0] if len(files) == 1 else files[0].parent}: item {i}"
        if not isinstance(raw, dict):
            raise DataError(f"{where}: expected an object, got {type(raw).__name__}")
        is_open = raw.get("question_type") != "multiple-choice"
        if is_open and not open_ended:
            skipped += 1
            continue
        if is_open:
            options, answer = [], str(raw.get("answer", "")).strip()
            if not answer:
                raise DataError(f"{where}: an open-ended question without an answer")
        else:
            choices = _choices(raw.get("choices"), where)
            letters = sorted(k for k, v in choices.items() if v.strip())
            if letters != list("ABCDEFGH"[: len(letters)]) or len(letters) < 2:
                raise DataError(f"{where}: choices must fill the letters A.. in order, got {sorted(choices)}")
            options = [choices[k] for k in letters]
            try:
                answer = normalize_gold_choice(str(raw.get("answer", "")), options)
            except ValueError:
                raise DataError(f"{where}: answer {raw.get('answer')!r} is not one of {letters}") from None
        rel = _relative(str(raw.get("video_path") or raw.get("video") or ""))
        if not rel:
            raise DataError(f"{where}: no video / video_path")
        meta_raw = _parse(raw.get("metadata")) or {}
        subject = meta_raw.get("subject") if isinstance(meta_raw, dict) else None
        subject = str(subject) if subject else (Path(rel).parent.name or "None")
        meta: dict[str, Any] = {"subject": subject, "source": "mmvu"}
        video, _ = find_media(bases, rel, index=index)
        if video is None:
            video = expected_media_path(bases, rel)
            mark_missing(meta, f"{where}: video '{rel}' (any case of the extension) not found in "
                               f"{', '.join(str(b) for b in bases)}")
        samples.append(Sample(
            id=str(raw.get("id", i)), problem_type="open" if is_open else "multiple_choice", question=str(raw["question"]),
            options=options, answer=answer, media=[MediaItem("video", str(video))],
            meta=meta,
        ))
    info: dict[str, Any] = {"split": split, "file": str(files[0]), "layout": layout,
                            "open_ended_skipped": skipped}
    if open_ended:
        info["open_ended"] = sum(1 for s in samples if s.problem_type == "open")
    if len(files) > 1:
        info["files"] = [str(f) for f in files]
    info["missing_media"] = missing_media(TITLE, root, samples, EXPECTED, "videos (videos/<subject>/<n>.mp4)")
    return BenchmarkData("mmvu", root, samples, info)


# ------------------------------------------------------------------------------------------------ prompts
DIRECT = ("Do not generate any intermediate reasoning process. Answer directly with the option letter "
          "from the given choices.")


# yale-nlp/MMVU utils/constant.py OPEN_ENDED_DO_PROMPT (main.py --prompt direct-output, open-ended questions)
DIRECT_OPEN = "Do not generate any intermediate reasoning process. Directly output the final short answer."


def official_prompt(sample: Sample, subtitles: str | None = None) -> tuple[str | None, str, str]:
    """``main.py``'s direct-output prompt (an open-ended question: no options, the final answer asked for)."""
    if sample.problem_type == "open":
        return None, f"Question:{sample.question.strip()}\nVisual Information: processed video\n{DIRECT_OPEN}", ""
    opts = option_lines(plain_options(sample.options), "{letter}: {text}")
    return None, f"Question:{sample.question.strip()}\n{opts}\nVisual Information: processed video\n{DIRECT}", ""


def lmms_prompt(sample: Sample, subtitles: str | None = None) -> tuple[str | None, str, str]:
    """lmms-eval's ``multiple_choice_prompt`` (``tasks/mmvu/utils.py``): always the letters A to E (empty text for
    unused ones); lmms-eval's task has no open-ended questions: those get :func:`official_prompt`'s."""
    if sample.problem_type == "open":
        return official_prompt(sample, subtitles)
    opts = plain_options(sample.options)
    five = list(opts) + [""] * max(0, 5 - len(opts))
    return LMMS_SYSTEM, (f"\nQuestion:{sample.question.strip()}\n{option_lines(five, '{letter}: {text}')}\n"
                         "Visual Information: processed video\n"
                         "Do not generate any intermediate reasoning process. Answer directly with the option letter "
                         "from the\ngiven choices.\n"), ""


# ------------------------------------------------------------------------------------------------ fixture
def mmvu_fixture(out: Path, *, n: int, seed: int, layout: str = "yale-nlp", **_: Any) -> None:
    """The yale-nlp layout (``layout="lmms-eval"``: the Parquet export lmms-eval downloads): the videos (the first
    stored as ``.MP4``), one open-ended question and one question whose video is missing (the last)."""
    if layout not in ("yale-nlp", "lmms-eval"):
        raise ValueError(f"MMVU fixture layout must be 'yale-nlp' or 'lmms-eval', got {layout!r}")
    items = []
    with toy_questions("color", n, seed) as recs:
        for j, r in enumerate(recs):
            subject = ["Art", "Chemistry"][j % 2]
            copy_media(r["file"], out / "videos" / subject / f"{j}.{'MP4' if j == 0 else 'mp4'}")  # videos/Art/0.MP4
            url = f"https://huggingface.co/datasets/yale-nlp/MMVU/resolve/main/videos/{subject}/{j}.mp4"
            choices = {k: "" for k in "ABCDE"}
            choices.update({"ABCD"[i]: o for i, o in enumerate(r["options"])})
            items.append({"id": f"validation_{j}", "video": url, "youtube_url": None,
                          "question_type": "multiple-choice", "metadata": {"subject": subject, "textbook": "",
                                                                            "rationale": "", "knowledge": ""},
                          "question": r["question"], "choices": choices, "answer": r["answer"]})
    items.append({"id": "validation_open", "video": items[0]["video"], "youtube_url": None,
                  "question_type": "open-ended", "metadata": {"subject": "Art", "textbook": "", "rationale": "",
                                                              "knowledge": ""},
                  "question": "Describe the motion.", "choices": {k: "" for k in "ABCDE"}, "answer": "it moves"})
    # the extra question, last: its video videos/Chemistry/missing.mp4 is not there
    items.append(dict(items[0], id="validation_missing", metadata=dict(items[0]["metadata"], subject="Chemistry"),
                      video="https://huggingface.co/datasets/yale-nlp/MMVU/resolve/main/videos/Chemistry/missing.mp4"))
    if layout == "yale-nlp":
        (out / "validation.json").write_text(json.dumps(items, indent=1))
        return
    import pyarrow as pa
    import pyarrow.parquet as pq

    # lmms-eval/MMVU: the Hub's Parquet export, a relative video_path, choices as a struct, no metadata column
    rows = [{"id": it["id"], "video_path": it["video"].split("/resolve/main/", 1)[1],
             "question_type": it["question_type"], "question": it["question"], "choices": it["choices"],
             "answer": it["answer"]} for it in items]
    (out / "data").mkdir(parents=True, exist_ok=True)
    pq.write_table(pa.Table.from_pylist(rows), out / "data" / "validation-00000-of-00001.parquet")


MMVU = register_benchmark(Benchmark(
    name="mmvu", title=TITLE, reader=load_mmvu, splits=("val",), kind="video_mc",
    official={"video_policy": "uniform", "nframes": 10, "max_new_tokens": 1024,
              "source": "MMVU main.py direct-output prompt (yale-nlp/MMVU)"},
    prompt=official_prompt,
    lmms_eval={"max_new_tokens": 1024, "temperature": 0.7, "source": "lmms-eval tasks/mmvu (mmvu_val)"},
    lmms_prompt=lmms_prompt, lmms_task="mmvu_val",
    breakdowns=("subject",),
    headline=("accuracy", "MMVU (mc): the multiple-choice validation questions, every one counted"),
    fixture=mmvu_fixture, fixture_layouts=("yale-nlp", "lmms-eval"),
))
