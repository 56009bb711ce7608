"""The curriculum plug-in on the tiny model and the toy scans: switching by steps (with the reference reset and
the replay share, in a real run; with a fresh optimizer and a new peak learning rate), by a plateau of the moving-average reward and by reward sparsity (fed
hand-made step statistics on a real trainer), the stage in the logs and curriculum.json, bad settings, and a
run interrupted in the middle of stage 2 that resumes there with the ARMed buffer it had."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from tiny_runs import TINY_RUN, module_cache, rl_rows  # noqa: F401 (module_cache is a fixture)

import mmrl.methods.medcco  # noqa: F401 (registers the plug-in)
import rewards.medical  # noqa: F401 (registers the rewards)
from mmrl.config import load_run_config
from mmrl.engine.checkpoint import load_trainer_state
from mmrl.engine.plugins import Callback, register_plugin
from mmrl.run import load_split, train
from mmrl_common.errors import ConfigError
from rewards.registry import register_reward

pytestmark = pytest.mark.usefixtures("module_cache")

SCANS = ["data.toy_tasks=[scan]", "data.toy_size={train: 8, val: 2, test: 2}",
         "data.media.image_min_pixels=3136", "data.media.image_max_pixels=3136", "prompt.answer_format=answer"]
OPEN_REWARDS = ("[{name: medical_closed}, {name: lexical, weight: 0.5}, "
                "{name: armed, label: semantic, weight: 0.5, init: {reward: t_len_score, buffer_size: 64}}]")
PROBES: dict[str, list[dict]] = {}


def stages(switch: str, *, replay: float = 0.5, second_rewards: str = OPEN_REWARDS, second: str = "") -> str:
    return ("plugins={curriculum: {stages: ["
            "{name: closed, select: {answer_types: [closed]}, rewards: [{name: medical_closed}, {name: t_len_score}], "
            f"switch: {switch}}}, "
            f"{{name: open, select: {{answer_types: [open]}}, replay: {replay}, rewards: {second_rewards}{second}}}]}}, "
            "t_probe: {key: %s}}")


@register_reward("t_len_score")
def len_score(completions, **_):
    """A continuous stand-in for the semantic score (no model load in the training tests)."""
    return [min(1.0, len(c) / 40) for c in completions]


@register_plugin("t_probe")
class Probe(Callback):
    """After the curriculum's step end: the stage, the pool and how far the reference is from the policy."""

    def on_step_end(self, step, stats):
        t = self.ctx._trainer  # the probe looks inside the trainer
        gap = None
        if t.ref is not None:
            gap = max(float((a - b).detach().abs().max()) for a, b in zip(t.ref.model.parameters(), t.policy.model.parameters()))
        adam_steps = sorted({int(st["step"]) for st in t.optimizer.state.values()})
        PROBES.setdefault(self.settings["key"], []).append(
            {"step": step, "stage": t.stage["name"], "pool": [t.train_samples[i].id for i in t.pool], "gap": gap,
             "adam_steps": adam_steps, "lr": t.optimizer.param_groups[0]["lr"]})

    def after_rollout(self, batch):
        if self.ctx.step == self.settings.get("crash_at"):
            raise KeyboardInterrupt


def config(*overrides: str):
    return load_run_config("image-qa", overrides=[
        *TINY_RUN, *SCANS, "imports=[mmrl.methods.medcco]", "grpo.kl_coef=0.05",
        "train.lr=1e-2", *overrides])


