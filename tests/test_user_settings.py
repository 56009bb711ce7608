"""A user's own settings (issue 47): ``mmrl sft --model DIR`` resolves its settings as ``mmrl train`` does (the
real-model preset for a 100M+ model), and every count, size and rate setting has a range that the config refuses
values outside of, in one line naming the key, before anything loads."""

from __future__ import annotations

import dataclasses
import json
import typing
from pathlib import Path
from typing import get_type_hints

import pytest
from tiny_runs import as_7b, module_cache, own_model  # noqa: F401 (module_cache is a fixture)

from mmrl import cli
from mmrl.config.io import load_yaml

PRESET = load_yaml(Path(__file__).resolve().parent.parent / "configs" / "presets" / "real-model.yaml")


@pytest.fixture()
def tiny(tmp_path: Path, module_cache: None) -> Path:  # noqa: F811
    return own_model(tmp_path / "tiny")


# ------------------------------------------------------------------------------ item 1: sft takes the preset

def _assert_preset(settings: dict) -> None:
    """``settings`` (an mmrl_eval.json) hold the preset's prompt, generation length and media budgets."""
    assert settings["prompt"]["answer_format"] == PRESET["prompt"]["answer_format"]
    assert settings["rollout"]["max_new_tokens"] == PRESET["rollout"]["max_new_tokens"]
    for key in ("fps", "max_frames", "video_max_pixels", "image_max_pixels"):
        assert settings["data"]["media"][key] == PRESET["data"]["media"][key], key


def test_sft_on_a_7b_sized_model_takes_the_real_model_preset(tiny: Path, capsys: pytest.CaptureFixture) -> None:
    from mmrl.cli.commands import sft_config
    from mmrl.config.eval_settings import eval_settings

    big = as_7b(tiny)
    cfg = sft_config(cli.build_parser(only="sft").parse_args(["sft", "--model", str(big)]))
    assert cfg.model.dtype == PRESET["model"]["dtype"] and cfg.sft.lr == PRESET["sft"]["lr"]
    assert cfg.sft.target == "gold"
    _assert_preset(eval_settings(cfg))  # what sft writes into final/mmrl_eval.json
    said = capsys.readouterr().out
    assert f"sft: --model {big}: the real-model preset" in said and "model.dtype=bf16" in said
    # the user's override wins; --recipe-settings keeps the recipe's values, as with mmrl train
    cfg = sft_config(cli.build_parser(only="sft").parse_args(["sft", "--model", str(big), "sft.lr=5e-7"]))
    assert cfg.sft.lr == 5e-7
    kept = sft_config(cli.build_parser(only="sft").parse_args(["sft", "--model", str(big), "--recipe-settings"]))
    assert kept.model.dtype == "fp32" and kept.prompt.answer_format != PRESET["prompt"]["answer_format"]


@pytest.mark.slow
def test_sft_writes_the_presets_settings_and_train_takes_them(tiny: Path, tmp_path: Path,
                                                              monkeypatch: pytest.MonkeyPatch,
                                                              capsys: pytest.CaptureFixture) -> None:
    """Through the CLI: the tiny model counted as a real one (the threshold lowered; its weights load), a
    2-step sft whose final/mmrl_eval.json holds the preset's values, which mmrl train --model final then uses."""
    from mmrl.cli import commands
    from mmrl.run import recipe

    monkeypatch.setattr(recipe, "REAL_MODEL_PARAMS", 0)
    cheap = ["data.toy_size={train: 2, val: 1, test: 1}", "data.toy_tasks=[color]", "sft.batch_size=2",
             "train.cpu_threads=1"]
    out = tmp_path / "sft"
    assert cli.main(["sft", "--quiet", "--model", str(tiny), "--steps", "1", "--out", str(out), *cheap]) == 0
    saved = json.loads((out / "final" / "mmrl_eval.json").read_text())
    _assert_preset(saved)
    args = cli.build_parser(only="train").parse_args(["train", "--model", str(out / "final")])
    cfg = commands.config_from_args(args, base=commands.own_model_base(args))
    assert cfg.prompt.answer_format == PRESET["prompt"]["answer_format"]
    assert cfg.data.media.max_frames == PRESET["data"]["media"]["max_frames"]


# ---------------------------------------------------------------- items 3 and 13: every number has a range

