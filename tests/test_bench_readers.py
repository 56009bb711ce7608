"""Benchmark readers on fixtures in each benchmark's public layout; layout errors; frame rules."""

import json
import shutil
from pathlib import Path

import pytest

from data_pipelines.benchmarks import LayoutError, load_benchmark
from data_pipelines.benchmarks.fixtures import write_fixture
from mmrl.benchmarks_eval.media import BenchMediaPreparer, lvb_indices, mvbench_folder_indices
from mmrl.benchmarks_eval.protocols import make_protocol
from mmrl.benchmarks_eval.runner import media_config
from mmrl_common.errors import DataError


@pytest.fixture(scope="module")
def roots(tmp_path_factory) -> dict[str, Path]:
    base = tmp_path_factory.mktemp("bench")
    names = ("mvbench", "videomme", "longvideobench", "mmvu", "vqa-rad", "pathvqa", "slake", "toy")
    return {n: write_fixture(n, base / n, n=4) for n in names}


def test_every_reader(roots, tmp_path) -> None:
    counts = {n: len(load_benchmark(n, r, media_cache=tmp_path).samples) for n, r in roots.items()}
    assert counts == {"mvbench": 4, "videomme": 4, "longvideobench": 4, "mmvu": 4, "vqa-rad": 4,
                      "pathvqa": 4, "slake": 4, "toy": 8}


def test_mvbench_main_branch(roots, tmp_path) -> None:
    data = load_benchmark("mvbench", roots["mvbench"], media_cache=tmp_path)
    by = {s.id: s for s in data.samples}
    s = by["action_sequence/0"]
    raw = json.loads((roots["mvbench"] / "json" / "action_sequence.json").read_text())[0]
    assert s.answer == "ABCD"[raw["candidates"].index(raw["answer"])] and s.options == raw["candidates"]
    assert s.media[0].sampling == {"start": 0.3, "end": 1.7}  # raw videos: the bound is applied
    er = by["episodic_reasoning/0"]
    assert Path(er.media[0].path).is_dir() and er.media[0].sampling["folder_fps"] == 3.0
    assert "object_interaction" in data.info["tasks_missing"]


def test_mvbench_video_branch(roots, tmp_path) -> None:
    root = tmp_path / "mvb"
    shutil.copytree(roots["mvbench"] / "json", root / "json")
    shutil.copytree(roots["mvbench"] / "video" / "clevrer", root / "clevrer")
    seg = root / "star" / "Charades_segment"
    shutil.copytree(roots["mvbench"] / "video" / "star" / "Charades_v1_480", seg)
    items = json.loads((root / "json" / "action_sequence.json").read_text())
    items[1]["video"] = "1.avi"  # converted copies are .mp4 on the video branch
    (root / "json" / "action_sequence.json").write_text(json.dumps(items))
    (root / "json" / "episodic_reasoning.json").unlink()
    data = load_benchmark("mvbench", root, media_cache=tmp_path)
    s = {x.id: x for x in data.samples}
    assert s["action_sequence/0"].media[0].sampling == {}  # pre-trimmed segment: no bound
    assert s["action_sequence/1"].media[0].path.endswith("Charades_segment/1.mp4")


def test_layout_errors_say_what_is_expected_where(roots, tmp_path) -> None:
    with pytest.raises(LayoutError, match=r"folder not found.*\n.*expected layout.*\n.*json/<task>\.json"):
        load_benchmark("mvbench", tmp_path / "nope", media_cache=tmp_path)
    (tmp_path / "empty").mkdir()
    with pytest.raises(LayoutError, match="no json/ folder"):
        load_benchmark("mvbench", tmp_path / "empty", media_cache=tmp_path)
    broken = tmp_path / "broken"
    shutil.copytree(roots["mvbench"] / "json", broken / "json")
    with pytest.raises(LayoutError) as err:
        load_benchmark("mvbench", broken, media_cache=tmp_path)
    msg = str(err.value)
    assert "video '0.mp4'" in msg and str(broken / "video" / "star" / "Charades_v1_480") in msg
    with pytest.raises(LayoutError, match=r"no question table.*\n(.*\n)*.*videomme/test-\*\.parquet"):
        load_benchmark("videomme", tmp_path / "empty", media_cache=tmp_path)
    vm = tmp_path / "vm"
    shutil.copytree(roots["videomme"] / "videomme", vm / "videomme")
    with pytest.raises(LayoutError, match=r"2 video\(s\) not found.*vid000xyz.*\n(.*\n)*.*data/<videoID>\.mp4"):
        load_benchmark("videomme", vm, media_cache=tmp_path)
    (tmp_path / "lvb").mkdir()
    (tmp_path / "lvb" / "lvb_test_wo_gt.json").write_text("[]")
    with pytest.raises(LayoutError, match="has no answers"):
        load_benchmark("longvideobench", tmp_path / "lvb", media_cache=tmp_path)
    with pytest.raises(LayoutError, match="no Parquet file for split 'test'"):
        load_benchmark("vqa-rad", tmp_path / "empty", media_cache=tmp_path)
    shutil.copy(roots["slake"] / "test.json", tmp_path / "empty" / "test.json")
    with pytest.raises(LayoutError, match=r"image imgs/xmlab0/source\.jpg not found"):
        load_benchmark("slake", tmp_path / "empty", media_cache=tmp_path)
    with pytest.raises(LayoutError, match="no validation.json"):
        load_benchmark("mmvu", tmp_path / "lvb", media_cache=tmp_path)