@pytest.mark.slow
def test_steps_rule_resets_the_reference_and_replays_closed_questions(tmp_path: Path) -> None:
    cfg = config(stages("{rule: steps, steps: 2}") % "steps", "train.steps=4")
    train(cfg, run_dir=tmp_path / "run", show_progress=False)
    rows = rl_rows(tmp_path / "run")
    assert [r["curriculum_stage"] for r in rows] == ["closed", "closed", "open", "open"]
    assert [r["curriculum/switched"] for r in rows] == [0, 1, 0, 0]
    assert "reward/semantic" not in rows[0] and "reward/semantic" in rows[2]
    probe = PROBES["steps"]
    samples, _ = load_split(cfg, "train", show_progress=False)
    closed = {s.id for s in samples if s.problem_type != "open"}
    open_ = {s.id for s in samples if s.problem_type == "open"}
    assert set(probe[0]["pool"]) == closed
    # replay 0.5: as many closed questions as open ones (all 4 of them here), drawn from stage 1's pool
    assert set(probe[2]["pool"]) == open_ | closed and len(open_) == 4
    assert rows[2]["curriculum/replay_share"] == 0.5
    # the reference: the starting model until the switch, the policy of step 2 at the switch
    assert probe[0]["gap"] > 0 and probe[1]["gap"] == 0.0 and probe[3]["gap"] > 0
    doc = json.loads((tmp_path / "run" / "curriculum.json").read_text())
    assert [h["stage"] for h in doc["history"]] == ["closed", "open"]
    assert doc["history"][1]["start_step"] == 2 and doc["history"][1]["reference_reset"] is True
    assert doc["history"][1]["replayed"] == 4 and doc["history"][0]["steps"] == 2
    assert "curriculum_stage.png" in (tmp_path / "run" / "report.md").read_text()


@pytest.mark.slow
def test_a_stage_can_start_with_a_fresh_optimizer_and_its_own_learning_rate(tmp_path: Path) -> None:
    # the same run twice, the second stage's optimizer kept (control) or reset with a 5x peak learning rate
    # (the run's schedule kept: restart_schedule false; tests/test_lr_schedule.py has the restart)
    for key, second in (("opt_kept", ""), ("opt_reset", ", reset_optimizer: true, restart_schedule: false, lr: 0.05")):
        cfg = config(stages("{rule: steps, steps: 2}", replay=0.0, second=second) % key, "train.steps=4",
                     "train.warmup_steps=1", "train.min_lr_ratio=0.1")
        train(cfg, run_dir=tmp_path / key, show_progress=False)
    kept, reset = PROBES["opt_kept"], PROBES["opt_reset"]
    assert [p["stage"] for p in reset] == ["closed", "open", "open", "open"]  # switched at the end of step 2
    # AdamW's per-parameter step counts: the control's run on (1, 2, 3, 4); the reset drops the state at the
    # switch (end of step 2), so step 3 is the fresh optimizer's first step
    assert [p["adam_steps"] for p in kept] == [[1], [2], [3], [4]]
    assert [p["adam_steps"] for p in reset] == [[1], [], [1], [2]]
    # the learning rate: the same schedule, 5x its peak from the switch on (1e-2 -> 5e-2)
    assert reset[0]["lr"] == pytest.approx(kept[0]["lr"])
    for k, r in zip(kept[1:], reset[1:]):
        assert k["lr"] > 0 and r["lr"] == pytest.approx(5 * k["lr"])
    doc = json.loads((tmp_path / "opt_reset" / "curriculum.json").read_text())
    assert doc["history"][1]["optimizer_reset"] is True and doc["history"][1]["lr"] == 0.05
    assert doc["history"][0]["optimizer_reset"] is False and doc["history"][0]["lr"] is None


@pytest.fixture(scope="module")
def make_trainer(tmp_path_factory: pytest.TempPathFactory):
    from mmrl.engine.trainer import GRPOTrainer
    from mmrl.model import load_policy
    from mmrl.run import resolve_model

    def build(switch: str):
        cfg = config(stages(switch, replay=0.0) % "rules", "train.steps=50")
        samples, _ = load_split(cfg, "train", show_progress=False)
        policy = load_policy(resolve_model(cfg), device="cpu")
        return GRPOTrainer(cfg, policy, samples, run_dir=tmp_path_factory.mktemp("rules"), show_progress=False)

    return build


def drive(trainer, key: str, values: list[float]) -> list[str]:
    """Feed ``values`` as the step statistic ``key``; the stage after each step."""
    cur = trainer.plugins["curriculum"]
    cur.on_train_start()
    out = []
    for step, v in enumerate(values, start=1):
        trainer.step = step
        cur.on_step_end(step, {"reward": 0.0, "informative_groups": 1.0, key: v})
        out.append(trainer.stage["name"])
    return out


