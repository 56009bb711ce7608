"""Temporal-R1's whole-video pixel budget (issue 48). Its released code (appletea233/Temporal-R1,
verl/utils/dataset_video.py) hands qwen-vl-utils a video item ``{"total_pixels": data.max_pixels (1,605,632),
"min_pixels": 3136}`` with no fps, frame count or per-frame cap, so qwen-vl-utils samples at its default 2 fps and
caps each frame at ``total_pixels / nframes * FRAME_FACTOR`` (qwen_vl_utils/vision_process.py, fetch_video). The
reference here is qwen_vl_utils.fetch_video itself on the same file."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from data_pipelines.schema import MediaItem, Sample
from mmrl.config import MediaConfig, load_run_config
from mmrl.engine.media import MediaPreparer
from mmrl_common.errors import ConfigError
from video import sample_video
from video.writer import write_mp4

CODE_ITEM = {"total_pixels": 1605632, "min_pixels": 3136}  # dataset_video.py's video item for charades_train


@pytest.fixture(scope="module")
def long_video(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """60 frames of 360x480 at 2 fps: 30 s, so 2 fps samples all 60 and the whole-video budget binds."""
    rng = np.random.default_rng(0)
    frames = rng.integers(0, 256, (60, 360, 480, 3), dtype=np.uint8)
    return write_mp4(tmp_path_factory.mktemp("tp") / "long.mp4", frames, 2.0)


def _reference(path: Path, **item: object) -> tuple:
    from qwen_vl_utils import fetch_video

    (ref, meta) = fetch_video({"video": str(path), **item}, return_video_metadata=True)
    return ref, list(meta["frames_indices"])


def test_the_temporal_r1_recipe_samples_as_its_code(long_video: Path) -> None:
    """The path a run takes: the recipe's data.media through MediaPreparer equals qwen-vl-utils on the code's item."""
    cfg = load_run_config("temporal-grounding").data.media
    sample = Sample("v", "temporal_grounding", "When?", [1.0, 2.0], None, [MediaItem("video", str(long_video))])
    (ours,) = MediaPreparer(cfg).prepare(sample)
    ref, indices = _reference(long_video, **CODE_ITEM)
    assert ours.data.indices == indices
    assert tuple(ours.data.frames.shape) == tuple(ref.shape)
    t, _, h, w = ref.shape
    assert t == 60 and h * w <= CODE_ITEM["total_pixels"] / t * 2  # qwen-vl-utils' per-frame cap binds here


@pytest.mark.parametrize("total", [1605632, 401408, 100000])
def test_a_total_budget_caps_each_frame_as_qwen_vl_utils(long_video: Path, total: int) -> None:
    ours = sample_video(long_video, "qwen", total_pixels=total, min_pixels=3136)
    ref, indices = _reference(long_video, total_pixels=total, min_pixels=3136)
    assert ours.indices == indices and tuple(ours.frames.shape) == tuple(ref.shape)
    cfg = MediaConfig(video_total_pixels=total, video_min_pixels=3136, video_max_pixels=768 * 28 * 28,
                      max_frames=768)
    prep = MediaPreparer(cfg)
    assert prep.video_options({})["total_pixels"] == total
    (item,) = prep.prepare(Sample("v", "free_form", "?", "x", None, [MediaItem("video", str(long_video))]))
    assert tuple(item.data.frames.shape) == tuple(ref.shape)


def test_no_budget_by_default_and_a_bad_one_is_refused() -> None:
    assert "total_pixels" not in MediaPreparer(MediaConfig()).video_options({})
    assert "total_pixels" not in MediaPreparer(MediaConfig(video_total_pixels=0)).video_options({})
    with pytest.raises(ConfigError, match="data.media.video_total_pixels"):
        MediaConfig(video_total_pixels=-5)
