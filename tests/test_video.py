"""Video readers, sampling policies and EARL re-sampling, on real H.264 files written with PyAV."""

from __future__ import annotations

import hashlib
from fractions import Fraction
from pathlib import Path

import av
import numpy as np
import pytest
import torch

from mmrl_common.errors import MediaError
from video import (
    FrameIndexError,
    SampledVideo,
    available_policies,
    open_video,
    register_policy,
    resample_around,
    resample_video,
    sample_video,
    write_mp4,
)
from video.sampling import unregister_policy

W, H = 64, 48


def moving_pattern(n: int, h: int = H, w: int = W, seed: int = 0) -> np.ndarray:
    """A coloured square moving over a background whose colours drift with time: every frame differs."""
    t = np.arange(n)[:, None, None]
    y = np.arange(h)[None, :, None]
    x = np.arange(w)[None, None, :]
    bg = np.stack(np.broadcast_arrays((x * 3 + t * 9) % 200, (y * 4 + t * 5) % 200, (x + y + t * 13) % 200), -1)
    frames = bg.astype(np.uint8)
    rng = np.random.default_rng(seed)
    colour = rng.integers(120, 256, size=3, dtype=np.uint8)
    for i in range(n):
        cx = (i * 3) % (w - 12)
        cy = (i * 2) % (h - 12)
        frames[i, cy : cy + 12, cx : cx + 12] = colour
    return frames


def nearest_source(decoded: np.ndarray, source: np.ndarray) -> list[int]:
    """For each decoded frame, the index of the closest source frame (mean abs difference)."""
    d = np.abs(decoded[:, None].astype(np.int16) - source[None].astype(np.int16)).mean(axis=(2, 3, 4))
    return d.argmin(axis=1).tolist()


def _write_with_pyav(path: Path, frames: np.ndarray, fps: int, fmt: str) -> Path:
    container = av.open(str(path), "w", format=fmt)
    stream = container.add_stream("libx264", rate=Fraction(fps), options={"threads": "1"})
    stream.width, stream.height, stream.pix_fmt = W, H, "yuv420p"
    for f in frames:
        for packet in stream.encode(av.VideoFrame.from_ndarray(f, format="rgb24")):
            container.mux(packet)
    for packet in stream.encode(None):
        container.mux(packet)
    container.close()
    return path


@pytest.fixture(scope="session")
def media(tmp_path_factory: pytest.TempPathFactory) -> dict:
    root = tmp_path_factory.mktemp("videos")
    out: dict = {"root": root, "src": {}}
    for fps, sec in [(8, 3), (25, 5), (30, 2)]:
        frames = moving_pattern(fps * sec, seed=fps)
        out[f"v{fps}"] = write_mp4(root / f"v{fps}.mp4", frames, fps)
        out["src"][f"v{fps}"] = frames
    out["src"]["raw"] = moving_pattern(20, seed=3)
    out["mkv"] = _write_with_pyav(root / "clip.mkv", out["src"]["raw"], 10, "matroska")
    out["h264"] = _write_with_pyav(root / "clip.h264", out["src"]["raw"], 10, "h264")
    return out


# --- writer -----------------------------------------------------------------------------------------


def test_write_mp4_is_deterministic_and_decodes_back(media: dict, tmp_path: Path) -> None:
    frames = media["src"]["v8"]
    a = write_mp4(tmp_path / "a.mp4", frames, 8)
    digests = set()
    for i in range(4):  # other encodes in between must not change the bytes
        write_mp4(tmp_path / "other.mp4", media["src"]["v30"], 30)
        b = write_mp4(tmp_path / f"b{i}.mp4", iter(list(frames)), 8)
        digests.add(hashlib.sha256(b.read_bytes()).hexdigest())
    assert digests == {hashlib.sha256(a.read_bytes()).hexdigest()}
    with av.open(str(a)) as c:
        s = c.streams.video[0]
        assert s.codec_context.name == "h264" and s.codec_context.pix_fmt == "yuv420p"
        assert float(s.average_rate) == 8
    with open_video(a) as r:
        assert nearest_source(r.get_frames(range(24)), frames) == list(range(24))


