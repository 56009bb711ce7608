"""Bad input at load and at train time (issue 46): every decoder error is a MediaError naming the file (a
decompression bomb PNG is skipped by ``data.on_bad_sample=skip``); a PNG named ``.mp4`` is no video; a symlink
loop says so; the media-check cache trusts content, not size and time; a question that is a list, a prompt
over ``max_question_chars`` and a file with no records are refused at load, named."""

from __future__ import annotations

import io
import json
import os
import struct
import zlib
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from data_pipelines.loaders import load_samples
from data_pipelines.media_check import check_files, check_media_file
from data_pipelines.schema import MediaItem, Sample
from data_pipelines.toy import ToyConfig
from data_pipelines.toy.video_tasks import color_task
from data_pipelines.validate import run_validate
from mmrl.config import MediaConfig
from mmrl.engine.media import MediaPreparer
from mmrl_common.errors import DataError, MediaError
from video.reader import open_video
from video.writer import write_mp4
from vision import open_image


def _png_claiming(path: Path, width: int, height: int) -> Path:
    """A tiny PNG whose header says ``width`` x ``height`` (PIL refuses it as a bomb before any pixel)."""
    def chunk(tag: bytes, data: bytes) -> bytes:
        return struct.pack(">I", len(data)) + tag + data + struct.pack(">I", zlib.crc32(tag + data) & 0xFFFFFFFF)

    header = struct.pack(">IIBBBBB", width, height, 8, 0, 0, 0, 0)
    path.write_bytes(b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", header) + chunk(b"IDAT", zlib.compress(b"\0" * 64))
                     + chunk(b"IEND", b""))
    return path


def _video(path: Path) -> Path:
    item = color_task(np.random.default_rng(0), 1, ToyConfig())
    return write_mp4(path, item.frames, item.fps)


def _record(i: int, media: list[dict] | None = None, **kw) -> dict:
    r = {"id": f"q{i}", "problem_type": "multiple_choice", "question": "What colour is it?",
         "options": ["red", "green", "blue"], "answer": "B", "media": media or [], "meta": {}}
    r.update(kw)
    return r


def _jsonl(path: Path, records: list[dict]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in records))
    return path


# ------------------------------------------------------------------------------------------------ media
def test_a_decompression_bomb_png_is_a_media_error_naming_the_file(tmp_path: Path) -> None:
    bomb = _png_claiming(tmp_path / "huge.png", 30_000, 30_000)
    with pytest.raises(MediaError, match=r"huge\.png: image too large to decode safely"):
        open_image(bomb)
    sample = Sample("big", "multiple_choice", "Which?", "A", ["x", "y"], [MediaItem("image", str(bomb))])
    with pytest.raises(MediaError, match=r"huge\.png"):  # the trainer skips a MediaError with on_bad_sample=skip
        MediaPreparer(MediaConfig()).prepare(sample)
    reason = check_media_file(bomb, "image")
    assert "too large" in reason and "truncated" not in reason


def test_a_png_named_mp4_is_not_a_video(tmp_path: Path) -> None:
    fake = tmp_path / "clip.mp4"
    Image.new("RGB", (32, 32), (200, 10, 10)).save(fake, format="PNG")
    with pytest.raises(MediaError, match=r"clip\.mp4: is a PNG image, not a video"):
        open_video(fake)
    assert "PNG image, not a video" in check_media_file(fake, "video")
    assert "PNG image, not a video" in check_media_file(fake, "video", decode=False)
    data = _jsonl(tmp_path / "d.jsonl", [_record(1, [{"type": "video", "path": "clip.mp4"}])])
    printed = io.StringIO()
    assert run_validate(data, out=printed) == 1
    assert f"{data}:1: sample 'q1': media[0] (path 'clip.mp4'): video {fake}: is a PNG image" in printed.getvalue()


def test_a_symlink_loop_says_symlink_loop(tmp_path: Path) -> None:
    loop = tmp_path / "loop.mp4"
    os.symlink(loop.name, loop)
    assert "symlink loop" in check_media_file(loop, "video")
    with pytest.raises(MediaError, match="symlink loop"):
        open_video(loop)
    png = tmp_path / "loop.png"
    os.symlink(png.name, png)
    with pytest.raises(MediaError, match="symlink loop"):
        open_image(png)


