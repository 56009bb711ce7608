"""The README's "Extending mmrl" example, run as written: its Python block is saved as a file outside the
package, its YAML block names it under ``imports:``, and ``mmrl train`` runs a few steps with it."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
import yaml

from mmrl import cli

README = Path(__file__).resolve().parent.parent / "README.md"


def blocks(lang: str) -> list[str]:
    section = README.read_text().split("## Extending mmrl", 1)[1].split("\n## ", 1)[0]
    return re.findall(rf"```{lang}\n(.*?)```", section, flags=re.DOTALL)


def test_readme_extension_example_runs(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("MMRL_CACHE", str(tmp_path / "cache"))
    (py,), (cfg,) = blocks("python"), blocks("yaml")
    (tmp_path / "my_method.py").write_text(py)
    spec = yaml.safe_load(cfg)
    spec["plugins"]["my_curriculum"]["switch_at"] = 1  # switch stage after the first of two steps
    spec["rewards"][1]["weight"] = 0.5
    (tmp_path / "my.yaml").write_text(yaml.safe_dump(spec))
    out = tmp_path / "run"
    args = ["train", "--quiet", "--config", str(tmp_path / "my.yaml"), "--out", str(out),
            "model.tiny_family=qwen2_5_vl", "model.init=random", "data.toy_size={train: 4, val: 2, test: 2}",
            "data.toy_tasks=[color, scan]", "data.media.video_min_pixels=3136", "data.media.video_max_pixels=3136",
            "rollout.group_size=2", "rollout.max_new_tokens=4", "train.prompts_per_step=2", "train.steps=2",
            "train.save_every=0", "train.log_every=0", "sft.steps=0", "eval.before_rl=false", "eval.after_rl=false",
            "data.problem_types=[multiple_choice, open]"]
    assert cli.main(args) == 0
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    rl = [r for r in rows if r["stage"] == "rl"]
    assert "reward/consistency" in rl[0] and rl[0]["curriculum_stage"] == "default"
    assert rl[1]["curriculum_stage"] == "open" and "reward/token_f1" in rl[1]
