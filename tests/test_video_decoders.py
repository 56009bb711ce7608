"""Video decoders as a setting (issue 61, item 13): ``data.media.decoder`` (auto, decord, pyav, torchcodec) and
``data.media.decode_timeout``, on real H.264 files written with PyAV.

* every decoder gives the same frames of the same files (torchcodec where it is installed; where it is not, the one
  line that says how to install it);
* the setting reaches the decode: a run's media (``MediaPreparer``), the re-opening of a sampled video by an
  environment, and the media check before training (``load_split``);
* an unknown or uninstalled decoder is one line;
* a decode past the timeout is a MediaError naming the file, fd 2 comes back while the decode given up on still
  runs, its verdict is not cached, and a run with ``data.on_bad_sample=skip`` skips the video and trains on.
"""

from __future__ import annotations

import importlib.util
import json
import os
import sys
import threading
import time
from pathlib import Path

import av
import numpy as np
import pytest
from test_video import moving_pattern, nearest_source
from tiny_runs import TINY_RUN, module_cache, rl_rows  # noqa: F401 -- module_cache is a fixture

from data_pipelines.media_check import check_files
from data_pipelines.schema import MediaItem, Sample
from mmrl.config import MediaConfig, load_run_config
from mmrl.engine.media import MediaPreparer
from mmrl.run import load_split
from mmrl_common.errors import ConfigError, MediaError
from video import DecodeTimeoutError, open_video, sample_video, write_mp4
from video.decoders import torchcodec_problem

pytestmark = pytest.mark.usefixtures("module_cache")
TORCHCODEC_INSTALLED = importlib.util.find_spec("torchcodec") is not None


def remux(src: Path, dst: Path) -> Path:
    """The same H.264 stream in another container (Matroska: its header carries no frame count)."""
    with av.open(str(src)) as inp, av.open(str(dst), "w") as out:
        stream = out.add_stream_from_template(inp.streams.video[0])
        for packet in inp.demux(inp.streams.video[0]):
            if packet.dts is None:
                continue
            packet.stream = stream
            out.mux(packet)
    return dst


@pytest.fixture(scope="module")
def files(tmp_path_factory: pytest.TempPathFactory) -> dict:
    root = tmp_path_factory.mktemp("decoders")
    out: dict = {"src": {}}
    for name, fps, n, (h, w) in [("v8", 8, 24, (48, 64)), ("v25", 25, 125, (48, 64)), ("v30", 30, 45, (96, 128))]:
        out["src"][name] = moving_pattern(n, h, w, seed=fps)
        out[name] = write_mp4(root / f"{name}.mp4", out["src"][name], fps)
    out["mkv"] = remux(out["v8"], root / "v8.mkv")
    out["src"]["mkv"] = out["src"]["v8"]
    # long enough to decode that a timeout of 1 ms is always passed: 120 frames at 320x240 (0.1-0.4 s here)
    out["big"] = write_mp4(root / "big.mp4", moving_pattern(120, 240, 320, seed=1), 24)
    out["h264"] = root / "raw.h264"  # a raw H.264 stream: decord cannot measure its length, PyAV can
    with av.open(str(out["v8"])) as inp, av.open(str(out["h264"]), "w", format="h264") as raw:
        stream = raw.add_stream_from_template(inp.streams.video[0])
        for packet in inp.demux(inp.streams.video[0]):
            if packet.dts is not None:
                packet.stream = stream
                raw.mux(packet)
    return out


@pytest.fixture
def fifo(tmp_path: Path):
    """A video path that never finishes arriving: a named pipe nothing writes to (opening it blocks). Whatever
    is still blocked on it at the end is let through (a writer opens and closes it)."""
    path = tmp_path / "arriving.mp4"
    os.mkfifo(path)
    yield path
    for _ in range(200):
        if not any(t.is_alive() and t.name == f"mmrl-decode {path.name}" for t in threading.enumerate()):
            break
        try:
            os.close(os.open(path, os.O_WRONLY | os.O_NONBLOCK))  # wakes the blocked readers; they read EOF
        except OSError:
            pass
        time.sleep(0.05)


