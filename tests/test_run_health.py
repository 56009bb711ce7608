"""A run that cannot be learning says so, once, on the console and in the report.

* a tiny run whose format reward is 0 on every rollout, with every group's rewards equal, warns about both
  (``warning/<kind>`` in metrics.jsonl, ``## Warnings`` in report.md, ``warnings`` in summary.json);
* resumed with more steps, it says how the learning-rate schedule changes, does not repeat the warnings,
  and its time totals cover both sessions;
* a batch whose multiple-choice answers all name the same letter (the data's answers are balanced) is a
  collapse warning; one whose answers follow the data is not.
"""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
from tiny_runs import TINY_RUN, module_cache, rl_rows  # noqa: F401 -- module_cache is a fixture

from data_pipelines.schema import Sample
from mmrl.config import RunConfig, load_run_config, resume_run_config
from mmrl.engine.batch import RolloutBatch
from mmrl.engine.health import RunHealth
from mmrl.engine.plugins import Callback, register_plugin
from mmrl.model import TokenSeq
from mmrl.run import train

pytestmark = pytest.mark.usefixtures("module_cache")


@register_plugin("t_interrupt")
class Interrupt(Callback):
    """Ctrl-C in the middle of step ``at`` (after the checkpoint of the step before)."""

    def after_rollout(self, batch) -> None:
        if self.ctx.step + 1 == self.settings["at"]:
            raise KeyboardInterrupt


@pytest.mark.slow
def test_no_signal_and_equal_groups_warn_once_and_survive_a_resume(tmp_path: Path,
                                                                   capsys: pytest.CaptureFixture) -> None:
    run = tmp_path / "run"
    cfg = load_run_config("video-qa", overrides=[*TINY_RUN, "train.steps=3", "train.health_window=2",
                                                 "train.save_every=1", "plugins={t_interrupt: {at: 3}}"])
    with pytest.raises(KeyboardInterrupt):
        train(cfg, run_dir=run, show_progress=False)
    printed = capsys.readouterr().out
    assert "warning (step 2): reward 'format' was 0.000 on all 16 rollouts of steps 1-2" in printed
    assert "groups in steps 1-2 gave every rollout the same reward" in printed
    rows = rl_rows(run)
    assert [r["step"] for r in rows] == [1, 2]
    warned = [k for r in rows for k in r if k.startswith("warning/")]
    assert "warning/no_reward_signal.format" in warned and "warning/equal_reward_groups" in warned
    assert len(warned) == len(set(warned))  # each once

    # --resume train.steps=4: the schedule change is said; the warnings are not repeated
    more = resume_run_config(run / "config.yaml", ["train.steps=4", "plugins={}"])
    train(more, run_dir=run, resume=True, show_progress=False)
    printed = capsys.readouterr().out
    assert "resume: train.steps 3 -> 4: the learning-rate schedule is recomputed" in printed
    assert "at step 2 the learning rate goes from" in printed
    assert "warning" not in printed
    rows = rl_rows(run)
    assert [r["step"] for r in rows] == [1, 2, 3, 4]
    assert not [k for r in rows[2:] for k in r if k.startswith("warning/")]
    report = (run / "report.md").read_text()
    assert "## Warnings" in report and "reward 'format' was 0.000" in report
    summary = json.loads((run / "summary.json").read_text())
    assert {w["kind"] for w in summary["warnings"]} >= {"no_reward_signal.format", "equal_reward_groups"}
    # the RL time covers the steps of both sessions
    assert summary["stages"]["rl"]["seconds"] == pytest.approx(sum(r["time/step_s"] for r in rows), abs=0.2)
    assert summary["wall_seconds"] >= summary["stages"]["rl"]["seconds"]


def _batch(answers: list[str], golds: list[str]) -> RolloutBatch:
    n = len(answers)
    samples = [Sample(id=f"q{i // 4}", problem_type="multiple_choice", question="which?",
                      options=["red", "green", "blue", "yellow"], answer=golds[i // 4]) for i in range(n)]
    return RolloutBatch(
        samples=samples, prompt_index=[i // 4 for i in range(n)], group_index=torch.arange(n) // 4,
        seqs=[TokenSeq(ids=[1, 2], mm_types=[0, 0], loss_mask=[0, 1]) for _ in range(n)],
        completions=[f"<answer>{a}</answer>" for a in answers], turns=[[f"<answer>{a}</answer>"] for a in answers],
        env_info=[{} for _ in range(n)], finished=torch.ones(n, dtype=torch.bool), loss_mask=torch.ones(n, 2),
        rewards=torch.tensor([float(a == golds[i // 4]) for i, a in enumerate(answers)]),
        reward_components={"accuracy": torch.tensor([float(a == golds[i // 4]) for i, a in enumerate(answers)])})


def _health(batches: list[RolloutBatch]) -> list[str]:
    cfg = RunConfig()
    cfg.train.steps = len(batches)
    health = RunHealth(SimpleNamespace(cfg=cfg), window=len(batches))
    fired: list[str] = []
    for step, batch in enumerate(batches, start=1):
        health.after_rewards(batch)
        stats = {"entropy": 0.05}
        health.on_step_end(step, stats)
        fired += [k for k in stats if k.startswith("warning/")]
    return fired


def test_collapse_onto_one_answer_is_told_from_following_the_data() -> None:
    golds = ["A", "B", "C", "D"]  # balanced answers, four questions of four rollouts
    collapsed = [_batch(["B"] * 16, golds) for _ in range(2)]
    assert "warning/one_answer" in _health(collapsed)
    right = [_batch([g for g in golds for _ in range(4)], golds) for _ in range(2)]
    assert "warning/one_answer" not in _health(right)


def test_informative_groups_is_the_share_of_groups_with_unequal_rewards() -> None:
    from mmrl.engine.trainer import GRPOTrainer

    # group 0: all right (no signal); group 1: one right of four; group 2: all wrong
    batch = _batch(["red"] * 4 + ["red", "blue", "blue", "blue"] + ["green"] * 4, ["red", "red", "blue"])
    stats = GRPOTrainer.reward_metrics(batch)
    assert stats["informative_groups"] == pytest.approx(1 / 3)
    assert stats["reward/accuracy"] == pytest.approx(5 / 12)
