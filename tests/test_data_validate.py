"""`mmrl data validate` finds planted faults by file and line; `mmrl data inspect` writes a contact sheet."""

from __future__ import annotations

import json
import re
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from data_pipelines.loaders import load_samples
from data_pipelines.toy import ToyConfig, make_toy, toy_tasks
from data_pipelines.toy.scan import render_scan
from data_pipelines.toy.video_tasks import color_task
from mmrl.cli import main as cli_main
from video.writer import write_mp4


def _rec(i: int, media: list[dict], **kw) -> str:
    r = {"id": f"s{i}", "problem_type": "multiple_choice", "question": "What colour is the object?",
         "options": ["red", "green", "blue", "yellow"], "answer": "B", "media": media, "meta": {}}
    r.update(kw)
    return json.dumps(r)


@pytest.fixture(scope="module")
def planted(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict[int, str]]:
    """A JSONL file with good records and one planted fault per line; returns it and {line: fault}."""
    root = tmp_path_factory.mktemp("planted")
    item = color_task(np.random.default_rng(0), 1, ToyConfig())
    good = write_mp4(root / "media" / "good.mp4", item.frames, item.fps)
    data = good.read_bytes()
    (root / "media" / "truncated.mp4").write_bytes(data[: len(data) // 2])
    (root / "media" / "empty.mp4").write_bytes(b"")
    Image.fromarray(render_scan(np.random.default_rng(1), 64, None)).save(root / "media" / "scan.png")
    vid = {"type": "video", "path": "media/good.mp4"}
    lines = [
        _rec(1, [vid]),                                                         # 1 good
        _rec(2, [{"type": "image", "path": "media/scan.png"}], problem_type="yes_no", options=None,
             answer="no"),                                                      # 2 good
        _rec(3, [{"type": "video", "path": "media/missing.mp4"}]),             # 3 missing media file
        _rec(4, [{"type": "video", "path": "media/truncated.mp4"}]),           # 4 truncated MP4
        _rec(5, [{"type": "video", "path": "media/empty.mp4"}]),               # 5 zero-byte file
        '{"id": "s6", "problem_type": "multiple_choice", "question": "x"',    # 6 broken JSON line
        _rec(7, [vid], answer="E"),                                             # 7 answer letter outside options
        _rec(8, [vid], problem_type="riddle"),                                  # 8 unknown problem type
        _rec(9, [vid], answer="D"),                                             # 9 good
    ]
    path = root / "planted.jsonl"
    path.write_text("\n".join(lines) + "\n")
    faults = {3: r"video file not found: .*missing\.mp4", 4: r"cannot decode video.*truncated\.mp4",
              5: r"empty \(0 bytes\)", 6: r"broken JSON", 7: r"answer letter 'E' is outside the options",
              8: r"unknown problem_type 'riddle'"}
    return path, faults


def test_validate_reports_every_planted_fault(planted, capsys: pytest.CaptureFixture[str]):
    path, faults = planted
    rc = cli_main(["data", "validate", str(path), "--no-progress"])
    out = capsys.readouterr().out
    assert rc == 1
    lines = out.strip().splitlines()
    problem_lines = [ln for ln in lines if ln.startswith(f"{path}:")]
    for lineno, pattern in faults.items():
        hits = [ln for ln in problem_lines if ln.startswith(f"{path}:{lineno}: ")]
        assert hits, f"fault on line {lineno} not reported:\n{out}"
        assert any(re.search(pattern, ln) for ln in hits), (lineno, hits)
    reported = {int(ln[len(str(path)) + 1:].split(":")[0]) for ln in problem_lines}
    assert reported == set(faults)  # good lines 1, 2, 9 are not reported
    assert lines[-1].startswith("FAILED") and "9 records" in lines[-1] and "3 good, 6 bad" in lines[-1]
    assert "5 media files checked, 3 bad" in lines[-1]


def test_validate_with_media_root_and_good_exit(planted, tmp_path: Path, capsys: pytest.CaptureFixture[str]):
    path, _ = planted
    good_lines = [ln for i, ln in enumerate(path.read_text().splitlines(), 1) if i in (1, 2, 9)]
    elsewhere = tmp_path / "records.jsonl"
    elsewhere.write_text("\n".join(good_lines) + "\n")
    assert cli_main(["data", "validate", str(elsewhere), "--no-progress"]) == 1  # media not next to it
    assert "not found" in capsys.readouterr().out
    rc = cli_main(["data", "validate", str(elsewhere), "--media-root", str(path.parent), "--no-progress"])
    out = capsys.readouterr().out
    assert rc == 0 and out.startswith("OK:") and "3 good, 0 bad" in out


def test_loader_skip_keeps_every_good_record(planted):
    path, faults = planted
    res = load_samples(path, on_bad_sample="skip", check_media="decode")
    assert [s.id for s in res.samples] == ["s1", "s2", "s9"]
    assert res.skipped == len(faults) == 6
    assert sorted({p.line for p in res.problems}) == sorted(faults)
    # without media checks, the records whose only fault is their media load fine
    res = load_samples(path, on_bad_sample="skip")
    assert [s.id for s in res.samples] == ["s1", "s2", "s3", "s4", "s5", "s9"] and res.skipped == 3


def test_validate_json_reports_record_index(planted, tmp_path: Path, capsys: pytest.CaptureFixture[str]):
    path, _ = planted
    recs = [json.loads(ln) for i, ln in enumerate(path.read_text().splitlines(), 1) if i != 6]
    data = tmp_path / "planted.json"
    data.write_text(json.dumps({"data": recs}))
    rc = cli_main(["data", "validate", str(data), "--media-root", str(path.parent), "--no-progress"])
    out = capsys.readouterr().out
    assert rc == 1
    assert f"{data}:record 5: sample 's7': answer letter 'E'" in out  # 0-based index in the JSON list
    assert re.search(rf"{re.escape(str(data))}:record 3: sample 's4': media\[0\] .*cannot decode video", out)


def test_inspect_writes_contact_sheet(tmp_path: Path, capsys: pytest.CaptureFixture[str]):
    toy = make_toy(tmp_path / "toy", seed=2, size={"train": 0, "val": 2, "test": 0}, progress=False)
    out_dir = tmp_path / "sheet"
    rc = cli_main(["data", "inspect", str(toy / "val.jsonl"), "--out", str(out_dir), "--samples", "5"])
    text = capsys.readouterr().out
    assert rc == 0
    png = out_dir / "val_contact_sheet.png"
    assert png.exists() and f"contact sheet: {png}" in text
    img = np.asarray(Image.open(png).convert("RGB"))
    assert img.shape[0] > 5 * 96 and img.std() > 10  # five rows of real frames, not a blank page
    assert "problem type" in text and "multiple_choice" in text and "needle" in text
    longest = max(json.loads(ln)["meta"]["video"]["duration"] for ln in (toy / "val.jsonl").read_text().splitlines()
                  if "video" in json.loads(ln).get("meta", {}))
    match = re.search(r"duration \(s\)\s+2\s+2\s+(\d+)", text)
    assert match and float(match.group(1)) == pytest.approx(longest)
    n_image_tasks = sum(t.kind == "image" for t in toy_tasks().values())
    assert f"images: {2 * n_image_tasks} files" in text and "64x64" in text
