"""A user's own data in the formats the README names (issue 47, items 7, 8, 14, 15, 16): EasyR1 multiple choice
with the options in the problem text, Arrow's null-filled structs, a ``datasets`` folder with splits, an empty
data file, a Hub-layout folder and a glob of shards. Each goes through the loader and the user's own entry
(``mmrl data validate`` or ``mmrl.run.load_split``, which ``mmrl train --data`` calls)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from PIL import Image

from data_pipelines.loaders import dataset_exists, held_out_split, load_samples, write_jsonl
from mmrl.cli import main as cli_main
from mmrl_common.errors import DataError


def _validate(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str]:
    code = cli_main(["data", "validate", *map(str, args), "--no-progress"])
    out = capsys.readouterr()
    return code, out.out + out.err


def _native(sid: str, **kw) -> dict:
    r = {"id": sid, "problem_type": "multiple_choice", "question": f"Colour of {sid}?",
         "options": ["red", "green", "blue"], "answer": "B", "media": [], "meta": {"level": "easy"}}
    r.update(kw)
    return r


def _run_cfg(*overrides: str):
    from mmrl.config import load_run_config

    return load_run_config("video-qa", overrides=["data.check_media=none", *overrides])


# ------------------------------------------------------------------ item 7: EasyR1 multiple choice in the text
EASYR1_MC = [
    {"problem": "<image>What colour is the ball?\nA. red\nB. blue\nC. green", "answer": "B", "images": ["a.png"]},
    {"problem": "<image>Which shape is shown?\nOptions:\n(A) a circle\n(B) a square", "answer": "<answer>(A)</answer>",
     "images": ["a.png"]},
    {"problem": "<image>What is the animal doing?\nA. running\nB. sleeping", "answer": "B. sleeping",
     "images": ["a.png"]},
    {"problem": "<image>What happens in the picture?", "answer": "a ball falls", "images": ["a.png"]},
    {"problem": "<image>Name the plan.\nA. Plan A is short", "answer": "Plan A", "images": ["a.png"]},
]


def test_easyr1_options_in_the_problem_text_import_as_multiple_choice(tmp_path: Path):
    from rewards.accuracy import score_answer

    Image.fromarray(np.full((8, 8, 3), 90, np.uint8)).save(tmp_path / "a.png")
    pq.write_table(pa.Table.from_pylist(EASYR1_MC), tmp_path / "mc.parquet")
    res = load_samples(tmp_path / "mc.parquet")
    assert res.record_format == "easyr1"
    ball, shape, animal, falls, plan = res.samples
    assert (ball.problem_type, ball.question, ball.options, ball.answer) == \
        ("multiple_choice", "What colour is the ball?", ["red", "blue", "green"], "B")
    assert ball.answer_text() == "blue"
    assert (shape.problem_type, shape.question, shape.options, shape.answer) == \
        ("multiple_choice", "Which shape is shown?", ["a circle", "a square"], "A")
    assert (animal.problem_type, animal.options, animal.answer) == ("multiple_choice", ["running", "sleeping"], "B")
    # open questions stay open (one option-like line is no list of options)
    assert (falls.problem_type, falls.options, falls.answer) == ("open", None, "a ball falls")
    assert (plan.problem_type, plan.options, plan.question) == ("open", None, "Name the plan.\nA. Plan A is short")
    # the right option scores 1, by letter or by its text
    row = ball.to_dict()
    assert score_answer("B", row) == 1.0 and score_answer("blue", row) == 1.0 and score_answer("red", row) == 0.0


def test_easyr1_multiple_choice_through_the_training_loader(tmp_path: Path):
    from mmrl.run import load_split

    write_jsonl(tmp_path / "e.jsonl", EASYR1_MC[:2])
    samples, _ = load_split(_run_cfg(f"data.train={tmp_path / 'e.jsonl'}"), "train", show_progress=False)
    assert [(s.problem_type, s.answer, len(s.options)) for s in samples] == \
        [("multiple_choice", "B", 3), ("multiple_choice", "A", 2)]


def test_easyr1_letter_outside_the_options_is_named(tmp_path: Path, capsys: pytest.CaptureFixture[str]):
    write_jsonl(tmp_path / "bad.jsonl", [{"problem": "Pick one.\nA. red\nB. blue", "answer": "D"}])
    code, out = _validate(capsys, tmp_path / "bad.jsonl")
    assert code == 1 and f"{tmp_path / 'bad.jsonl'}:1:" in out and "'D'" in out


# --------------------------------------------------------- item 8: Arrow fills the keys other records have with null
def _video(path: Path) -> Path:
    from video.writer import write_mp4

    return write_mp4(path, np.zeros((8, 32, 32, 3), np.uint8), 4.0)


SAMPLING_ROWS = [
    _native("fps", media=[{"type": "video", "path": "v.mp4", "sampling": {"fps": 2}}]),
    _native("nframes", media=[{"type": "video", "path": "v.mp4", "sampling": {"nframes": 4}}]),
    _native("plain", media=[{"type": "video", "path": "v.mp4"}]),
    _native("qwen", media=[{"video": "v.mp4", "fps": 1}]),
    _native("image", media=[{"image": "a.png"}]),
]


def test_parquet_and_datasets_records_keep_only_the_sampling_keys_they_were_written_with(tmp_path: Path):
    import datasets

    from mmrl.config import MediaConfig
    from mmrl.engine.media import MediaPreparer

    _video(tmp_path / "v.mp4")
    Image.fromarray(np.full((32, 32, 3), 90, np.uint8)).save(tmp_path / "a.png")
    pq.write_table(pa.Table.from_pylist(SAMPLING_ROWS), tmp_path / "s.parquet")
    datasets.Dataset.from_list(SAMPLING_ROWS).save_to_disk(str(tmp_path / "hf"))
    (tmp_path / "hf" / "v.mp4").write_bytes((tmp_path / "v.mp4").read_bytes())
    (tmp_path / "hf" / "a.png").write_bytes((tmp_path / "a.png").read_bytes())
    for name in ("s.parquet", "hf"):
        res = load_samples(tmp_path / name)
        got = {s.id: (s.media[0].type, s.media[0].sampling) for s in res.samples}
        assert got == {"fps": ("video", {"fps": 2}), "nframes": ("video", {"nframes": 4}), "plain": ("video", {}),
                       "qwen": ("video", {"fps": 1}), "image": ("image", {})}, name
        prep = MediaPreparer(MediaConfig())
        for s in res.samples:  # what training does with each drawn record: no NoneType arithmetic
            assert prep.prepare(s)


def test_datasets_sequence_of_media_items_reads_as_the_items(tmp_path: Path):
    import datasets

    item = {"type": datasets.Value("string"), "path": datasets.Value("string"),
            "sampling": {"fps": datasets.Value("float32"), "nframes": datasets.Value("int32")}}
    features = datasets.Features({"id": datasets.Value("string"), "problem_type": datasets.Value("string"),
                                  "question": datasets.Value("string"), "answer": datasets.Value("string"),
                                  "media": datasets.Sequence(item)})
    media = {"type": ["video", "image"], "path": ["v.mp4", "a.png"], "sampling": [{"fps": 2.0}, {"nframes": None}]}
    datasets.Dataset.from_dict({"id": ["q"], "problem_type": ["open"], "question": ["What?"], "answer": ["x"],
                                "media": [media]}, features=features).save_to_disk(str(tmp_path / "seq"))
    (sample,) = load_samples(tmp_path / "seq").samples
    assert [(m.type, Path(m.path).name, m.sampling) for m in sample.media] == \
        [("video", "v.mp4", {"fps": 2.0}), ("image", "a.png", {})]


def test_validate_and_train_loader_agree_on_arrow_records(tmp_path: Path, capsys: pytest.CaptureFixture[str]):
    from mmrl.run import load_split

    _video(tmp_path / "v.mp4")
    Image.fromarray(np.full((32, 32, 3), 90, np.uint8)).save(tmp_path / "a.png")
    pq.write_table(pa.Table.from_pylist(SAMPLING_ROWS), tmp_path / "s.parquet")
    code, out = _validate(capsys, tmp_path / "s.parquet")
    assert code == 0 and "5 good, 0 bad" in out
    samples, _ = load_split(_run_cfg(f"data.train={tmp_path / 's.parquet'}"), "train", show_progress=False)
    assert all(None not in m.sampling.values() for s in samples for m in s.media)
    assert [m.path for s in samples for m in s.media][-1] == str(tmp_path / "a.png")


# ------------------------------------------------------------------------ item 14: a datasets folder with splits
@pytest.fixture
def dataset_dict(tmp_path: Path) -> Path:
    import datasets

    out = tmp_path / "dd"
    datasets.DatasetDict({
        "train": datasets.Dataset.from_list([_native("t1"), _native("t2")]),
        "validation": datasets.Dataset.from_list([_native("v1")]),
        "test": datasets.Dataset.from_list([_native("x1", answer="Z"), _native("x2")]),
    }).save_to_disk(str(out))
    return out


def test_datasets_folder_splits_by_name_by_folder_and_by_role(dataset_dict: Path):
    dd = dataset_dict
    assert [s.id for s in load_samples(f"{dd}:validation")] == ["v1"]
    assert [s.id for s in load_samples(dd / "train")] == ["t1", "t2"]
    assert [s.id for s in load_samples(dd, role="train")] == ["t1", "t2"]
    assert load_samples(dd, role="train").split == "train"
    assert [s.id for s in load_samples(dd, role="val")] == ["v1"]
    assert [s.id for s in load_samples(dd, role="test", on_bad_sample="skip")] == ["x2"]
    # what `mmrl train --data dd` evaluates on when no --eval-data is given; what exists for data.<split>
    assert (held_out_split(dd, "test"), held_out_split(f"{dd}:train", "val")) == (f"{dd}:test", f"{dd}:validation")
    # the train split's own folder (the README's fallback) evaluates on its DatasetDict's test split as `dd` does;
    # another split's own folder, or a split named, picks nothing
    assert (held_out_split(dd / "train", "test"), held_out_split(dd / "train", "val")) == (f"{dd}:test",
                                                                                         f"{dd}:validation")
    assert held_out_split(dd / "test", "test") is None and held_out_split(f"{dd}:test", "test") is None
    assert dataset_exists(f"{dd}:test") and dataset_exists(dd / "test") and not dataset_exists(f"{dd}-x:test")
    # a bad record is named at its split's folder
    with pytest.raises(DataError) as exc:
        load_samples(f"{dd}:test")
    assert f"{dd / 'test'}:record 0: sample 'x1'" in str(exc.value)
    # nothing chosen, several splits: the message names options that exist, and never `split=`
    with pytest.raises(DataError) as exc:
        load_samples(dd)
    msg = str(exc.value)
    assert "split=" not in msg and f"{dd}:train" in msg and "train, validation, test" in msg
    with pytest.raises(DataError) as exc:
        load_samples(f"{dd}:dev")
    assert "no split 'dev'" in str(exc.value) and f"{dd}:validation" in str(exc.value)


def test_datasets_folder_splits_from_the_cli(dataset_dict: Path, capsys: pytest.CaptureFixture[str]):
    from mmrl.run import load_split

    dd = dataset_dict
    code, out = _validate(capsys, dd)  # every split, each record named at its split's folder
    assert code == 1 and f"{dd / 'test'}:record 0: sample 'x1'" in out and "5 records" in out
    assert "duplicate" not in out
    code, out = _validate(capsys, f"{dd}:train")
    assert code == 0 and "2 good, 0 bad" in out
    samples, _ = load_split(_run_cfg(f"data.train={dd / 'train'}"), "train", show_progress=False)
    assert [s.id for s in samples] == ["t1", "t2"]


# ----------------------------------------------------------------------------------------- item 15: no records
def test_empty_data_is_an_error_in_every_format(tmp_path: Path, capsys: pytest.CaptureFixture[str]):
    import datasets

    (tmp_path / "zero.json").write_bytes(b"")
    datasets.Dataset.from_dict({"id": []}).save_to_disk(str(tmp_path / "empty_hf"))
    (tmp_path / "shards").mkdir()
    write_jsonl(tmp_path / "shards" / "part-0.jsonl", [])
    write_jsonl(tmp_path / "shards" / "part-1.jsonl", [])
    for name in ("zero.json", "empty_hf", "shards", "shards/*.jsonl"):
        with pytest.raises(DataError, match="has no records"):
            load_samples(tmp_path / name)
        code, out = _validate(capsys, tmp_path / name)
        assert code == 1 and "has no records" in out and "Traceback" not in out, name
        assert "FAILED" in out, name


def test_empty_training_data_is_named_at_load(tmp_path: Path):
    import datasets

    from mmrl.run import load_split

    empty = tmp_path / "empty_hf"
    datasets.Dataset.from_dict({"id": [], "question": []}).save_to_disk(str(empty))
    with pytest.raises(DataError) as exc:
        load_split(_run_cfg(f"data.train={empty}"), "train", show_progress=False)
    assert str(exc.value).startswith(f"{empty} has no records") and "toy_tasks" not in str(exc.value)


# ------------------------------------------------------------------ item 16: a Hub-layout folder, a glob of shards
@pytest.fixture
def hub(tmp_path: Path) -> Path:
    root = tmp_path / "hub"
    (root / "data").mkdir(parents=True)
    (root / "README.md").write_text("---\nlicense: mit\n---\n# my dataset\n")
    (root / ".gitattributes").write_text("*.parquet filter=lfs\n")
    rows = {"train-00000-of-00002": [_native("t1"), _native("t2")], "train-00001-of-00002": [_native("t3", answer="Q")],
            "test-00000-of-00001": [_native("x1")]}
    for name, recs in rows.items():
        pq.write_table(pa.Table.from_pylist(recs), root / "data" / f"{name}.parquet")
    return root


def test_hub_folder_loads_by_split_and_names_the_shard(hub: Path):
    res = load_samples(hub, role="train", on_bad_sample="skip")
    assert [s.id for s in res] == ["t1", "t2"] and res.total == 3 and res.split == "train"
    shard = hub / "data" / "train-00001-of-00002.parquet"
    assert str(res.problems[0]).startswith(f"{shard}:record 0: sample 't3'")
    assert res.locations == [f"{hub / 'data' / 'train-00000-of-00002.parquet'}:record {i}" for i in (0, 1)]
    assert [s.id for s in load_samples(hub, role="test")] == ["x1"]
    assert [s.id for s in load_samples(f"{hub}:test")] == ["x1"]
    assert held_out_split(hub, "val") == f"{hub}:test"  # no validation split: the test split is held out
    with pytest.raises(DataError) as exc:
        load_samples(hub)
    assert f"{hub}:train" in str(exc.value) and "train, test" in str(exc.value)


def test_glob_of_shards_is_one_dataset(tmp_path: Path, capsys: pytest.CaptureFixture[str]):
    shards = tmp_path / "shards"
    for i in range(3):
        write_jsonl(shards / f"part-{i}.jsonl", [_native(f"s{i}a"), _native(f"s{i}b")])
    (shards / "notes.txt").write_text("not data\n")
    assert dataset_exists(shards / "*.jsonl") and not dataset_exists(shards / "*.parquet")
    res = load_samples(shards / "*.jsonl")
    assert [s.id for s in res] == ["s0a", "s0b", "s1a", "s1b", "s2a", "s2b"]
    assert res.locations[2] == f"{shards / 'part-1.jsonl'}:1" and res.lines == 6
    assert [s.id for s in load_samples(shards)] == [s.id for s in res]  # the folder: the same shards
    write_jsonl(shards / "part-3.jsonl", [_native("s0a")])
    code, out = _validate(capsys, shards / "*.jsonl")
    assert code == 1 and f"{shards / 'part-3.jsonl'}:1: sample 's0a': duplicate id (first used at " \
                         f"{shards / 'part-0.jsonl'}:1)" in out
    code, out = _validate(capsys, tmp_path / "none" / "*.parquet")
    assert code == 2 and "no file matches" in out


def test_hub_folder_from_the_cli(hub: Path, capsys: pytest.CaptureFixture[str]):
    code, out = _validate(capsys, hub)
    assert code == 1 and "4 records" in out and f"{hub / 'data' / 'train-00001-of-00002.parquet'}:record 0" in out
    code, out = _validate(capsys, f"{hub}:test")
    assert code == 0 and "1 good, 0 bad" in out
    code, out = _validate(capsys, hub / "data" / "train-*.parquet")
    assert code == 1 and "3 records" in out


# ------------------------------------------------------------------------ README: the data section's commands
def test_readme_data_layouts_validate_as_written(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                 capsys: pytest.CaptureFixture[str]):
    import re
    import shlex

    readme = (Path(__file__).resolve().parent.parent / "README.md").read_text()
    block = re.search(r"Other layouts load as they are.*?```bash\n(.*?)```", readme, flags=re.DOTALL).group(1)
    commands = [shlex.split(line) for line in block.splitlines() if line.startswith("mmrl data validate")]
    assert len(commands) == 2
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("MMRL_CACHE", str(tmp_path / "cache"))
    Image.fromarray(np.full((8, 8, 3), 90, np.uint8)).save(tmp_path / "ball.png")
    (tmp_path / "shards").mkdir()
    for i in range(2):
        pq.write_table(pa.Table.from_pylist([_native(f"s{i}")]), tmp_path / "shards" / f"part-{i}.parquet")
    example = json.loads(re.search(r"# (\{\"problem\".*\})\n", block).group(1))
    pq.write_table(pa.Table.from_pylist([example]), tmp_path / "easyr1_train.parquet")
    for argv in commands:
        code, out = _validate(capsys, *argv[3:])
        assert code == 0 and "0 bad" in out, out
    assert load_samples("easyr1_train.parquet").samples[0].problem_type == "multiple_choice"