def test_bad_records(roots, tmp_path) -> None:
    root = tmp_path / "mvb"
    shutil.copytree(roots["mvbench"], root)
    items = json.loads((root / "json" / "object_existence.json").read_text())
    items[0]["answer"] = "purple"
    (root / "json" / "object_existence.json").write_text(json.dumps(items))
    with pytest.raises(DataError, match=r"object_existence\.json: item 0: answer 'purple' is not one of"):
        load_benchmark("mvbench", root, media_cache=tmp_path)


def test_fields_for_breakdowns(roots, tmp_path) -> None:
    vm = load_benchmark("videomme", roots["videomme"], media_cache=tmp_path).samples[0]
    assert vm.options[0] == "A. red" and vm.answer in "ABCD"
    assert {"duration", "domain", "task_type", "sub_category"} <= vm.meta.keys() and vm.meta["subtitle_path"]
    lvb = load_benchmark("longvideobench", roots["longvideobench"], media_cache=tmp_path).samples[0]
    assert lvb.meta["duration_group"] == "15" and lvb.media[0].sampling == {"duration": 2.0}
    mmvu = load_benchmark("mmvu", roots["mmvu"], media_cache=tmp_path)
    assert mmvu.info["open_ended_skipped"] == 1 and mmvu.samples[0].meta["subject"] == "Art"
    rad = load_benchmark("vqa-rad", roots["vqa-rad"], media_cache=tmp_path).samples
    assert [s.meta["answer_type"] for s in rad] == ["closed", "open", "open", "open"]
    assert Path(rad[0].media[0].path).parent == tmp_path / "vqa-rad"
    slake = load_benchmark("slake", roots["slake"], media_cache=tmp_path)
    assert slake.info["other_language_skipped"] == 1


def test_frame_rules(roots) -> None:
    # MVBench get_index on a 16-file folder at 3 fps, bound [0.3, 1.7] s: start_idx max(1, 1) = 1,
    # end_idx min(5, 16) = 5, seg = 4/4 = 1 -> int(1 + 0.5 + i) = 1, 2, 3, 4 (files 00001..00004)
    assert mvbench_folder_indices(16, 3.0, 0.3, 1.7, 4) == [0, 1, 2, 3]
    # whole folder: start 1, end 16, seg 15/4 = 3.75 -> int(1 + 1.875 + round(3.75 i)) = 2, 6, 10, 13
    assert mvbench_folder_indices(16, 3.0, None, None, 4) == [1, 5, 9, 12]
    # LongVideoBench: duration 10 s at 8 fps -> 80 valid frames, n = min(16, 10) = 10, stride 8
    assert lvb_indices(100, 8.0, nframes=16, duration=10.0) == list(range(0, 80, 8))
    assert lvb_indices(16, 8.0, nframes=4, duration=2.0) == [0, 8]
    data = load_benchmark("mvbench", roots["mvbench"], media_cache=roots["mvbench"])
    prep = BenchMediaPreparer(media_config(make_protocol("mvbench", frames=4, max_pixels=3136)), family="qwen2_5_vl")
    by = {s.id: s for s in data.samples}
    video = prep.prepare(by["action_sequence/0"])[0].data
    # MP4 at 8 fps, 16 frames, bound [0.3, 1.7]: round(2.4) = 2 .. round(13.6) = 14, seg 3 -> 3, 6, 9, 12
    assert video.indices == [3, 6, 9, 12]
    folder = prep.prepare(by["episodic_reasoning/0"])[0].data
    assert folder.indices == [0, 1, 2, 3] and tuple(folder.frames.shape[:2]) == (4, 3)
