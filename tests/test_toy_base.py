"""The toy base model's pre-training split and build: descriptions on media of their own, sharing no
question, option list, answer or media file with the RL and test splits; a (very short) build gives an
ordinary model folder that a run can start from."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from data_pipelines.toy import make_toy
from data_pipelines.toy.pretrain import DESCRIPTIONS, check_disjoint, make_pretrain


def records(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()]


@pytest.mark.slow
def test_pretraining_split_shares_nothing_with_the_rl_and_test_splits(tmp_path: Path) -> None:
    tasks = list(DESCRIPTIONS)
    toy = make_toy(tmp_path / "toy", 0, size={"train": 8, "val": 2, "test": 8}, tasks=tasks, progress=False)
    pre = records(make_pretrain(tmp_path / "toy", 1, tasks=tasks, per_task=8, progress=False))
    rl = [r for split in ("train", "val", "test") for r in records(toy / f"{split}.jsonl")]
    assert {r["meta"]["task"] for r in pre} == set(tasks)
    assert all(r["options"] is None and r["problem_type"] == "open" for r in pre)
    assert check_disjoint(pre, rl) == []
    # the answers name what is seen (a colour, a count, a direction), never an option letter
    assert not {r["answer"] for r in pre} & set("ABCDE")
    # and the check does find a planted overlap
    planted = [dict(pre[0], question=rl[0]["question"])]
    assert check_disjoint(planted, rl) and "question shared" in check_disjoint(planted, rl)[0]


def test_pretraining_describes_what_the_media_show(tmp_path: Path) -> None:
    pre = records(make_pretrain(tmp_path, 3, tasks=["count", "motion", "order"], per_task=4, progress=False))
    by_task = {}
    for r in pre:
        by_task.setdefault(r["meta"]["task"], []).append(r["answer"])
    assert set(by_task["count"]) <= {"1", "2", "3", "4"}
    assert set(by_task["motion"]) <= {"left", "right", "up", "down"}
    assert set(by_task["order"]) <= {"red", "green", "blue", "yellow"}
    assert all((tmp_path / r["media"][0]["path"]).stat().st_size > 0 for r in pre)


def test_toy_base_build_is_a_model_folder_a_run_starts_from(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from mmrl.model import load_policy
    from mmrl.toy.base import INFO_FILE, BaseRecipe, base_dir, ensure_toy_base

    monkeypatch.setenv("MMRL_CACHE", str(tmp_path / "cache"))
    recipe = BaseRecipe(tasks=("color",), per_task=4, steps=3, batch_size=4)
    path = ensure_toy_base(recipe, progress=False)
    assert path == base_dir(recipe)
    info = json.loads((path / INFO_FILE).read_text())
    assert info["descriptions"] == 8 and info["recipe"]["steps"] == 3
    assert ensure_toy_base(recipe, progress=False) == path  # cached
    assert load_policy(path, device="cpu").family == "qwen2_5_vl"
    assert not list(path.parent.glob(".*tmp*"))  # built atomically, nothing left behind


def test_processes_that_need_the_base_at_once_build_it_once(tmp_path: Path,
                                                              monkeypatch: pytest.MonkeyPatch) -> None:
    """Two callers at the same moment (the runs of a parallel compare): one builds, the other waits for it."""
    import threading
    from concurrent.futures import ThreadPoolExecutor

    from mmrl.toy import base as toy_base

    monkeypatch.setenv("MMRL_CACHE", str(tmp_path / "cache"))
    recipe = toy_base.BaseRecipe(tasks=("color",), per_task=4, steps=3, batch_size=4)
    builds, real = [], toy_base.make_toy_base
    monkeypatch.setattr(toy_base, "make_toy_base", lambda *a, **k: (builds.append(1), real(*a, **k))[1])
    start = threading.Barrier(2)

    def need() -> Path:
        start.wait()
        return toy_base.ensure_toy_base(recipe, progress=False)

    with ThreadPoolExecutor(2) as pool:
        paths = list(pool.map(lambda _: need(), range(2)))
    assert paths[0] == paths[1] == toy_base.base_dir(recipe)
    assert len(builds) == 1
    assert (paths[0] / toy_base.INFO_FILE).is_file()


def test_the_demo_starts_from_the_base_shipped_with_mmrl_on_every_machine(tmp_path: Path,
                                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    """`make demo` builds no base: every machine starts from the same weights (issue 49: a build differs with the
    CPU), ahead of an earlier cached build of the same recipe."""
    from mmrl.config import load_run_config
    from mmrl.run import resolve_model
    from mmrl.toy import base as toy_base

    monkeypatch.setenv("MMRL_CACHE", str(tmp_path / "cache"))
    cfg = load_run_config("video-qa")
    recipe = toy_base.BaseRecipe(family=cfg.model.tiny_family, seed=cfg.model.tiny_seed,
                                 world=tuple(cfg.data.toy_world.items()), **cfg.model.toy_base)
    built = toy_base.base_dir(recipe)  # an earlier build of the same recipe on this machine
    built.mkdir(parents=True)
    (built / toy_base.INFO_FILE).write_text("{}")

    def no_build(*_a: object, **_k: object) -> None:
        raise AssertionError("the demo's base was built, not taken from mmrl/assets")

    monkeypatch.setattr(toy_base, "make_toy_base", no_build)
    path = resolve_model(cfg)
    assert path.parent == toy_base.SHIPPED and path != built
    info = json.loads((path / toy_base.INFO_FILE).read_text())
    assert info["key"] == toy_base.base_key(recipe) and info["recipe"]["steps"] == cfg.model.toy_base["steps"]
    from safetensors import safe_open

    with safe_open(path / "model.safetensors", "pt") as weights:
        assert sum(weights.get_tensor(k).numel() for k in weights.keys()) == info["parameters"]  # noqa: SIM118 (safe_open has keys(), no __iter__)


@pytest.mark.slow
def test_half_of_the_requests_list_the_words_to_pick_from(tmp_path: Path) -> None:
    from data_pipelines.toy.pretrain import VOCABULARIES

    pre = records(make_pretrain(tmp_path, 5, tasks=["color", "shape", "count", "motion", "scan"], per_task=24,
                                progress=False))
    listed = [r for r in pre if "Pick one of:" in r["question"]]
    worded = [r for r in pre if r["meta"]["task"] != "scan"]
    assert 0.3 < len(listed) / len(worded) < 0.7
    for r in listed:
        words = r["question"].split("Pick one of: ", 1)[1].rstrip(".").split(", ")
        vocabulary = next(v for v in VOCABULARIES if r["answer"] in v)
        assert sorted(words) == sorted(vocabulary), r  # the answer's own word set, every word once
    assert len({r["question"] for r in listed}) > len(listed) // 2  # the order varies between records
    assert not any("Pick one of" in r["question"] for r in pre if r["meta"]["task"] == "scan")


@pytest.mark.slow
def test_letter_share_poses_word_list_requests_as_lettered_options(tmp_path: Path) -> None:
    tasks = ["color", "shape", "count", "scan"]
    toy = make_toy(tmp_path / "toy", 0, size={"train": 8, "val": 2, "test": 8}, tasks=tasks, progress=False)
    rl = [r for split in ("train", "val", "test") for r in records(toy / f"{split}.jsonl")]
    plain = records(make_pretrain(tmp_path / "a", 1, tasks=tasks, per_task=12, progress=False))
    same = records(make_pretrain(tmp_path / "b", 1, tasks=tasks, per_task=12, letter_share=0.0, progress=False))
    assert plain == same  # 0 draws nothing extra: the default split is unchanged
    pre = records(make_pretrain(tmp_path / "c", 1, tasks=tasks, per_task=12, letter_share=0.5, progress=False))
    mc = [r for r in pre if r["problem_type"] == "multiple_choice"]
    assert 0 < len(mc) < len(pre)
    assert not any(r["meta"]["task"] == "scan" for r in mc)  # a free-text finding has no word list
    # same media and the same facts as the open records of the default split, only posed with letters
    by_id = {r["id"]: r for r in plain}
    for r in mc:
        fact = by_id[r["id"]]["answer"]
        assert r["options"][ord(r["answer"]) - ord("A")] == fact
        assert sorted(r["options"]) == sorted(set(r["options"])) and fact in r["options"]
    rl_lists = {tuple(r["options"]) for r in rl if r.get("options")}
    assert not {tuple(r["options"]) for r in mc} & rl_lists  # never an RL split's option order
    assert check_disjoint(pre, rl) == []  # letters may be answers elsewhere; option lists and media may not


def test_toy_base_overrides_key_and_validation() -> None:
    from mmrl.config import ModelConfig
    from mmrl.toy.base import BaseRecipe, base_key
    from mmrl_common.errors import ConfigError

    assert base_key(BaseRecipe(letter_share=0.0)) == base_key(BaseRecipe())
    assert base_key(BaseRecipe(letter_share=0.5)) != base_key(BaseRecipe())
    assert ModelConfig(init="toy_base", toy_base={"letter_share": 0.5}).toy_base == {"letter_share": 0.5}
    with pytest.raises(ConfigError, match="model.toy_base.leter_share: not a setting.*letter_share"):
        ModelConfig(toy_base={"leter_share": 0.5})
    with pytest.raises(ConfigError, match="^model.toy_base.letter_share=1.5: a share, in \\[0, 1\\]"):
        ModelConfig(toy_base={"letter_share": 1.5})
    import argparse

    from mmrl.toy.base import _cmd_make_toy_base

    args = argparse.Namespace(family="qwen2_5_vl", seed=0, letter_share=2.0, out="unused", quiet=True)
    with pytest.raises(ConfigError, match="^--letter-share=2.0: a share"):  # the CLI names its flag
        _cmd_make_toy_base(args)
    for flag, value, msg in (("pointer_steps", -1, "^--pointer-steps=-1: a whole number, 0 or more"),
                             ("steps", 0, "^--steps=0: a whole number, 1 or more"),
                             ("tasks", "scan,scna", "^--tasks: no pre-training descriptions for scna")):
        bad = argparse.Namespace(family="qwen2_5_vl", seed=0, letter_share=0.0, out="unused", quiet=True,
                                 **{flag: value})
        with pytest.raises(ConfigError, match=msg):
            _cmd_make_toy_base(bad)

    # the pointer phase: off by default (the default base keeps its key), its own base when on
    assert base_key(BaseRecipe(pointer_steps=0)) == base_key(BaseRecipe())
    assert base_key(BaseRecipe(pointer_steps=6000)) != base_key(BaseRecipe())
    with pytest.raises(ConfigError, match="^model.toy_base.pointer_steps=2.5: a whole number, 0 or more"):
        ModelConfig(toy_base={"pointer_steps": 2.5})
    with pytest.raises(ConfigError, match="^model.toy_base.per_task=0: a whole number, 1 or more"):
        ModelConfig(toy_base={"per_task": 0})
    with pytest.raises(ConfigError, match="^model.toy_base.tasks: no pre-training descriptions for scna"):
        ModelConfig(toy_base={"tasks": ["scan", "scna"]})
    with pytest.raises(ConfigError, match="^model.toy_base.tasks='scan': a non-empty list"):
        ModelConfig(toy_base={"tasks": "scan"})


def test_pointer_drill_names_the_option_whose_letter_answers() -> None:
    from data_pipelines.schema import Sample, option_letter
    from data_pipelines.toy.pretrain import VOCABULARIES, pointer_drill

    drill = pointer_drill(400, seed=3)
    assert drill == pointer_drill(400, seed=3) and drill != pointer_drill(400, seed=4)
    letters = set()
    for r in drill:
        sample = Sample.from_dict(r)  # a valid record, text only
        assert sample.media == [] and sample.problem_type == "multiple_choice"
        opts = r["options"]
        assert 3 <= len(opts) <= 4 and len(set(opts)) == len(opts)
        assert any(set(opts) <= set(v) for v in VOCABULARIES)  # one word set per request
        named = [o for o in opts if f" {o}" in r["question"]]
        assert named == [opts["ABCD".index(r["answer"])]]  # the question names exactly the answer's option
        letters.add(r["answer"])
        assert r["answer"] == option_letter(opts.index(named[0]))
    assert letters == set("ABCD")
    # never an RL split's option order (the full word set in its own order)
    assert not any(tuple(r["options"]) in VOCABULARIES for r in drill)


def test_pointer_phase_runs_before_the_pretraining(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from mmrl.toy.base import INFO_FILE, BaseRecipe, make_toy_base

    recipe = BaseRecipe(tasks=("color",), per_task=4, steps=2, batch_size=4, pointer_steps=2, size={"layers": 1})
    out = make_toy_base(tmp_path / "base", recipe, progress=True)
    said = capsys.readouterr().out
    assert said.index("pointer phase, 2 steps") < said.index("pre-training on")
    info = json.loads((out / INFO_FILE).read_text())
    assert info["recipe"]["pointer_steps"] == 2 and "pointer phase" in info["trained_on"]


def test_toy_base_of_another_size_is_its_own_base(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from mmrl.config import ModelConfig
    from mmrl.model import load_policy
    from mmrl.run import resolve_model
    from mmrl.toy.base import INFO_FILE, BaseRecipe, base_key
    from mmrl_common.errors import ConfigError

    assert base_key(BaseRecipe(size=())) == base_key(BaseRecipe())  # the default base keeps its key
    assert BaseRecipe(size={"layers": 2, "rope_theta": 0}) == BaseRecipe()  # explicit defaults: the same base
    assert BaseRecipe(size={"layers": 4, "hidden_size": 256}) == BaseRecipe(size=(("hidden_size", 256), ("layers", 4)))
    assert base_key(BaseRecipe(size={"layers": 4})) not in (base_key(BaseRecipe()), base_key(BaseRecipe(size={"layers": 3})))
    with pytest.raises(ConfigError, match="unknown tiny-model size option.*'layer'"):
        BaseRecipe(size={"layer": 4})
    with pytest.raises(ConfigError, match="^model.tiny_size: hidden_size 130 is not divisible by heads 4"):
        ModelConfig(init="toy_base", tiny_size={"hidden_size": 130})
    with pytest.raises(ConfigError, match="model.toy_base.size: not a setting.*model.tiny_size"):
        ModelConfig(init="toy_base", toy_base={"size": {"layers": 4}})

    # a run's model.tiny_size reaches the toy base it builds
    monkeypatch.setenv("MMRL_CACHE", str(tmp_path / "cache"))
    from mmrl.config import RunConfig

    cfg = RunConfig()
    cfg.model.init, cfg.model.tiny_size = "toy_base", {"layers": 1, "hidden_size": 64}
    cfg.model.toy_base = {"tasks": ("color",), "per_task": 4, "steps": 2, "batch_size": 4}
    path = resolve_model(cfg)
    info = json.loads((path / INFO_FILE).read_text())
    assert info["recipe"]["size"] == {"hidden_size": 64, "layers": 1}
    model = load_policy(path, device="cpu").model
    text = model.config.text_config
    assert (text.num_hidden_layers, text.hidden_size) == (1, 64)
    assert info["parameters"] == sum(p.numel() for p in model.parameters())


def test_make_toy_base_takes_the_size_options(capsys: pytest.CaptureFixture[str]) -> None:
    import argparse

    from mmrl.toy.base import add_models_parser
    from mmrl.toy.tiny_models import size_options

    sub = argparse.ArgumentParser().add_subparsers()
    add_models_parser(sub)
    parser = sub.choices["models"]
    args = parser.parse_args(["make-toy-base", "--layers", "4", "--hidden-size", "256"])
    assert size_options(args) == {"layers": 4, "hidden_size": 256}
    with pytest.raises(SystemExit):
        parser.parse_args(["make-toy-base", "--help"])
    assert "--vision-depth" in capsys.readouterr().out