# ------------------------------------------------------------------------------------------- same frames
@pytest.mark.parametrize("name", ["v8", "v25", "v30", "mkv"])
@pytest.mark.parametrize("decoder", ["decord", "torchcodec"])
def test_each_decoder_gives_pyavs_frames(files: dict, name: str, decoder: str) -> None:
    path, src = files[name], files["src"][name]
    n = len(src)
    rng = np.random.default_rng(n)
    idx = [n - 1, 0, *rng.integers(0, n, 10).tolist(), 5, 5, n // 2]
    if decoder == "torchcodec" and not TORCHCODEC_INSTALLED:  # mmrl does not install it: said how to, in one line
        with pytest.raises(ConfigError) as err:
            open_video(path, "torchcodec")
        said = str(err.value)
        assert "\n" not in said and said.startswith("data.media.decoder=torchcodec: torchcodec is not installed")
        assert "pip install torchcodec" in said and "data.media.decoder=pyav" in said
        return
    with open_video(path, "pyav") as ref, open_video(path, decoder) as r:
        assert r.backend == decoder
        assert (r.num_frames, r.fps, r.width, r.height) == (ref.num_frames, ref.fps, ref.width, ref.height)
        assert r.num_frames == n
        a, b = r.get_frames(idx), ref.get_frames(idx)
        assert a.dtype == np.uint8 and a.shape == b.shape == (len(idx), src.shape[1], src.shape[2], 3)
        assert np.abs(a.astype(int) - b.astype(int)).max() <= 2  # test_video's tolerance between decoders
        assert nearest_source(a, src) == idx  # the requested frames, in the order asked, repeats kept


def test_auto_is_decord_then_pyav(files: dict) -> None:
    with open_video(files["v8"]) as r:
        assert r.backend == "decord"
    with open_video(files["h264"]) as r:  # decord cannot open a raw stream: PyAV does
        assert r.backend == "pyav"
    with pytest.raises(MediaError, match=r"raw\.h264: cannot open the video .*decord"):
        open_video(files["h264"], "decord")


# ------------------------------------------------------------------------------------ the setting reaches
def _video_sample(path: Path, sid: str = "q1") -> Sample:
    return Sample(sid, "multiple_choice", "Which way?", "A", ["left", "right"], [MediaItem("video", str(path))])


@pytest.mark.parametrize("decoder,expected", [("auto", "decord"), ("decord", "decord"), ("pyav", "pyav")])
def test_the_decoder_setting_reaches_a_runs_decode(files: dict, decoder: str, expected: str) -> None:
    cfg = MediaConfig(decoder=decoder, decode_timeout=30, video_min_pixels=3136, video_max_pixels=3136)
    [media] = MediaPreparer(cfg).prepare(_video_sample(files["v25"]))
    data = media.data
    assert data.backend == expected and data.decode_timeout == 30
    # an environment that reads more of the video (EARL's new frames, a zoom) opens it as it was decoded
    with data.reopen() as again:
        assert again.backend == expected and again.timeout == 30
    # and the frames are the same whichever decoder read them
    ref = sample_video(files["v25"], "qwen", backend="pyav", min_pixels=3136, max_pixels=3136, fps=2.0,
                       min_frames=4, max_frames=16)
    assert data.indices == ref.indices
    assert (data.frames.float() - ref.frames.float()).abs().max().item() <= 2.0


def test_the_media_check_before_a_run_uses_the_runs_decoder(files: dict, tmp_path: Path) -> None:
    record = {"id": "raw", "problem_type": "multiple_choice", "question": "Which way?", "options": ["l", "r"],
              "answer": "A", "media": [{"type": "video", "path": str(files["h264"])}]}
    data = tmp_path / "train.jsonl"
    data.write_text(json.dumps(record) + "\n")
    common = [*TINY_RUN, f"data.train={data}", "data.check_media=decode", "data.on_bad_sample=skip"]
    samples, info = load_split(load_run_config("video-qa", overrides=[*common, "data.media.decoder=pyav"]), "train",
                               show_progress=False)
    assert [s.id for s in samples] == ["raw"] and not info["skipped_records"]
    samples, info = load_split(load_run_config("video-qa", overrides=[*common, "data.media.decoder=decord"]),
                               "train", show_progress=False)  # the cached pyav verdict is not decord's
    assert samples == []
    [skipped] = info["skipped_records"]
    assert "raw.h264" in skipped["reasons"][0] and "decord" in skipped["reasons"][0]


# ------------------------------------------------------------------------------------- one line when wrong
def test_an_unknown_decoder_is_one_line_naming_the_values() -> None:
    with pytest.raises(ConfigError) as err:
        load_run_config("video-qa", overrides=["data.media.decoder=ffmpeg"])
    said = str(err.value)
    assert "\n" not in said and "data.media.decoder" in said and "'ffmpeg'" in said
    assert all(v in said for v in ("auto", "decord", "pyav", "torchcodec"))
    with pytest.raises(ConfigError, match=r"^data\.media\.decoder: unknown video decoder 'ffmpeg': use one of auto, "
                                          r"decord, pyav, torchcodec$"):
        MediaConfig(decoder="ffmpeg")  # type: ignore[arg-type]
    with pytest.raises(ConfigError, match=r"^data\.media\.decode_timeout=-1(\.0)?: must be a finite number >= 0"):
        load_run_config("video-qa", overrides=["data.media.decode_timeout=-1"])


@pytest.mark.parametrize("decoder,module", [("decord", "decord"), ("torchcodec", "torchcodec")])
def test_an_uninstalled_decoder_is_one_line_saying_how_to_install_it(files: dict, monkeypatch: pytest.MonkeyPatch,
                                                                    decoder: str, module: str) -> None:
    monkeypatch.setitem(sys.modules, module, None)  # what Python does for a package that is not there
    torchcodec_problem.cache_clear()
    try:
        with pytest.raises(ConfigError) as err:
            load_run_config("video-qa", overrides=[f"data.media.decoder={decoder}"])
        said = str(err.value)
        assert "\n" not in said
        assert said.startswith(f"data.media.decoder={decoder}: {decoder} is not installed: pip install {decoder}")
        with pytest.raises(ConfigError, match=f"{decoder} is not installed"):  # nor is a video opened with it
            open_video(files["v8"], decoder)  # type: ignore[arg-type]
        with open_video(files["v8"]) as r:  # auto reads with what there is
            assert r.backend == ("pyav" if decoder == "decord" else "decord")
    finally:
        monkeypatch.undo()
        torchcodec_problem.cache_clear()


# ---------------------------------------------------------------------------------------------- timeouts
@pytest.mark.parametrize("decoder", ["auto", "decord", "pyav"])
def test_a_decode_past_the_timeout_is_a_media_error_naming_the_file(files: dict, decoder: str) -> None:
    big = files["big"]
    with pytest.raises(DecodeTimeoutError) as err, open_video(big, decoder, timeout=0.001) as r:
        r.get_frames(list(range(r.num_frames)))  # the opening or the read: whichever runs past 1 ms first
    assert isinstance(err.value, MediaError) and err.value.path == str(big)
    said = str(err.value)
    assert said.startswith(f"{big}: decoding took longer than 0.001 s (data.media.decode_timeout) while ")
    assert "\n" not in said
    with open_video(big, decoder, timeout=None) as r:  # the file is good: it was the timeout
        assert nearest_source(r.get_frames([0, 119]), moving_pattern(120, 240, 320, seed=1)) == [0, 119]


def test_a_reader_given_up_on_reads_no_more_and_gives_fd2_back(files: dict, capfd: pytest.CaptureFixture) -> None:
    big = files["big"]
    reader = open_video(big, "decord")
    reader.timeout = 0.001
    passes = list(range(reader.num_frames)) * 4  # back to frame 0 each pass: decord decodes them all again
    with pytest.raises(DecodeTimeoutError, match=r"while reading frames of the video with decord"):
        reader.get_frames(passes)
    worker = next(t for t in threading.enumerate() if t.name == f"mmrl-decode {big.name}")
    os.write(2, b"said on fd 2 while the decode runs on\n")
    _, err = capfd.readouterr()
    assert worker.is_alive()  # the decode given up on was still inside decord when fd 2 was written to
    assert "said on fd 2 while the decode runs on" in err
    with pytest.raises(MediaError, match="an earlier read of this video was given up on"):
        reader.get_frames([0])
    reader.close()
    worker.join(30)


def test_a_video_that_never_arrives_is_given_up_on(fifo: Path) -> None:
    for decoder in ("auto", "pyav"):
        with pytest.raises(DecodeTimeoutError) as err:
            open_video(fifo, decoder, timeout=0.2)  # type: ignore[arg-type]
        assert str(err.value).startswith(f"{fifo}: decoding took longer than 0.2 s (data.media.decode_timeout) "
                                         "while opening the video")


def test_a_timed_out_check_is_not_cached(files: dict, tmp_path: Path) -> None:
    big, cache = files["big"], tmp_path / "media-check.json"
    first = check_files([(big, "video")], cache_file=cache, decode_timeout=0.001)[(str(big), "video")]
    assert first is not None and "decoding took longer than 0.001 s" in first and "truncated" not in first
    assert check_files([(big, "video")], cache_file=cache, decode_timeout=60) == {(str(big), "video"): None}


@pytest.mark.slow
def test_a_run_skips_a_video_past_the_timeout_and_trains_on(files: dict, fifo: Path, tmp_path: Path,
                                                            capsys: pytest.CaptureFixture) -> None:
    """A video that hangs its decoder (here: a file that never finishes arriving) in a run with
    ``data.on_bad_sample=skip``: each draw of it waits ``decode_timeout`` seconds, is named and skipped; the other
    prompts train."""
    from mmrl.run import train

    good = {"problem_type": "multiple_choice", "question": "Which way does the square move?",
            "options": ["left", "right"], "answer": "B"}
    records = [{**good, "id": "good-1", "media": [{"type": "video", "path": str(files["v25"])}]},
               {**good, "id": "hangs", "media": [{"type": "video", "path": str(fifo)}]}]
    data = tmp_path / "train.jsonl"
    data.write_text("".join(json.dumps(r) + "\n" for r in records))
    cfg = load_run_config("video-qa", overrides=[*TINY_RUN, f"data.train={data}", "data.check_media=none",
                                                 "data.on_bad_sample=skip", "data.media.decode_timeout=2",
                                                 "train.prompts_per_step=2", "train.steps=2"])
    train(cfg, run_dir=tmp_path / "run", show_progress=False)
    out = capsys.readouterr().out
    assert (f"skipping sample hangs: {fifo}: decoding took longer than 2 s (data.media.decode_timeout) while opening "
            "the video") in out
    rows = rl_rows(tmp_path / "run")
    assert [r["skipped_samples"] for r in rows] == [1, 2]  # drawn (and skipped) in each of the 2 steps
    assert (tmp_path / "run" / "final").is_dir()
