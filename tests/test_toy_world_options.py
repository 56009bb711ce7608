"""The toy world's options (``data.toy_world``): a trail behind the moving square, needle videos sampled at more
frames; the default world, its data and its base model keep their pictures and cache keys."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from data_pipelines.toy import make_toy, toy_key
from data_pipelines.toy.draw import COLORS
from data_pipelines.toy.pretrain import make_pretrain
from data_pipelines.toy.registry import ToyConfig, get_task, world_config
from mmrl.cli import main as cli_main
from mmrl.config.toy import BaseRecipe, base_key
from mmrl_common.errors import DataError

VIDEO_QA = ["color", "shape", "count", "motion", "order", "needle"]


def _square_column_profile(frame: np.ndarray, color: tuple[int, int, int]) -> np.ndarray:
    """Per column of ``frame``: how close its pixels come to ``color`` (1: the colour, 0: the background)."""
    c = np.asarray(color, np.float32)
    bg = 50.0
    closeness = ((frame.astype(np.float32) - bg) @ (c - bg)) / float((c - bg) @ (c - bg))
    return closeness.max(axis=0)


def test_the_default_world_is_drawn_and_keyed_as_before() -> None:
    # the keys of the default toy world and base model are those every earlier result was measured on
    assert toy_key(0, size={"train": 64, "val": 16, "test": 50}, tasks=VIDEO_QA) == "7124c9494025"
    assert base_key(BaseRecipe()) == "6878a53c8446"
    assert base_key(BaseRecipe(world=(("motion_trail", 0), ("needle_frames", 8)))) == base_key(BaseRecipe())
    assert toy_key(0, tasks=VIDEO_QA, world={"motion_trail": 0}) == toy_key(0, tasks=VIDEO_QA)
    # and an option moves the keys of both
    assert toy_key(0, tasks=VIDEO_QA, world={"motion_trail": 4}) != toy_key(0, tasks=VIDEO_QA)
    assert base_key(BaseRecipe(world=(("needle_frames", 16),))) != base_key(BaseRecipe())
    # the same draws: an option changes the pictures it names, never the facts
    plain = get_task("motion").fn(np.random.default_rng(3), 1, ToyConfig())
    trail = get_task("motion").fn(np.random.default_rng(3), 1, ToyConfig(motion_trail=4))
    assert plain.answer == trail.answer and plain.meta == trail.meta
    assert not np.array_equal(plain.frames, trail.frames)


@pytest.mark.parametrize("index", [0, 1, 2, 3])  # left, right, up, down (easy and medium variants)
def test_the_trail_lies_behind_the_square_and_fades(index: int) -> None:
    item = get_task("motion").fn(np.random.default_rng(index), index, ToyConfig(motion_trail=4))
    plain = get_task("motion").fn(np.random.default_rng(index), index, ToyConfig())
    direction = item.answer
    frame, bare = item.frames[12], plain.frames[12]
    color = next(c for c in COLORS.values() if (np.abs(bare.astype(int) - c).sum(-1) == 0).any())
    # the square itself is where it was; the trail only adds fainter pixels behind it
    same = np.abs(bare.astype(int) - np.asarray(color)).sum(-1) == 0
    assert (np.abs(frame.astype(int) - np.asarray(color)).sum(-1)[same] == 0).all()
    f, b = (frame, bare) if direction in ("left", "right") else (frame.transpose(1, 0, 2), bare.transpose(1, 0, 2))
    prof, solid = _square_column_profile(f, color), _square_column_profile(b, color) > 0.9
    cols = np.nonzero(solid)[0]
    lead_back = direction in ("right", "down")  # the trail lies at smaller coordinates
    behind = prof[:cols.min()][::-1] if lead_back else prof[cols.max() + 1:]
    ahead = prof[cols.max() + 1:] if lead_back else prof[:cols.min()][::-1]
    assert (behind[:3] > 0.6).all() and (ahead < 0.3).all()  # a trail behind, nothing ahead
    tail = behind[:np.argmax(behind < 0.15)]  # up to where the background noise begins
    assert len(tail) >= 4 and (np.diff(tail) <= 1e-6).all()  # fading with distance


def test_needle_frames_sets_the_sampling_and_the_world_reaches_the_files(tmp_path: Path) -> None:
    world = {"motion_trail": 3, "needle_frames": 16}
    out = make_toy(tmp_path / "toy", 0, size={"train": 2, "val": 1, "test": 1}, tasks=["motion", "needle"],
                   world=world, progress=False)
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["world"] == world
    needles = [json.loads(line) for line in (out / "train.jsonl").read_text().splitlines() if "needle" in line]
    assert needles and all(r["media"][0]["sampling"] == {"nframes": 16} for r in needles)
    plain = make_toy(tmp_path / "plain", 0, size={"train": 2, "val": 1, "test": 1}, tasks=["needle"], progress=False)
    assert "world" not in json.loads((plain / "manifest.json").read_text())
    pre = make_pretrain(tmp_path / "pre", 1, tasks=["needle"], per_task=2, world=world, progress=False)
    assert all(json.loads(line)["media"][0]["sampling"] == {"nframes": 16} for line in pre.read_text().splitlines())


def test_bad_world_options_are_named(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(DataError, match="motion_trial.*known: motion_trail, needle_frames"):
        world_config(world={"motion_trial": 4})
    with pytest.raises(DataError, match="needle_frames=1: a whole number, 2 or more"):
        world_config(world={"needle_frames": 1})
    with pytest.raises(DataError, match="motion_trail"):
        BaseRecipe(world=(("motion_trail", -1),))
    assert cli_main(["config", "show", "data.toy_world={motion_trial: 4}"]) != 0
    assert "data.toy_world: unknown toy world option(s) motion_trial" in capsys.readouterr().err
