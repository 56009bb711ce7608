"""The README's data section run as written through ``mmrl train`` and ``mmrl eval`` (issue 61, item 4): every
layout it shows (a JSONL file, a ``datasets`` folder with splits and ``my_dd:test`` or its split's folder
``my_dd/test``, a Hub-style folder with ``my_hub_repo:validation``, a quoted glob of shards) is built here as small
real data, and the README's own command lines run with a tiny model for one step. Before, ``mmrl train`` and
``mmrl eval`` tested ``Path.exists()`` on each data path and refused ``PATH:SPLIT`` and globs ("file not found")
that ``mmrl data validate`` read."""

from __future__ import annotations

import json
import re
import shlex
from pathlib import Path

import pytest
from tiny_runs import module_cache, own_model  # noqa: F401 (a fixture)

from mmrl import cli

README = Path(__file__).resolve().parent.parent / "README.md"

CHEAP = ["model.init=random", "data.media.min_frames=2", "data.media.max_frames=2",
         "data.media.video_min_pixels=3136", "data.media.video_max_pixels=3136", "rollout.max_new_tokens=2",
         "eval.max_new_tokens=2", "train.cpu_threads=1", "train.steps=1", "rollout.group_size=2",
         "train.prompts_per_step=1", "train.save_every=0", "train.log_every=0", "sft.steps=0",
         "eval.limit=2", "prompt.answer_format=answer"]
"""Appended to each README command (a later KEY=VALUE wins): one seconds-long step of a tiny model."""


def _records(prefix: str, n: int) -> list[dict]:
    return [{"id": f"{prefix}{i}", "problem_type": "multiple_choice", "question": f"Which colour is {prefix} {i}?",
             "options": ["red", "green", "blue"], "answer": "ABC"[i % 3], "media": []} for i in range(n)]


def _jsonl(path: Path, records: list[dict]) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps(r) + "\n" for r in records))
    return path


def _parquet(path: Path, records: list[dict]) -> Path:
    import pyarrow as pa
    import pyarrow.parquet as pq

    path.parent.mkdir(parents=True, exist_ok=True)
    pq.write_table(pa.Table.from_pylist([{**r, "media": json.dumps(r["media"])} for r in records]), path)
    return path


def readme_commands(section: str, until: str) -> list[str]:
    """The ``mmrl ...`` lines of the bash blocks of the README between ``section`` and ``until`` (continuation
    lines joined), in order."""
    text = README.read_text().split(section, 1)[1].split(until, 1)[0]
    lines = []
    for block in re.findall(r"```bash\n(.*?)```", text, flags=re.DOTALL):
        for line in block.replace("\\\n", " ").splitlines():
            line = " ".join(line.split("  #", 1)[0].split())
            if line.startswith("mmrl "):
                lines.append(line)
    return lines


@pytest.fixture(scope="module")
def layouts(tmp_path_factory: pytest.TempPathFactory, module_cache: None) -> Path:  # noqa: F811
    """A folder holding the README's data in each layout, and ``DIR``: a user's own (tiny) model folder."""
    from datasets import Dataset, DatasetDict

    root = tmp_path_factory.mktemp("readme")
    own_model(root / "DIR")
    _jsonl(root / "my_train.jsonl", _records("train", 3))
    _jsonl(root / "my_test.jsonl", _records("test", 2))
    DatasetDict({"train": Dataset.from_list(_records("dd-train", 3)),
                 "test": Dataset.from_list(_records("dd-test", 2))}).save_to_disk(str(root / "my_dd"))
    hub = root / "my_hub_repo"
    (hub / "README.md").parent.mkdir()
    (hub / "README.md").write_text("---\nlicense: mit\n---\n# my hub repo\n")
    _parquet(hub / "data" / "train-00000-of-00002.parquet", _records("hub-train-a", 2))
    _parquet(hub / "data" / "train-00001-of-00002.parquet", _records("hub-train-b", 2))
    _parquet(hub / "data" / "validation-00000-of-00001.parquet", _records("hub-val", 2))
    _parquet(root / "shards" / "part-0.parquet", _records("shard-a", 2))
    _parquet(root / "shards" / "part-1.parquet", _records("shard-b", 2))
    return root


def _run(root: Path, line: str, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture) -> str:
    """The README command ``line`` run in ``root`` with ``DIR`` / the 3B path as the tiny model, quiet and cheap;
    its exit status must be 0. Returns what it printed."""
    argv = shlex.split(line.replace("/path/to/Qwen2.5-VL-3B-Instruct", "DIR"))
    assert argv[0] == "mmrl"
    monkeypatch.chdir(root)
    capsys.readouterr()
    rc = cli.main([argv[1], "--quiet", *argv[2:], *CHEAP])
    got = capsys.readouterr()
    assert rc == 0, f"{line}\n{got.err}"
    return got.out


