"""Medical VQA sets in their public layouts: VQA-RAD, PathVQA (Hugging Face Parquet copies), SLAKE (its JSON +
image folder), and the multiple-choice sets PMC-VQA (CSV + images/), OmniMedVQA (QA_information/ + Images/),
MedXpertQA-MM (MM/*.jsonl + images/) and MMMU Health & Medicine (<Subject>/*.parquet).

* ``vqa-rad`` (flaviagiammarino/vqa-rad) and ``pathvqa`` (flaviagiammarino/path-vqa): ``data/<split>-*.parquet``
  with ``image`` (``{"bytes", "path"}``), ``question``, ``answer``. These copies carry no answer type; a question
  is **closed when its answer is yes or no** (MedEvalKit's rule: alibaba-damo-academy/MedEvalKit
  ``utils/VQA_RAD/VQA_RAD.py``, ``utils/PATH_VQA/PATH_VQA.py``). Images are written once to the media cache.
* ``slake`` (BoKelvin/SLAKE): ``<split>.json`` (``img_name``, ``qid``, ``question``, ``answer``,
  ``answer_type`` OPEN/CLOSED, ``q_lang``, ``modality``, ``content_type``) and ``imgs/<img_name>`` from
  ``imgs.zip``; the dataset's own ``answer_type`` decides closed/open; English questions by default.

Closed yes/no questions become ``yes_no`` samples; other closed and open questions ``open`` samples; the four
multiple-choice sets give ``multiple_choice`` samples (answer: the gold letter). ``meta.answer_type`` is
``closed`` or ``open`` and ``meta.closed_rule`` records which rule decided it. A folder laid out otherwise
raises :class:`LayoutError` saying what was expected where.

Evaluation: VQA-RAD, PathVQA and SLAKE ask the question as it is and are scored as LLaVA-Med scores closed and
open answers (microsoft/LLaVA-Med ``llava/eval/run_eval_batch.py``; the ``closed_open`` scoring); the
multiple-choice sets show the lettered options with the training prompt and score the letter.

Training: ``python -m data_pipelines.benchmarks.medical export NAME ROOT --split train --out train.jsonl`` writes
native records for ``mmrl train --data train.jsonl`` (:func:`export_training_file`).
"""

from __future__ import annotations

import ast
import csv
import json
import re
from pathlib import Path
from typing import Any

from data_pipelines.benchmarks._common import (
    BENCHMARKS,
    Benchmark,
    BenchmarkData,
    check_root,
    copy_media,
    first_existing,
    layout_error,
    read_json,
    read_parquet,
    read_with,
    register_benchmark,
    save_embedded_image,
    toy_questions,
)
from data_pipelines.schema import MediaItem, Sample, option_letters
from mmrl_common.errors import DataError
from rewards.answers import normalize_gold_choice, normalize_text

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


SLAKE_EXPECTED = (
    "test.json                        questions (validation.json, train.json for the other splits)",
    "imgs/<img_name>                  images unzipped from imgs.zip, e.g. imgs/xmlab102/source.jpg",
)


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


# ----------------------------------------------------------------------------------------------------------
# Multiple-choice medical sets: PMC-VQA, OmniMedVQA, MedXpertQA-MM, MMMU Health & Medicine (layouts from each
# dataset card, the columns as MedEvalKit and MedVLThinker's data_process/ scripts read them). Every question is
# closed: a multiple_choice sample whose answer is the gold letter (rewards.answers.normalize_gold_choice reads a
# letter or an option's text) and whose options are the plain option texts; meta.answer_type "closed",
# meta.closed_rule "multiple choice".
# ----------------------------------------------------------------------------------------------------------

_OPTION_LABEL = re.compile(r"^\s*\(?([A-Za-z])\s*[\):.]\s*")


def _plain_option(text: Any, letter_: str) -> str:
    """An option's text without its own ``A:`` / ``(A)`` / ``A.`` label (PMC-VQA writes ``A:Lungs``)."""
    s = "" if text is None else str(text).strip()
    m = _OPTION_LABEL.match(s)
    return s[m.end():].strip() if m and m.group(1).upper() == letter_ else s


