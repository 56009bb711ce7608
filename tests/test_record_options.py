"""Options of a record (issue 47, item 5): a label that repeats the option's own letter ("A. red") is stripped
when the record is read, so the prompt says "A. red" once; options that are the same text, or more than the 26
that have letters, make a bad record named by ``mmrl data validate`` and refused at load."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from data_pipelines.loaders import load_samples
from mmrl.cli import main as cli_main
from mmrl.config import PromptConfig
from mmrl.engine.prompts import user_text


def _rec(i: int, options: list[str], answer: str = "A", **kw) -> dict:
    return {"id": f"q{i}", "problem_type": "multiple_choice", "question": "What colour is it?",
            "options": options, "answer": answer, "media": [], **kw}


def _write(path: Path, records: list[dict]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in records))
    return path


def test_labelled_options_render_once_in_the_prompt(tmp_path: Path) -> None:
    data = _write(tmp_path / "d.jsonl", [
        _rec(1, ["A. red", "B. green", "C. blue"]),
        _rec(2, ["(A) red", "(B) green"]),
        _rec(3, ["A) red", "B: green", "C.blue"]),
    ])
    samples = load_samples(data).samples
    assert [s.options for s in samples] == [["red", "green", "blue"], ["red", "green"], ["red", "green", "blue"]]
    text = user_text(samples[0], PromptConfig())  # the text the training and evaluation prompts show
    assert "A. red\nB. green\nC. blue\n" in text
    assert "A. A." not in text and "B. B." not in text
    # only a label of the option's own letter, on every option, is a label: "A. Lincoln" beside an unlabelled
    # option, or letters out of order, are the options' own text
    data = _write(tmp_path / "kept.jsonl", [
        _rec(1, ["A. Lincoln", "Washington"]),
        _rec(2, ["B. red", "A. green"]),
        _rec(3, ["A.", "B."]),
    ])
    assert [s.options for s in load_samples(data).samples] == [
        ["A. Lincoln", "Washington"], ["B. red", "A. green"], ["A.", "B."]]


def test_duplicate_options_are_a_bad_record(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    data = _write(tmp_path / "d.jsonl", [
        _rec(1, ["red", "green", "blue"]),                 # good
        _rec(2, ["red", "green", "red"]),                  # C repeats A
        _rec(3, ["A. red", "B. Red ", "C. blue"]),         # the same after the labels go (case, spaces)
        _rec(4, [f"colour {i}" for i in range(27)]),       # 27 options: there are 26 letters
    ])
    rc = cli_main(["data", "validate", str(data), "--no-progress"])
    out = capsys.readouterr().out
    assert rc == 1, out
    lines = out.splitlines()
    assert not any(ln.startswith(f"{data}:1:") for ln in lines)
    assert any(ln.startswith(f"{data}:2: sample 'q2': ") and "options A and C are the same" in ln
               and "'red'" in ln for ln in lines), out
    assert any(ln.startswith(f"{data}:3: sample 'q3': ") and "options A and B are the same" in ln
               for ln in lines), out
    assert any(ln.startswith(f"{data}:4: sample 'q4': ") and "27 options" in ln and "26" in ln for ln in lines), out
    assert "Traceback" not in out
    assert "1 good, 3 bad" in lines[-1]
    # and training refuses them at load, or leaves them out with on_bad_sample=skip
    res = load_samples(data, on_bad_sample="skip")
    assert [s.id for s in res.samples] == ["q1"] and res.skipped == 3
