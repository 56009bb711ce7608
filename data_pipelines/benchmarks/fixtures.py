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
"""

from __future__ import annotations

import json
import shutil
import tempfile
from pathlib import Path
from typing import Any

FIXTURES = ("mvbench", "videomme", "longvideobench", "mmvu", "vqa-rad", "pathvqa", "slake", "pmc-vqa", "omnimedvqa",
            "medxpertqa-mm", "mmmu-med", "toy")
MULTIPLE_CHOICE_MEDICAL = ("pmc-vqa", "omnimedvqa", "medxpertqa-mm", "mmmu-med")


def _toy(tmp: Path, task: str, n: int, seed: int) -> list[dict[str, Any]]:
    from data_pipelines.toy import make_toy

    make_toy(tmp, seed, size={"train": 0, "val": 0, "test": n}, tasks=[task], progress=False)
    recs = [json.loads(line) for line in (tmp / "test.jsonl").read_text().splitlines()]
    for r in recs:
        r["file"] = tmp / r["media"][0]["path"]
    return sorted(recs, key=lambda r: r["id"])


def _copy(src: Path, dst: Path) -> None:
    dst.parent.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(src, dst)


def _frame_folder(video: Path, folder: Path) -> None:
    from PIL import Image

    from video import open_video

    folder.mkdir(parents=True, exist_ok=True)
    with open_video(video) as reader:
        frames = reader.get_frames(range(reader.num_frames))
    for k, frame in enumerate(frames, start=1):  # the official reader counts files from 00001.jpg
        Image.fromarray(frame).save(folder / f"{k:05d}.jpg", quality=95)


def _mvbench(out: Path, recs: list[dict[str, Any]]) -> None:
    (out / "json").mkdir(parents=True, exist_ok=True)
    layout = [  # (task, folder under video/, file name in the JSON, bounded)
        ("action_sequence", "star/Charades_v1_480", "{i}.mp4", True),
        ("object_existence", "clevrer/video_validation", "video_{i}.mp4", False),
        ("episodic_reasoning", "tvqa/frames_fps3_hq", "clip_{i}", True),
    ]
    for k, (task, folder, pattern, bounded) in enumerate(layout):
        items = []
        for j, r in enumerate(recs[k::len(layout)]):
            name = pattern.format(i=j)
            target = out / "video" / folder / name
            if task == "episodic_reasoning":
                _frame_folder(r["file"], target)
            else:  # action_sequence/0 is stored as 0.MP4 (the JSON says 0.mp4)
                _copy(r["file"], target.with_suffix(".MP4") if (k, j) == (0, 0) else target)
            item = {"video": name, "question": r["question"],
                    "candidates": r["options"], "answer": r["options"]["ABCD".index(r["answer"])]}
            if bounded:
                item.update(start=0.3, end=1.7)
            items.append(item)
        if task == "episodic_reasoning":  # the extra question, read last: its frame folder is not there
            r = recs[0]
            items.append({"video": "clip_missing", "question": r["question"], "candidates": r["options"],
                          "answer": r["options"]["ABCD".index(r["answer"])], "start": 0.3, "end": 1.7})
        (out / "json" / f"{task}.json").write_text(json.dumps(items, indent=1))


def _videomme(out: Path, recs: list[dict[str, Any]]) -> None:
    import pyarrow as pa
    import pyarrow.parquet as pq

    rows = []
    durations = ["short", "medium", "long"]
    for j, r in enumerate(recs):
        vid = f"vid{j // 2:03d}xyz"
        _copy(r["file"], out / "data" / f"{vid}.{'MP4' if j // 2 == 0 else 'mp4'}")  # vid000xyz.MP4
        rows.append({"video_id": f"{j // 2 + 1:03d}", "duration": durations[(j // 2) % 3],
                     "domain": ["Knowledge", "Sports Competition"][(j // 2) % 2], "sub_category": "Toy",
                     "url": f"https://www.youtube.com/watch?v={vid}", "videoID": vid,
                     "question_id": f"{j // 2 + 1:03d}-{j % 2 + 1}",
                     "task_type": ["Attribute Perception", "Object Recognition"][j % 2], "question": r["question"],
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


# LongVideoBench subtitle files (the two formats longvideobench_dataset.py reads), by video:
# lvb0 in the clip's own clock ("timestamp" seconds, a null end = the clip's end), lvb1 cut from a source video
# at 100 s ("start"/"end" strings, starting_timestamp_for_subtitles = 100).
LVB_SUBTITLES: dict[str, tuple[float, list[dict[str, Any]]]] = {
    "lvb0": (0.0, [{"timestamp": [0.0, 0.9], "text": "Look at the moving object."},
                   {"timestamp": [1.2, None], "text": "It keeps its colour."}]),
    "lvb1": (100.0, [{"start": "00:01:40.250", "end": "00:01:41.000", "line": "Here it comes."},
                     {"start": "00:01:41.000", "end": "00:01:41.750", "line": "There it goes."}]),
}


def _lvb(out: Path, recs: list[dict[str, Any]]) -> None:
    items = []
    for j, r in enumerate(recs):
        _copy(r["file"], out / "videos" / f"lvb{j}.{'MP4' if j == 0 else 'mp4'}")  # lvb0.MP4
        cands = list(r["options"])
        offset, subs = LVB_SUBTITLES.get(f"lvb{j}", (0.0, None))
        if subs is not None:
            (out / "subtitles").mkdir(parents=True, exist_ok=True)
            (out / "subtitles" / f"lvb{j}_en.json").write_text(json.dumps(subs))
        items.append({"id": f"lvb{j}_0", "video_id": f"lvb{j}", "video_path": f"lvb{j}.mp4",
                      "subtitle_path": f"lvb{j}_en.json", "question": r["question"], "candidates": cands,
                      "correct_choice": "ABCD".index(r["answer"]), "duration": 2.0,
                      "duration_group": [15, 60][j % 2], "question_category": ["S2E", "T3O"][j % 2],
                      "topic_category": "TOY", "starting_timestamp_for_subtitles": offset})
    # the extra question, last: its video lvbmissing.mp4 is not in videos/
    items.append(dict(items[0], id="lvbmissing_0", video_id="lvbmissing", video_path="lvbmissing.mp4",
                      subtitle_path="lvbmissing_en.json", starting_timestamp_for_subtitles=0.0))
    (out / "lvb_val.json").write_text(json.dumps(items, indent=1))


def _mmvu(out: Path, recs: list[dict[str, Any]], layout: str = "yale-nlp") -> None:
    items = []
    for j, r in enumerate(recs):
        subject = ["Art", "Chemistry"][j % 2]
        _copy(r["file"], out / "videos" / subject / f"{j}.{'MP4' if j == 0 else 'mp4'}")  # videos/Art/0.MP4
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
    if layout != "lmms-eval":
        raise ValueError(f"MMVU fixture layout must be 'yale-nlp' or 'lmms-eval', got {layout!r}")
    import pyarrow as pa
    import pyarrow.parquet as pq

    # lmms-eval/MMVU: the Hub's Parquet export, a relative video_path, choices as a struct, no metadata column
    rows = [{"id": it["id"], "video_path": it["video"].split("/resolve/main/", 1)[1],
             "question_type": it["question_type"], "question": it["question"], "choices": it["choices"],
             "answer": it["answer"]} for it in items]
    (out / "data").mkdir(parents=True, exist_ok=True)
    pq.write_table(pa.Table.from_pylist(rows), out / "data" / "validation-00000-of-00001.parquet")


def _medical_rows(recs: list[dict[str, Any]]) -> list[tuple[Path, str, str]]:
    rows = []
    for r in recs:
        answer = r["answer"]
        if r["problem_type"] == "multiple_choice":
            answer = r["options"]["ABCD".index(answer)]
        rows.append((r["file"], r["question"], str(answer)))
    return rows


def _hf_parquet(out: Path, recs: list[dict[str, Any]], name: str) -> None:
    import pyarrow as pa
    import pyarrow.parquet as pq

    rows = [{"image": {"bytes": f.read_bytes(), "path": f"synpic{j}.png"}, "question": q, "answer": a}
            for j, (f, q, a) in enumerate(_medical_rows(recs))]
    (out / "data").mkdir(parents=True, exist_ok=True)
    pq.write_table(pa.Table.from_pylist(rows), out / "data" / f"test-00000-of-00001-{name}.parquet")


def _slake(out: Path, recs: list[dict[str, Any]]) -> None:
    items = []
    for j, (f, q, a) in enumerate(_medical_rows(recs)):
        _copy(f, out / "imgs" / f"xmlab{j}" / "source.jpg")
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


def _pmc_vqa(out: Path, recs: list[dict[str, Any]]) -> None:
    import csv

    rows = []
    for j, (f, q, opts, gold) in enumerate(_scan_mcq(recs)):
        name = f"PMC{1000 + j}_F{j % 3 + 1}.jpg"
        _copy(f, out / "images" / name)
        row = {"Figure_path": name, "Question": q, "Answer": opts[gold], "Answer_label": "ABCD"[gold]}
        row.update({f"Choice {c}": "" for c in "ABCD"})
        row.update({f"Choice {'ABCD'[i]}": f"{'ABCD'[i]}:{o}" for i, o in enumerate(opts)})
        rows.append(row)
    with open(out / "test_clean.csv", "w", encoding="utf-8", newline="") as fh:
        w = csv.DictWriter(fh, ["Figure_path", "Question", "Answer", "Choice A", "Choice B", "Choice C", "Choice D",
                                "Answer_label"])
        w.writeheader()
        w.writerows(rows)


def _omnimedvqa(out: Path, recs: list[dict[str, Any]]) -> None:
    qa = out / "QA_information" / "Open-access"
    qa.mkdir(parents=True, exist_ok=True)
    by_set: dict[str, list[dict[str, Any]]] = {}
    for j, (f, q, opts, gold) in enumerate(_scan_mcq(recs)):
        dataset = ["Toy CT", "Toy MRI"][j % 2]
        rel = f"Images/{dataset.replace(' ', '_')}/scan_{j}.png"
        _copy(f, out / rel)
        item = {"dataset": dataset, "question_id": f"{dataset.replace(' ', '_')}_{j}", "question_type":
                "Anatomy Identification", "question": q, "gt_answer": opts[gold], "image_path": rel,
                "modality_type": dataset.split()[1]}
        item.update({f"option_{'ABCD'[i]}": o for i, o in enumerate(opts)})
        by_set.setdefault(dataset, []).append(item)
    for dataset, items in by_set.items():
        (qa / f"{dataset.replace(' ', '_')}.json").write_text(json.dumps(items, indent=1))


def _medxpertqa(out: Path, recs: list[dict[str, Any]]) -> None:
    lines = []
    for j, (f, q, opts, gold) in enumerate(_scan_mcq(recs)):
        name = f"MM-{j}-a.jpeg"
        _copy(f, out / "images" / name)
        letters = "ABCDE"[:len(opts)]
        choices = " ".join(f"({c}) {o}" for c, o in zip(letters, opts))
        lines.append(json.dumps({"id": f"MM-{j}", "question": f"{q}\nAnswer Choices: {choices}",
                                 "options": dict(zip(letters, opts)), "label": letters[gold], "images": [name],
                                 "medical_task": "Diagnosis", "body_system": "Lymphatic",
                                 "question_type": ["Reasoning", "Understanding"][j % 2]}))
    (out / "MM").mkdir(parents=True, exist_ok=True)
    (out / "MM" / "test.jsonl").write_text("\n".join(lines) + "\n")


def _mmmu_med(out: Path, recs: list[dict[str, Any]]) -> None:
    import pyarrow as pa
    import pyarrow.parquet as pq

    from data_pipelines.benchmarks.medical import MMMU_SUBJECTS

    by_subject: dict[str, list[dict[str, Any]]] = {}
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


def write_fixture(name: str, out: str | Path, *, seed: int = 0, n: int = 4, layout: str | None = None) -> Path:
    """Write a ``n``-question copy of benchmark ``name`` in its public layout into ``out`` (the video benchmarks:
    ``n`` answerable questions and one more whose video is missing). ``layout="lmms-eval"`` writes MMVU as
    lmms-eval downloads it; other benchmarks have one layout."""
    if layout is not None and not (name == "mmvu" and layout in ("yale-nlp", "lmms-eval")):
        raise ValueError(f"no layout {layout!r} for the {name!r} fixture (MMVU has 'yale-nlp' and 'lmms-eval')")
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    if name == "toy":
        from data_pipelines.toy import make_toy

        return make_toy(out, seed, size={"train": 0, "val": 0, "test": n}, tasks=["color", "scan"], progress=False)
    with tempfile.TemporaryDirectory() as tmp:
        medical = name in ("vqa-rad", "pathvqa", "slake", *MULTIPLE_CHOICE_MEDICAL)
        recs = _toy(Path(tmp), "scan" if medical else "color", n, seed)
        writers = {"mvbench": _mvbench, "videomme": _videomme, "longvideobench": _lvb,
                   "mmvu": lambda o, r: _mmvu(o, r, layout or "yale-nlp"),
                   "vqa-rad": lambda o, r: _hf_parquet(o, r, "vqa-rad"),
                   "pathvqa": lambda o, r: _hf_parquet(o, r, "pathvqa"), "slake": _slake, "pmc-vqa": _pmc_vqa,
                   "omnimedvqa": _omnimedvqa, "medxpertqa-mm": _medxpertqa, "mmmu-med": _mmmu_med}
        if name not in writers:
            raise ValueError(f"no fixture for {name!r}; fixtures: {', '.join(FIXTURES)}")
        writers[name](out, recs)
    return out