def _mc_sample(sid: str, question: str, options: list[str], gold: str, images: list[Path], where: str,
               meta: dict[str, Any]) -> Sample:
    try:
        answer = normalize_gold_choice(str(gold), options)
    except ValueError:
        letters = option_letters(len(options))
        raise DataError(f"{where}: the answer {gold!r} is neither an option letter ({', '.join(letters)}) nor "
                        f"exactly one option's text ({options})") from None
    return Sample(id=sid, problem_type="multiple_choice", question=question.strip(), options=options, answer=answer,
                  media=[MediaItem("image", str(p)) for p in images],
                  meta={"answer_type": "closed", "closed_rule": "multiple choice", **meta})


def _find_image(bases: list[Path], name: str) -> Path | None:
    for base in bases:
        p = base / name
        if p.is_file():
            return p
    return None


PMC_EXPECTED = (
    "test_clean.csv / test.csv / test_2.csv   questions of the test split (train.csv / train_2.csv for train):",
    "(columns Figure_path, Question, Choice A .. Choice D, and Answer_label or Answer (a letter or the option text))",
    "images/<Figure_path>                    figures unzipped from images.zip (figures/ or images_2/ for the v2 files)",
)
_PMC_FILES = {"test": ("test_clean.csv", "test.csv", "test_2.csv"), "train": ("train.csv", "train_2.csv")}


def load_pmc_vqa(root: Path, *, split: str, media_cache: Path, file: str | None = None, **_: Any) -> BenchmarkData:
    """PMC-VQA (xmcmic/PMC-VQA): a question CSV and an image folder; ``file`` picks the CSV (default: the first
    of ``test_clean.csv, test.csv, test_2.csv`` or ``train.csv, train_2.csv`` that exists)."""
    root = check_root("PMC-VQA", root, PMC_EXPECTED)
    path = root / file if file else first_existing(root / n for n in _PMC_FILES[split])
    if path is None or not path.is_file():
        raise layout_error("PMC-VQA", root, f"no question file for split '{split}'"
                           + (f" ({file} not found)" if file else ""), PMC_EXPECTED)
    with open(path, encoding="utf-8", newline="") as fh:
        rows = list(csv.DictReader(fh))
    cols = set(rows[0]) if rows else set()
    need = {"Figure_path", "Question", "Choice A", "Choice B"}
    if not rows or not need <= cols or not ({"Answer_label", "Answer"} & cols):
        raise layout_error("PMC-VQA", root, f"{path.name}: missing column(s) "
                           f"{sorted(need - cols) or ['Answer_label or Answer']} (found {sorted(cols)})", PMC_EXPECTED)
    bases = [root / "images", root / "figures", root / "images_2", root]
    samples = []
    for i, row in enumerate(rows):
        where = f"{path}: row {i + 2}"
        options = [_plain_option(row[f"Choice {c}"], c) for c in "ABCD" if (row.get(f"Choice {c}") or "").strip()]
        image = _find_image(bases, row["Figure_path"].strip())
        if image is None:
            raise layout_error("PMC-VQA", root, f"{where}: image {row['Figure_path']!r} not found", PMC_EXPECTED)
        gold = (row.get("Answer_label") or "").strip() or row.get("Answer", "")
        samples.append(_mc_sample(f"pmc-vqa-{split}-{row.get('index') or i}", row["Question"], options, gold, [image],
                                  where, {"source": "pmc-vqa"}))
    return BenchmarkData("pmc-vqa", root, samples, {"split": split, "file": str(path), "closed_rule": "multiple choice"})


OMNI_EXPECTED = (
    "QA_information/Open-access/<dataset>.json   question lists (keys question, gt_answer, option_A .. option_D,",
    "(image_path, question_type, modality_type; Restricted-access/ too with access=all)",
    "Images/<dataset>/...                        images, as image_path names them (relative to the root)",
)


