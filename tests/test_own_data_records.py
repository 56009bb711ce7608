"""A user's own data, fourth pass (issue 61): LLaVA / ShareGPT records keep their media, ``<image>`` / ``<video>``
placeholders leave the prompt, a video given as its frame files is refused in one line, CSV files load, a one-frame
video is told in mmrl's words while training, several acceptable answers, and a split's own folder resolves media
as its ``DatasetDict`` folder does. Real files throughout: PNGs, MP4s from :func:`video.writer.write_mp4`, a CSV
file, a ``datasets.save_to_disk`` folder; through the loader and ``mmrl data validate``."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from data_pipelines.loaders import load_samples, write_jsonl
from mmrl.cli import main as cli_main
from mmrl_common.errors import DataError, MediaError


def _validate(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str]:
    code = cli_main(["data", "validate", *map(str, args), "--no-progress"])
    out = capsys.readouterr()
    return code, out.out + out.err


def _png(path: Path, value: int = 90) -> Path:
    Image.fromarray(np.full((32, 32, 3), value, np.uint8)).save(path)
    return path


def _mp4(path: Path, frames: int = 8) -> Path:
    from video.writer import write_mp4

    rng = np.random.default_rng(frames)
    return write_mp4(path, rng.integers(0, 256, (frames, 32, 32, 3), dtype=np.uint8), fps=4)


@pytest.fixture
def media(tmp_path: Path) -> Path:
    _png(tmp_path / "x.png")
    _mp4(tmp_path / "clip.mp4")
    return tmp_path


# ------------------------------------------------------------------ item 1: LLaVA / ShareGPT records keep media
SHAREGPT = [
    {"id": "s1", "video": "clip.mp4",
     "conversations": [{"from": "human", "value": "<video>\nWhat happens in the clip?"},
                       {"from": "gpt", "value": "a ball falls"}]},
    {"id": "s2", "image": "x.png",
     "conversations": [{"from": "human", "value": "<image>\nWhat colour is the square?\nA. red\nB. grey"},
                       {"from": "gpt", "value": "B"}]},
    {"id": "s3", "images": ["x.png"],
     "conversations": [{"role": "system", "content": "Answer briefly."},
                       {"role": "user", "content": "<image>How many squares?"},
                       {"role": "assistant", "content": "<answer>1</answer>"}]},
]


def test_sharegpt_records_import_with_their_media_and_no_placeholder(media: Path, capsys):
    (media / "sg.json").write_text(json.dumps(SHAREGPT))
    res = load_samples(media / "sg.json", check_media="decode")
    assert res.record_format == "sharegpt"
    clip, colour, count = res.samples
    assert [(m.type, Path(m.path)) for m in clip.media] == [("video", media / "clip.mp4")]
    assert (clip.problem_type, clip.question, clip.answer) == ("open", "What happens in the clip?", "a ball falls")
    assert [(m.type, Path(m.path)) for m in colour.media] == [("image", media / "x.png")]
    assert (colour.problem_type, colour.question, colour.options, colour.answer) == \
        ("multiple_choice", "What colour is the square?", ["red", "grey"], "B")
    assert (count.problem_type, count.question, count.answer, len(count.media)) == \
        ("numeric", "How many squares?", "1", 1)
    assert all("<" not in s.question for s in res.samples)
    code, out = _validate(capsys, media / "sg.json")
    assert code == 0 and "3 good" in out and "2 media files checked" in out, out


def test_native_record_with_a_top_level_video_or_image_key_keeps_it(media: Path, capsys):
    rows = [{"id": "n1", "problem_type": "open", "question": "<video>\nWhat happens?", "answer": "x",
             "video": "clip.mp4"},
            {"id": "n2", "problem_type": "open", "question": "What is it? <image>", "answer": "x", "image": "x.png",
             "media": []}]
    write_jsonl(media / "top.jsonl", rows)
    res = load_samples(media / "top.jsonl")
    assert [[(m.type, Path(m.path)) for m in s.media] for s in res.samples] == \
        [[("video", media / "clip.mp4")], [("image", media / "x.png")]]
    assert [s.question for s in res.samples] == ["What happens?", "What is it?"]
    assert "video" not in res.samples[0].meta and "image" not in res.samples[1].meta
    code, out = _validate(capsys, media / "top.jsonl")
    assert code == 0 and "2 media files checked" in out, out


def test_a_datasets_image_column_of_embedded_bytes_joins_the_media(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    import datasets

    monkeypatch.setenv("MMRL_CACHE", str(tmp_path / "cache"))
    png = _png(tmp_path / "x.png").read_bytes()
    rows = [{"id": "b1", "problem_type": "open", "question": "<image>\nWhat is it?", "answer": "a square",
             "image": {"bytes": png, "path": None}}]
    ds = datasets.Dataset.from_list(rows).cast_column("image", datasets.Image(decode=False))
    ds.to_parquet(str(tmp_path / "b.parquet"))
    (sample,) = load_samples(tmp_path / "b.parquet", check_media="decode").samples
    assert sample.question == "What is it?" and [m.type for m in sample.media] == ["image"]
    assert Path(sample.media[0].path).read_bytes() == png and "image" not in sample.meta


def test_a_placeholder_left_in_a_native_question_leaves_the_prompt(media: Path):
    row = {"id": "p1", "problem_type": "open", "question": "<video>\nWhat happens?", "answer": "x",
           "media": [{"type": "video", "path": "clip.mp4"}]}
    write_jsonl(media / "p.jsonl", [row])
    (sample,) = load_samples(media / "p.jsonl").samples
    assert sample.question == "What happens?" and len(sample.media) == 1


def test_records_that_cannot_be_imported_are_refused_by_name(media: Path, capsys):
    rows = [
        {"id": "multi", "image": "x.png", "conversations": [
            {"from": "human", "value": "<image>What is it?"}, {"from": "gpt", "value": "a square"},
            {"from": "human", "value": "And its colour?"}, {"from": "gpt", "value": "grey"}]},
        {"id": "nofile", "conversations": [{"from": "human", "value": "<video>\nWhat happens?"},
                                          {"from": "gpt", "value": "a ball falls"}]},
    ]
    write_jsonl(media / "bad.jsonl", rows)
    code, out = _validate(capsys, media / "bad.jsonl")
    lines = [line for line in out.splitlines() if line.startswith(str(media / "bad.jsonl"))]
    assert code == 1 and len(lines) == 2, out
    assert "bad.jsonl:1: sample 'multi': cannot import sharegpt record" in lines[0]
    assert "2 human and 2 gpt turns" in lines[0] and "one record per question" in lines[0]
    assert "bad.jsonl:2: sample 'nofile'" in lines[1] and "<video> placeholder" in lines[1] \
        and '"video": "FILE"' in lines[1]
    # a native record with a media list and a top-level key naming another file: which is meant is unclear
    other = {"id": "both", "problem_type": "open", "question": "Q?", "answer": "x", "video": "clip.mp4",
             "media": [{"type": "image", "path": "x.png"}]}
    write_jsonl(media / "both.jsonl", [other])
    with pytest.raises(DataError, match=r"both.jsonl:1: sample 'both': .*top-level 'video' key naming 'clip.mp4'"):
        load_samples(media / "both.jsonl")


# ------------------------------------------------------------------ item 2: a video as a list of frame files
def test_a_video_given_as_frame_files_is_refused_in_one_line_naming_the_record(media: Path, capsys):
    frames = [str(_png(media / f"f{i}.png", 40 * i).name) for i in range(3)]
    rows = [{"id": "v1", "problem_type": "open", "question": "What?", "answer": "x",
             "media": [{"type": "video", "path": frames}]},
            {"id": "v2", "problem_type": "open", "question": "What?", "answer": "x", "media": [{"video": frames}]},
            {"id": "v3", "problem_type": "open", "question": "What?", "answer": "x", "video": frames}]
    write_jsonl(media / "frames.jsonl", rows)
    code, out = _validate(capsys, media / "frames.jsonl")
    lines = [line for line in out.splitlines() if line.startswith(str(media / "frames.jsonl"))]
    assert code == 1 and len(lines) == 3, out
    for n, line in enumerate(lines, start=1):
        assert f"frames.jsonl:{n}: sample 'v{n}': media[0]: a list of 3 files ('f0.png', 'f1.png', ...)" in line
        assert "join the frames into one video file" in line and "not found" not in line


# ------------------------------------------------------------------ item 3: CSV files
def test_a_csv_file_loads_with_column_mapping_and_names_its_lines(media: Path, capsys):
    csv_text = ("qid,problem_type,query,options,answer,video,level\n"
                'c1,open,"<video>\nWhat happens, then?",,a ball falls,clip.mp4,easy\n'
                'c2,multiple_choice,Which colour?,"[""red"", ""grey""]",B,,hard\n'
                "c3,numeric,How many?,,3,,easy\n"
                "c4,yes_no,Is it round?,,maybe,,easy\n")
    (media / "d.csv").write_text(csv_text, encoding="utf-8")
    columns = {"qid": "id", "query": "question", "level": "meta.difficulty"}
    res = load_samples(media / "d.csv", columns=columns, on_bad_sample="skip")
    assert (res.file_format, res.total, res.skipped) == ("csv", 4, 1)
    c1, c2, c3 = res.samples
    assert (c1.id, c1.question, c1.answer, c1.meta["difficulty"]) == ("c1", "What happens, then?", "a ball falls", "easy")
    assert [(m.type, Path(m.path)) for m in c1.media] == [("video", media / "clip.mp4")]
    assert (c2.options, c2.answer, c2.media) == (["red", "grey"], "B", [])
    assert (c3.problem_type, c3.answer) == ("numeric", "3")
    assert str(res.problems[0]).startswith(f"{media / 'd.csv'}:6: sample 'c4': yes_no answer")  # FILE:LINE
    assert load_samples(media / "d.csv", fmt="csv", columns=columns, on_bad_sample="skip").total == 4
    code, out = _validate(capsys, media / "d.csv", "--columns", "{qid: id, query: question}")
    assert code == 1 and "d.csv:6: sample 'c4'" in out and "4 records (native records, csv file)" in out, out


# ------------------------------------------------------------------ item 4: a one-frame video while training
def test_a_one_frame_video_is_told_in_mmrls_words_when_its_frames_are_sampled(tmp_path: Path):
    from mmrl.config import load_run_config
    from mmrl.engine.media import MediaPreparer

    one = _mp4(tmp_path / "one.mp4", frames=1)
    write_jsonl(tmp_path / "one.jsonl", [{"id": "o1", "problem_type": "open", "question": "What?", "answer": "x",
                                          "media": [{"type": "video", "path": "one.mp4"}]}])
    (sample,) = load_samples(tmp_path / "one.jsonl").samples
    cfg = load_run_config("video-qa", overrides=["data.check_media=none"])
    with pytest.raises(MediaError) as caught:
        MediaPreparer(cfg.data.media).prepare(sample)
    said = str(caught.value)
    assert str(one) in said and "the video has 1 frame" in said and "give it as an image" in said, said
    assert "nframes should in interval" not in said


# ------------------------------------------------------------------ item 5: several acceptable answers
def test_a_list_of_acceptable_answers_loads_and_scores_any_of_them(tmp_path: Path):
    from rewards.accuracy import score_answer

    rows = [{"id": "a1", "problem_type": "open", "question": "What animal?", "answer": ["cat", "kitten"]},
            {"id": "a2", "problem_type": "open", "question": "What animal?", "answer": ["cat", ""]},
            {"id": "a3", "problem_type": "numeric", "question": "How many?", "answer": [3, 4]}]
    write_jsonl(tmp_path / "a.jsonl", rows)
    res = load_samples(tmp_path / "a.jsonl", on_bad_sample="skip")
    (good,) = res.samples
    assert good.answer == ["cat", "kitten"] and good.answer_text() == "cat"
    row = good.to_dict()
    assert score_answer("kitten", row) == 1.0 and score_answer("cat", row) == 1.0 and score_answer("dog", row) == 0.0
    reasons = [str(p) for p in res.problems]
    assert len(reasons) == 2 and "a.jsonl:2: sample 'a2': open answer list must hold one or more non-empty texts" \
        in reasons[0] and "a.jsonl:3: sample 'a3': numeric answer must be a finite number" in reasons[1], reasons


# ------------------------------------------------------------------ item 6: a split's own folder
def test_a_splits_own_folder_resolves_media_as_its_datasetdict_folder_does(tmp_path: Path, capsys):
    import datasets

    from mmrl.config import load_run_config
    from mmrl.run import load_split

    def rows(split: str) -> list[dict]:
        return [{"id": f"{split}1", "problem_type": "open", "question": "What?", "answer": "x",
                 "media": [{"type": "image", "path": "img/x.png"}]}]

    dd = tmp_path / "my_dd"
    datasets.DatasetDict({s: datasets.Dataset.from_list(rows(s)) for s in ("train", "test")}).save_to_disk(str(dd))
    (dd / "img").mkdir()
    _png(dd / "img" / "x.png")
    want = dd / "img" / "x.png"
    for name in (dd, f"{dd}:train", dd / "train"):  # one split, named three ways: one meaning
        (sample,) = load_samples(name, role="train").samples
        assert Path(sample.media[0].path) == want, name
        code, out = _validate(capsys, name)
        assert code == 0, out
    # mmrl train's loader (mmrl.run.load_split): the split folders as data.train and data.test
    cfg = load_run_config("video-qa", overrides=[f"data.train={dd / 'train'}", f"data.test={dd / 'test'}",
                                                 "data.check_media=exists"])
    for split in ("train", "test"):
        samples, info = load_split(cfg, split, show_progress=False)
        assert [(s.id, Path(m.path)) for s in samples for m in s.media] == [(f"{split}1", want)], info
