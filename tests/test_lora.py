"""LoRA through PEFT (``model.lora``), on the tiny random-weight models:

* a LoRA run trains the adapters only (every base weight bitwise unchanged), holds no copy of the model as
  the KL reference, and writes adapters in PEFT format (checkpoints) and a merged export (``final/``);
* a run interrupted after a checkpoint and resumed ends with the same adapters and metrics as an
  uninterrupted one, a reference reset by a curriculum stage included;
* the merged export loads in transformers and answers greedily with the adapter model's tokens, and
  ``mmrl eval --model final`` evaluates it;
* the reference's log-probs (adapters disabled) equal the base model's;
* an unknown ``model.lora`` key is a config error naming it.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file
from tiny_runs import TINY_RUN, module_cache, rl_rows  # noqa: F401  (module_cache is a fixture)

from mmrl import cli
from mmrl.config import LoraSettings, load_run_config
from mmrl.engine.plugins import Callback, register_plugin
from mmrl.model import Policy, checkpointing_switch, load_policy
from mmrl.model.lora import (
    ADAPTER_DIR,
    AdapterReference,
    adapter_state,
    apply_lora,
    disabled_adapters,
    load_adapters,
    merged_export,
    save_adapters,
)
from mmrl_common.errors import ConfigError

pytestmark = pytest.mark.usefixtures("module_cache")

PROBES: dict[str, dict] = {}

LORA_RUN = [*TINY_RUN, "model.lora={r: 4}", "train.steps=3", "train.save_every=1", "train.keep_checkpoints=10",
            "train.lr=1e-3", "train.min_lr_ratio=1.0", "grpo.entropy_coef=0.05", "grpo.kl_coef=0.05",
            "train.health_window=0"]


@register_plugin("t_lora_probe")
class LoraProbe(Callback):
    """Records the weights at the start and the end, switches to a stage with a fresh KL reference after
    step ``reset_at``, and interrupts step ``crash_at`` + 1 (after checkpoint ``crash_at``)."""

    def on_train_start(self):
        t = self.ctx._trainer  # the probe looks inside the trainer
        rec = PROBES.setdefault(self.settings["tag"], {})
        if t.step == 0:
            rec["start"] = {n: p.detach().clone() for n, p in t.policy.model.named_parameters()}
        rec["ref_start"] = t.ref
        rec["trainable"] = sorted(n for n, p in t.policy.model.named_parameters() if p.requires_grad)

    def after_rollout(self, batch):
        if self.ctx.step == self.settings.get("crash_at"):
            raise KeyboardInterrupt

    def on_step_end(self, step, stats):
        t = self.ctx._trainer  # the probe looks inside the trainer
        if step == self.settings.get("reset_at"):
            t.set_stage("fresh-reference", reset_reference=True)
        if step == t.cfg.train.steps:
            rec = PROBES[self.settings["tag"]]
            rec["end"] = {n: p.detach().clone() for n, p in t.policy.model.named_parameters()}
            rec["ref"] = t.ref


def lora_config(*extra: str):
    return load_run_config("video-qa", overrides=[*LORA_RUN, *extra])


@pytest.fixture(scope="module")
def lora_run(tmp_path_factory: pytest.TempPathFactory, module_cache) -> Path:  # noqa: F811
    """An uninterrupted 3-step LoRA run whose KL reference is reset (to the adapters of then) after step 1."""
    from mmrl.run import train

    run = tmp_path_factory.mktemp("lora") / "run"
    train(lora_config("plugins={t_lora_probe: {tag: straight, reset_at: 1}}"), run_dir=run, show_progress=False)
    return run


@pytest.mark.slow
def test_a_lora_run_trains_only_the_adapters(lora_run: Path) -> None:
    rec = PROBES["straight"]
    start, end = rec["start"], rec["end"]
    lora = [n for n in start if ".lora_" in n]
    assert lora and rec["trainable"] == sorted(lora)
    assert all(".language_model." in n for n in lora)  # the vision tower has no adapters
    for name in start:
        if name not in lora:
            assert torch.equal(start[name], end[name]), name  # base weights bitwise unchanged
    b = [n for n in lora if ".lora_B." in n]
    assert all(not start[n].any() for n in b)  # PEFT starts B at 0: the run starts at the base model
    assert all(end[n].any() for n in b)  # every adapter learned
    # the KL reference is the policy's own model, adapters swapped (no copy of the weights)
    assert isinstance(rec["ref_start"], AdapterReference) and rec["ref_start"].state is None  # the base model
    ref = rec["ref"]
    assert isinstance(ref, AdapterReference) and ref.model is ref.policy.model
    assert ref.state is not None  # reset after step 1: the adapters of then
    # checkpoints: adapters (PEFT format) and trainer state, no full weights; the reference's adapters
    ckpt = lora_run / "checkpoint-3"
    assert (ckpt / "adapter_config.json").is_file() and (ckpt / "adapter_model.safetensors").is_file()
    assert not (ckpt / "model.safetensors").exists() and (ckpt / "trainer_state.pt").is_file()
    assert (ckpt / "reference_adapter.safetensors").is_file()
    saved = load_file(ckpt / "adapter_model.safetensors")
    assert len(saved) == len(lora)
    assert all(torch.equal(saved[k.replace(".default", "")].cpu(), end[k.removeprefix("base_model.model.")])
               for k in (f"base_model.model.{n}" for n in lora))
    # final: the merged model (no adapter layers) and the adapters beside it
    final = lora_run / "final"
    merged = load_file(final / "model.safetensors")
    assert not any("lora_" in k or "base_layer" in k for k in merged)
    assert (final / ADAPTER_DIR / "adapter_config.json").is_file()
    assert load_file(final / ADAPTER_DIR / "adapter_model.safetensors").keys() == saved.keys()


@pytest.mark.slow
def test_an_interrupted_lora_run_resumes_to_the_same_end(lora_run: Path, tmp_path: Path) -> None:
    from mmrl.run import train

    run = tmp_path / "run"
    with pytest.raises(KeyboardInterrupt):  # in step 3, after checkpoint-2 (the reference was reset at 1)
        train(lora_config("plugins={t_lora_probe: {tag: killed, reset_at: 1, crash_at: 2}}"), run_dir=run,
              show_progress=False)
    assert (run / "checkpoint-2").is_dir() and not (run / "checkpoint-3").exists()
    assert (run / "checkpoint-2" / "reference_adapter.safetensors").is_file()
    train(lora_config("plugins={t_lora_probe: {tag: resumed, reset_at: 1}}"), run_dir=run, resume=True,
          show_progress=False)
    a = load_file(lora_run / "final" / ADAPTER_DIR / "adapter_model.safetensors")
    b = load_file(run / "final" / ADAPTER_DIR / "adapter_model.safetensors")
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    ra = load_file(lora_run / "checkpoint-3" / "reference_adapter.safetensors")
    rb = load_file(run / "checkpoint-3" / "reference_adapter.safetensors")
    assert ra.keys() == rb.keys() and all(torch.equal(ra[k], rb[k]) for k in ra)
    drop = ("time/", "memory/")
    rows_a = [{k: v for k, v in r.items() if not k.startswith(drop) and k != "time"} for r in rl_rows(lora_run)]
    rows_b = [{k: v for k, v in r.items() if not k.startswith(drop) and k != "time"} for r in rl_rows(run)]
    assert rows_a == rows_b
    assert any(r.get("kl", 0) > 0 for r in rows_a[1:])  # the reset reference differs from the policy


def _prompts(policy: Policy) -> list:
    questions = ["what colour is the sky", "name a fruit", "count to three", "say hello"]
    return [policy.encode(policy.render([{"role": "user", "content": [{"type": "text", "text": q}]}]))
            for q in questions]


def _greedy(policy: Policy, seqs: list) -> list[list[int]]:
    with policy.inference():
        return [g[0].token_ids for g in policy.generate(seqs, max_new_tokens=8, do_sample=False)]


def _lora_policy(family: str, seed: int = 0) -> Policy:
    """The tiny base model with adapters whose B weights are random (a real change of the answers)."""
    from mmrl.toy.tiny_models import ensure_tiny

    policy = load_policy(ensure_tiny(family), device="cpu")
    apply_lora(policy, LoraSettings(r=4))
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in policy.model.named_parameters():
            if ".lora_B." in name:
                p.copy_(0.2 * torch.randn(p.shape, generator=gen))
    return policy


@pytest.mark.slow
def test_the_runs_merged_export_answers_as_its_adapters(lora_run: Path, tmp_path: Path) -> None:
    from peft import PeftModel
    from transformers import AutoModelForImageTextToText

    from mmrl.toy.tiny_models import ensure_tiny

    base_dir = ensure_tiny("qwen2_5_vl")
    adapted = load_policy(base_dir, device="cpu")
    apply_lora(adapted, LoraSettings(r=4))
    load_adapters(adapted, lora_run / "final")  # its adapter/ folder
    merged = load_policy(lora_run / "final", device="cpu")
    seqs = _prompts(adapted)
    assert _greedy(merged, seqs) == _greedy(adapted, seqs)
    # PEFT's own loader reads the adapters too
    peft = PeftModel.from_pretrained(AutoModelForImageTextToText.from_pretrained(base_dir),
                                     str(lora_run / "final" / ADAPTER_DIR))
    assert all(torch.equal(p, adapted.model.get_parameter(n.removeprefix("base_model.model.")))
               for n, p in peft.named_parameters() if ".lora_" in n)
    # mmrl eval --model final evaluates the merged export
    from mmrl.config import resume_run_config
    from mmrl.run import load_split

    cfg = resume_run_config(lora_run / "config.yaml")
    _, info = load_split(cfg, "test", show_progress=False)
    out = tmp_path / "eval"
    assert cli.main(["eval", "--quiet", "--model", str(lora_run / "final"), "--eval-data", info["path"],
                     "--out", str(out)]) == 0
    assert json.loads((out / "metrics.json").read_text())["n"] == info["used"]


@pytest.mark.slow
def test_a_lora_checkpoint_evaluates_as_its_merged_model(lora_run: Path, tmp_path: Path) -> None:
    """``mmrl eval --model runs/r/checkpoint-N`` on a LoRA run: the checkpoint holds adapters only; it loads
    as its base model with the adapters merged (the same answers as the run's merged final export, taken after
    the same last step), and a base that cannot be found is a clear error."""
    import shutil

    from mmrl_common.errors import MmrlError

    ckpt = lora_run / "checkpoint-3"
    saved = json.loads((ckpt / "adapter_config.json").read_text())["base_model_name_or_path"]
    assert Path(saved).is_absolute()  # found from any working directory
    from_ckpt, final = load_policy(ckpt, device="cpu"), load_policy(lora_run / "final", device="cpu")
    seqs = _prompts(final)
    assert _greedy(from_ckpt, seqs) == _greedy(final, seqs)
    from mmrl.config import resume_run_config
    from mmrl.run import load_split

    _, info = load_split(resume_run_config(lora_run / "config.yaml"), "test", show_progress=False)
    assert cli.main(["eval", "--quiet", "--model", str(ckpt), "--eval-data", info["path"],
                     "--out", str(tmp_path / "eval")]) == 0
    lost = tmp_path / "moved" / "checkpoint-3"
    shutil.copytree(ckpt, lost)
    cfg = json.loads((lost / "adapter_config.json").read_text())
    (lost / "adapter_config.json").write_text(json.dumps({**cfg, "base_model_name_or_path": "models/gone"}))
    with pytest.raises(MmrlError, match="base model was not found.*models/gone"):
        load_policy(lost, device="cpu")


@pytest.mark.parametrize("family", ["qwen2_vl", "qwen2_5_vl", "qwen3_vl"])
def test_merged_export_loads_and_gives_the_adapter_models_greedy_answers(family: str, tmp_path: Path) -> None:
    from transformers import AutoModelForImageTextToText

    policy = _lora_policy(family)
    names = [n for n, _ in policy.model.named_modules() if n.endswith(".q_proj")]
    assert names and all(n.startswith("model.language_model.") for n in names)
    live = {n: p.detach().clone() for n, p in policy.model.named_parameters()}
    merged_export(policy, policy.processor, tmp_path / "merged")
    assert all(torch.equal(live[n], p) for n, p in policy.model.named_parameters())  # the live model untouched
    model = AutoModelForImageTextToText.from_pretrained(tmp_path / "merged")
    merged = Policy(model, policy.processor)
    seqs = _prompts(policy)
    answers = _greedy(policy, seqs)
    assert _greedy(merged, seqs) == answers
    with disabled_adapters(policy):
        assert _greedy(policy, seqs) != answers  # the adapters do change the answers: the merge carries them


def test_reference_logprobs_with_adapters_disabled_are_the_base_models(tmp_path: Path) -> None:
    from mmrl.toy.tiny_models import ensure_tiny

    policy = _lora_policy("qwen2_5_vl")
    base = load_policy(ensure_tiny("qwen2_5_vl"), device="cpu")
    seqs = [s.extend(s.ids[-5:], trained=True) for s in _prompts(policy)]
    ref = AdapterReference(policy, adapter_state(policy) | {n: torch.zeros_like(t) for n, t in
                                                          adapter_state(policy).items() if ".lora_B." in n})
    assert ref.state is None  # adapters that change nothing: the reference is the base model
    with ref.inference():
        ref_lp, _, mask = ref.forward_logprobs(seqs)
    with base.inference():
        base_lp, _, _ = base.forward_logprobs(seqs)
    with policy.inference():
        pol_lp, _, _ = policy.forward_logprobs(seqs)
    assert torch.equal(ref_lp, base_lp)
    assert not torch.allclose(pol_lp[mask > 0], base_lp[mask > 0])  # the adapters are back on afterwards
    # a reference holding other adapter weights swaps them in for its passes and puts the live ones back
    live = adapter_state(policy)
    other = {n: t * 0.5 if ".lora_B." in n else t for n, t in live.items()}
    with ref.inference():
        other_lp, _, _ = AdapterReference(policy, other).forward_logprobs(seqs)
    assert all(torch.equal(live[n], p) for n, p in adapter_state(policy).items())
    assert not torch.equal(other_lp, pol_lp) and not torch.equal(other_lp, base_lp)


def test_adapters_save_and_load_exactly_and_train_under_gradient_checkpointing(tmp_path: Path) -> None:
    policy = _lora_policy("qwen3_vl", seed=1)
    save_adapters(policy, tmp_path / "a")
    assert sorted(p.name for p in (tmp_path / "a").iterdir()) == ["adapter_config.json", "adapter_model.safetensors"]
    other = _lora_policy("qwen3_vl", seed=2)
    load_adapters(other, tmp_path / "a")
    assert all(torch.equal(a, b) for a, b in zip(adapter_state(policy).values(), adapter_state(other).values()))
    # gradient checkpointing: the frozen base still passes gradients to the adapters
    checkpointing_switch(policy.model, True)
    policy.model.train()
    seqs = [s.extend(s.ids[-3:], trained=True) for s in _prompts(policy)[:2]]
    logp, _, mask = policy.forward_logprobs(seqs)
    (logp * mask).sum().backward()
    grads = [p.grad for n, p in policy.model.named_parameters() if ".lora_A." in n]
    assert grads and all(g is not None and g.any() for g in grads)
    assert all(p.grad is None for n, p in policy.model.named_parameters() if ".lora_" not in n)


def test_lora_settings_are_checked() -> None:
    assert load_run_config("video-qa", overrides=[*TINY_RUN]).model.lora is None  # off by default
    cfg = load_run_config("video-qa", overrides=[*TINY_RUN, "model.lora={r: 8}"])
    assert (cfg.model.lora.r, cfg.model.lora.alpha, cfg.model.lora.dropout) == (8, 32, 0.05)
    assert load_run_config("video-qa", overrides=[*TINY_RUN, "model.lora.alpha=16"]).model.lora.alpha == 16
    with pytest.raises(ConfigError, match=r"unknown config key 'model\.lora\.rank'"):
        load_run_config("video-qa", overrides=[*TINY_RUN, "model.lora={rank: 8}"])
    with pytest.raises(ConfigError, match=r"model\.lora\.r=0"):
        load_run_config("video-qa", overrides=[*TINY_RUN, "model.lora={r: 0}"])