def load_omnimedvqa(root: Path, *, split: str, media_cache: Path, access: str = "open", **_: Any) -> BenchmarkData:
    """OmniMedVQA (foreverbeliever/OmniMedVQA) unzipped: one JSON list per source dataset; ``access`` =
    ``open`` (default: Open-access, whose images ship in the zip) or ``all`` (Restricted-access too: their images
    must be placed under the root by the user)."""
    root = check_root("OmniMedVQA", root, OMNI_EXPECTED)
    if access not in ("open", "all"):
        raise DataError(f"OmniMedVQA: access must be 'open' or 'all', got {access!r}")
    folders = ["Open-access"] + (["Restricted-access"] if access == "all" else [])
    files = [p for f in folders for p in sorted((root / "QA_information" / f).glob("*.json"))]
    if not files:
        raise layout_error("OmniMedVQA", root, "no QA_information/Open-access/*.json file", OMNI_EXPECTED)
    samples = []
    for path in files:
        items = read_json(path)
        if not isinstance(items, list):
            raise DataError(f"{path}: expected a JSON list of questions")
        for i, raw in enumerate(items):
            where = f"{path}: item {i}"
            missing = [k for k in ("question", "gt_answer", "option_A", "image_path") if k not in raw]
            if missing:
                raise layout_error("OmniMedVQA", root, f"{where}: missing key(s) {missing}", OMNI_EXPECTED)
            options = [str(raw[f"option_{c}"]).strip() for c in "ABCDEFGH" if raw.get(f"option_{c}") not in (None, "")]
            image = _find_image([root], str(raw["image_path"]).lstrip("./"))
            if image is None:
                raise layout_error("OmniMedVQA", root, f"{where}: image {raw['image_path']!r} not found", OMNI_EXPECTED)
            samples.append(_mc_sample(
                f"omnimedvqa-{raw.get('question_id', f'{path.stem}-{i}')}", str(raw["question"]), options,
                str(raw["gt_answer"]), [image], where,
                {"source": "omnimedvqa", "dataset": str(raw.get("dataset", path.stem)),
                 "question_type": str(raw.get("question_type")), "modality": str(raw.get("modality_type"))}))
    return BenchmarkData("omnimedvqa", root, samples, {"split": split, "files": len(files), "access": access,
                                                       "closed_rule": "multiple choice"})


MEDXPERT_EXPECTED = (
    "MM/test.jsonl (MM/dev.jsonl for split val)   questions: id, question, options {letter: text}, label, images",
    "images/<file>                                 images unzipped from images.zip",
)
_ANSWER_CHOICES = re.compile(r"\s*Answer Choices\s*:.*\Z", re.DOTALL | re.IGNORECASE)


def load_medxpertqa_mm(root: Path, *, split: str, media_cache: Path, **_: Any) -> BenchmarkData:
    """MedXpertQA, config MM (TsinghuaC3I/MedXpertQA): JSONL questions and an image folder. The question's
    appended "Answer Choices: (A) ..." block is dropped (the options are given separately)."""
    root = check_root("MedXpertQA-MM", root, MEDXPERT_EXPECTED)
    path = first_existing([root / "MM" / f"{'dev' if split == 'val' else 'test'}.jsonl"])
    if path is None:
        raise layout_error("MedXpertQA-MM", root, f"no question file for split '{split}'", MEDXPERT_EXPECTED)
    samples = []
    for n, line in enumerate(path.read_text(encoding="utf-8").splitlines(), start=1):
        if not line.strip():
            continue
        where = f"{path}:{n}"
        try:
            raw = json.loads(line)
        except json.JSONDecodeError as exc:
            raise DataError(f"{where}: not valid JSON ({exc})") from exc
        if not isinstance(raw.get("options"), dict) or "label" not in raw or not raw.get("images"):
            raise layout_error("MedXpertQA-MM", root, f"{where}: needs options {{letter: text}}, label and images",
                               MEDXPERT_EXPECTED)
        letters = sorted(raw["options"])
        options = [str(raw["options"][k]).strip() for k in letters]
        if letters != option_letters(len(letters)):
            raise DataError(f"{where}: option keys {letters} are not A, B, C, ... in order")
        images = []
        for name in raw["images"]:
            p = _find_image([root / "images", root / "MM" / "images", root], str(name))
            if p is None:
                raise layout_error("MedXpertQA-MM", root, f"{where}: image {name!r} not found", MEDXPERT_EXPECTED)
            images.append(p)
        question = _ANSWER_CHOICES.sub("", str(raw["question"]))
        samples.append(_mc_sample(f"medxpertqa-{raw.get('id', n)}", question, options, str(raw["label"]), images,
                                  where, {"source": "medxpertqa-mm", "medical_task": str(raw.get("medical_task")),
                                          "body_system": str(raw.get("body_system")),
                                          "question_type": str(raw.get("question_type"))}))
    return BenchmarkData("medxpertqa-mm", root, samples, {"split": split, "file": str(path),
                                                          "closed_rule": "multiple choice"})


