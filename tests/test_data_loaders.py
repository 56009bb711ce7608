"""Loaders on JSONL, JSON, Parquet and `datasets` folders, column mapping, bad records, importers."""

from __future__ import annotations

import io
import json
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from data_pipelines.importers import detect_record_format, extract_answer_tag
from data_pipelines.loaders import load_samples, write_jsonl
from data_pipelines.schema import split_option
from mmrl_common.errors import DataError

# Source records with differently named columns, mapped by COLUMNS onto the schema.
ROWS = [
    {"uid": "a", "kind": "multiple_choice", "query": "Colour?", "options": ["red", "green", "blue"],
     "label": "C", "media": [{"type": "image", "path": "img/a.png"}], "level": "easy"},
    {"uid": "b", "kind": "yes_no", "query": "Lesion?", "options": None, "label": "no",
     "media": [{"type": "image", "path": "img/b.png"}], "level": "hard"},
    {"uid": "c", "kind": "temporal_grounding", "query": "When?", "options": None, "label": "[1.0, 2.5]",
     "media": [{"type": "video", "path": "vid/c.mp4"}], "level": "medium"},
    {"uid": "d", "kind": "numeric", "query": "How many?", "options": None, "label": "3",
     "media": [{"type": "video", "path": "vid/d.mp4"}], "level": "easy"},
]
COLUMNS = {"uid": "id", "kind": "problem_type", "query": "question", "label": "answer", "level": "meta.difficulty"}


def _check_loaded(result, base: Path) -> None:
    assert [s.id for s in result.samples] == ["a", "b", "c", "d"]
    assert result.skipped == 0 and result.problems == [] and result.total == 4
    a, b, c, d = result.samples
    assert a.answer == "C" and a.answer_text() == "blue" and a.meta["difficulty"] == "easy"
    assert b.problem_type == "yes_no" and b.meta["difficulty"] == "hard"
    assert c.answer == [1.0, 2.5]
    assert d.answer == "3"
    assert Path(a.media[0].path) == base / "img/a.png"  # resolved against the data folder / media_root
    assert c.media[0].type == "video"


def test_jsonl_json_parquet_hf_with_column_mapping(tmp_path: Path):
    write_jsonl(tmp_path / "d.jsonl", ROWS)
    (tmp_path / "list.json").write_text(json.dumps(ROWS))
    (tmp_path / "obj.json").write_text(json.dumps({"version": 1, "data": ROWS}))
    import pyarrow as pa
    import pyarrow.parquet as pq

    pq.write_table(pa.Table.from_pylist(ROWS), tmp_path / "d.parquet")
    import datasets

    datasets.Dataset.from_list(ROWS).save_to_disk(str(tmp_path / "hf"))

    for name, fmt in [("d.jsonl", "jsonl"), ("list.json", "json"), ("obj.json", "json"),
                      ("d.parquet", "parquet"), ("hf", "hf")]:
        auto = load_samples(tmp_path / name, columns=COLUMNS)
        assert auto.file_format == fmt, name
        base = tmp_path / "hf" if name == "hf" else tmp_path
        _check_loaded(auto, base)
        explicit = load_samples(tmp_path / name, columns=COLUMNS, fmt=fmt)
        assert [s.to_dict() for s in explicit] == [s.to_dict() for s in auto]
    media_root = tmp_path / "elsewhere"
    _check_loaded(load_samples(tmp_path / "d.jsonl", columns=COLUMNS, media_root=media_root), media_root)


def _native(i: int, **kw) -> dict:
    r = {"id": f"r{i}", "problem_type": "multiple_choice", "question": "q", "options": ["x", "y", "z"],
         "answer": "A", "media": [], "meta": {}}
    r.update(kw)
    return r


def _bad_jsonl(path: Path) -> None:
    lines = [json.dumps(_native(1)), json.dumps(_native(2, answer="F")), '{"id": "r3", "question": ',
             "", json.dumps(_native(4)), json.dumps(_native(5, problem_type="riddle")), json.dumps(_native(1)),
             json.dumps(_native(7))]
    path.write_text("\n".join(lines) + "\n")


