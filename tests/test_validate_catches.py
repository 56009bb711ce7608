"""`mmrl data validate` names every record that would stop training (issue 47, "Done when"; items 5, 8, 9).

A data file of good records and records that each stop a run when drawn (a sampling window past the end of
the video, more frames than it has, an image typed as a video and the reverse, a video that does not decode, a
missing file, sampling values of the wrong type or range, duplicate or too many options, an answer outside the
options, a question over ``data.max_question_chars``...). The media are real files written here (PyAV MP4, PIL
images). Validate names each bad record at its line with its reason and exits 1; the good ones pass. The load
``mmrl train`` does (``load_split``) refuses the file listing them, or with ``data.on_bad_sample=skip`` keeps the
good records, and every one of those goes through the media preparer and the prompt as training takes them.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import numpy as np
import pytest
from PIL import Image
from tiny_runs import TINY_RUN, module_cache  # noqa: F401 -- module_cache is a fixture

from data_pipelines.loaders import DEFAULT_MAX_QUESTION_CHARS
from mmrl.cli import main as cli_main
from mmrl.config import load_run_config
from mmrl.engine.media import MediaPreparer
from mmrl.engine.prompts import user_text
from mmrl.run import load_split
from video.writer import write_mp4

pytestmark = pytest.mark.usefixtures("module_cache")

VIDEO = "media/ten seconds.mp4"  # 20 frames at 2 fps: 10 s


def _rec(rid: str, media: list[dict], **kw) -> dict:
    r = {"id": rid, "problem_type": "multiple_choice", "question": "What colour is the square?",
         "options": ["red", "green", "blue", "yellow"], "answer": "B", "media": media}
    r.update(kw)
    return r


def _video(path: str = VIDEO, **sampling) -> dict:
    return {"type": "video", "path": path, **({"sampling": sampling} if sampling else {})}


GOOD = [
    _rec("good-video", [_video()]),
    _rec("good-window", [_video(start=2, end=6, nframes=4)]),
    _rec("good-nulls", [_video(fps=None, nframes=4, start=None)]),  # null = not given (Parquet/datasets rows)
    _rec("good-image", [{"type": "image", "path": "media/scan.png"}], problem_type="yes_no", options=None,
         answer="no"),
    _rec("good-labelled", [_video(end=9.5)], options=["A. red", "B. green", "C. blue"]),
]

BAD = {  # id: (record, what validate must say)
    "window-after-end": (_rec("window-after-end", [_video(start=30, end=40)]),
                         r"start=30 s is at or after the end of the video: the video is 10\.00 s"),
    "start-after-end": (_rec("start-after-end", [_video(start=12)]), r"start=12 s is at or after the end"),
    "window-too-short": (_rec("window-too-short", [_video(start=3, end=3.4)]), r"holds fewer than 2 frames"),
    "more-frames-than-video": (_rec("more-frames-than-video", [_video(nframes=64)]),
                               r"nframes=64 does not fit: the window holds 20 frames"),
    "one-frame": (_rec("one-frame", [_video(nframes=1)]), r"nframes=1 does not fit"),
    "max-frames-1": (_rec("max-frames-1", [_video(max_frames=1)]), r"max_frames=1 takes no frames"),
    "one-frame-video": (_rec("one-frame-video", [_video("media/still.mp4")]),
                        r"the video has 1 frame; Qwen-VL's frame rule takes at least 2"),
    "image-as-video": (_rec("image-as-video", [_video("media/photo.jpg")]), r"is a JPEG image, not a video"),
    "video-as-image": (_rec("video-as-image", [{"type": "image", "path": VIDEO}]),
                       r"is a \.mp4 video file, not an image; give it as a video item"),
    "truncated": (_rec("truncated", [_video("media/truncated.mp4")]), r"cannot decode video .*truncated\.mp4"),
    "missing": (_rec("missing", [_video("media/missing.mp4")]), r"video file not found: .*missing\.mp4"),
    "fps-text": (_rec("fps-text", [_video(fps="two")]), r"fps='two' must be a number"),
    "fps-quoted": (_rec("fps-quoted", [_video(fps="2")]), r"fps='2' is text; write the number without quotes"),
    "fps-zero": (_rec("fps-zero", [_video(fps=0)]), r"fps=0 must be above 0"),
    "nframes-negative": (_rec("nframes-negative", [_video(nframes=-2)]), r"nframes=-2 must be a whole number"),
    "nframes-fraction": (_rec("nframes-fraction", [_video(nframes=2.5)]), r"nframes=2\.5 must be a whole number"),
    "start-not-before-end": (_rec("start-not-before-end", [_video(start=5, end=2)]),
                             r"start=5 s is after end=2 s: the window holds no video"),
    "pixels-crossed": (_rec("pixels-crossed", [{"type": "image", "path": "media/scan.png",
                                                "sampling": {"min_pixels": 100000, "max_pixels": 1000}}]),
                       r"min_pixels=100000 is above max_pixels=1000"),
    "zero-size": (_rec("zero-size", [_video(resized_height=0, resized_width=0)]), r"resized_height=0 must be"),
    "too-narrow": (_rec("too-narrow", [{"type": "image", "path": "media/strip.png"}]),
                   r"it is 3000x14 pixels, an aspect ratio of 214:1, past the 200:1 Qwen-VL's resize takes"),
    "url": (_rec("url", [_video("https://example.com/ten.mp4")]), r"is a URL; mmrl reads local files only"),
    "no-type": (_rec("no-type", ["media/ten seconds"]), r"no type, and the path's extension does not tell"),
    "sampling-list": (_rec("sampling-list", [{"type": "video", "path": VIDEO, "sampling": [2, 8]}]),
                      r"'sampling' must be an object"),
    "duplicate-options": (_rec("duplicate-options", [_video()], options=["red", "green", "red", "blue"]),
                          r"options A and C are the same text \('red'\)"),
    "too-many-options": (_rec("too-many-options", [_video()], options=[f"colour {i}" for i in range(27)]),
                         r"27 options, but options are lettered A to Z"),
    "answer-outside": (_rec("answer-outside", [_video()], answer="E"), r"answer letter 'E' is outside the options"),
    "question-too-long": (_rec("question-too-long", [_video()], question="Why? " * (DEFAULT_MAX_QUESTION_CHARS // 4)),
                          r"over the cap of 20,000"),
}


@pytest.fixture(scope="module")
def data(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict[str, int]]:
    """The data file (good and bad records mixed) and each record's line."""
    root = tmp_path_factory.mktemp("catches")
    rng = np.random.default_rng(0)
    video = write_mp4(root / VIDEO, rng.integers(0, 256, (20, 32, 32, 3), dtype=np.uint8), 2.0)
    write_mp4(root / "media" / "still.mp4", rng.integers(0, 256, (1, 32, 32, 3), dtype=np.uint8), 1.0)
    raw = video.read_bytes()
    (root / "media" / "truncated.mp4").write_bytes(raw[: len(raw) // 2])
    Image.fromarray(rng.integers(0, 256, (56, 56, 3), dtype=np.uint8)).save(root / "media" / "scan.png")
    Image.fromarray(rng.integers(0, 256, (56, 56, 3), dtype=np.uint8)).save(root / "media" / "photo.jpg")
    Image.new("RGB", (3000, 14), (40, 200, 90)).save(root / "media" / "strip.png")
    records = [r for pair in zip(GOOD, [b for b, _ in BAD.values()]) for r in pair]
    records += [b for b, _ in list(BAD.values())[len(GOOD):]]
    path = root / "train.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in records))
    return path, {r["id"]: i for i, r in enumerate(records, 1)}


def test_validate_names_every_record_that_would_stop_training(data, capsys: pytest.CaptureFixture[str]) -> None:
    path, lines = data
    rc = cli_main(["data", "validate", str(path), "--no-progress"])
    out = capsys.readouterr().out
    assert rc == 1, out
    assert "Traceback" not in out
    reported = out.splitlines()
    for rid, (_, pattern) in BAD.items():
        hits = [ln for ln in reported if ln.startswith(f"{path}:{lines[rid]}: sample '{rid}': ")]
        assert hits, f"{rid} (line {lines[rid]}) not named:\n{out}"
        assert any(re.search(pattern, ln) for ln in hits), (rid, hits)
    for good in GOOD:
        assert not [ln for ln in reported if ln.startswith(f"{path}:{lines[good['id']]}:")], (good["id"], out)
    assert reported[-1].startswith("FAILED") and f"{len(GOOD)} good, {len(BAD)} bad" in reported[-1]


def test_training_refuses_them_at_load_or_keeps_only_the_good_ones(data, tmp_path: Path,
                                                                   capfd: pytest.CaptureFixture[str]) -> None:
    """``mmrl train`` stops at load, before the first step, listing every bad record; with skip, the load keeps
    the good records, each of which the media preparer decodes and the prompt renders, as a training step does."""
    path, lines = data
    run = tmp_path / "run"
    rc = cli_main(["train", "--quiet", "--data", str(path), "--out", str(run), *TINY_RUN])
    _, err = capfd.readouterr()
    assert rc == 2, err
    assert f"{len(BAD)} bad record(s) of {len(GOOD) + len(BAD)} in {path}" in err and "Traceback" not in err
    for rid in BAD:
        assert f"{path}:{lines[rid]}: sample '{rid}'" in err, rid
    assert not (run / "metrics.jsonl").exists()
    cfg = load_run_config("video-qa", overrides=[*TINY_RUN, f"data.train={path}", "data.on_bad_sample=skip"])
    samples, info = load_split(cfg, "train", show_progress=False)
    capfd.readouterr()
    assert [s.id for s in samples] == [g["id"] for g in GOOD]
    assert info["skipped"] == len(BAD)
    preparer = MediaPreparer(cfg.data.media)
    for s in samples:
        media = preparer.prepare(s)
        assert len(media) == len(s.media)
        assert "A. A." not in user_text(s, cfg.prompt)
    window = next(s for s in samples if s.id == "good-window")
    assert all(2 <= t <= 6 for t in preparer.prepare(window)[0].timestamps)


def test_parquet_rows_with_different_sampling_keys(data, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """An EasyR1/Hub-style Parquet table: Arrow gives every row every sampling key (null where the row had none).
    The good rows pass and train; a window past the video's end and too many frames are named at their record."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    path, _ = data
    video = str(path.parent / VIDEO)
    rows = [_rec("pq-nframes", [_video(video, nframes=4)]), _rec("pq-window", [_video(video, start=2, end=6)]),
            _rec("pq-after-end", [_video(video, start=30, end=40)]), _rec("pq-too-many", [_video(video, nframes=64)]),
            _rec("pq-plain", [_video(video)])]
    table = tmp_path / "train.parquet"
    pq.write_table(pa.Table.from_pylist(rows), table)
    assert cli_main(["data", "validate", str(table), "--no-progress"]) == 1
    out = capsys.readouterr().out
    assert re.search(rf"{re.escape(str(table))}:record 2: sample 'pq-after-end': .*start=30 s is at or after the end",
                     out), out
    assert re.search(rf"{re.escape(str(table))}:record 3: sample 'pq-too-many': .*nframes=64 does not fit", out), out
    assert "3 good, 2 bad" in out.splitlines()[-1]
    cfg = load_run_config("video-qa", overrides=[*TINY_RUN, f"data.train={table}", "data.on_bad_sample=skip"])
    samples, _ = load_split(cfg, "train", show_progress=False)
    capsys.readouterr()
    assert [s.id for s in samples] == ["pq-nframes", "pq-window", "pq-plain"]
    preparer = MediaPreparer(cfg.data.media)
    for s in samples:
        assert preparer.prepare(s)


@pytest.mark.slow
def test_a_run_with_skip_trains_past_them(data, tmp_path: Path, capfd: pytest.CaptureFixture[str]) -> None:
    """The run of the report (stopped at step 18 by a window past the video's end) with data.on_bad_sample=skip:
    the bad records are named at load and every step trains on good ones."""
    path, lines = data
    run = tmp_path / "run"
    rc = cli_main(["train", "--quiet", "--data", str(path), "--out", str(run), *TINY_RUN, "train.steps=3",
                   "data.on_bad_sample=skip"])
    out, err = capfd.readouterr()
    assert rc == 0, err
    info = json.loads((run / "summary.json").read_text())["stages"]["data"]["train"]
    assert info["used"] == len(GOOD) and info["skipped"] == len(BAD)
    assert f"  {path}:{lines['window-after-end']}: sample 'window-after-end': " in out
    assert "skipping sample" not in out + err  # nothing left to fail when drawn


def test_a_decoder_error_names_its_file_once(data) -> None:
    """A video whose frames cannot be taken as a run's settings ask, drawn in training: the preparer's
    MediaError names the file once (video.sampling's message already starts with it: it read "v.mp4: v.mp4: ...")."""
    from data_pipelines.schema import Sample
    from mmrl_common.errors import MediaError

    path, _ = data
    video = str(path.parent / VIDEO)
    cfg = load_run_config(task="video-qa", overrides=["data.media.video_policy=uniform", "data.media.nframes=4"])
    sample = Sample.from_dict(_rec("x", [{"type": "video", "path": video, "sampling": {"min_frames": 2}}]))
    with pytest.raises(MediaError) as err:
        MediaPreparer(cfg.data.media).prepare(sample)
    assert str(err.value).count(video) == 1, str(err.value)


def test_validate_takes_the_runs_question_cap(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """A run with a lower data.max_question_chars refuses at load a record the default cap passes: validate
    checks against the same cap with --max-question-chars, and its hint names that flag."""
    path = tmp_path / "long.jsonl"
    path.write_text(json.dumps(_rec("long", [], question="Which colour? " + "x" * 600)) + "\n")
    assert cli_main(["data", "validate", str(path), "--no-progress"]) == 0
    capsys.readouterr()
    assert cli_main(["data", "validate", str(path), "--no-progress", "--max-question-chars", "500"]) == 1
    out = capsys.readouterr().out
    assert re.search(r"long\.jsonl:1: .*over the cap of 500; .*--max-question-chars N", out), out
    cfg = load_run_config(task="video-qa", overrides=[f"data.train={path}", "data.max_question_chars=500"])
    with pytest.raises(Exception, match="over the cap of 500"):
        load_split(cfg, "train", show_progress=False)
