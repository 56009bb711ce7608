"""Medical VQA sets: VQA-RAD, PathVQA (Hugging Face Parquet copies) and SLAKE (its JSON + image folder).

* ``vqa-rad`` (flaviagiammarino/vqa-rad) and ``pathvqa`` (flaviagiammarino/path-vqa): ``data/<split>-*.parquet``
  with ``image`` (``{"bytes", "path"}``), ``question``, ``answer``. These copies carry no answer type; a question
  is **closed when its answer is yes or no** (MedEvalKit's rule, research/medical.md §4). Images are written
  once to the media cache.
* ``slake`` (BoKelvin/SLAKE): ``<split>.json`` (``img_name``, ``qid``, ``question``, ``answer``,
  ``answer_type`` OPEN/CLOSED, ``q_lang``, ``modality``, ``content_type``) and ``imgs/<img_name>`` from
  ``imgs.zip``; the dataset's own ``answer_type`` decides closed/open; English questions by default.

Closed yes/no questions become ``yes_no`` samples; other closed and open questions ``open`` samples.
``meta.answer_type`` is ``closed`` or ``open`` and ``meta.closed_rule`` records which rule decided it.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from data_pipelines.benchmarks import register_benchmark
from data_pipelines.benchmarks._common import (
    BenchmarkData,
    check_root,
    first_existing,
    layout_error,
    read_json,
    read_parquet,
    save_embedded_image,
)
from data_pipelines.schema import MediaItem, Sample
from mmrl_common.errors import DataError
from rewards.answers import normalize_text

_SPLIT_FILES = {"test": ("test",), "val": ("validation", "val"), "train": ("train",)}


def _parquet_reader(name: str, title: str) -> Any:
    expected = (
        ("data/<split>-*.parquet           columns image {bytes, path}, question, answer "
        "(the Hugging Face copy; split test, validation or train)"),
    )

    def load(root: Path, *, split: str, media_cache: Path, **_: Any) -> BenchmarkData:
        root = check_root(title, root, expected)
        tables: list[Path] = []
        for stem in _SPLIT_FILES[split]:
            for d in (root / "data", root):
                tables = sorted(d.glob(f"{stem}-*.parquet")) or sorted(d.glob(f"{stem}.parquet"))
                if tables:
                    break
            if tables:
                break
        if not tables:
            raise layout_error(title, root, f"no Parquet file for split '{split}'", expected)
        rows = read_parquet(tables, ("image", "question", "answer"))
        samples = []
        for i, row in enumerate(rows):
            where = f"{tables[0].parent}/{_SPLIT_FILES[split][0]}-*.parquet row {i}"
            image = save_embedded_image(row["image"], media_cache / name, where)
            answer = str(row["answer"]).strip()
            closed = normalize_text(answer) in ("yes", "no")
            samples.append(Sample(
                id=f"{name}-{split}-{i}", problem_type="yes_no" if closed else "open",
                question=str(row["question"]), answer=answer.lower() if closed else answer,
                media=[MediaItem("image", str(image))],
                meta={"answer_type": "closed" if closed else "open", "closed_rule": "answer is yes/no",
                      "source": name},
            ))
        return BenchmarkData(name, root, samples, {"split": split, "tables": [str(t) for t in tables],
                                                   "closed_rule": "answer is yes/no (MedEvalKit)"})

    return load


register_benchmark("vqa-rad", title="VQA-RAD", kind="medical", splits=("test", "train"), aliases=("vqarad",))(
    _parquet_reader("vqa-rad", "VQA-RAD"))
register_benchmark("pathvqa", title="PathVQA", kind="medical", splits=("test", "val", "train"),
                   aliases=("path-vqa",))(
    _parquet_reader("pathvqa", "PathVQA"))

SLAKE_EXPECTED = (
    "test.json                        questions (validation.json, train.json for the other splits)",
    "imgs/<img_name>                  images unzipped from imgs.zip, e.g. imgs/xmlab102/source.jpg",
)


@register_benchmark("slake", title="SLAKE", kind="medical", splits=("test", "val", "train"))
def load_slake(root: Path, *, split: str, media_cache: Path, language: str = "en", **_: Any) -> BenchmarkData:
    root = check_root("SLAKE", root, SLAKE_EXPECTED)
    path = first_existing(root / f"{stem}.json" for stem in _SPLIT_FILES[split])
    if path is None:
        raise layout_error("SLAKE", root, f"no question file for split '{split}'", SLAKE_EXPECTED)
    items = read_json(path)
    if not isinstance(items, list):
        raise DataError(f"{path}: expected a JSON list of questions")
    samples, other_lang = [], 0
    for i, raw in enumerate(items):
        where = f"{path}: item {i}"
        if language and raw.get("q_lang", "en") != language:
            other_lang += 1
            continue
        kind = str(raw.get("answer_type", "")).upper()
        if kind not in ("OPEN", "CLOSED"):
            raise DataError(f"{where}: answer_type must be OPEN or CLOSED, got {raw.get('answer_type')!r}")
        image = root / "imgs" / str(raw.get("img_name", ""))
        if not image.is_file():
            raise layout_error("SLAKE", root, f"{where}: image imgs/{raw.get('img_name')} not found", SLAKE_EXPECTED)
        answer = str(raw["answer"]).strip()
        yes_no = kind == "CLOSED" and normalize_text(answer) in ("yes", "no")
        samples.append(Sample(
            id=f"slake-{raw.get('qid', i)}", problem_type="yes_no" if yes_no else "open",
            question=str(raw["question"]), answer=answer.lower() if yes_no else answer,
            media=[MediaItem("image", str(image))],
            meta={"answer_type": kind.lower(), "closed_rule": "answer_type field", "source": "slake",
                  "modality": str(raw.get("modality")), "content_type": str(raw.get("content_type"))},
        ))
    return BenchmarkData("slake", root, samples, {"split": split, "file": str(path), "language": language,
                                                  "other_language_skipped": other_lang,
                                                  "closed_rule": "answer_type field"})