MMMU_SUBJECTS = ("Basic_Medical_Science", "Clinical_Medicine", "Diagnostics_and_Laboratory_Medicine", "Pharmacy",
                 "Public_Health")
MMMU_EXPECTED = (
    "<Subject>/validation-*.parquet   for the Health & Medicine subjects " + ", ".join(MMMU_SUBJECTS),
    "(dev-*.parquet for split dev; columns id, question, options (a list written as text), answer, image_1 ..",
    "(image_7 {bytes, path}, question_type, subfield; test answers are hidden, so there is no test split)",
)
_IMAGE_TAG = re.compile(r"<image (\d+)>")


def load_mmmu_med(root: Path, *, split: str, media_cache: Path, subjects: Any = None, include_open: bool = False,
                  **_: Any) -> BenchmarkData:
    """MMMU (MMMU/MMMU) Health & Medicine subjects from the Parquet copy; multiple-choice questions only unless
    ``include_open`` (MedVLThinker keeps multiple choice). ``<image n>`` tags become "(image n)"; the images
    of a question, in the order image_1 .. image_7, are written once to the media cache."""
    root = check_root("MMMU", root, MMMU_EXPECTED)
    names = list(subjects) if subjects else list(MMMU_SUBJECTS)
    stem = "validation" if split == "val" else split
    samples, open_skipped, found = [], 0, []
    for subject in names:
        tables = sorted((root / subject).glob(f"{stem}-*.parquet"))
        if not tables:
            continue
        found.append(subject)
        rows = read_parquet(tables, ("id", "question", "options", "answer"))
        for i, row in enumerate(rows):
            where = f"{tables[0]} row {i}"
            images = [save_embedded_image(row[f"image_{k}"], media_cache / "mmmu", where)
                      for k in range(1, 8) if row.get(f"image_{k}")]
            question = _IMAGE_TAG.sub(r"(image \1)", str(row["question"]))
            if str(row.get("question_type", "multiple-choice")) != "multiple-choice":
                if not include_open:
                    open_skipped += 1
                    continue
                samples.append(Sample(id=f"mmmu-{row['id']}", problem_type="open", question=question,
                                      answer=str(row["answer"]), media=[MediaItem("image", str(p)) for p in images],
                                      meta={"answer_type": "open", "closed_rule": "question_type", "source": "mmmu",
                                            "subject": subject, "subfield": str(row.get("subfield"))}))
                continue
            try:
                options = ast.literal_eval(str(row["options"]))
            except (ValueError, SyntaxError) as exc:
                raise DataError(f"{where}: options {row['options']!r} is not a list written as text ({exc})") from exc
            options = [_IMAGE_TAG.sub(r"(image \1)", str(o)) for o in options]
            samples.append(_mc_sample(f"mmmu-{row['id']}", question, options, str(row["answer"]), images, where,
                                      {"source": "mmmu", "subject": subject, "subfield": str(row.get("subfield"))}))
    if not found:
        raise layout_error("MMMU", root, f"no {stem}-*.parquet under any of {', '.join(names)}", MMMU_EXPECTED)
    return BenchmarkData("mmmu-med", root, samples, {"split": split, "subjects": found, "open_skipped": open_skipped,
                                                     "closed_rule": "multiple choice"})


# ----------------------------------------------------------------------------------------------------------
# Fixtures: the toy world's scans in each set's layout
# ----------------------------------------------------------------------------------------------------------