def test_bad_records_skip_and_raise(tmp_path: Path):
    path = tmp_path / "bad.jsonl"
    _bad_jsonl(path)
    res = load_samples(path, on_bad_sample="skip")
    assert [s.id for s in res.samples] == ["r1", "r4", "r7"]
    assert res.skipped == 4 and res.total == 7
    where = {p.line: p for p in res.problems}
    assert sorted(where) == [2, 3, 6, 7]  # 1-based lines; the blank line 4 is not a record
    assert "outside the options" in where[2].reason
    assert where[3].kind == "json" and "broken JSON" in where[3].reason
    assert "unknown problem_type" in where[6].reason
    assert "duplicate id" in where[7].reason and f"{path}:1" in where[7].reason
    assert str(where[3]).startswith(f"{path}:3: broken JSON")
    assert res.locations == [f"{path}:1", f"{path}:5", f"{path}:8"]
    with pytest.raises(DataError) as exc:
        load_samples(path)
    assert f"{path}:2: sample 'r2'" in str(exc.value) and f"{path}:3: broken JSON" in str(exc.value)
    assert "on_bad_sample='skip'" in str(exc.value)


def test_json_record_index_and_broken_json(tmp_path: Path):
    path = tmp_path / "d.json"
    path.write_text(json.dumps([_native(0), _native(1, answer="Q"), _native(2)], indent=1))
    res = load_samples(path, on_bad_sample="skip")
    assert len(res) == 2 and str(res.problems[0]).startswith(f"{path}:record 1: sample 'r1'")
    path.write_text('[{"id": "a",\n "question": }]')
    res = load_samples(path, on_bad_sample="skip")
    assert len(res) == 0 and res.problems[0].line == 2 and "broken JSON" in res.problems[0].reason
    with pytest.raises(DataError, match=r"d\.json:2: broken JSON"):
        load_samples(path)


def test_check_media_exists(tmp_path: Path):
    img = tmp_path / "ok.png"
    Image.fromarray(np.arange(64 * 64 * 3, dtype=np.uint32).reshape(64, 64, 3).astype(np.uint8)).save(img)
    (tmp_path / "empty.png").write_bytes(b"")
    rows = [_native(1, media=[{"type": "image", "path": "ok.png"}]),
            _native(2, media=[{"type": "image", "path": "missing.png"}]),
            _native(3, media=[{"type": "image", "path": "empty.png"}])]
    write_jsonl(tmp_path / "m.jsonl", rows)
    assert len(load_samples(tmp_path / "m.jsonl")) == 3  # media not checked by default
    res = load_samples(tmp_path / "m.jsonl", check_media=True, on_bad_sample="skip")
    assert [s.id for s in res] == ["r1"]
    assert "not found" in res.problems[0].reason and res.problems[0].line == 2
    assert "empty (0 bytes)" in res.problems[1].reason and res.problems[1].line == 3


def test_unknown_format_and_missing_file(tmp_path: Path):
    (tmp_path / "d.txt").write_text("a,b\n")  # .csv reads as CSV since issue 61; .txt tells nothing
    with pytest.raises(DataError, match="--format with one of jsonl, json, parquet, csv, hf"):
        load_samples(tmp_path / "d.txt")
    with pytest.raises(DataError, match="not found"):
        load_samples(tmp_path / "nope.jsonl")
    with pytest.raises(DataError, match="unknown format 'xml'"):
        load_samples(tmp_path / "d.txt", fmt="xml")


VIDEO_R1 = [
    {"problem_id": 1, "problem": "What is the man doing?", "data_type": "video", "problem_type": "multiple choice",
     "options": ["A. running", "B. sitting", "C. eating"], "process": "<think>..</think>",
     "solution": "<answer>B</answer>", "path": "./videos/1.mp4", "data_source": "LLaVA-Video"},
    {"problem_id": 2, "problem": "How many cars?", "data_type": "image", "problem_type": "numerical",
     "options": [], "solution": "<answer> 4 </answer>", "path": "./images/2.jpg", "data_source": "CLEVR"},
    {"problem_id": 3, "problem": "Read the sign.", "data_type": "image", "problem_type": "OCR",
     "options": [], "solution": "<answer>STOP HERE</answer>", "path": "./images/3.jpg", "data_source": "TextVQA"},
    {"problem_id": 4, "problem": "Describe it.", "data_type": "video", "problem_type": "free-form",
     "options": [], "solution": "<answer>A dog runs.</answer>", "path": "./videos/4.mp4", "data_source": "X"},
    {"problem_id": 5, "problem": "Distance in m?", "data_type": "video", "problem_type": "regression",
     "options": [], "solution": "<answer>2.75</answer>", "path": "./videos/5.mp4", "data_source": "X"},
]