def _numeric_keys() -> list[str]:
    """Every key of the run config whose value is a number (int or float, perhaps null), walked from the
    dataclasses themselves (a key added later is covered without editing this test)."""
    from mmrl.config import RunConfig
    from rewards.registry import RewardSpec

    keys: list[str] = []

    def walk(cls: type, prefix: str) -> None:
        hints = get_type_hints(cls)
        for f in dataclasses.fields(cls):
            tp, key = hints[f.name], f"{prefix}.{f.name}" if prefix else f.name
            options = typing.get_args(tp) if typing.get_origin(tp) in (typing.Union, __import__("types").UnionType) \
                else (tp,)
            inner = [o for o in options if dataclasses.is_dataclass(o)]
            if inner:
                walk(inner[0], key)
            elif typing.get_origin(tp) is list and typing.get_args(tp) and typing.get_args(tp)[0] is RewardSpec:
                walk(RewardSpec, key)
            elif any(o in (int, float) for o in options):
                keys.append(key)

    walk(RunConfig, "")
    return keys


def _bad_value(key: str) -> str:
    """A value just outside ``key``'s range (NaN for a key without bounds)."""
    from mmrl.config import RANGES

    rng = RANGES[key]
    if rng.low is not None:
        return str(rng.low if rng.low_open else rng.low - 1)
    if rng.high is not None:
        return str(rng.high if rng.high_open else rng.high + 1)
    return ".nan"


def test_every_numeric_setting_has_a_range() -> None:
    from mmrl.config import RANGES

    keys = _numeric_keys()
    assert "train.prompts_per_step" in keys and "eval.batch_size" in keys and "rewards.weight" in keys
    assert sorted(set(keys) - set(RANGES)) == []  # a new count or rate setting needs its range
    assert sorted(set(RANGES) - set(keys)) == []


@pytest.mark.parametrize("key", _numeric_keys())
def test_each_numeric_setting_out_of_range_is_one_line_naming_it(key: str, capsys: pytest.CaptureFixture) -> None:
    bad = _bad_value(key)
    if key == "rewards.weight":
        override, named = f"rewards=[{{name: accuracy, weight: {bad}}}]", "rewards[0].weight="
    elif key.startswith("model.lora."):
        override, named = f"model.lora={{{key.rsplit('.', 1)[1]}: {bad}}}", f"{key}="
    else:
        override, named = f"{key}={bad}", f"{key}="
    assert cli.main(["config", "show", override]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"error: {named}") and err.count("\n") == 1 and "Traceback" not in err


@pytest.mark.parametrize(("override", "message"), [
    ("train.prompts_per_step=0", "error: train.prompts_per_step=0: must be a whole number >= 1"),
    ("train.prompts_per_step=-3", "error: train.prompts_per_step=-3: must be a whole number >= 1"),
    ("train.steps=-1", "error: train.steps=-1: must be a whole number >= 1"),
    ("eval.batch_size=0", "error: eval.batch_size=0: must be a whole number >= 1"),
    ("sft.batch_size=0", "error: sft.batch_size=0: must be a whole number >= 1"),
    ("train.micro_batch_size=0", "error: train.micro_batch_size=0: must be a whole number >= 1"),
])
def test_the_issues_bad_numbers_are_refused_before_training(override: str, message: str, tmp_path: Path,
                                                            capsys: pytest.CaptureFixture) -> None:
    out = tmp_path / "run"
    assert cli.main(["train", "--quiet", "--out", str(out), override]) == 2
    err = capsys.readouterr().err
    assert err.startswith(message) and err.count("\n") == 1 and "Traceback" not in err
    assert not out.exists()  # refused before anything was written


@pytest.mark.parametrize("flags", [[], ["--benchmark", "mvbench", "--data-root", "."]])
def test_eval_flags_are_checked_like_the_settings(flags: list[str], tmp_path: Path,
                                                  capsys: pytest.CaptureFixture) -> None:
    for flag, value, least in (("--batch-size", "0", 1), ("--limit", "0", 1), ("--frames", "0", 1),
                               ("--max-pixels", "-1", 1), ("--workers", "-1", 0)):
        assert cli.main(["eval", "--quiet", "--out", str(tmp_path / "e"), *flags, flag, value]) == 2
        err = capsys.readouterr().err
        assert err.startswith(f"error: {flag}={value}: must be a whole number >= {least}") and "Traceback" not in err
    assert not (tmp_path / "e").exists()