def _medical_rows(recs: list[dict[str, Any]]) -> list[tuple[Path, str, str]]:
    rows = []
    for r in recs:
        answer = r["answer"]
        if r["problem_type"] == "multiple_choice":
            answer = r["options"]["ABCD".index(answer)]
        rows.append((r["file"], r["question"], str(answer)))
    return rows


def _hf_parquet_fixture(name: str) -> Any:
    def write(out: Path, *, n: int, seed: int, **_: Any) -> None:
        import pyarrow as pa
        import pyarrow.parquet as pq

        with toy_questions("scan", n, seed) as recs:
            rows = [{"image": {"bytes": f.read_bytes(), "path": f"synpic{j}.png"}, "question": q, "answer": a}
                    for j, (f, q, a) in enumerate(_medical_rows(recs))]
        (out / "data").mkdir(parents=True, exist_ok=True)
        pq.write_table(pa.Table.from_pylist(rows), out / "data" / f"test-00000-of-00001-{name}.parquet")

    return write


def slake_fixture(out: Path, *, n: int, seed: int, **_: Any) -> None:
    items = []
    with toy_questions("scan", n, seed) as recs:
        for j, (f, q, a) in enumerate(_medical_rows(recs)):
            copy_media(f, out / "imgs" / f"xmlab{j}" / "source.jpg")
            closed = a.lower() in ("yes", "no")
            items.append({"img_id": j, "img_name": f"xmlab{j}/source.jpg", "question": q, "answer": a,
                          "q_lang": "en", "location": "Abdomen", "modality": ["CT", "MRI"][j % 2],
                          "answer_type": "CLOSED" if closed else "OPEN", "base_type": "vqa",
                          "content_type": "Abnormality", "triple": ["vhead", "_", "_"], "qid": j})
    items.append(dict(items[0], q_lang="zh", qid=1000, question="图像中有病变吗?"))
    (out / "test.json").write_text(json.dumps(items, ensure_ascii=False, indent=1))


def _scan_mcq(recs: list[dict[str, Any]]) -> list[tuple[Path, str, list[str], int]]:
    """Every toy scan question as multiple choice: (image, question, options, index of the gold option)."""
    from data_pipelines.toy.scan import LOCATIONS, POLARITIES

    out = []
    for r in recs:
        if r["problem_type"] == "multiple_choice":
            out.append((r["file"], r["question"], list(r["options"]), "ABCD".index(r["answer"])))
            continue
        options = ["yes", "no"] if r["problem_type"] == "yes_no" else \
            list(LOCATIONS) if r["answer"] in LOCATIONS else list(POLARITIES)
        out.append((r["file"], r["question"], options, options.index(r["answer"])))
    return out


def pmc_vqa_fixture(out: Path, *, n: int, seed: int, **_: Any) -> None:
    rows = []
    with toy_questions("scan", n, seed) as recs:
        for j, (f, q, opts, gold) in enumerate(_scan_mcq(recs)):
            name = f"PMC{1000 + j}_F{j % 3 + 1}.jpg"
            copy_media(f, out / "images" / name)
            row = {"Figure_path": name, "Question": q, "Answer": opts[gold], "Answer_label": "ABCD"[gold]}
            row.update({f"Choice {c}": "" for c in "ABCD"})
            row.update({f"Choice {'ABCD'[i]}": f"{'ABCD'[i]}:{o}" for i, o in enumerate(opts)})
            rows.append(row)
    with open(out / "test_clean.csv", "w", encoding="utf-8", newline="") as fh:
        w = csv.DictWriter(fh, ["Figure_path", "Question", "Answer", "Choice A", "Choice B", "Choice C", "Choice D",
                                "Answer_label"])
        w.writeheader()
        w.writerows(rows)