def test_readme_lists_the_layouts_this_test_runs() -> None:
    """The commands below are the README's: when it changes, this test is looked at again."""
    own = readme_commands("## Training your own model", "Every option of the recipe")
    data = readme_commands("Other layouts load as they are", "Check a dataset before a long run")
    assert own[0].startswith("mmrl train --task video-qa --model /path/to/Qwen2.5-VL-3B-Instruct --data "
                             "my_train.jsonl --eval-data my_test.jsonl --out runs/my-run")
    assert own[2] == "mmrl eval --model runs/my-run/final --eval-data my_test.jsonl"
    assert "mmrl train --model DIR --data my_dd --out runs/dd" in data
    assert "mmrl train --model DIR --data my_hub_repo --eval-data my_hub_repo:validation --out runs/hub" in data
    assert "mmrl data validate 'shards/*.parquet'" in data


def test_readme_jsonl_commands_train_and_evaluate(layouts: Path, monkeypatch: pytest.MonkeyPatch,
                                                  capsys: pytest.CaptureFixture) -> None:
    train, _resume, evaluate = readme_commands("## Training your own model", "Every option of the recipe")[:3]
    out = _run(layouts, train, monkeypatch, capsys)
    assert "accuracy before RL" in out and (layouts / "runs/my-run/final/config.json").exists()
    out = _run(layouts, evaluate, monkeypatch, capsys)
    assert "on 2 questions" in out


def test_readme_datasets_folder_trains_on_train_and_evaluates_its_test_split(
        layouts: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture) -> None:
    line = next(c for c in readme_commands("Other layouts load as they are", "Check a dataset")
                if "--data my_dd " in c)
    out = _run(layouts, line, monkeypatch, capsys)
    assert "accuracy before RL" in out
    report = (layouts / "runs/dd/report.md").read_text()
    assert "my_dd" in report
    # the comment's two ways to name its test split: my_dd:test and the split's folder my_dd/test
    for named in ("my_dd:test", "my_dd/test"):
        out = _run(layouts, f"mmrl eval --model runs/dd/final --eval-data {named}", monkeypatch, capsys)
        assert "on 2 questions" in out, named
    out = _run(layouts, "mmrl eval --model DIR --data my_dd", monkeypatch, capsys)  # its own test split
    assert "on 2 questions" in out


def test_readme_hub_repo_with_a_validation_split_trains_and_evaluates(
        layouts: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture) -> None:
    line = next(c for c in readme_commands("Other layouts load as they are", "Check a dataset")
                if "my_hub_repo:validation" in c)
    out = _run(layouts, line, monkeypatch, capsys)
    assert "accuracy before RL" in out
    out = _run(layouts, "mmrl eval --model runs/hub/final --eval-data my_hub_repo:validation", monkeypatch, capsys)
    assert "on 2 questions" in out


def test_readme_quoted_glob_of_shards_trains_and_evaluates(layouts: Path, monkeypatch: pytest.MonkeyPatch,
                                                           capsys: pytest.CaptureFixture) -> None:
    validate = next(c for c in readme_commands("Other layouts load as they are", "Check a dataset")
                    if "shards/" in c)
    glob = shlex.quote(shlex.split(validate)[-1])  # 'shards/*.parquet', quoted as the README quotes it
    out = _run(layouts, f"mmrl train --model DIR --data {glob} --eval-data {glob} --out runs/shards",
               monkeypatch, capsys)
    assert "accuracy before RL" in out
    out = _run(layouts, f"mmrl eval --model runs/shards/final --eval-data {glob}", monkeypatch, capsys)
    assert "on 2 questions" in out


def test_train_and_eval_take_path_split_and_globs_as_validate_does(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The paths' check before anything loads (fast, no model): ``PATH:SPLIT``, a glob that matches, and a
    split's folder pass; a glob that matches nothing and a missing file are still one line naming the path."""
    from datasets import Dataset, DatasetDict

    from mmrl.cli.commands import _check_paths
    from mmrl.config import load_run_config
    from mmrl_common.errors import ConfigError

    DatasetDict({"train": Dataset.from_list(_records("a", 2)),
                 "validation": Dataset.from_list(_records("b", 2))}).save_to_disk(str(tmp_path / "dd"))
    _parquet(tmp_path / "shards" / "p0.parquet", _records("c", 2))
    for given in (f"{tmp_path}/dd:validation", f"{tmp_path}/dd/validation", f"{tmp_path}/shards/*.parquet"):
        _check_paths(load_run_config("video-qa", overrides=[f"data.train={given}", f"data.test={given}"]))
    for missing in (f"{tmp_path}/none/*.parquet", f"{tmp_path}/nothing.jsonl", f"{tmp_path}/nothing:test"):
        with pytest.raises(ConfigError, match=re.escape(f"data.test: file not found: {missing}")):
            _check_paths(load_run_config("video-qa", overrides=[f"data.test={missing}"]))