def test_plateau_rule_switches_when_the_moving_average_stops_rising(make_trainer) -> None:
    t = make_trainer("{rule: plateau, window: 2, patience: 2, min_delta: 0.01, metric: reward/acc}")
    # moving averages 0.1 | 0.2 0.4 0.5 (new bests) | 0.5 0.5: two steps without a gain > 0.01 -> switch at 6
    got = drive(t, "reward/acc", [0.1, 0.3, 0.5, 0.5, 0.5, 0.5, 0.5])
    assert got == ["closed"] * 5 + ["open"] * 2
    hist = t.plugins["curriculum"].history
    assert hist[1]["start_step"] == 6 and hist[1]["reason"].startswith("plateau")


def test_sparsity_rule_switches_on_zero_variance_groups(make_trainer) -> None:
    t = make_trainer("{rule: sparsity, threshold: 0.7, window: 2}")
    # zero-variance shares 0, 0.5, 0.8, 0.8 -> moving 0, 0.25, 0.65, 0.8 -> switch after step 4
    got = drive(t, "informative_groups", [1.0, 0.5, 0.2, 0.2, 0.2])
    assert got == ["closed"] * 3 + ["open"] * 2
    assert t.plugins["curriculum"].history[1]["reason"].startswith("sparsity: 0.800")
    capped = make_trainer("{rule: sparsity, threshold: 0.9, window: 2, max_steps: 3}")
    assert drive(capped, "informative_groups", [1.0, 1.0, 1.0, 1.0]) == ["closed"] * 2 + ["open"] * 2


@pytest.mark.parametrize("bad, message", [
    ("{rule: steps}", "a positive number of steps"),
    ("{rule: plateau, window: 2, patience: 1, treshold: 3}", "'treshold' is not a setting of rule 'plateau'"),
    ("{rule: sometimes}", "rule: steps|plateau|sparsity"),
])
def test_bad_switch_settings_are_named(make_trainer, bad: str, message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        make_trainer(bad)


@pytest.mark.slow
def test_resume_in_the_middle_of_stage_two(tmp_path: Path) -> None:
    run = tmp_path / "run"
    base = [stages("{rule: steps, steps: 2}", replay=0.0, second=", reset_optimizer: true, lr: 0.05") % "resume",
            "train.steps=5", "train.save_every=1"]
    with pytest.raises(KeyboardInterrupt):
        train(config(*base[:1], "plugins.t_probe.crash_at=3", *base[1:]), run_dir=run, show_progress=False)
    state = load_trainer_state(run / "checkpoint-3")
    plugin = state["plugins"]["curriculum"]
    assert plugin["current"] == 1 and plugin["stage_step"] == 1  # stage 2, one step in
    buffer = state["rewards"]["semantic"]["buffer"]  # the trainer keeps stateful rewards
    assert len(buffer) == 8  # the open questions of step 3 (2 prompts x 4 rollouts)
    PROBES.pop("resume", None)
    train(config(*base), run_dir=run, resume=True, show_progress=False)
    rows = rl_rows(run)
    assert [r["step"] for r in rows] == [1, 2, 3, 4, 5]
    assert [r["curriculum_stage"] for r in rows] == ["closed", "closed", "open", "open", "open"]
    assert [r["curriculum/stage_step"] for r in rows[2:]] == [1, 2, 3]
    assert PROBES["resume"][0]["gap"] > 0  # no second reference reset on resume
    # nor a second optimizer reset: AdamW counts on from the stage's fresh start (step 3 was its first)
    assert [p["adam_steps"] for p in PROBES["resume"]] == [[2], [3]]
    uninterrupted = config(*base)  # the stage's peak lr (0.05) kept: 0.05 times the factor of steps 4, 5 of the
    from mmrl.engine.optim import (
        LrSchedule,  # schedule restarted with the optimizer at the switch (position 2)
    )

    t = uninterrupted.train
    factor = LrSchedule(t.lr_schedule, t.warmup_steps, 5, t.min_lr_ratio)
    factor.restart(2)
    assert [p["lr"] for p in PROBES["resume"]] == pytest.approx([0.05 * factor(4), 0.05 * factor(5)])
    doc = json.loads((run / "curriculum.json").read_text())
    assert [h["stage"] for h in doc["history"]] == ["closed", "open"] and doc["stage_step"] == 3
    final = load_trainer_state(run / "checkpoint-5")["rewards"]["semantic"]["buffer"]
    assert len(final) == 24 and final[:8] == buffer  # the buffer went on across the resume