def omnimedvqa_fixture(out: Path, *, n: int, seed: int, **_: Any) -> None:
    qa = out / "QA_information" / "Open-access"
    qa.mkdir(parents=True, exist_ok=True)
    by_set: dict[str, list[dict[str, Any]]] = {}
    with toy_questions("scan", n, seed) as recs:
        for j, (f, q, opts, gold) in enumerate(_scan_mcq(recs)):
            dataset = ["Toy CT", "Toy MRI"][j % 2]
            rel = f"Images/{dataset.replace(' ', '_')}/scan_{j}.png"
            copy_media(f, out / rel)
            item = {"dataset": dataset, "question_id": f"{dataset.replace(' ', '_')}_{j}", "question_type":
                    "Anatomy Identification", "question": q, "gt_answer": opts[gold], "image_path": rel,
                    "modality_type": dataset.split()[1]}
            item.update({f"option_{'ABCD'[i]}": o for i, o in enumerate(opts)})
            by_set.setdefault(dataset, []).append(item)
    for dataset, items in by_set.items():
        (qa / f"{dataset.replace(' ', '_')}.json").write_text(json.dumps(items, indent=1))


def medxpertqa_fixture(out: Path, *, n: int, seed: int, **_: Any) -> None:
    lines = []
    with toy_questions("scan", n, seed) as recs:
        for j, (f, q, opts, gold) in enumerate(_scan_mcq(recs)):
            name = f"MM-{j}-a.jpeg"
            copy_media(f, out / "images" / name)
            letters = "ABCDE"[:len(opts)]
            choices = " ".join(f"({c}) {o}" for c, o in zip(letters, opts))
            lines.append(json.dumps({"id": f"MM-{j}", "question": f"{q}\nAnswer Choices: {choices}",
                                     "options": dict(zip(letters, opts)), "label": letters[gold], "images": [name],
                                     "medical_task": "Diagnosis", "body_system": "Lymphatic",
                                     "question_type": ["Reasoning", "Understanding"][j % 2]}))
    (out / "MM").mkdir(parents=True, exist_ok=True)
    (out / "MM" / "test.jsonl").write_text("\n".join(lines) + "\n")


def mmmu_med_fixture(out: Path, *, n: int, seed: int, **_: Any) -> None:
    import pyarrow as pa
    import pyarrow.parquet as pq

    by_subject: dict[str, list[dict[str, Any]]] = {}
    with toy_questions("scan", n, seed) as recs:
        for j, (f, q, opts, gold) in enumerate(_scan_mcq(recs)):
            subject = MMMU_SUBJECTS[j % 2]
            row = {"id": f"validation_{subject}_{j + 1}", "question": f"<image 1> {q}", "options": str(opts),
                   "explanation": "", "image_1": {"bytes": f.read_bytes(), "path": f"{j}.png"},
                   **{f"image_{k}": None for k in range(2, 8)}, "img_type": "['CT']", "answer": "ABCD"[gold],
                   "topic_difficulty": "Easy", "question_type": "multiple-choice", "subfield": "Radiology"}
            by_subject.setdefault(subject, []).append(row)
    first = by_subject[MMMU_SUBJECTS[0]][0]  # one open question, left out by default
    by_subject[MMMU_SUBJECTS[0]].append(dict(first, id="validation_open_1", question_type="open", answer="left"))
    schema = pa.schema([(k, pa.string()) for k in first if not k.startswith("image_")]
                       + [(f"image_{k}", pa.struct([("bytes", pa.binary()), ("path", pa.string())]))
                          for k in range(1, 8)])
    for subject, rows in by_subject.items():
        (out / subject).mkdir(parents=True, exist_ok=True)
        pq.write_table(pa.Table.from_pylist(rows, schema=schema), out / subject / "validation-00000-of-00001.parquet")


# ----------------------------------------------------------------------------------------------------------
# The specs
# ----------------------------------------------------------------------------------------------------------


def question_only(sample: Sample, subtitles: str | None = None) -> tuple[str | None, str, str]:
    """LLaVA-Med's prompt: the question as it is."""
    return None, sample.question.strip(), ""


_LLAVA_MED = {"max_new_tokens": 128, "source": "LLaVA-Med scoring (microsoft/LLaVA-Med llava/eval/run_eval_batch.py)"}
_MC = {"max_new_tokens": 128, "source": "multiple choice, letter or option text"}