def test_write_mp4_rejects_bad_input(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="even"):
        write_mp4(tmp_path / "odd.mp4", moving_pattern(3, h=47), 5)
    with pytest.raises(ValueError, match="uint8"):
        write_mp4(tmp_path / "f.mp4", moving_pattern(3).astype(np.float32), 5)
    with pytest.raises(ValueError, match="no frames"):
        write_mp4(tmp_path / "empty.mp4", [], 5)
    assert not (tmp_path / "empty.mp4").exists()


# --- readers ----------------------------------------------------------------------------------------


@pytest.mark.parametrize("name,fps,n", [("v8", 8, 24), ("v25", 25, 125), ("v30", 30, 60)])
def test_decord_and_pyav_agree(media: dict, name: str, fps: int, n: int) -> None:
    rng = np.random.default_rng(fps)
    idx = [n - 1, 0, *rng.integers(0, n, 12).tolist(), 5, 5, n // 2]
    with open_video(media[name], backend="decord") as d, open_video(media[name], backend="pyav") as p:
        for r in (d, p):
            assert (r.num_frames, r.fps, r.width, r.height) == (n, fps, W, H)
            assert r.duration == pytest.approx(n / fps)
        a, b = d.get_frames(idx), p.get_frames(idx)
        assert a.dtype == np.uint8 and a.shape == (len(idx), H, W, 3) == b.shape
        assert np.abs(a.astype(int) - b.astype(int)).max() <= 2
        # the frames really are the requested ones (B-frames, seeking)
        assert nearest_source(b, media["src"][name]) == idx
        assert nearest_source(a, media["src"][name]) == idx


def test_pyav_counts_frames_when_container_says_zero(media: dict) -> None:
    with av.open(str(media["mkv"])) as c:
        assert c.streams.video[0].frames == 0  # MKV carries no frame count
    with open_video(media["mkv"], backend="pyav") as p, open_video(media["mkv"], backend="decord") as d:
        assert p.num_frames == d.num_frames == 20
        idx = [19, 3, 11, 0]
        assert np.abs(p.get_frames(idx).astype(int) - d.get_frames(idx).astype(int)).max() <= 2
        assert nearest_source(p.get_frames(idx), media["src"]["raw"]) == idx


def test_auto_falls_back_to_pyav_when_decord_rejects(media: dict) -> None:
    path = media["h264"]  # raw elementary stream: decord cannot measure its length
    with pytest.raises(MediaError) as err:
        open_video(path, backend="decord")
    assert str(path) in str(err.value)
    with open_video(path) as r:
        assert r.backend == "pyav"
        assert r.num_frames == 20
        idx = [0, 7, 19, 7]
        assert nearest_source(r.get_frames(idx), media["src"]["raw"]) == idx


def test_get_frames_at_picks_nearest_frame(media: dict) -> None:
    with open_video(media["v25"]) as r:
        frames, idx = r.get_frames_at([0.0, 0.019, 0.021, 1.0, 4.99])
        assert idx == [0, 0, 1, 25, 124]
        assert frames.shape == (5, H, W, 3)
        with pytest.raises(FrameIndexError, match="out of range") as err:
            r.get_frames([125])
        assert str(media["v25"]) in str(err.value)
        with pytest.raises(FrameIndexError, match="timestamp"):
            r.get_frames_at([7.0])
        with pytest.raises(IndexError):
            r.get_frames([-1])


def test_reader_errors_name_the_file(media: dict, tmp_path: Path) -> None:
    missing = tmp_path / "missing.mp4"
    empty = tmp_path / "empty.mp4"
    empty.write_bytes(b"")
    truncated = tmp_path / "truncated.mp4"
    truncated.write_bytes(Path(media["v25"]).read_bytes()[:4000])
    text = tmp_path / "text.mp4"
    text.write_text("not a video at all\n" * 20)
    cases = [(missing, "not found"), (empty, "empty"), (truncated, "truncated or corrupt"), (text, "truncated or corrupt")]
    for backend in ("auto", "decord", "pyav"):
        for path, reason in cases:
            with pytest.raises(MediaError, match=reason) as err:
                open_video(path, backend=backend)
            assert err.value.path == str(path) and str(path) in str(err.value)


def test_file_without_video_stream(tmp_path: Path) -> None:
    path = tmp_path / "tone.wav"
    with av.open(str(path), "w", format="wav") as c:
        s = c.add_stream("pcm_s16le", rate=8000)
        samples = (np.sin(np.arange(800) / 5) * 3000).astype(np.int16)[None]
        frame = av.AudioFrame.from_ndarray(samples, format="s16", layout="mono")
        frame.sample_rate = 8000
        for packet in s.encode(frame):
            c.mux(packet)
        for packet in s.encode(None):
            c.mux(packet)
    with pytest.raises(MediaError, match="no video stream") as err:
        open_video(path, backend="pyav")
    assert str(path) in str(err.value)
    with pytest.raises(MediaError, match="no video stream"):
        open_video(path)


# --- qwen policy == qwen-vl-utils ---------------------------------------------------------------------

QWEN_CASES = [
    {},
    {"fps": 4.0},
    {"nframes": 6},
    {"fps": 1.0, "min_frames": 2, "max_frames": 8},
    {"video_start": 0.5, "video_end": 1.7},
    {"video_start": 1.2},
    {"max_pixels": 64 * 28 * 28 * 2, "min_pixels": 16 * 28 * 28},
]


@pytest.mark.parametrize("name", ["v8", "v25", "v30"])
def test_qwen_policy_matches_fetch_video(media: dict, name: str) -> None:
    from qwen_vl_utils import fetch_video

    for case in QWEN_CASES:
        (ref, ref_meta), ref_fps = fetch_video(
            {"video": str(media[name]), **case}, return_video_metadata=True, return_video_sample_fps=True
        )
        opts = dict(case)
        start, end = opts.pop("video_start", None), opts.pop("video_end", None)
        ours = sample_video(media[name], "qwen", start=start, end=end, **opts)
        assert ours.indices == list(ref_meta["frames_indices"]), case
        assert tuple(ours.frames.shape) == tuple(ref.shape), case
        assert ours.frames.dtype == torch.uint8
        assert ours.sample_fps == pytest.approx(ref_fps)
        assert ours.metadata["total_num_frames"] == ref_meta["total_num_frames"]
        assert ours.metadata["fps"] == pytest.approx(ref_meta["fps"])
        assert (ours.frames.float() - ref).abs().max().item() <= 1.0
        if start is not None:
            assert min(ours.timestamps) >= start
        if end is not None:
            assert max(ours.timestamps) <= end


def test_qwen_policy_patch_size_16_and_resized_dims(media: dict) -> None:
    from qwen_vl_utils import fetch_video

    ref = fetch_video({"video": str(media["v30"]), "nframes": 4}, image_patch_size=16)
    ours = sample_video(media["v30"], nframes=4, image_patch_size=16)
    assert tuple(ours.frames.shape) == tuple(ref.shape)
    assert ours.frames.shape[-1] % 32 == 0
    fixed = sample_video(media["v30"], nframes=4, resized_height=60, resized_width=90)
    assert tuple(fixed.frames.shape[-2:]) == (56, 84)


def test_metadata_is_what_the_hf_video_processor_wants(media: dict) -> None:
    from transformers.models.qwen2_vl.video_processing_qwen2_vl import Qwen2VLVideoProcessor
    from transformers.video_utils import VideoMetadata

    s = sample_video(media["v25"], "qwen", fps=2.0, max_pixels=128 * 28 * 28)
    meta = VideoMetadata(**s.metadata)
    assert meta.sampled_fps == pytest.approx(s.sample_fps)
    assert meta.timestamps == pytest.approx(s.timestamps)
    proc = Qwen2VLVideoProcessor()
    out = proc(videos=[s.frames], video_metadata=[s.metadata], do_sample_frames=False, return_tensors="pt")
    t, h, w = s.frames.shape[0], s.frames.shape[-2], s.frames.shape[-1]
    assert out["video_grid_thw"].tolist() == [[t // 2, h // 14, w // 14]]


# --- uniform / segments / registry ---------------------------------------------------------------------


def test_uniform_and_segments_indices_hand_checked(media: dict) -> None:
    path = media["v25"]  # 125 frames at 25 fps
    assert sample_video(path, "uniform", nframes=5).indices == [0, 31, 62, 93, 124]
    # window [1 s, 3 s] = frames 25..75; linspace 25, 37.5, 50, 62.5, 75 rounded half to even
    u = sample_video(path, "uniform", nframes=5, start=1.0, end=3.0)
    assert u.indices == [25, 38, 50, 62, 75]
    assert u.timestamps == pytest.approx([1.0, 1.52, 2.0, 2.48, 3.0])
    assert u.sample_fps == pytest.approx(5 / 51 * 25)
    # MVBench: seg = 124/4 = 31 -> int(15.5 + 31 i)
    assert sample_video(path, "segments", nframes=4).indices == [15, 46, 77, 108]
    # bounded: s=25, e=75, seg=12.5 -> int(31.25 + round(12.5 i)) = 31, 43, 56, 69
    seg = sample_video(path, "segments", nframes=4, start=1.0, end=3.0)
    assert seg.indices == [31, 43, 56, 69]
    assert all(1.0 <= t <= 3.0 for t in seg.timestamps)
    assert seg.frames.shape[0] == 4


def test_sampled_frames_are_the_indexed_frames(media: dict) -> None:
    s = sample_video(media["v8"], "uniform", nframes=4, resized_height=H, resized_width=W - 8)
    assert isinstance(s, SampledVideo)
    with open_video(media["v8"]) as r:
        raw = r.get_frames(s.indices)
    assert s.indices == [0, 8, 15, 23]
    assert nearest_source(raw, media["src"]["v8"]) == s.indices
    assert s.total_frames == 24 and s.duration == pytest.approx(3.0) and s.video_fps == 8


def test_policy_registry(media: dict) -> None:
    assert {"qwen", "uniform", "segments"} <= set(available_policies())

    def last_two(num_frames: int, video_fps: float, /, *, start=None, end=None) -> list[int]:
        return [num_frames - 2, num_frames - 1]

    register_policy("test_last_two", last_two)
    try:
        with open_video(media["v30"], backend="pyav") as r:
            s = sample_video(r, "test_last_two")
            assert s.indices == [58, 59] and s.backend == "pyav"
            assert r.num_frames == 60  # reader passed in stays open
        with pytest.raises(ValueError, match="already registered"):
            register_policy("test_last_two", last_two)
    finally:
        unregister_policy("test_last_two")
    assert "test_last_two" not in available_policies()
    with pytest.raises(ValueError, match="unknown sampling policy 'nope'.*valid: .*qwen"):
        sample_video(media["v30"], "nope")
    with pytest.raises(ValueError, match="bad options"):
        sample_video(media["v30"], "uniform", fps=2.0)
    with pytest.raises(ValueError, match="Invalid time range"):
        sample_video(media["v30"], "uniform", start=1.5, end=1.0)


# --- EARL re-sampling ----------------------------------------------------------------------------------


def test_resample_hand_checked() -> None:
    grid = [0.5, 1.5, 2.5, 3.5]  # 4 frames shown from a 40-frame, 10 fps video
    r = resample_around(grid, [1], 4, fps=10, num_frames=40)
    assert r.intervals == [(0.5, 2.5)]
    # unseen frames 6..24 without 15 (18 frames); centres of 4 equal shares -> 8, 12, 18, 22
    assert r.indices == [8, 12, 18, 22]
    assert r.timestamps == pytest.approx([0.8, 1.2, 1.8, 2.2])
    # first and last frames reach the bounds; equal lengths -> 3 + 2 frames (ties go to the earlier one)
    r2 = resample_around(grid, [0, 3], 5, fps=10, num_frames=40)
    assert r2.intervals == [(0.0, 1.5), (2.5, 4.0)]
    assert sum(0 <= i <= 15 for i in r2.indices) == 3 and sum(25 <= i <= 39 for i in r2.indices) == 2
    # adjacent selections merge into one interval
    assert resample_around(grid, [1, 2], 3, fps=10, num_frames=40).intervals == [(0.5, 3.5)]
    # proportional: a 3 s interval gets 3x the frames of a 1 s one
    r3 = resample_around([1.0, 2.0, 3.0, 6.0], [3, 0], 8, fps=10, num_frames=100, end=9.0)
    assert r3.intervals == [(0.0, 2.0), (3.0, 9.0)]
    assert sum(i < 20 for i in r3.indices) == 2 and sum(i > 30 for i in r3.indices) == 6
    r4 = resample_around([1.0, 2.0, 3.0, 6.0], [3, 0], 8, fps=10, num_frames=100, end=9.0, allocation="equal")
    assert sum(i < 20 for i in r4.indices) == 4


def test_resample_never_repeats_and_respects_bounds() -> None:
    rng = np.random.default_rng(1)
    fps, n = 30.0, 900  # 30 s video
    for _ in range(40):
        start, end = sorted(rng.uniform(0, 30, 2))
        if end - start < 1:
            continue
        grid = sorted(set(np.round(np.linspace(start, end, rng.integers(2, 12)) * fps) / fps))
        shown = set(grid) | set(rng.uniform(start, end, 20).round(3))
        selected = rng.choice(len(grid), size=rng.integers(1, len(grid) + 1), replace=False)
        max_n = int(rng.integers(1, 20))
        r = resample_around(grid, selected, max_n, fps=fps, num_frames=n, start=start, end=end, shown=shown)
        assert len(r.indices) <= max_n
        assert r.indices == sorted(set(r.indices))
        seen = {round(t * fps) for t in shown}
        assert not seen & set(r.indices)
        assert all(start - 1e-9 <= t <= end + 1e-9 for t in r.timestamps)
        # a second round with everything shown so far returns only new frames again
        r2 = resample_around(grid, selected, max_n, fps=fps, num_frames=n, start=start, end=end,
                             shown=shown | set(r.timestamps))
        assert not set(r2.indices) & (seen | set(r.indices))


def test_resample_exhausts_gracefully_and_validates() -> None:
    grid = [0.0, 0.1, 0.2]  # 3 frames of a 4-frame, 10 fps video: only frame 3 is unseen
    r = resample_around(grid, [0, 1, 2], 16, fps=10, num_frames=4)
    assert r.indices == [3]
    assert resample_around(grid, [], 16, fps=10, num_frames=4).indices == []
    with pytest.raises(ValueError, match="not in the current grid"):
        resample_around(grid, [3], 4, fps=10, num_frames=4)
    with pytest.raises(ValueError, match="sorted"):
        resample_around([0.3, 0.1], [0], 4, fps=10, num_frames=4)


def test_resample_video_decodes_the_new_frames(media: dict) -> None:
    with open_video(media["v25"]) as r:
        first = sample_video(r, "uniform", nframes=8)
        res, clip = resample_video(r, first.timestamps, [2, 3], 6, shown=first.timestamps, max_pixels=64 * 28 * 28)
        assert clip is not None and len(res) == clip.frames.shape[0] <= 6
        assert clip.indices == res.indices and not set(res.indices) & set(first.indices)
        lo, hi = first.timestamps[1], first.timestamps[4]
        assert all(lo <= t <= hi for t in clip.timestamps)
        raw = r.get_frames(res.indices)
        assert nearest_source(raw, media["src"]["v25"]) == res.indices
