"""Benchmark readers on fixtures in each benchmark's public layout; layout errors; frame rules."""

import json
import re
import shutil
from pathlib import Path

import pytest

from data_pipelines.benchmarks import LayoutError, load_benchmark
from data_pipelines.benchmarks._common import MediaIndex, find_media
from data_pipelines.benchmarks.fixtures import write_fixture
from data_pipelines.benchmarks.lvb import lvb_subtitles
from data_pipelines.benchmarks.videomme import parse_srt
from mmrl.benchmarks.media import BenchMediaPreparer, lvb_indices, mvbench_folder_indices
from mmrl.benchmarks.protocols import make_protocol
from mmrl.benchmarks.runner import media_config
from mmrl_common.errors import DataError


@pytest.fixture(scope="module")
def roots(tmp_path_factory) -> dict[str, Path]:
    base = tmp_path_factory.mktemp("bench")
    names = ("mvbench", "videomme", "longvideobench", "mmvu", "vqa-rad", "pathvqa", "slake", "toy")
    return {n: write_fixture(n, base / n, n=4) for n in names}


VIDEO = ("mvbench", "videomme", "longvideobench", "mmvu")


def _answerable(data) -> list:
    return [s for s in data.samples if not s.meta.get("missing_media")]


def test_every_reader(roots, tmp_path) -> None:
    data = {n: load_benchmark(n, r, media_cache=tmp_path) for n, r in roots.items()}
    counts = {n: len(_answerable(d)) for n, d in data.items()}
    assert counts == {"mvbench": 4, "videomme": 4, "longvideobench": 4, "mmvu": 4, "vqa-rad": 4,
                      "pathvqa": 4, "slake": 4, "toy": 8}
    # the video fixtures hold one more question, whose video is missing
    assert {n: len(d.samples) - counts[n] for n, d in data.items()} == {n: int(n in VIDEO) for n in data}


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
    with pytest.raises(LayoutError, match=r"no question table.*\n(.*\n)*.*videomme/test-\*\.parquet"):
        load_benchmark("videomme", tmp_path / "empty", media_cache=tmp_path)
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


# ------------------------------------------------------------------ extensions in any case, missing videos
def test_find_media_ignores_the_case_of_the_extension(tmp_path) -> None:
    (tmp_path / "sub").mkdir()
    for name in ("a.MP4", "b.Mp4", "c.WEBM", "sub/d.MOV", "e.mp4", "f.txt"):
        (tmp_path / name).write_bytes(b"x")
    index = MediaIndex()
    for asked, found in [("a.mp4", "a.MP4"), ("b.mp4", "b.Mp4"), ("c.webm", "c.WEBM"), ("c.mp4", "c.WEBM"),
                         ("sub/d.mov", "sub/d.MOV"), ("sub/d.avi", "sub/d.MOV"), ("e.MP4", "e.mp4")]:
        path, base = find_media([tmp_path / "nope", tmp_path], asked, index=index)
        assert (path, base) == (tmp_path / found, tmp_path), asked
    assert find_media([tmp_path], "f.mp4", index=index) == (None, None)  # .txt is no video
    assert find_media([tmp_path], "A.mp4", index=index) == (None, None)  # only the extension's case is free
    assert find_media([tmp_path], "a.mp4") == (tmp_path / "a.MP4", tmp_path)  # without an index too


@pytest.mark.parametrize("name", VIDEO)
def test_upper_case_extension_found_by_every_reader(name, roots, tmp_path) -> None:
    samples = _answerable(load_benchmark(name, roots[name], media_cache=tmp_path))
    assert all(Path(s.media[0].path).exists() for s in samples)
    assert any(Path(s.media[0].path).suffix == ".MP4" for s in samples)


@pytest.mark.parametrize("name", VIDEO)
def test_missing_video_is_kept_marked_and_listed(name, roots, tmp_path) -> None:
    data = load_benchmark(name, roots[name], media_cache=tmp_path)
    marked = [s for s in data.samples if s.meta.get("missing_media")]
    assert len(marked) == 1 and isinstance(marked[0].meta["missing_media"], str)
    assert marked[0].answer in "ABCDE" and marked[0].options  # the question itself is read as usual
    assert not Path(marked[0].media[0].path).exists()
    assert str(roots[name]) in marked[0].meta["missing_media"]  # says where it looked
    assert data.info["missing_media"] == [{"id": marked[0].id, "path": marked[0].media[0].path}]
    assert all("missing_media" not in s.meta for s in data.samples if s is not marked[0])