VQA_RAD = register_benchmark(Benchmark(
    name="vqa-rad", title="VQA-RAD", reader=_parquet_reader("vqa-rad", "VQA-RAD"), splits=("test", "train"),
    aliases=("vqarad",), kind="medical", official=_LLAVA_MED, prompt=question_only, scoring="closed_open",
    fixture=_hf_parquet_fixture("vqa-rad")))
PATHVQA = register_benchmark(Benchmark(
    name="pathvqa", title="PathVQA", reader=_parquet_reader("pathvqa", "PathVQA"), splits=("test", "val", "train"),
    aliases=("path-vqa",), kind="medical", official=_LLAVA_MED, prompt=question_only, scoring="closed_open",
    fixture=_hf_parquet_fixture("pathvqa")))
SLAKE = register_benchmark(Benchmark(
    name="slake", title="SLAKE", reader=load_slake, splits=("test", "val", "train"), kind="medical",
    official=_LLAVA_MED, prompt=question_only, scoring="closed_open", breakdowns=("modality",),
    # the English questions, as papers report SLAKE (lmms-eval's "slake" also runs the Chinese ones)
    lmms_task="slake_en", fixture=slake_fixture))
PMC_VQA = register_benchmark(Benchmark(
    name="pmc-vqa", title="PMC-VQA", reader=load_pmc_vqa, splits=("test", "train"), aliases=("pmcvqa",),
    kind="medical", official=_MC, fixture=pmc_vqa_fixture))
OMNIMEDVQA = register_benchmark(Benchmark(
    name="omnimedvqa", title="OmniMedVQA", reader=load_omnimedvqa, splits=("test",), aliases=("omni-med-vqa",),
    kind="medical", official=_MC, fixture=omnimedvqa_fixture))
MEDXPERTQA_MM = register_benchmark(Benchmark(
    name="medxpertqa-mm", title="MedXpertQA-MM", reader=load_medxpertqa_mm, splits=("test", "val"),
    aliases=("medxpertqa",), kind="medical", official=_MC, fixture=medxpertqa_fixture))
MMMU_MED = register_benchmark(Benchmark(
    name="mmmu-med", title="MMMU Health & Medicine", reader=load_mmmu_med, splits=("val", "dev"),
    aliases=("mmmu-health", "mmmu-hm"), kind="medical", official=_MC, fixture=mmmu_med_fixture))


# ----------------------------------------------------------------------------------------------------------
# Training on a public set: write its records as a native JSONL file for `mmrl train --data`
# ----------------------------------------------------------------------------------------------------------


def export_training_file(name: str, root: str | Path, out: str | Path, *, split: str = "train",
                         **options: Any) -> Path:
    """Write benchmark ``name``'s ``split`` as native JSONL records (absolute image paths; closed/open in
    ``meta.answer_type``), loadable by ``mmrl train --data OUT``; returns ``OUT``."""
    from data_pipelines.loaders import write_jsonl

    data = read_with(BENCHMARKS.get(name), root, split=split, **options)  # this module's readers (registered below)
    return write_jsonl(out, data.samples)


def main(argv: list[str] | None = None) -> int:
    import argparse

    p = argparse.ArgumentParser(prog="python -m data_pipelines.benchmarks.medical",
                                description="Write a medical VQA set as a JSONL training file (mmrl train --data).")
    sub = p.add_subparsers(dest="cmd", required=True)
    e = sub.add_parser("export", help="NAME ROOT --split SPLIT --out FILE.jsonl")
    e.add_argument("name", help="vqa-rad, pathvqa, slake, pmc-vqa, omnimedvqa, medxpertqa-mm, mmmu-med")
    e.add_argument("root", help="the folder the set was downloaded to, in its public layout")
    e.add_argument("--split", default="train", help="split to write (default train; test/val/dev where the set has no train)")
    e.add_argument("--out", required=True, help="output JSONL file")
    args = p.parse_args(argv)
    out = export_training_file(args.name, args.root, args.out, split=args.split)
    print(f"wrote {len(out.read_text(encoding='utf-8').splitlines())} records to {out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
