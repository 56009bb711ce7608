"""``mmrl train --model DIR``: a user's own model starts from the real-model preset, not the toy recipe's values,
and from the settings the folder was trained with (its mmrl_eval.json), under everything the user sets."""

import json
from pathlib import Path

import pytest
from tiny_runs import as_7b, own_model

from mmrl.cli import build_parser
from mmrl.cli.commands import _say_changes
from mmrl.config.io import load_yaml
from mmrl.run.recipe import REAL_MODEL_PARAMS, config_from_args, estimated_params, own_model_base


@pytest.fixture()
def tiny(tmp_path) -> Path:
    return own_model(tmp_path / "tiny")


def _cfg(*argv: str):
    args = build_parser().parse_args(["train", *argv])
    base = own_model_base(args)
    return args, base, config_from_args(args, base=base)


def test_a_real_model_starts_from_the_preset_and_says_what_changed(tiny, capsys) -> None:
    big = as_7b(tiny)
    assert estimated_params(big) > REAL_MODEL_PARAMS
    preset = load_yaml(Path(__file__).resolve().parent.parent / "configs" / "presets" / "real-model.yaml")
    args, base, cfg = _cfg("--model", str(big))
    assert cfg.train.lr == preset["train"]["lr"] == 1e-6 and cfg.model.dtype == "bf16"
    assert cfg.prompt.answer_format == "think_answer" and cfg.rollout.max_new_tokens >= 512
    assert cfg.data.media.max_frames == preset["data"]["media"]["max_frames"] >= 16
    assert next(s for s in cfg.rewards if s.name == "format").kwargs["mode"] == "think_answer"
    _say_changes(args, cfg, base)
    said = capsys.readouterr().out
    assert "train.lr=1e-06" in said and "prompt.answer_format=think_answer" in said
    # the user's override wins over the preset; --recipe-settings keeps the recipe
    _, _, cfg = _cfg("--model", str(big), "train.lr=5e-7")
    assert cfg.train.lr == 5e-7
    _, base, cfg = _cfg("--model", str(big), "--recipe-settings")
    assert base is None and cfg.train.lr == _cfg()[2].train.lr


def test_a_tiny_model_keeps_the_recipe_but_takes_its_own_training_settings(tiny) -> None:
    _, base, cfg = _cfg("--model", str(tiny))
    assert base is None and cfg.train.lr == _cfg()[2].train.lr  # a tiny model: the toy recipe suits it
    (tiny / "mmrl_eval.json").write_text(json.dumps({"prompt": {"answer_format": "think_answer"},
                                                     "data": {"media": {"max_frames": 6}}}))
    _, base, cfg = _cfg("--model", str(tiny))
    assert cfg.prompt.answer_format == "think_answer" and cfg.data.media.max_frames == 6
    _, _, cfg = _cfg("--model", str(tiny), "data.media.max_frames=5")
    assert cfg.data.media.max_frames == 5


def test_a_paper_recipe_without_its_model_says_how_to_run_it(capsys) -> None:
    from mmrl.cli import main

    assert main(["train", "--task", "earl", "--quiet"]) == 2
    err = capsys.readouterr().err
    assert "configs/earl.yaml is the paper's recipe" in err and "--model DIR" in err
    assert "mmrl compare configs/compare/earl.yaml" in err
    assert main(["train", "--task", "earl", "--quiet", "--model", "/no/such/folder"]) == 2
    assert "paper's recipe" not in capsys.readouterr().err  # the user's own path: no recipe hint


@pytest.mark.parametrize("family,sizes", [
    ("qwen3_5", {"hidden_size": 4096, "num_hidden_layers": 32, "intermediate_size": 12288, "vocab_size": 248320}),
    # Qwen3.5-35B-A3B's config.json has no dense intermediate_size: the estimate's default fills it
    ("qwen3_5_moe", {"hidden_size": 2048, "num_hidden_layers": 40, "vocab_size": 248320}),
])
def test_a_qwen3_5_folder_resolves_the_settings_of_a_qwen2_5_vl_one(tmp_path, family: str, sizes: dict) -> None:
    """The sources are silent on Qwen3.5: ``--model`` gives its folder (Qwen3.5-9B's and -35B-A3B's text sizes)
    every setting a Qwen2.5-VL-7B folder gets."""
    import shutil

    from mmrl.toy.tiny_models import ensure_tiny

    folder = tmp_path / family
    shutil.copytree(ensure_tiny(family), folder)
    (folder / "mmrl_eval.json").unlink(missing_ok=True)
    cfg = json.loads((folder / "config.json").read_text())
    cfg["text_config"].pop("intermediate_size", None)
    cfg["text_config"].update(sizes)
    (folder / "config.json").write_text(json.dumps(cfg))
    assert estimated_params(folder) > REAL_MODEL_PARAMS
    qwen25 = as_7b(own_model(tmp_path / "qwen2_5_vl"))
    for task in ("video-qa", "image-qa"):
        mine = _cfg("--task", task, "--model", str(folder))[2]
        theirs = _cfg("--task", task, "--model", str(qwen25))[2]
        assert mine.train == theirs.train and mine.rollout == theirs.rollout and mine.grpo == theirs.grpo
        assert mine.prompt == theirs.prompt and mine.data.media == theirs.data.media
        assert mine.model.dtype == theirs.model.dtype == "bf16"
        assert mine.model.attn_implementation == theirs.model.attn_implementation