def test_the_check_cache_trusts_content_not_size_and_time(tmp_path: Path) -> None:
    video = _video(tmp_path / "v.mp4")
    cache = tmp_path / "media-check.json"
    assert check_files([(video, "video")], cache_file=cache) == {(str(video), "video"): None}
    st = video.stat()
    video.write_bytes(b"x" * st.st_size)  # other bytes, the same size, the time put back
    os.utime(video, ns=(st.st_atime_ns, st.st_mtime_ns))
    assert "cannot decode video" in check_files([(video, "video")], cache_file=cache)[(str(video), "video")]


# ------------------------------------------------------------------------------------------------ records
def test_a_question_that_is_a_list_is_refused_naming_the_record(tmp_path: Path) -> None:
    data = _jsonl(tmp_path / "d.jsonl", [_record(1), _record(2, question=["What", "colour?"])])
    with pytest.raises(DataError, match=r"d\.jsonl:2: sample 'q2': 'question' must be a string, got list"):
        load_samples(data)
    assert [s.question for s in load_samples(data, on_bad_sample="skip").samples] == ["What colour is it?"]


def test_an_empty_data_file_is_refused(tmp_path: Path) -> None:
    for name, text in (("empty.jsonl", ""), ("blank.jsonl", "\n\n"), ("empty.json", "[]")):
        data = tmp_path / name
        data.write_text(text)
        with pytest.raises(DataError, match=rf"{name} has no records"):
            load_samples(data, on_bad_sample="skip")
        printed = io.StringIO()
        assert run_validate(data, out=printed) == 1
        assert f"{data}: has no records" in printed.getvalue() and "FAILED" in printed.getvalue()


def test_a_question_over_the_cap_is_refused_with_its_length_and_the_cap(tmp_path: Path) -> None:
    long = _record(2, question="Why? " * 40_000)  # 200,000 characters
    data = _jsonl(tmp_path / "d.jsonl", [_record(1), long, _record(3, options=["o" * 30, "p" * 30])])
    with pytest.raises(DataError, match=r"d\.jsonl:2: sample 'q2': question and options are 200,012 characters, "
                                        r"over the cap of 20,000; .*data\.max_question_chars=N"):
        load_samples(data)
    # the options count too; the cap can be raised
    kept = load_samples(data, on_bad_sample="skip", max_question_chars=70)
    assert [s.id for s in kept.samples] == ["q1"] and [p.line for p in kept.problems] == [2, 3]
    assert len(load_samples(data, max_question_chars=200_012).samples) == 3
    printed = io.StringIO()
    assert run_validate(data, out=printed) == 1 and "over the cap of 20,000" in printed.getvalue()


def test_data_max_question_chars_is_a_setting_checked_at_load() -> None:
    from mmrl.config import load_run_config
    from mmrl_common.errors import ConfigError

    assert load_run_config("video-qa").data.max_question_chars == 20_000
    assert load_run_config("video-qa", overrides=["data.max_question_chars=500"]).data.max_question_chars == 500
    with pytest.raises(ConfigError, match="data.max_question_chars"):
        load_run_config("video-qa", overrides=["data.max_question_chars=0"])


def test_the_run_reads_its_data_under_its_question_cap(tmp_path: Path) -> None:
    from mmrl.config import load_run_config
    from mmrl.run import load_split

    data = _jsonl(tmp_path / "train.jsonl", [_record(1), _record(2, question="Why? " * 100)])  # 500 characters
    common = [f"data.train={data}", "data.check_media=none", "data.problem_types=[multiple_choice]"]
    with pytest.raises(DataError, match=r"train\.jsonl:2: .*over the cap of 200"):
        load_split(load_run_config("video-qa", overrides=[*common, "data.max_question_chars=200"]), "train",
                   show_progress=False)
    samples, _ = load_split(load_run_config("video-qa", overrides=common), "train", show_progress=False)
    assert [s.id for s in samples] == ["q1", "q2"]