def test_more_missing_videos_listed_in_order(roots, tmp_path) -> None:
    root = tmp_path / "vm"
    shutil.copytree(roots["videomme"], root)
    for f in (root / "data").glob("vid001xyz.*"):
        f.unlink()
    data = load_benchmark("videomme", root, media_cache=tmp_path)
    assert [m["id"] for m in data.info["missing_media"]] == ["002-1", "002-2", "999-1"]
    assert len(data.samples) == 5 and Path(data.info["missing_media"][0]["path"]).parent == root / "data"


def _question_table_only(name: str, src: Path, dst: Path) -> None:
    for rel in {"mvbench": ["json"], "videomme": ["videomme"], "longvideobench": ["lvb_val.json"],
                "mmvu": ["validation.json", "data"]}[name]:
        if (src / rel).is_dir():
            shutil.copytree(src / rel, dst / rel)
        elif (src / rel).exists():
            dst.mkdir(parents=True, exist_ok=True)
            shutil.copy(src / rel, dst / rel)


@pytest.mark.parametrize("name", VIDEO)
def test_all_videos_missing_is_a_layout_error_naming_the_folder(name, roots, tmp_path) -> None:
    root = tmp_path / "wrong"
    _question_table_only(name, roots[name], root)
    with pytest.raises(LayoutError) as err:
        load_benchmark(name, root, media_cache=tmp_path)
    msg = str(err.value)
    assert "none of the videos" in msg and str(root) in msg and "expected layout under" in msg
    if name == "mvbench":
        assert "video '0.mp4'" in msg and str(root / "video" / "star" / "Charades_v1_480") in msg
    if name == "videomme":
        assert re.search(r"vid\d{3}xyz|vidmissing", msg) and "data/<videoID>.mp4" in msg


# --------------------------------------------------------------------------------- MMVU, lmms-eval layout
def _portable(data) -> list[tuple]:
    return [(s.id, s.question, s.options, s.answer, s.meta["subject"], bool(s.meta.get("missing_media")),
             Path(s.media[0].path).relative_to(data.root).as_posix()) for s in data.samples]


def test_mmvu_lmms_eval_layout_reads_as_the_yale_layout(roots, tmp_path) -> None:
    import pyarrow as pa
    import pyarrow.parquet as pq

    lmms = write_fixture("mmvu", tmp_path / "lmms", n=4, layout="lmms-eval")
    assert not (lmms / "validation.json").exists() and (lmms / "data").is_dir()
    yale = load_benchmark("mmvu", roots["mmvu"], media_cache=tmp_path)
    got = load_benchmark("mmvu", lmms, media_cache=tmp_path)
    assert _portable(got) == _portable(yale) and len(got.samples) == 5
    assert got.info["layout"] == "lmms-eval" and yale.info["layout"] == "yale-nlp"
    assert got.info["open_ended_skipped"] == yale.info["open_ended_skipped"] == 1
    assert [m["id"] for m in got.info["missing_media"]] == [m["id"] for m in yale.info["missing_media"]]

    # choices stored as JSON strings and video_path relative to videos/: the same questions
    (table,) = (lmms / "data").glob("*.parquet")
    rows = pq.read_table(table).to_pylist()
    for r in rows:
        r["choices"] = json.dumps(r["choices"])
        r["video_path"] = r["video_path"].removeprefix("videos/")
    pq.write_table(pa.Table.from_pylist(rows), table)
    again = load_benchmark("mmvu", lmms, media_cache=tmp_path)
    assert [x[:6] for x in _portable(again)] == [x[:6] for x in _portable(yale)]
    assert all(Path(s.media[0].path).exists() for s in _answerable(again))

    # a structural problem still raises
    rows[0]["answer"] = "Z"
    pq.write_table(pa.Table.from_pylist(rows), table)
    with pytest.raises(DataError, match="answer 'Z' is not one of"):
        load_benchmark("mmvu", lmms, media_cache=tmp_path)