def test_every_way_of_naming_a_folder_gives_its_settings(tiny, tmp_path, capsys) -> None:
    """``--model DIR``, ``model.path=DIR``, a ``--config`` file with ``model: {path: DIR}`` and a compare arm naming
    ``model.path`` give a 7B-sized folder the same settings (the real-model preset and the folder's own), in
    ``mmrl train``, ``mmrl sft`` and ``mmrl config show`` alike (before, only ``--model`` did: the others got the
    toy recipe's values without a word)."""
    from mmrl.cli import main
    from mmrl.cli.commands import sft_config, train_config
    from mmrl.cli.compare import Arm, arm_argv
    from mmrl.config.io import to_dict

    big = as_7b(tiny)
    (big / "mmrl_eval.json").write_text(json.dumps({"data": {"media": {"max_frames": 24}}}))
    own = tmp_path / "own.yaml"
    own.write_text(f"model:\n  path: {big}\n")
    named = {"--model": ["--model", str(big)], "model.path=": [f"model.path={big}"], "--config": ["--config", str(own)]}
    want = to_dict(_cfg("--model", str(big))[2])
    assert want["train"]["lr"] == 1e-6 and want["model"]["dtype"] == "bf16" and want["data"]["media"]["max_frames"] == 24
    for how, argv in named.items():
        assert to_dict(_cfg(*argv)[2]) == want, how
        assert to_dict(train_config(argv)) == want, how
        args = build_parser().parse_args(["sft", *argv])
        assert to_dict(sft_config(args)).get("train") == to_dict(sft_config(
            build_parser().parse_args(["sft", "--model", str(big)]))).get("train"), how
        capsys.readouterr()
        assert main(["config", "show", *argv]) == 0
        shown = capsys.readouterr().out
        assert "train.lr: 1.0e-06" in shown and "model.dtype: bf16" in shown, how
    arm = Arm("grpo", task="video-qa", overrides=[f"model.path={big}"])
    got = to_dict(train_config(arm_argv(arm, 0)))
    assert got == to_dict(train_config(["--task", "video-qa", "--model", str(big), "train.seed=0"]))
    # --recipe-settings keeps the recipe's values whichever way the folder is named
    assert to_dict(_cfg(f"model.path={big}", "--recipe-settings")[2])["train"]["lr"] == _cfg()[2].train.lr


def test_config_show_sources_names_the_origin_of_every_value(tiny, tmp_path, capsys) -> None:
    """``mmrl config show --sources``: each value's origin, one from each layer (mmrl's default, the recipe, a
    paper's published value, the real-model preset, the folder's mmrl_eval.json, --config, a flag, an override),
    and every key has one."""
    from mmrl.cli import main
    from mmrl.run.recipe import setting_sources

    big = as_7b(tiny)
    (big / "mmrl_eval.json").write_text(json.dumps({"data": {"media": {"max_frames": 24}}}))
    own = tmp_path / "own.yaml"
    own.write_text("rollout:\n  top_k: 5\n")
    argv = ["--task", "ares", "--config", str(own), "--model", str(big), "--data", str(tmp_path / "d.jsonl"),
            "train.seed=7"]
    src = setting_sources(build_parser().parse_args(["config", "show", *argv]))
    want = {
        "model.device": "mmrl's default",
        "rollout.temperature": "published: code: config.yaml rollout.temperature 1.0",  # = the default, still named
        "train.lr": "published: code: config.yaml actor.optim.lr 1e-6",  # the paper's, kept over the preset's
        "model.dtype": "the real-model preset (real-model.yaml)",
        "data.media.max_frames": "the model folder's mmrl_eval.json",
        "rollout.top_k": f"--config {own}",
        "data.train": "a flag (--model, --data, --eval-data, --out)",
        "train.seed": "a KEY=VALUE override",
    }
    assert {k: src.get(k) for k in want} == want
    assert any(v == "recipe ares" for v in src.values())
    capsys.readouterr()
    assert main(["config", "show", "--sources", *argv]) == 0
    lines = [ln for ln in capsys.readouterr().out.splitlines() if ln and not ln.startswith(" ")]
    assert lines and all(ln.endswith("]") and "    [" in ln for ln in lines), [ln for ln in lines if "    [" not in ln][:3]
    assert "train.seed: 7    [a KEY=VALUE override]" in lines


@pytest.mark.parametrize("task", ["acre", "ares", "earl"])
def test_a_recipes_toy_cold_start_does_not_run_in_train_on_a_real_model_but_sft_keeps_its_steps(
        tiny, task: str, capsys) -> None:
    """ACRE's 200-step reasoning cold start (ARES's 600, EARL's 30) is the toy's practice on synthetic traces: under
    ``--model <a real model>`` ``mmrl train`` starts RL at once, says so, and runs one when asked (sft.steps=N);
    ``mmrl sft --model`` of the same folder keeps its own steps."""
    from mmrl.cli.commands import own_model_config

    big = as_7b(tiny)
    toy = _cfg("--task", task)[2]
    assert toy.sft.steps > 0  # the recipe's toy cold start
    args, base, cfg = _cfg("--task", task, "--model", str(big))
    assert cfg.sft.steps == 0
    _say_changes(args, cfg, base)
    assert "sft.steps=0" in capsys.readouterr().out
    assert _cfg("--task", task, "--model", str(big), "sft.steps=7")[2].sft.steps == 7
    sft_args = build_parser().parse_args(["sft", "--task", task, "--model", str(big), "--quiet"])
    assert own_model_config(sft_args, {"sft": {"target": "gold"}}, command="sft").sft.steps == toy.sft.steps
