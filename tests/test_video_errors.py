"""An unreadable video is one clear mmrl line naming the file, and the decoders' own output stays off the console.

Real broken files: an MP4 written by :func:`video.writer.write_mp4` and cut in half (its index lost), the same
MP4 with its picture data overwritten (the index intact: it opens, then fails to decode), a text file named
.mp4 and an empty file. decord prints ``[mov,mp4,...] moov atom not found`` through its FFmpeg and
``[time] .../video_reader.cc:83: ERROR opening`` through its C++ logger, and raises errors carrying C++
``file.cc:line`` prefixes; PyAV's errors carry ``[Errno N]``. None of that may reach the user: not through the
readers, ``mmrl data validate`` or ``mmrl data inspect``.
"""

from __future__ import annotations

import json
import os
import random
from pathlib import Path

import numpy as np
import pytest

from mmrl_common.errors import MediaError
from video.reader import native_output_held, open_video
from video.writer import write_mp4

NOISE = ("moov atom", "video_reader.cc", ".cc:", "@ 0x", "[h264", "Stack trace", "[bt]", "DECORDError",
         "Traceback", "[Errno")


@pytest.fixture(scope="module")
def broken(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("broken")
    rng = np.random.default_rng(0)
    good = write_mp4(root / "good.mp4", rng.integers(0, 256, (16, 48, 64, 3), dtype=np.uint8), fps=8)
    data = good.read_bytes()
    (root / "truncated.mp4").write_bytes(data[: len(data) // 2])
    garbled = bytearray(data)
    start = garbled.find(b"mdat") + 2000  # the moov index (at the end) kept: the file opens, frames do not decode
    pick = random.Random(0)
    for k in range(start, min(start + 28000, garbled.find(b"moov") - 8), 7):
        garbled[k] = pick.randrange(256)
    (root / "garbled.mp4").write_bytes(bytes(garbled))
    (root / "text.mp4").write_text("this is not a video\n" * 5)
    (root / "empty.mp4").write_bytes(b"")
    return {p.stem: p for p in root.glob("*.mp4")}


def _read_all(path: Path, backend: str) -> None:
    with open_video(path, backend=backend) as r:
        r.get_frames(list(range(r.num_frames)))


@pytest.mark.parametrize("backend", ["auto", "decord", "pyav"])
@pytest.mark.parametrize("name", ["truncated", "garbled", "text", "empty"])
def test_reader_error_is_one_clean_line_and_the_decoders_say_nothing(broken: dict, name: str, backend: str,
                                                                     capfd: pytest.CaptureFixture) -> None:
    with pytest.raises(MediaError) as err:
        _read_all(broken[name], backend)
    out, errout = capfd.readouterr()
    message = str(err.value)
    assert err.value.path == str(broken[name]) and message.startswith(f"{broken[name]}: ")
    assert "\n" not in message and len(message) < 300, message
    assert "truncated or corrupt" in message or "empty" in message, message
    for noise in NOISE:
        assert noise not in message, (noise, message)
        assert noise not in out + errout, (noise, out + errout)
    assert out + errout == ""


def test_a_good_video_still_reads_and_other_stderr_output_is_kept(broken: dict, capfd: pytest.CaptureFixture
                                                                  ) -> None:
    for backend in ("decord", "pyav"):
        with open_video(broken["good"], backend=backend) as r:
            assert r.get_frames([0, 15]).shape == (2, 48, 64, 3)
    with native_output_held():
        with native_output_held():  # nested (and, on threads, overlapping) holds share one redirection
            os.write(2, b"[mov,mp4,m4a,3gp,3g2,mj2 @ 0x55e7a84beec0] moov atom not found\n")
            os.write(2, b"[04:49:43] /github/workspace/src/video/video_reader.cc:83: ERROR opening: x.mp4\n")
            os.write(2, b"a warning of someone else\n")
        os.write(2, b"said while still held\n")
    os.write(2, b"said after\n")
    _, errout = capfd.readouterr()
    assert errout == "a warning of someone else\nsaid while still held\nsaid after\n"


@pytest.fixture()
def dataset(broken: dict, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("MMRL_CACHE", str(tmp_path / "cache"))  # no verdict from an earlier check
    rows = [{"id": f"q-{name}", "problem_type": "multiple_choice", "question": "What moves?",
             "options": ["a ball", "a box"], "answer": "A",
             "media": [{"type": "video", "path": str(broken[name])}]}
            for name in ("good", "truncated", "garbled", "text", "empty")]
    path = tmp_path / "mine.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def test_data_validate_names_each_file_its_line_and_the_fix_without_decoder_noise(
        broken: dict, dataset: Path, capfd: pytest.CaptureFixture) -> None:
    from mmrl import cli

    assert cli.main(["data", "validate", str(dataset)]) == 1
    out, errout = capfd.readouterr()
    for line_no, name in enumerate(("truncated", "garbled", "text", "empty"), start=2):
        line = next(x for x in out.splitlines() if x.startswith(f"{dataset}:{line_no}: "))
        assert f"sample 'q-{name}'" in line and str(broken[name]) in line, line
        assert "replace it" in line or "re-create" in line, line
    for noise in NOISE:
        assert noise not in out + errout, (noise, out + errout)


def test_data_inspect_names_each_file_its_line_and_the_fix_without_decoder_noise(
        broken: dict, dataset: Path, tmp_path: Path, capfd: pytest.CaptureFixture) -> None:
    from mmrl import cli

    assert cli.main(["data", "inspect", str(dataset), "--out", str(tmp_path / "sheet"), "--samples", "5"]) == 0
    out, errout = capfd.readouterr()
    assert "re-encode or replace them" in out
    for line_no, name in ((2, "truncated"), (4, "text"), (5, "empty")):  # inspect opens files (garbled.mp4 opens)
        line = next(x for x in out.splitlines() if x.strip().startswith(f"{dataset}:{line_no}: "))
        assert f"sample 'q-{name}'" in line and line.count(str(broken[name])) == 1, line
    assert (tmp_path / "sheet" / "mine_contact_sheet.png").is_file()  # the sheet decodes the bad files too
    for noise in NOISE:
        assert noise not in out + errout, (noise, out + errout)
