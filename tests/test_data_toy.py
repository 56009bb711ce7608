"""The toy world: real MP4/PNG files, determinism, disjoint splits, balanced answers, strong signal."""

from __future__ import annotations

import hashlib
import json
from collections import Counter
from pathlib import Path

import numpy as np
import pytest

from data_pipelines.loaders import load_samples
from data_pipelines.toy import COLOR_NAMES, COLORS, DIFFICULTIES, SPLITS, ensure_toy, make_toy, toy_tasks
from data_pipelines.validate import validate_dataset
from mmrl.cli import main as cli_main
from mmrl_common.errors import DataError
from video.reader import open_video

TINY = {"train": 2, "val": 1, "test": 1}


@pytest.fixture(scope="module")
def small(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_toy(tmp_path_factory.mktemp("toy") / "small", seed=0, size="small", progress=False)


@pytest.fixture(scope="module")
def tiny_builds(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path, Path]:
    root = tmp_path_factory.mktemp("tiny")
    a = make_toy(root / "a", seed=0, size=TINY, progress=False)
    b = make_toy(root / "b", seed=0, size=TINY, progress=False)
    c = make_toy(root / "c", seed=1, size=TINY, progress=False)
    return a, b, c


def _records(root: Path, split: str) -> list[dict]:
    return [json.loads(line) for line in (root / f"{split}.jsonl").read_text().splitlines()]


def _all_frames(path: Path) -> np.ndarray:
    with open_video(path) as r:
        return r.get_frames(range(r.num_frames))


def test_same_seed_identical_different_seed_differs(tiny_builds):
    a, b, c = tiny_builds
    for split in SPLITS:
        assert (a / f"{split}.jsonl").read_bytes() == (b / f"{split}.jsonl").read_bytes()
    assert (a / "manifest.json").read_bytes() == (b / "manifest.json").read_bytes()
    videos = sorted(p.relative_to(a) for p in a.rglob("*.mp4"))
    images = sorted(p.relative_to(a) for p in a.rglob("*.png"))
    kinds = Counter(t.kind for t in toy_tasks().values())  # the tiny build has 4 records per task
    assert len(videos) == kinds["video"] * 4 and len(images) == kinds["image"] * 4
    differing = 0
    for rel in videos:
        fa, fb = _all_frames(a / rel), _all_frames(b / rel)
        assert fa.shape == fb.shape and np.array_equal(fa, fb), rel
        fc = _all_frames(c / rel)
        differing += int(fa.shape != fc.shape or not np.array_equal(fa, fc))
    for rel in images:
        assert (a / rel).read_bytes() == (b / rel).read_bytes()
    assert differing == len(videos)
    assert (a / "train.jsonl").read_bytes() != (c / "train.jsonl").read_bytes()


@pytest.mark.slow
def test_every_record_validates_and_counts_match(small):
    manifest = json.loads((small / "manifest.json").read_text())
    assert manifest["tasks"] == list(toy_tasks()) and manifest["seed"] == 0
    for split in SPLITS:
        report = validate_dataset(small / f"{split}.jsonl")
        assert report.ok, [str(p) for p in report.problems]
        per_task = {"train": 8, "val": 4, "test": 4}[split]
        assert report.total == manifest["splits"][split]["records"] == len(toy_tasks()) * per_task
        assert report.media_checked == report.total  # one media file per record, all decoded
    assert (small / "README.md").read_text().startswith("# mmrl toy world")


@pytest.mark.slow
def test_splits_are_disjoint(small):
    ids, paths, digests = {}, {}, {}
    for split in SPLITS:
        recs = _records(small, split)
        ids[split] = {r["id"] for r in recs}
        paths[split] = {r["media"][0]["path"] for r in recs}
        digests[split] = {hashlib.sha1((small / p).read_bytes()).hexdigest() for p in paths[split]}
        assert len(ids[split]) == len(recs) == len(digests[split])
    for s1, s2 in [("train", "val"), ("train", "test"), ("val", "test")]:
        assert not ids[s1] & ids[s2] and not paths[s1] & paths[s2] and not digests[s1] & digests[s2]


@pytest.mark.slow
def test_answers_balanced_and_options_canonical(small):
    recs = _records(small, "train")
    by_task: dict[str, Counter] = {}
    for r in recs:
        assert r["meta"]["source"] == "toy" and r["meta"]["difficulty"] in DIFFICULTIES
        if r["problem_type"] in ("multiple_choice", "yes_no"):
            by_task.setdefault(r["meta"]["task"] + ":" + r["problem_type"], Counter())[r["answer"]] += 1
        if r["problem_type"] == "multiple_choice":
            assert len(r["options"]) >= 3
        if r["meta"]["task"] in ("color", "order", "needle"):
            assert r["options"] == list(COLOR_NAMES)
    assert by_task["color:multiple_choice"] == Counter({"A": 2, "B": 2, "C": 2, "D": 2})
    assert by_task["motion:multiple_choice"] == Counter({"A": 2, "B": 2, "C": 2, "D": 2})
    assert by_task["shape:multiple_choice"] == Counter({"A": 3, "B": 3, "C": 2})
    assert by_task["scan:yes_no"] == Counter({"yes": 1, "no": 1})
    for counter in by_task.values():
        assert max(counter.values()) - min(counter.values()) <= 1
    # difficulty varies within tasks (a curriculum needs that)
    assert {r["meta"]["difficulty"] for r in recs if r["meta"]["task"] == "needle"} == set(DIFFICULTIES)
    assert {r["meta"]["difficulty"] for r in recs if r["meta"]["task"] == "color"} == {"easy", "medium"}


def test_shuffled_options_keep_the_right_answer(tmp_path: Path):
    out = make_toy(tmp_path / "s", seed=3, size={"train": 8, "val": 0, "test": 0}, tasks=["color"],
                   shuffle_options=True, progress=False)
    recs = _records(out, "train")
    assert len({tuple(r["options"]) for r in recs}) > 1
    for r in recs:
        assert sorted(r["options"]) == sorted(COLOR_NAMES)
        frames = _all_frames(out / r["media"][0]["path"])
        assert _dominant_colour(frames) == r["options"][ord(r["answer"]) - 65]


def _colour_share(frames: np.ndarray, name: str) -> float:
    diff = np.abs(frames.astype(int) - np.array(COLORS[name])).max(axis=-1)
    return float((diff < 50).mean())


def _dominant_colour(frames: np.ndarray) -> str:
    return max(COLOR_NAMES, key=lambda n: _colour_share(frames, n))


@pytest.mark.slow
def test_videos_small_and_signal_strong(small):
    recs = load_samples(small / "train.jsonl").samples
    for s in recs:
        task = s.meta["task"]
        if toy_tasks()[task].kind == "image":
            continue
        frames = _all_frames(Path(s.media[0].path))
        n, h, w, _ = frames.shape
        assert (h, w) == (64, 64)
        expect = {"needle": (96, 4.0), "grounding": (32, 4.0), "evidence": (128, 4.0)}.get(task, (16, 8.0))
        assert (n, s.meta["video"]["fps"]) == expect
        if task == "color":
            assert _dominant_colour(frames) == s.answer_text()
            assert _colour_share(frames, s.answer_text()) > 0.08  # the object covers a good part of the frame
        if task == "needle":
            gold = s.meta["gold_frames"]
            colour = s.answer_text()
            assert all(_colour_share(frames[i:i + 1], colour) > 0.15 for i in gold)
            others = [i for i in range(n) if i not in gold]
            assert max(_colour_share(frames[i:i + 1], colour) for i in others) < 0.01
            assert s.meta["gold_span"] == [gold[0] / 4.0, (gold[-1] + 1) / 4.0]
        if task == "grounding":
            assert s.problem_type == "temporal_grounding"
            start, end = s.answer
            inside = [i for i in range(n) if start <= i / 4.0 < end]
            assert inside == s.meta["gold_frames"]
            colour = s.meta["color"]
            assert all(_colour_share(frames[i:i + 1], colour) > 0.1 for i in inside)
        if task == "order":
            first = s.answer_text()
            first_frame = min(i for i in range(n) if max(_colour_share(frames[i:i + 1], c) for c in COLOR_NAMES) > 0.1)
            assert _dominant_colour(frames[first_frame:first_frame + 1]) == first


@pytest.mark.slow
def test_scans(small):
    from PIL import Image

    recs = load_samples(small / "train.jsonl").samples
    scans = [s for s in recs if s.meta["task"] == "scan"]
    kinds = Counter(s.meta["question_kind"] for s in scans)
    assert kinds == Counter({"presence": 2, "location_mc": 2, "location_open": 2, "polarity_open": 2})
    for s in scans:
        img = Image.open(s.media[0].path)
        assert img.mode == "L" and img.size == (64, 64)
        if s.problem_type == "open":
            assert s.answer in s.meta["synonyms"]
        if s.meta["question_kind"] == "location_open" and s.answer == "upper left":
            assert "left upper" in s.meta["synonyms"]
        finding = s.meta["finding"]
        if finding["present"]:
            x, y = finding["center"]
            arr = np.asarray(img, dtype=float)
            yy, xx = np.mgrid[0:64, 0:64] + 0.5
            dist = np.hypot(xx - x, yy - y)
            inside = arr[dist < 0.7 * finding["radius"]].mean()
            around = arr[(dist > finding["radius"] + 1) & (dist < finding["radius"] + 4)].mean()
            sign = 1 if finding["polarity"] == "bright" else -1
            assert sign * (inside - around) > finding["contrast"] / 2  # brighter or darker than its surroundings


def test_scan_tissue_shows_where_it_is():
    """v2 scans: the tissue itself tells top from bottom (brightness) and left from right (stripes), so a lesion's
    pixels carry its location (v1 tissue looked the same everywhere and the tiny models could not place it)."""
    from data_pipelines.toy.scan import TISSUE_RAMP, render_scan

    for seed in range(5):
        img = render_scan(np.random.default_rng(seed), 64, None).astype(float)
        body = img > 60
        top, bottom = img[16:28, 20:44], img[36:48, 20:44]
        assert body[16:48, 20:44].all() and bottom.mean() - top.mean() > TISSUE_RAMP / 2
        # striation: neighbouring columns differ much more on the left half than on the right
        left, right = img[24:40, 12:30], img[24:40, 34:52]
        assert np.abs(np.diff(left, axis=1)).mean() > 2 * np.abs(np.diff(right, axis=1)).mean()


def test_a_task_version_moves_only_the_keys_of_data_that_hold_it(monkeypatch: pytest.MonkeyPatch):
    from data_pipelines.toy import toy_key
    from data_pipelines.toy.registry import get_task, task_versions
    from mmrl.toy.base import BaseRecipe, base_key

    shape, both, base = toy_key(0, tasks=["shape"]), toy_key(0, tasks=["color", "shape"]), base_key(BaseRecipe())
    no_color = base_key(BaseRecipe(tasks=("shape", "count")))
    monkeypatch.setattr(get_task("color"), "version", get_task("color").version + 1)
    assert task_versions(["color", "shape"]) == {"color": get_task("color").version}
    assert toy_key(0, tasks=["shape"]) == shape and base_key(BaseRecipe(tasks=("shape", "count"))) == no_color
    assert toy_key(0, tasks=["color", "shape"]) != both and base_key(BaseRecipe()) != base


def test_ensure_toy_builds_once(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    monkeypatch.setenv("MMRL_CACHE", str(tmp_path / "cache"))
    kw = {"size": {"train": 1, "val": 1, "test": 1}, "tasks": ["color", "scan"], "progress": False}
    first = ensure_toy(0, **kw)
    assert first.parent == tmp_path / "cache" / "toy" and (first / "manifest.json").exists()
    stamp = (first / "manifest.json").stat().st_mtime_ns
    assert ensure_toy(0, **kw) == first and (first / "manifest.json").stat().st_mtime_ns == stamp
    assert ensure_toy(1, **kw) != first
    assert not [p for p in first.parent.iterdir() if p.name.startswith(".tmp")]


def test_cli_make_toy_and_errors(tmp_path: Path, capsys: pytest.CaptureFixture[str]):
    out = tmp_path / "cli"
    rc = cli_main(["data", "make-toy", "--out", str(out), "--size", "small", "--tasks", "motion", "count",
                   "--seed", "5", "--no-progress"])
    assert rc == 0 and "wrote toy world" in capsys.readouterr().out
    assert {r["meta"]["task"] for r in _records(out, "train")} == {"motion", "count"}
    # regenerating into a previous toy world is fine; a foreign non-empty folder is refused
    assert cli_main(["data", "make-toy", "--out", str(out), "--tasks", "motion", "--size", "small",
                     "--no-progress"]) == 0
    assert not (out / "media" / "train" / "count").exists()
    (tmp_path / "foreign").mkdir()
    (tmp_path / "foreign" / "notes.txt").write_text("mine")
    assert cli_main(["data", "make-toy", "--out", str(tmp_path / "foreign"), "--no-progress"]) == 2
    assert "not empty" in capsys.readouterr().err
    with pytest.raises(DataError, match="unknown toy task 'nope'"):
        make_toy(tmp_path / "x", tasks=["nope"], progress=False)