# ---------------------------------------------------------------------------------------------- subtitles
def test_videomme_subtitle_markup_stripped(roots, tmp_path) -> None:
    srt = tmp_path / "x.srt"
    srt.write_bytes("\ufeff1\r\n00:00:01,500 --> 00:00:03,250\r\n<font color=\"white\" size=\".72c\">so we go "
                    "to the</font>\r\n\r\n2\r\n00:01:02,000 --> 00:01:04,000\r\n{\\an8}<i>first</i> line\r\n"
                    "<b>second</b>  line\r\n\r\n3\r\n00:01:05,000 --> 00:01:06,000\r\n<font color=\"white\">"
                    "</font>\r\n".encode())
    assert parse_srt(srt) == [(1.5, 3.25, "so we go to the"), (62.0, 64.0, "first line second line")]
    # the fixture's Video-MME file: the text lmms-eval keeps (inside the <font> element) and no markup
    sample = load_benchmark("videomme", roots["videomme"], media_cache=tmp_path).samples[0]
    path = Path(sample.meta["subtitle_path"])
    cues = parse_srt(path)
    raw = path.read_text()
    assert '<font color="white" size=".72c">' in raw and "{\\an8}" in raw
    lmms = re.findall(r'<font color="white" size=".72c">(.*?)</font>', raw)
    assert cues[0][2] == lmms[0] and len(cues) == raw.count("-->")
    assert all(not re.search(r"[<>{}\\]", text) and text == text.strip() for _, _, text in cues)


def test_lvb_subtitles_in_both_formats_on_the_clip_clock(roots, tmp_path) -> None:
    root = tmp_path / "lvb"
    shutil.copytree(roots["longvideobench"], root)
    items = json.loads((root / "lvb_val.json").read_text())
    items[2].update(subtitle_path="cut_en.json", starting_timestamp_for_subtitles=30.5, duration=2.0)
    (root / "lvb_val.json").write_text(json.dumps(items))
    (root / "subtitles" / "cut_en.json").write_text(json.dumps([
        {"timestamp": [30.5, 31.25], "text": "one"},
        {"start": "00:00:31.250", "end": "00:00:32.000", "line": "two"},
        {"timestamp": [32.0, None], "text": "three"},  # no end: duration, then shifted too (official code)
    ]))
    data = load_benchmark("longvideobench", root, media_cache=tmp_path)
    by = {s.id: s for s in data.samples}
    s = by[items[2]["id"]]
    assert s.meta["subtitle_path"] == str(root / "subtitles" / "cut_en.json")
    got = lvb_subtitles(s)
    assert [t for _, _, t in got] == ["one", "two", "three"]
    assert [x for a, b, _ in got for x in (a, b)] == pytest.approx([0.0, 0.75, 0.75, 1.5, 1.5, 2.0 - 30.5])
    # the fixture's own files: every entry read, times within the 2 s clips; no file -> None and []
    with_file = [x for x in data.samples if x.meta["subtitle_path"] and x is not s]
    assert with_file and all(lvb_subtitles(x) for x in with_file)
    for x in with_file:
        raw = json.loads(Path(x.meta["subtitle_path"]).read_text())
        assert [t for _, _, t in lvb_subtitles(x)] == [e.get("text", e.get("line")) for e in raw]
        assert all(0 <= a < b <= 2.0 for a, b, _ in lvb_subtitles(x))
    none = [x for x in data.samples if not x.meta["subtitle_path"]]
    assert none and all(lvb_subtitles(x) == [] for x in none)


def test_mmvu_open_questions_get_the_official_direct_output_prompt() -> None:
    """An open-ended MMVU question is asked with main.py's direct-output instruction for open-ended questions
    (yale-nlp/MMVU utils/constant.py OPEN_ENDED_DO_PROMPT: "... Directly output the final short answer."), no
    options; a multiple-choice one keeps the letter instruction."""
    from data_pipelines.benchmarks.mmvu import official_prompt
    from data_pipelines.schema import Sample

    open_q = Sample(id="o1", problem_type="open", question="Which technique is shown? ", answer="etching")
    _, text, _ = official_prompt(open_q)
    assert text.startswith("Question:Which technique is shown?\n") and "A:" not in text
    assert text.endswith("Do not generate any intermediate reasoning process. Directly output the final short answer.")
    mc = Sample(id="m1", problem_type="multiple_choice", question="Which?", answer="A", options=["x", "y"])
    assert official_prompt(mc)[1].endswith("Answer directly with the option letter from the given choices.")
