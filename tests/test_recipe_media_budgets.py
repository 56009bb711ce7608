"""The T-GRPO recipe sizes media as Video-R1's training code does, whatever model the user passes (issue 48).

Video-R1 (tulerfeng/Video-R1) trains with its own copy of qwen-vl-utils (src/qwen-vl-utils, installed by the
README's setup): src/r1-v/src/open_r1/grpo.py puts a bare ``{"type": "image"}`` / ``{"type": "video"}`` item in the
user turn (no per-item pixels, fps or frame count), so the copy's module constants size every item
(src/qwen-vl-utils/src/qwen_vl_utils/vision_process.py), before the processor, whose ``max_pixels`` (the scripts'
--max_pixels 401408 / 501760, larger) leaves them as they are. The constants below are written from that file, not
from the recipe; the frames and images mmrl makes under ``mmrl train --task t-grpo --model DIR`` (a 7B-sized
folder: the real-model preset applies) must have the sizes those constants give."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest
from PIL import Image
from qwen_vl_utils import smart_resize
from tiny_runs import as_7b, module_cache, own_model  # noqa: F401 (module_cache: a fixture)

from data_pipelines.schema import MediaItem, Sample
from mmrl import cli
from mmrl.engine.media import MediaPreparer
from video.writer import write_mp4

# Video-R1's src/qwen-vl-utils/src/qwen_vl_utils/vision_process.py
IMAGE_FACTOR = 28
MIN_PIXELS = 4 * 28 * 28                  # fetch_image: ele.get("min_pixels", MIN_PIXELS)
MAX_PIXELS = 256 * 28 * 28                # fetch_image: ele.get("max_pixels", MAX_PIXELS)
VIDEO_MIN_PIXELS = 128 * 28 * 28
VIDEO_MAX_PIXELS = 128 * 28 * 28
FRAME_FACTOR = 2
FPS, FPS_MIN_FRAMES, FPS_MAX_FRAMES = 2.0, 4, 16
VIDEO_TOTAL_PIXELS = int(128000 * 28 * 28 * 0.9)  # the VIDEO_MAX_PIXELS environment variable unset


def _video_r1_frame_size(height: int, width: int, nframes: int) -> tuple[int, int]:
    """fetch_video's resize of a video item without pixel keys (the code's lines, with its constants)."""
    min_pixels = VIDEO_MIN_PIXELS
    total_pixels = VIDEO_TOTAL_PIXELS
    max_pixels = max(min(VIDEO_MAX_PIXELS, total_pixels / nframes * FRAME_FACTOR), int(min_pixels * 1.05))
    return smart_resize(height, width, factor=IMAGE_FACTOR, min_pixels=min_pixels, max_pixels=max_pixels)


@pytest.fixture(scope="module")
def big(tmp_path_factory: pytest.TempPathFactory, module_cache: None) -> Path:  # noqa: F811
    return as_7b(own_model(tmp_path_factory.mktemp("big") / "model"))


def _trained_media(big: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Any:
    """data.media of the config ``mmrl train --task t-grpo --model DIR`` hands to its run (the run not started)."""
    import mmrl.run

    seen: list[Any] = []
    monkeypatch.setattr(mmrl.run, "train", lambda cfg, **_: seen.append(cfg) or {})
    assert cli.main(["train", "--task", "t-grpo", "--model", str(big), "--out", str(tmp_path / "run")]) == 0
    (cfg,) = seen
    assert cfg.model.dtype == "bf16"  # the real-model preset did apply
    return cfg.data.media


def test_t_grpo_with_a_7b_model_sizes_images_as_video_r1s_code(big: Path, tmp_path: Path,
                                                               monkeypatch: pytest.MonkeyPatch) -> None:
    media = _trained_media(big, tmp_path, monkeypatch)
    for size in ((1280, 960), (60, 40)):  # one image over the code's cap, one under its floor
        path = tmp_path / f"{size[0]}x{size[1]}.png"
        Image.fromarray(np.random.default_rng(0).integers(0, 256, (size[1], size[0], 3), dtype=np.uint8)).save(path)
        (item,) = MediaPreparer(media).prepare(Sample("i", "free_form", "?", "x", None, [MediaItem("image", str(path))]))
        h, w = smart_resize(size[1], size[0], factor=IMAGE_FACTOR, min_pixels=MIN_PIXELS, max_pixels=MAX_PIXELS)
        assert (item.data.height, item.data.width) == (h, w), size


def test_t_grpo_with_a_7b_model_samples_videos_as_video_r1s_code(big: Path, tmp_path: Path,
                                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    media = _trained_media(big, tmp_path, monkeypatch)
    # 10 s at 4 fps, 4:3 (where the code's 1.05 x VIDEO_MIN_PIXELS cap and a 128 x 28 x 28 cap differ)
    frames = np.random.default_rng(1).integers(0, 256, (40, 480, 640, 3), dtype=np.uint8)
    path = write_mp4(tmp_path / "clip.mp4", frames, 4.0)
    (item,) = MediaPreparer(media).prepare(Sample("v", "free_form", "?", "x", None, [MediaItem("video", str(path))]))
    t, _, h, w = item.data.frames.shape
    nframes = min(max(10 * FPS, FPS_MIN_FRAMES), FPS_MAX_FRAMES)  # smart_nframes: 20 at 2 fps, at most 16
    assert t == nframes
    assert (h, w) == _video_r1_frame_size(480, 640, t)
