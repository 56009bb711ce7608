"""MediaPreparer: record sampling hints override the run's settings; the decoded-media cache is an LRU
bounded in bytes."""

from __future__ import annotations

from pathlib import Path

import pytest

from data_pipelines.loaders import load_samples
from data_pipelines.toy import make_toy
from mmrl.config import MediaConfig
from mmrl.engine.media import MediaPreparer


@pytest.fixture(scope="module")
def samples(tmp_path_factory: pytest.TempPathFactory) -> list:
    toy = make_toy(tmp_path_factory.mktemp("toy"), 0, size={"train": 3, "val": 0, "test": 0}, tasks=["color"],
                   progress=False)
    return load_samples(Path(toy) / "train.jsonl").samples


def test_record_hints_win_and_frames_fit_the_budget(samples: list) -> None:
    cfg = MediaConfig(video_min_pixels=3136, video_max_pixels=3136, max_frames=4)
    media = MediaPreparer(cfg).prepare(samples[0])[0]
    assert media.kind == "video"
    assert samples[0].media[0].sampling["nframes"] == len(media.timestamps) == media.data.frames.shape[0]
    assert media.data.frames.shape[-2] * media.data.frames.shape[-1] <= 3136


def test_cache_is_lru_and_bounded_in_bytes(samples: list) -> None:
    cfg = MediaConfig(video_min_pixels=3136, video_max_pixels=3136)
    one = MediaPreparer(cfg).prepare(samples[0])[0].data.frames.nbytes
    prep = MediaPreparer(MediaConfig(video_min_pixels=3136, video_max_pixels=3136, cache_mb=2.5 * one / 2**20))
    first = prep.prepare(samples[0])[0]
    assert prep.prepare(samples[0])[0] is first  # a cache hit: not decoded again
    prep.prepare(samples[1])
    prep.prepare(samples[2])  # three items do not fit in 2.5 items' bytes: the least recently used goes
    assert len(prep.cache) == 2 and prep.cache_used == 2 * one
    assert prep.prepare(samples[0])[0] is not first
