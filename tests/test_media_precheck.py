"""Bad media are found at load, before the first training step.

A dataset with planted faults (a missing, an empty, a truncated and a fake MP4, a line cut short) stops
``mmrl train`` at load with every bad record listed as FILE:LINE and the override that skips them; with
``data.on_bad_sample=skip`` the run trains on the rest and names each skipped record on the console and in
the report. The file checks run on a thread pool, keep the decoders' own console noise back, and are cached
by path and content. Also: ``mmrl data inspect`` names a bad file once, ``mmrl data
validate`` says how JSON records are numbered; an image the processor cannot take (an aspect ratio past its
limit) stops the run naming the sample and the file, or is skipped with ``data.on_bad_sample=skip``.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
from tiny_runs import TINY_RUN, module_cache  # noqa: F401 -- module_cache is a fixture

from mmrl import cli
from mmrl.config import load_run_config
from mmrl.run import load_split

pytestmark = pytest.mark.usefixtures("module_cache")


@pytest.fixture(scope="module")
def planted(module_cache: None, tmp_path_factory: pytest.TempPathFactory) -> dict:  # noqa: F811
    """Lines 1-4: good toy records; 5: missing video; 6: empty; 7: truncated MP4; 8: text named .mp4;
    9: a JSON line cut short (its closing brace lost)."""
    cfg = load_run_config("video-qa", overrides=TINY_RUN)
    _, info = load_split(cfg, "train", show_progress=False)
    toy = Path(info["path"])
    rows = [json.loads(line) for line in toy.read_text().splitlines() if line.strip()][:4]
    root = tmp_path_factory.mktemp("planted")
    good_video = (toy.parent / rows[0]["media"][0]["path"]).resolve()
    for r in rows:
        for m in r["media"]:
            m["path"] = str((toy.parent / m["path"]).resolve())
    (root / "empty.mp4").write_bytes(b"")
    (root / "truncated.mp4").write_bytes(good_video.read_bytes()[:3000])
    (root / "fake.mp4").write_text("this is not a video\n")
    bad = {5: "missing.mp4", 6: "empty.mp4", 7: "truncated.mp4", 8: "fake.mp4"}
    lines = [json.dumps(r) for r in rows]
    for line, name in bad.items():
        lines.append(json.dumps({**rows[0], "id": f"bad-{line}", "media": [{"type": "video", "path": name}]}))
    broken = json.dumps({**rows[1], "id": "cut"})[:-1]  # the closing brace lost
    lines.append(broken)
    data = root / "my_train.jsonl"
    data.write_text("\n".join(lines) + "\n")
    return {"data": data, "root": root, "bad": bad, "cut_at": len(broken), "good_video": good_video}


def test_train_stops_at_load_listing_every_bad_record(planted: dict, tmp_path: Path,
                                                      capfd: pytest.CaptureFixture) -> None:
    run = tmp_path / "run"
    rc = cli.main(["train", "--quiet", "--data", str(planted["data"]), "--out", str(run), *TINY_RUN])
    out, err = capfd.readouterr()
    assert rc == 2
    data = planted["data"]
    assert f"5 bad record(s) of 9 in {data}" in err
    assert f"{data}:5: sample 'bad-5': media[0] (path 'missing.mp4'): video file not found" in err
    assert f"{data}:6: sample 'bad-6': media[0] (path 'empty.mp4'): video file is empty" in err
    assert f"{data}:7: sample 'bad-7': media[0] (path 'truncated.mp4'): cannot decode video" in err
    assert f"{data}:8: sample 'bad-8': media[0] (path 'fake.mp4'): cannot decode video" in err
    assert f"{data}:9: broken JSON: Expecting ',' delimiter at the end of the line (column {planted['cut_at'] + 1}): the record is cut short" in err
    assert "pass data.on_bad_sample=skip" in err
    # one reason per file, said once; nothing from the decoders themselves
    line7 = next(line for line in err.splitlines() if f"{data}:7:" in line)
    assert line7.count("truncated.mp4") == 2 and "decord also failed" not in line7  # the relative and full path
    assert "moov atom" not in out + err and "video_reader.cc" not in out + err
    # stopped before the first step
    assert not (run / "metrics.jsonl").exists() and not list(run.glob("checkpoint-*"))


def test_skip_trains_on_the_rest_and_names_each_skipped_record(planted: dict, tmp_path: Path,
                                                               capfd: pytest.CaptureFixture) -> None:
    run = tmp_path / "run"
    rc = cli.main(["train", "--quiet", "--data", str(planted["data"]), "--out", str(run), *TINY_RUN,
                   "train.steps=1", "data.on_bad_sample=skip"])
    out, _ = capfd.readouterr()
    assert rc == 0
    summary = json.loads((run / "summary.json").read_text())
    info = summary["stages"]["data"]["train"]
    assert info["used"] == 4 and info["skipped"] == 5
    data = planted["data"]
    report = (run / "report.md").read_text()
    for line in (5, 6, 7, 8, 9):
        assert f"  {data}:{line}: " in out
        assert f"skipped `{data}:{line}`" in report
    assert [r["where"] for r in info["skipped_records"]] == [f"{data}:{n}" for n in (5, 6, 7, 8, 9)]


def test_file_checks_are_cached_by_path_and_content(planted: dict, tmp_path: Path) -> None:
    from data_pipelines.media_check import LAST_CHECK, check_files

    video = tmp_path / "v.mp4"
    video.write_bytes(planted["good_video"].read_bytes())
    cache = tmp_path / "media-check.json"
    assert check_files([(video, "video")], cache_file=cache) == {(str(video), "video"): None}
    assert cache.is_file()
    # the same bytes with a newer modification time: the verdict comes from the cache
    st = video.stat()
    os.utime(video, ns=(st.st_atime_ns, st.st_mtime_ns + 10**9))
    assert check_files([(video, "video")], cache_file=cache) == {(str(video), "video"): None}
    assert LAST_CHECK["cached_here"] == 1 and LAST_CHECK["checked"] == 0
    # other bytes of the same size, the time put back: checked again
    video.write_bytes(b"x" * st.st_size)
    os.utime(video, ns=(st.st_atime_ns, st.st_mtime_ns))
    assert "cannot decode video" in check_files([(video, "video")], cache_file=cache)[(str(video), "video")]
    # the verdicts of files that are gone are dropped when the cache is next written
    other = tmp_path / "w.mp4"
    other.write_bytes(planted["good_video"].read_bytes())
    check_files([(other, "video")], cache_file=cache)
    assert len(json.loads(cache.read_text())) == 2
    video.unlink()
    other.write_bytes(b"y" * 100)  # changed: checked and written again
    check_files([(other, "video")], cache_file=cache)
    assert list(json.loads(cache.read_text())) == [f"video:decode:{other}"]


def test_inspect_names_a_bad_file_once_and_validate_says_how_records_count(planted: dict, tmp_path: Path) -> None:
    import io

    from data_pipelines.inspect import inspect_dataset
    from data_pipelines.validate import run_validate

    report = inspect_dataset(planted["data"], samples=0)
    assert report.media_errors
    for error in report.media_errors:
        name = next(n for n in ("missing.mp4", "empty.mp4", "truncated.mp4", "fake.mp4") if n in error)
        assert error.count(name) == 1, error
    records = [json.loads(line) for line in planted["data"].read_text().splitlines()[:5]]
    (tmp_path / "d.json").write_text(json.dumps(records))
    printed = io.StringIO()
    assert run_validate(tmp_path / "d.json", media_root=planted["root"], out=printed) == 1
    assert f"{tmp_path / 'd.json'}:record 4: sample 'bad-5'" in printed.getvalue()
    assert "0-based index in the JSON list" in printed.getvalue()


def _image_set(tmp_path: Path) -> Path:
    from PIL import Image

    rows = []
    for i, size in enumerate([(64, 64), (64, 64), (3000, 14), (64, 64)]):
        Image.new("RGB", size, (40 * i, 200, 90)).save(tmp_path / f"im{i}.png")
        rows.append({"id": f"q{i}", "problem_type": "multiple_choice", "question": "What colour?",
                     "options": ["red", "green", "blue"], "answer": "B",
                     "media": [{"type": "image", "path": f"im{i}.png"}]})
    path = tmp_path / "train.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def test_media_the_model_cannot_take_are_skipped_when_asked(tmp_path: Path) -> None:
    from mmrl.run import train
    from mmrl_common.errors import MmrlError

    data = _image_set(tmp_path)
    # data.check_media=none: the draw-time rule (a full check refuses the 214:1 image at load: test_validate_catches)
    common = [f"data.train={data}", "train.prompts_per_step=4", "data.media.image_max_pixels=12544",
              "data.check_media=none"]
    cfg = load_run_config("image-qa", overrides=[*TINY_RUN, *common, "data.on_bad_sample=skip"])
    summary = train(cfg, run_dir=tmp_path / "skip", show_progress=False)
    assert summary["stages"]["rl"]["skipped_samples"] >= 1
    cfg = load_run_config("image-qa", overrides=[*TINY_RUN, *common])
    with pytest.raises(MmrlError, match=r"sample q2: .*im2\.png.*aspect ratio.*on_bad_sample=skip"):
        train(cfg, run_dir=tmp_path / "raise", show_progress=False)
