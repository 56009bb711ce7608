"""The report's data counts are the data file's: lines read (blank ones too), records, loaded, skipped and why,
and the samples used (the good records a setting leaves out, named), for the training and the held-out split.

Before, ``report.md`` said "3 samples used of 3 loaded (4 bad records skipped)" for a file of 10 lines: the
blank lines, the records and why each was skipped were not said, a filter's and ``eval.limit``'s cuts were
counted as used, and a run without held-out data said nothing about it.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from tiny_runs import TINY_RUN, module_cache  # noqa: F401 -- module_cache is a fixture

from mmrl import cli
from mmrl.config import load_run_config
from mmrl.run import load_split

pytestmark = pytest.mark.usefixtures("module_cache")


@pytest.fixture(scope="module")
def files(module_cache: None, tmp_path_factory: pytest.TempPathFactory) -> dict:  # noqa: F811
    cfg = load_run_config("video-qa", overrides=TINY_RUN)
    _, info = load_split(cfg, "train", show_progress=False)
    toy = Path(info["path"])
    rows = [json.loads(line) for line in toy.read_text().splitlines() if line.strip()][:4]
    for r in rows:
        for m in r["media"]:
            m["path"] = str((toy.parent / m["path"]).resolve())
    root = tmp_path_factory.mktemp("counts")
    (root / "cut.mp4").write_bytes(Path(rows[0]["media"][0]["path"]).read_bytes()[:3000])
    train = [
        json.dumps(rows[0]), json.dumps(rows[1]),
        "",  # 3: blank
        json.dumps(rows[2]),
        json.dumps({**rows[0], "id": "bad-media", "media": [{"type": "video", "path": "cut.mp4"}]}),
        json.dumps({**rows[0], "id": "bad-field", "answer": "Z"}),
        "   ",  # 7: blank (spaces)
        json.dumps(rows[3])[:-1],  # 8: cut short
        json.dumps(rows[1]),  # 9: duplicate id
        json.dumps({**rows[0], "id": "missing", "media": [{"type": "video", "path": "nowhere.mp4"}]}),
        json.dumps({**rows[0], "id": "yes-no", "problem_type": "yes_no", "options": [], "answer": "yes"}),
    ]
    (root / "train.jsonl").write_text("\n".join(train) + "\n\n")  # 12: blank
    test = [json.dumps({**r, "id": f"t-{r['id']}"}) for r in rows[:3]]
    test.insert(1, "")
    test.append(json.dumps({**rows[0], "id": "t-bad", "media": [{"type": "video", "path": "cut.mp4"}]}))
    (root / "test.jsonl").write_text("\n".join(test) + "\n")
    return {"train": root / "train.jsonl", "test": root / "test.jsonl"}


def file_counts(path: Path) -> tuple[int, int]:
    """(lines, blank lines) of a JSONL file, counted as an editor numbers them."""
    lines = path.read_text().split("\n")
    if lines[-1] == "":
        lines.pop()
    return len(lines), sum(1 for line in lines if not line.strip())


def test_load_split_counts_the_file(files: dict) -> None:
    cfg = load_run_config("video-qa", overrides=[*TINY_RUN, f"data.train={files['train']}",
                                                 "data.on_bad_sample=skip", "data.problem_types=[multiple_choice]"])
    samples, info = load_split(cfg, "train", show_progress=False)
    lines, blank = file_counts(files["train"])
    assert (info["lines"], info["blank_lines"]) == (lines, blank) == (12, 3)
    assert info["records"] == lines - blank == info["loaded"] + info["skipped"] == 9
    assert info["skipped_by"] == {"media": 2, "fields": 1, "json": 1, "duplicate": 1}
    assert sum(info["skipped_by"].values()) == info["skipped"] == len(info["skipped_records"]) == 5
    assert info["loaded"] == 4 and info["used"] == len(samples) == 3
    assert info["left_out"] == {"data.problem_types": 1}


@pytest.mark.slow
def test_the_report_says_what_the_files_hold(files: dict, tmp_path: Path, capfd: pytest.CaptureFixture) -> None:
    run = tmp_path / "run"
    rc = cli.main(["train", "--quiet", "--data", str(files["train"]), "--eval-data", str(files["test"]),
                   "--out", str(run), *TINY_RUN, "train.steps=1", "data.on_bad_sample=skip",
                   "data.problem_types=[multiple_choice]", "eval.after_rl=true", "eval.limit=1"])
    capfd.readouterr()
    assert rc == 0
    report = (run / "report.md").read_text()
    train, test = files["train"], files["test"]
    assert (f"- **train data** `{train}`: 12 lines read (3 blank), 9 records: 4 loaded, 5 skipped (2 bad media, "
            "1 bad fields, 1 broken JSON, 1 duplicate id); 3 used (1 left out by data.problem_types)") in report
    assert (f"- **eval data** (test split) `{test}`: 5 lines read (1 blank), 4 records: 3 loaded, 1 skipped "
            "(1 bad media); 1 used (2 left out by eval.limit)") in report
    for where in (5, 6, 8, 9, 10):
        assert f"  - skipped `{train}:{where}`" in report
    assert f"  - skipped `{test}:5`" in report
    summary = json.loads((run / "summary.json").read_text())
    assert summary["eval_after_rl"]["n"] == summary["stages"]["data"]["eval"]["used"] == 1


def test_a_run_without_held_out_data_says_so(files: dict) -> None:
    from mmrl.run.report import data_line

    cfg = load_run_config("video-qa", overrides=[*TINY_RUN, f"data.train={files['train']}"])
    _, info = load_split(cfg, "test", show_progress=False)
    assert data_line("eval", info) == "- **eval data** (test split): none (no data.test file given)"
