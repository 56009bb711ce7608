"""``train.lr_schedule`` / ``sft.lr_schedule`` (issue 48): constant, cosine or linear after the linear warm-up; the
learning rate each step's update used (the ``lr`` of its metrics row) follows the schedule's formula; a curriculum
stage that resets the optimizer restarts the schedule (its first step at the peak rate), and a run resumed after
the restart goes on exactly as an unbroken one; a schedule name that does not exist is one line naming the
setting and the choices."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
import tiny_runs
from tiny_runs import TINY_RUN, module_cache, rl_rows, run_cli  # noqa: F401 (module_cache is a fixture)

import mmrl.methods.medcco  # noqa: F401 (registers the curriculum plug-in)
import rewards.medical  # noqa: F401 (registers the rewards)
from mmrl.engine.optim import LrSchedule, lr_lambda

pytestmark = pytest.mark.usefixtures("module_cache")


# ------------------------------------------------------------------------------------------ the formula
def test_each_schedule_after_its_warm_up() -> None:
    warm = [(k + 1) / 3 for k in range(3)]  # 1/3, 2/3, 1: linear warm-up to the peak
    assert [LrSchedule("constant", 3, 10)(n) for n in range(10)] == pytest.approx(warm + [1.0] * 7)
    cosine = LrSchedule("cosine", 3, 10, 0.1)
    progress = [(n - 3) / 7 for n in range(3, 10)]
    assert [cosine(n) for n in range(10)] == pytest.approx(
        warm + [0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * p)) for p in progress])
    linear = LrSchedule("linear", 3, 10, 0.1)
    assert [linear(n) for n in range(10)] == pytest.approx(warm + [0.1 + 0.9 * (1 - p) for p in progress])
    # the default is what mmrl always ran: cosine to min_lr_ratio
    assert lr_lambda(3, 10, 0.1)(7) == pytest.approx(cosine(7))


def test_a_restarted_schedule_warms_up_and_decays_again_over_its_own_steps() -> None:
    s = LrSchedule("cosine", 1, 10, 0.0)
    s.restart(4, 4)  # from step 4, over 4 steps: 4 warm-up, 5..7 the cosine, then its end
    assert [s(n) for n in range(4, 9)] == pytest.approx(
        [1.0, 1.0, 0.5 * (1 + math.cos(math.pi / 3)), 0.5 * (1 + math.cos(2 * math.pi / 3)), 0.0])
    s.restart(6)  # to the run's last step (10): 6 warm-up, 7..9 the cosine over 4 - 1 steps
    assert [s(n) for n in range(6, 10)] == pytest.approx(
        [1.0, 1.0, 0.5 * (1 + math.cos(math.pi / 3)), 0.5 * (1 + math.cos(2 * math.pi / 3))])


@pytest.mark.parametrize("key", ["train.lr_schedule", "sft.lr_schedule"])
def test_an_unknown_schedule_is_one_line_naming_the_choices(key: str, capsys: pytest.CaptureFixture) -> None:
    rc, _, err = run_cli(capsys, "config", "show", f"{key}=cosin")
    assert rc == 2
    line = err.strip()
    assert "\n" not in line and key in line and "'cosin'" in line
    assert all(name in line for name in ("'cosine'", "'constant'", "'linear'"))


# ------------------------------------------------------------------------------------------ real runs
@pytest.mark.slow
@pytest.mark.parametrize("kind", ["constant", "cosine", "linear"])
def test_the_logged_learning_rate_follows_the_schedule(kind: str, tmp_path: Path) -> None:
    rows = tiny_runs.run_rl(tmp_path, "train.steps=5", "train.warmup_steps=2", "train.lr=1e-3",
                            "train.min_lr_ratio=0.1", f"train.lr_schedule={kind}")
    schedule = LrSchedule(kind, 2, 5, 0.1)
    assert [r["lr"] for r in rows] == pytest.approx([1e-3 * schedule(n) for n in range(5)])
    if kind == "constant":  # the peak after the warm-up, to the last step
        assert [r["lr"] for r in rows] == pytest.approx([5e-4, 1e-3, 1e-3, 1e-3, 1e-3])


def test_the_cold_start_follows_its_own_schedule(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    rc, _, err = run_cli(capsys, "sft", "--quiet", "--steps", "3", "--out", str(tmp_path / "sft"), *TINY_RUN,
                         "sft.warmup_steps=1", "sft.lr=1e-3", "sft.lr_schedule=constant")
    assert rc == 0, err
    rows = [json.loads(line) for line in (tmp_path / "sft" / "metrics.jsonl").read_text().splitlines()]
    assert [r["lr"] for r in rows if r["stage"] == "sft"] == pytest.approx([1e-3, 1e-3, 1e-3])


# ------------------------------------------------------------------------------------------ curriculum stages
SCANS = ["data.toy_tasks=[scan]", "data.toy_size={train: 8, val: 2, test: 2}",
         "data.media.image_min_pixels=3136", "data.media.image_max_pixels=3136", "prompt.answer_format=answer"]


def staged(second: str, *extra: str) -> list[str]:
    """Two curriculum stages on the toy scans (closed questions for 2 steps, then open ones; the second stage's
    settings end with ``second``), the ``test-stop-at`` plug-in (see tiny_runs.STOP_AT), then ``extra``."""
    return [*TINY_RUN, *SCANS, "imports=[mmrl.methods.medcco]", "train.lr=1e-2", "train.min_lr_ratio=0", "train.warmup_steps=0",
            ("plugins={curriculum: {stages: ["
             "{name: closed, select: {answer_types: [closed]}, rewards: [{name: medical_closed}], "
             "switch: {rule: steps, steps: 2}}, "
             f"{{name: open, select: {{answer_types: [open]}}, rewards: [{{name: lexical}}]{second}}}]}}, "
             "test-stop-at: {}}"), *extra]


def run(tmp_path: Path, overrides: list[str], *, resume: bool = False) -> list[float]:
    from mmrl.config import load_run_config
    from mmrl.run import train

    train(load_run_config("image-qa", overrides=overrides), run_dir=tmp_path, resume=resume, show_progress=False)
    return [r["lr"] for r in rl_rows(tmp_path)]


@pytest.mark.slow
def test_a_stage_that_resets_the_optimizer_starts_at_the_peak_rate(tmp_path: Path) -> None:
    lrs = run(tmp_path / "reset", staged(", reset_optimizer: true", "train.steps=4", "train.lr_schedule=cosine"))
    whole = LrSchedule("cosine", 0, 4)
    restarted = LrSchedule("cosine", 0, 4)
    restarted.restart(2)  # stage 2 from step 3 (position 2) to the run's end
    assert lrs == pytest.approx([1e-2 * whole(0), 1e-2 * whole(1), 1e-2 * restarted(2), 1e-2 * restarted(3)])
    assert lrs[2] == pytest.approx(1e-2) and lrs[1] < 1e-2  # the stage's first step: the peak again
    doc = json.loads((tmp_path / "reset" / "curriculum.json").read_text())
    assert doc["history"][1]["schedule_restart"] is True
    # restart_schedule: false keeps the run's schedule going (stage 2 at the cosine's lower half)
    kept = run(tmp_path / "kept", staged(", reset_optimizer: true, restart_schedule: false", "train.steps=4"))
    assert kept == pytest.approx([1e-2 * whole(n) for n in range(4)])


@pytest.mark.slow
def test_a_run_resumed_after_the_restart_has_the_learning_rates_of_an_unbroken_one(tmp_path: Path) -> None:
    overrides = staged(", reset_optimizer: true", "train.steps=5", "train.save_every=1",
                       "train.warmup_steps=1", "train.lr_schedule=linear")
    unbroken = run(tmp_path / "whole", overrides)
    tiny_runs.STOP_AT[:] = [3]  # the process ends after step 3, before its checkpoint: checkpoint-2 is the last,
    try:  # written just after the stage switched and the schedule restarted
        with pytest.raises(tiny_runs.StopRun):
            run(tmp_path / "broken", overrides)
    finally:
        tiny_runs.STOP_AT[:] = []
    assert json.loads((tmp_path / "broken" / "curriculum.json").read_text())["current"] == "open"
    resumed = run(tmp_path / "broken", overrides, resume=True)
    assert resumed == pytest.approx(unbroken, rel=1e-12)
    restarted = LrSchedule("linear", 1, 5)
    restarted.restart(2)
    assert unbroken[2:] == pytest.approx([1e-2 * restarted(n) for n in range(2, 5)])


@pytest.mark.slow
def test_a_resume_forced_to_a_new_peak_and_schedule_trains_with_them_from_its_first_step(tmp_path: Path) -> None:
    from mmrl.config import load_run_config
    from mmrl.run import train

    base = [*TINY_RUN, "train.steps=4", "train.save_every=1", "train.warmup_steps=0", "train.lr=1e-3",
            "plugins={test-stop-at: {}}"]
    tiny_runs.STOP_AT[:] = [3]  # checkpoint-2 is the last
    try:
        with pytest.raises(tiny_runs.StopRun):
            train(load_run_config("video-qa", overrides=base), run_dir=tmp_path, show_progress=False)
    finally:
        tiny_runs.STOP_AT[:] = []
    changed = load_run_config("video-qa", overrides=[*base, "train.lr=5e-4", "train.lr_schedule=constant"])
    train(changed, run_dir=tmp_path, resume=True, force_settings=True, show_progress=False)
    lrs = [r["lr"] for r in rl_rows(tmp_path)]
    cosine = LrSchedule("cosine", 0, 4)
    assert lrs == pytest.approx([1e-3 * cosine(0), 1e-3 * cosine(1), 5e-4, 5e-4])


@pytest.mark.parametrize("stages, message", [
    ("[{name: a, restart_schedule: true, switch: {rule: steps, steps: 1}}, {name: b}]", "belong to a later stage"),
    ("[{name: a, switch: {rule: steps, steps: 1}}, {name: b, restart_schedule: 1}]",
     r"stages\[1\].restart_schedule: true or false"),
])
def test_bad_restart_settings_are_named(stages: str, message: str) -> None:
    from types import SimpleNamespace

    from mmrl.methods.medcco import Curriculum
    from mmrl_common.errors import ConfigError

    with pytest.raises(ConfigError, match=message):
        Curriculum(SimpleNamespace(train_samples=[object()]), stages=yaml_list(stages))


def yaml_list(text: str) -> list:
    import yaml

    return yaml.safe_load(text)
