"""A method written outside the package, named under ``imports:``, run by ``mmrl train``.

The method file (written into a temporary folder) holds the four kinds of plug-in the mission's methods need:
a reward that re-asks the policy through the rollout service with shuffled options (ACRE), a sampler that
reads the accuracy component from the rollout batch (variance-aware sampling), a plug-in that switches the
curriculum stage and resets the reference while the KL is off (MedCCO), and a token shaper that sets
per-token KL weights from each group's accuracy (ARES). Each piece writes what it saw to a JSON file beside
it, and the test checks the effect against the run's own outputs.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file
from tiny_runs import TINY_RUN, module_cache, rl_rows  # noqa: F401 (module_cache is a fixture)

from mmrl import cli

# one worker builds the shared run
pytestmark = [pytest.mark.xdist_group("engine_methods"), pytest.mark.usefixtures("module_cache")]

METHOD = '''
import json, random
from pathlib import Path

import torch

from data_pipelines.samplers import UniformSampler, register_sampler
from mmrl.grpo.shaping import ShapingOutput, register_shaper
from mmrl.engine.plugins import Callback, register_plugin
from mmrl.engine.service import Ask
from rewards import register_reward

LOG = Path(__file__).with_name("seen.json")


def record(key, value):
    data = json.loads(LOG.read_text()) if LOG.exists() else {}
    data.setdefault(key, []).append(value)
    LOG.write_text(json.dumps(data))


@register_reward("t_reask", locate_errors=False)
def reask(completions, rollout_service, options, id, rollout_batch, **kw):
    """1 when the re-asked answer (options reversed) names the same option text as the first answer."""
    from mmrl.engine.service import parse_answer

    out = []
    samples = rollout_batch.samples
    for i, text in enumerate(completions):
        first = parse_answer(text, samples[i], options[i])
        shuffled = list(reversed(options[i]))
        again = rollout_service.ask(samples[i], Ask(options=shuffled))[0]
        record("reask", {"id": id[i], "options": shuffled, "answer": again.answer, "text": again.text})
        same = (first is not None and again.answer is not None
                and options[i][ord(first) - 65] == shuffled[ord(again.answer) - 65])
        out.append(1.0 if same else 0.0)
    return out


@register_sampler("t_acc_sampler")
class AccuracySampler(UniformSampler):
    def __init__(self, samples, *, seed=0):
        super().__init__(samples, seed=seed)
        self.seen = {}

    def update(self, batch):
        acc = batch.component("accuracy")
        for rows in batch.groups():
            key = str(batch.prompt_index[rows[0]])
            self.seen.setdefault(key, []).append(float(acc[rows].mean()))
        record("sampler", {"groups": batch.n_groups, "accuracy_mean": float(acc.mean())})

    def state_dict(self):
        return {**super().state_dict(), "seen": self.seen}

    def load_state_dict(self, state):
        super().load_state_dict(state)
        self.seen = state["seen"]


@register_plugin("t_stage_switch")
class StageSwitch(Callback):
    def on_step_end(self, step, stats):
        if step == self.settings["at"]:
            keep = sorted(s.id for s in self.ctx.train_samples)[:2]
            self.ctx.set_stage("second", pool=keep, rewards=[{"name": "accuracy", "weight": 2.0}],
                                   grpo={"kl_coef": 0.05}, reset_reference=True)
            record("stage", {"step": step, "pool": keep})


@register_shaper("t_kl_by_accuracy")
class KLByAccuracy:
    requires = ()

    def __call__(self, inp):
        acc = inp.components["accuracy"]
        group_acc = torch.zeros(int(inp.group_index.max()) + 1).index_add_(0, inp.group_index, acc)
        group_acc = group_acc / torch.bincount(inp.group_index).float()
        w = (2.0 + group_acc[inp.group_index])[:, None] * torch.ones_like(inp.mask)
        record("shaper", float((w * inp.mask).sum() / inp.mask.sum()))
        return ShapingOutput(advantages=inp.advantages, kl_weights=w)


@register_plugin("t_crash")
class Crash(Callback):
    """Interrupts step 4 while a file named 'crash' lies beside this one."""

    def after_rollout(self, batch):
        if self.ctx.step == 3 and Path(__file__).with_name("crash").exists():
            raise KeyboardInterrupt
'''

BASE = [*TINY_RUN, "rollout.max_new_tokens=6", "train.micro_batch_size=4", "train.save_every=1",
        "train.keep_checkpoints=10", "train.lr=1e-3", "train.min_lr_ratio=1.0", "grpo.entropy_coef=0.05",
        "grpo.kl_coef=0", "train.steps=4"]


def write_method(folder: Path, steps: int) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "my_method.py").write_text(METHOD)
    cfg = folder / "method.yaml"
    cfg.write_text(
        "imports: [./my_method.py]\n"
        "rewards:\n  - {name: accuracy}\n  - {name: format, weight: 0.2}\n  - {name: t_reask, weight: 0.5}\n"
        "data: {sampler: t_acc_sampler}\n"
        "grpo: {shaper: t_kl_by_accuracy}\n"
        f"train: {{steps: {steps}}}\n"
        "plugins: {t_stage_switch: {at: 2}}\n")
    return cfg


@pytest.fixture(scope="module")
def method_run(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    root = tmp_path_factory.mktemp("method")
    folder = root / "elsewhere"
    cfg = write_method(folder, steps=4)
    out = root / "run"
    assert cli.main(["train", "--quiet", "--config", str(cfg), "--out", str(out), *BASE]) == 0
    return folder, out


def test_imports_load_the_method_and_the_reward_reasks_with_shuffled_options(method_run) -> None:
    folder, out = method_run
    seen = json.loads((folder / "seen.json").read_text())
    rows = rl_rows(out)
    assert [r["step"] for r in rows] == [1, 2, 3, 4]
    # steps 1-2 use the run's rewards (the re-ask among them): one re-ask per completion, 2 x 4 per step
    reasks = seen["reask"]
    assert len(reasks) == 2 * 2 * 4
    for r in reasks:
        assert r["answer"] is None or r["answer"] in "ABCD"[:len(r["options"])]
        assert len(r["options"]) == 4
    # the re-ask reward's mean per step is what the reward computed from those answers
    assert all(0.0 <= r["reward/t_reask"] <= 1.0 for r in rows[:2])
    # the stage switch replaced the rewards: steps 3-4 log accuracy only, the re-ask is gone
    assert all("reward/t_reask" not in r for r in rows[2:])
    assert [r["curriculum_stage"] for r in rows] == ["default", "default", "second", "second"]


def test_sampler_reads_accuracy_component_from_the_batch(method_run) -> None:
    folder, out = method_run
    seen = json.loads((folder / "seen.json").read_text())["sampler"]
    rows = rl_rows(out)
    assert [s["groups"] for s in seen] == [2, 2, 2, 2]
    for s, r in zip(seen, rows):
        assert s["accuracy_mean"] == pytest.approx(r["reward/accuracy"])
    state = torch.load(out / "checkpoint-4" / "trainer_state.pt", weights_only=True)
    # the new stage's sampler drew from the 2-sample pool: its statistics hold those prompts only
    assert set(state["sampler"]["seen"]) <= {"0", "1"}
    assert state["stage"]["name"] == "second" and len(state["stage"]["pool"]) == 2


def test_stage_switch_creates_the_reference_with_kl_off(method_run) -> None:
    folder, out = method_run
    stage = json.loads((folder / "seen.json").read_text())["stage"]
    assert [s["step"] for s in stage] == [2] and len(stage[0]["pool"]) == 2
    # no reference before the switch (KL off), so checkpoint-1 stores none
    assert not (out / "checkpoint-1" / "reference.safetensors").exists()
    ref = load_file(out / "checkpoint-2" / "reference.safetensors")
    policy_at_switch = load_file(out / "checkpoint-2" / "model.safetensors")
    start = load_file(next((out / "checkpoint-1").glob("model.safetensors")))
    # the reference is the policy at the switch (every tensor equals one of the policy's), which has moved
    # away from where it was after step 1
    assert len(ref) > 0
    assert all(any(torch.equal(v, p) for p in policy_at_switch.values() if p.shape == v.shape) for v in ref.values())
    assert any(not torch.equal(policy_at_switch[k], start[k]) for k in start)
    # later checkpoints keep the same reference (it is not reset again)
    ref4 = load_file(out / "checkpoint-4" / "reference.safetensors")
    assert all(torch.equal(ref[k], ref4[k]) for k in ref)


def test_shaper_kl_weights_reach_the_loss(method_run) -> None:
    folder, out = method_run
    shaped = json.loads((folder / "seen.json").read_text())["shaper"]
    rows = rl_rows(out)
    assert len(shaped) == 4
    # before the switch there is no reference, so no KL term; after it the loss got the shaper's weights
    assert all("kl_weight_mean" not in r for r in rows[:2])
    for w, r in zip(shaped[2:], rows[2:]):
        assert w >= 2.0
        assert r["kl_weight_mean"] == pytest.approx(w, rel=1e-5)
        assert "kl_loss" in r


@pytest.mark.slow
def test_resume_restores_the_stage_and_the_reference(tmp_path: Path, method_run) -> None:
    """Interrupted in step 4 (stage 'second', after checkpoint-3), resumed: the same weights as the straight
    run, so the pool, the rewards, the KL setting and the stored reference all came back."""
    folder, straight = method_run
    out = tmp_path / "run"
    (folder / "crash").write_text("")
    args = ["train", "--quiet", "--config", str(folder / "method.yaml"), "--out", str(out), *BASE,
            "plugins={t_stage_switch: {at: 2}, t_crash: {}}"]
    assert cli.main(args) == 130  # interrupted
    assert (out / "checkpoint-3").is_dir() and not (out / "checkpoint-4").exists()
    (folder / "crash").unlink()
    assert cli.main(["train", "--quiet", "--out", str(out), "--resume"]) == 0
    a, b = load_file(straight / "final" / "model.safetensors"), load_file(out / "final" / "model.safetensors")
    assert all(torch.equal(a[k], b[k]) for k in a)
    ra = load_file(straight / "checkpoint-4" / "reference.safetensors")
    rb = load_file(out / "checkpoint-4" / "reference.safetensors")
    assert all(torch.equal(ra[k], rb[k]) for k in ra)