def test_video_r1_import(tmp_path: Path):
    (tmp_path / "vr1.json").write_text(json.dumps(VIDEO_R1))
    res = load_samples(tmp_path / "vr1.json")
    assert res.record_format == "video-r1"
    mc, num, ocr, free, reg = res.samples
    assert mc.problem_type == "multiple_choice" and mc.options == ["running", "sitting", "eating"]
    assert mc.answer == "B" and mc.answer_text() == "sitting" and mc.id == "LLaVA-Video-1"
    assert mc.media[0].type == "video" and Path(mc.media[0].path) == tmp_path / "videos/1.mp4"
    assert (num.problem_type, num.answer, num.media[0].type) == ("numeric", "4", "image")
    assert (ocr.problem_type, ocr.answer) == ("ocr", "STOP HERE")
    assert ocr.meta["original_problem_type"] == "OCR" and ocr.meta["source"] == "video-r1"
    assert free.problem_type == "free_form" and reg.problem_type == "regression"
    # forced format on a JSONL file; a bad letter is reported at its line
    bad = dict(VIDEO_R1[0], solution="<answer>E</answer>")
    write_jsonl(tmp_path / "vr1.jsonl", [VIDEO_R1[1], bad])
    res = load_samples(tmp_path / "vr1.jsonl", fmt="video-r1", on_bad_sample="skip")
    assert len(res) == 1 and res.problems[0].line == 2 and "outside the options" in res.problems[0].reason


def test_easyr1_import(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    monkeypatch.setenv("MMRL_CACHE", str(tmp_path / "cache"))
    buf = io.BytesIO()
    Image.fromarray(np.full((8, 8, 3), 200, np.uint8)).save(buf, format="PNG")
    rows = [
        {"problem": "<image>Is the sky blue?", "answer": "yes", "images": ["a.png"]},
        {"prompt": "<video>What happens?", "answer": "<answer>a ball falls</answer>", "videos": ["v.mp4"],
         "difficulty": 0.3},
    ]
    assert detect_record_format(rows[0]) == "easyr1"
    write_jsonl(tmp_path / "e.jsonl", rows)
    res = load_samples(tmp_path / "e.jsonl")
    yn, opn = res.samples
    assert (yn.problem_type, yn.question, yn.answer) == ("yes_no", "Is the sky blue?", "yes")
    assert (opn.problem_type, opn.answer, opn.media[0].type) == ("open", "a ball falls", "video")
    assert opn.meta["difficulty"] == 0.3 and opn.id == "easyr1-2"
    # EasyR1 parquet files embed images as {"bytes", "path"}: they are written once to the media cache
    import pyarrow as pa
    import pyarrow.parquet as pq

    embedded = [{"problem": "<image>How many apples?", "answer": "5",
                 "images": [{"bytes": buf.getvalue(), "path": None}]}]
    pq.write_table(pa.Table.from_pylist(embedded), tmp_path / "e.parquet")
    (num,) = load_samples(tmp_path / "e.parquet", fmt="easyr1").samples
    assert num.problem_type == "numeric" and num.id == "easyr1-0"
    stored = Path(num.media[0].path)
    assert stored.parent == tmp_path / "cache" / "media" and stored.read_bytes() == buf.getvalue()


def test_importer_helpers():
    assert extract_answer_tag("<think>hm</think><answer> C </answer>") == "C"
    assert extract_answer_tag("plain") == "plain"
    assert split_option("B. a cat") == ("B", "a cat")
    assert split_option("(C) dog") == ("C", "dog")
    assert split_option("no letter") == (None, "no letter")
