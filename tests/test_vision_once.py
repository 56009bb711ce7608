"""The vision tower once per step (issue 11, item 4), on the real tiny Qwen2.5-VL and the toy colour videos.

* Frozen tower (model.freeze_vision and freeze_merger): a whole GRPO step with a reference, an old-logprob
  pass and two PPO epochs over mini-batches runs the tower exactly once per unique media item, counted by
  the towers' own forward hooks (the policy's and the reference's);
* trainable tower: the passes without gradient share one encoding per model (rollout and old log-probs on
  the policy, one for the reference); the passes with gradient run the tower as before;
* on or off (model.cache_vision_features), every logged number and the trained weights are the same;
* the cache follows the weights: an in-place change, swapped tensors, ``weights_changed()``, a reference
  whose tower differs from the policy's, LoRA adapters on the tower switched off: each encodes again, and
  every result equals the uncached one.
* a media key names one picture: the same key with other pixels is an error.
"""

from __future__ import annotations

import copy
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file
from tiny_runs import TINY_RUN, module_cache, run_rl  # noqa: F401 (module_cache is a fixture)

from mmrl.engine.plugins import Callback, register_plugin
from mmrl.model import MediaInput, Policy

pytestmark = pytest.mark.usefixtures("module_cache")

FROZEN = ("model.freeze_vision=true", "model.freeze_merger=true")
# a reference (KL), old log-probs (two mini-batches, two PPO epochs) and micro-batches of 3 over 2 prompts x 4
STEP = ("grpo.kl_coef=0.05", "grpo.ppo_epochs=2", "grpo.ppo_mini_batch_size=4", "train.lr=1e-3",
        "plugins={t_vision_count: {}}")


@register_plugin("t_vision_count")
class VisionCount(Callback):
    """Logs per step: ``t/tower_runs`` (forward calls of the policy's and the reference's vision towers, by
    their hooks), ``t/store_runs`` (the runs the shared media store counted), ``t/unique_media`` (distinct
    media items in the step's batch) and ``t/grad_runs`` (one per unique item per micro-batch per update
    pass: what the passes with gradient run without a cache)."""

    def on_train_start(self) -> None:
        self.mark = self._counts()
        self.row: dict[str, float] = {}

    def _counts(self) -> tuple[int, int]:
        t = self.ctx._trainer  # the probe looks inside the trainer
        runs = t.policy.vision_calls
        if isinstance(t.ref, Policy):  # a copy of the model with its own tower (LoRA: the policy's own)
            runs += t.ref.vision_calls
        return runs, t.policy.media.vision_calls

    def after_update(self, batch, stats) -> None:
        t = self.ctx._trainer
        seqs, _ = batch.micro_batch(list(range(len(batch))))
        keys = [s.media for s in seqs]
        micro = t.cfg.train.micro_batch_size
        per_epoch = 0
        for rows in batch.minibatches(t.cfg.grpo.ppo_mini_batch_size):
            for c0 in range(0, len(rows), micro):
                per_epoch += len({k for r in rows[c0:c0 + micro] for k in keys[r]})
        self.row = {"t/unique_media": len({k for ks in keys for k in ks}),
                    "t/grad_runs": per_epoch * t.cfg.grpo.ppo_epochs}

    def on_step_end(self, step: int, stats: dict) -> None:
        now = self._counts()
        stats["t/tower_runs"], stats["t/store_runs"] = now[0] - self.mark[0], now[1] - self.mark[1]
        stats.update(self.row)
        self.mark = now


def _final_weights(tmp_path: Path) -> dict[str, torch.Tensor]:
    return load_file(str(tmp_path / "run" / "final" / "model.safetensors"))


def _same_run(a: list[dict], b: list[dict]) -> None:
    """Every logged number equal (timings, memory and the vision counts aside)."""
    skip = ("time/", "memory/", "t/", "vision_calls")
    assert len(a) == len(b)
    for ra, rb in zip(a, b):
        keys = {k for k in ra if not k.startswith(skip)}
        assert keys == {k for k in rb if not k.startswith(skip)}
        for k in keys:
            assert ra[k] == rb[k] or (ra[k] != ra[k] and rb[k] != rb[k]), k  # equal, or both NaN


def _same_weights(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> None:
    assert a.keys() == b.keys()
    for k, t in a.items():
        assert torch.equal(t, b[k]), k


# ------------------------------------------------------------------------------------------------ steps
@pytest.mark.slow
def test_frozen_tower_encodes_each_item_once_per_step_and_changes_nothing(tmp_path: Path) -> None:
    on = run_rl(tmp_path / "on", *FROZEN, *STEP)
    for r in on:
        assert r["optimizer_steps"] == 4 and "kl" in r  # off-policy updates against a reference ran
        assert r["t/unique_media"] >= 2
        assert r["t/tower_runs"] == r["t/unique_media"]  # rollout, reference, old and 4 updates: once each
        assert r["t/store_runs"] == r["t/tower_runs"]
    off = run_rl(tmp_path / "off", *FROZEN, *STEP, "model.cache_vision_features=false")
    for r in off:  # without the cache every pass encodes again (the policy's update passes alone: grad_runs)
        assert r["t/tower_runs"] > r["t/grad_runs"] + r["t/unique_media"]
    assert on[0]["t/unique_media"] == off[0]["t/unique_media"]
    _same_run(on, off)
    _same_weights(_final_weights(tmp_path / "on"), _final_weights(tmp_path / "off"))
    assert any(r["kl"] != 0 for r in on)  # the weights moved: the equality is not that of an untrained model


@pytest.mark.slow
def test_trainable_tower_shares_the_passes_without_gradient(tmp_path: Path) -> None:
    on = run_rl(tmp_path / "on", *STEP)
    for r in on:
        # the policy: one encoding for rollout and old log-probs, then every update pass with gradient; the
        # reference (its own copy of the tower): one encoding
        assert r["t/tower_runs"] == 2 * r["t/unique_media"] + r["t/grad_runs"]
    off = run_rl(tmp_path / "off", *STEP, "model.cache_vision_features=false")
    for r in off:
        assert r["t/tower_runs"] > 2 * r["t/unique_media"] + r["t/grad_runs"]
    _same_run(on, off)
    _same_weights(_final_weights(tmp_path / "on"), _final_weights(tmp_path / "off"))


@pytest.mark.slow
def test_the_trainer_logs_the_steps_vision_calls(tmp_path: Path) -> None:
    """Needs the trainer's ``stats["vision_calls"]`` (tower runs of the step, from ``policy.media``)."""
    rows = run_rl(tmp_path, *FROZEN, *STEP, "train.steps=1")
    assert rows[0]["vision_calls"] == rows[0]["t/store_runs"] == rows[0]["t/unique_media"]


# ------------------------------------------------------------------------------------------------ passes
@pytest.fixture(scope="module")
def tiny_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from mmrl.toy.tiny_models import make_tiny

    return make_tiny("qwen2_5_vl", tmp_path_factory.mktemp("vision-once") / "m", seed=0)


@pytest.fixture(scope="module")
def tiny_policy(tiny_dir: Path) -> Policy:
    from mmrl.model import load_policy

    return load_policy(tiny_dir, device="cpu")


def _seqs(policy: Policy) -> list:
    """Two prompts with one image each, two completions each (the second image shown twice)."""
    from PIL import Image

    seqs = []
    for i in range(2):
        img = Image.new("RGB", (56, 56), (40 * i + 30, 200 - 50 * i, 90))
        img.paste((250, 10 * i, 20), (8, 8, 30, 40))
        item = MediaInput(key=f"img{i}", kind="image", data=img)
        text = policy.render([{"role": "user", "content": [{"type": "image"}, {"type": "text", "text": "Colour?"}]}])
        prompt = policy.encode(text, [item])
        seqs += [prompt.extend([100 + i, 200, 300 + j], trained=True) for j in range(2)]
    return seqs


def _logps(policy: Policy, seqs: list, *, cache: bool = True) -> torch.Tensor:
    policy.configure(cache_vision_features=cache)
    try:
        with policy.inference():
            return policy.forward_logprobs(seqs)[0]
    finally:
        policy.configure(cache_vision_features=True)


def _fresh(policy: Policy, *, vision: bool) -> list:
    policy.clear_media()
    policy.set_trainable(vision=vision, merger=vision)
    return _seqs(policy)


def test_trainable_tower_cache_follows_the_weights(tiny_policy: Policy) -> None:
    p = tiny_policy
    seqs = _fresh(p, vision=True)
    runs = p.vision_calls
    first = _logps(p, seqs)
    assert p.vision_calls - runs == 2
    assert torch.equal(_logps(p, seqs), first) and p.vision_calls - runs == 2  # reused
    p.model.train()
    lp, _, _ = p.forward_logprobs(seqs)  # with gradient: the tower runs (and trains)
    lp.sum().backward()
    assert p.vision_calls - runs == 4
    assert any(q.grad is not None for q in p.base.visual.parameters())
    p.model.zero_grad(set_to_none=True)
    weight = next(p.base.visual.parameters())
    try:
        with torch.no_grad():
            weight.add_(0.05)  # in place, as an optimizer step
        moved = _logps(p, seqs)
        assert p.vision_calls - runs == 6
        assert torch.equal(moved, _logps(p, seqs, cache=False)) and not torch.equal(moved, first)
        p.weights_changed()  # said explicitly: encoded again
        _logps(p, seqs)
        assert p.vision_calls - runs == 10
        old = weight.data
        weight.data = old.clone()  # a swapped tensor (same values): a new storage, encoded again
        assert torch.equal(_logps(p, seqs), moved) and p.vision_calls - runs == 12
    finally:
        with torch.no_grad():
            weight.sub_(0.05)
    # only the features of the weights of now are kept: one entry per item
    assert all(len(m.features) == 1 for m in p.media.values())


def test_frozen_tower_shared_with_an_identical_reference_only(tiny_policy: Policy) -> None:
    p = tiny_policy
    seqs = _fresh(p, vision=False)
    ref_model = copy.deepcopy(p.model).eval()
    for q in ref_model.parameters():
        q.requires_grad_(False)
    ref = Policy(ref_model, p.processor, media=p.media)  # the media store shared, as Policy.reference does
    runs, stored = p.vision_calls, p.media.vision_calls
    base = _logps(p, seqs)
    assert torch.equal(_logps(ref, seqs), base)
    p.model.train()
    lp, _, _ = p.forward_logprobs(seqs)  # with gradient, frozen tower: the cached features
    assert torch.equal(lp.detach(), base)
    assert p.vision_calls - runs == 2 and ref.vision_calls == 0 and p.media.vision_calls - stored == 2
    p.model.eval()
    with torch.no_grad():
        next(ref.base.visual.parameters()).add_(0.05)  # a reference whose tower differs
    changed = _logps(ref, seqs)
    assert ref.vision_calls == 2 and not torch.equal(changed, base)
    assert torch.equal(changed, _logps(ref, seqs, cache=False))
    p.clear_media()
    assert len(p.media) == 0 and len(ref.media) == 0


def test_lora_on_the_tower_reference_encodes_its_own(tiny_dir: Path) -> None:
    from mmrl.config import LoraSettings
    from mmrl.model import load_policy
    from mmrl.model.lora import AdapterReference, apply_lora

    p = load_policy(tiny_dir, device="cpu")  # a policy of its own: adapters go in place
    p.set_trainable(vision=False, merger=False, llm=False)
    apply_lora(p, LoraSettings(r=4, target_modules=r".*visual\.blocks\.\d+\.attn\.qkv"))
    with torch.no_grad():
        for n, q in p.model.named_parameters():
            if ".lora_B." in n:
                q.normal_(0, 0.5)
    seqs = _seqs(p)
    ref = AdapterReference(p)  # the adapters disabled: another tower
    runs = p.vision_calls
    mine = _logps(p, seqs)
    with p.inference():
        theirs = ref.forward_logprobs(seqs)[0]
    assert p.vision_calls - runs == 4  # the reference did not take the policy's features
    assert not torch.equal(mine, theirs)
    p.configure(cache_vision_features=False)
    with p.inference():
        assert torch.equal(ref.forward_logprobs(seqs)[0], theirs)
    p.configure(cache_vision_features=True)
    assert torch.equal(_logps(p, seqs), mine)


def test_a_media_key_cannot_be_reused_for_other_pixels(tiny_dir: Path) -> None:
    from PIL import Image

    from mmrl.model import load_policy
    from mmrl_common.errors import MmrlError

    policy = load_policy(tiny_dir, device="cpu")
    text = policy.render([{"role": "user", "content": [{"type": "image"}, {"type": "text", "text": "hi"}]}])
    red, blue = Image.new("RGB", (56, 56), (255, 0, 0)), Image.new("RGB", (56, 56), (0, 0, 255))
    policy.encode(text, [MediaInput("same-key", "image", red)])
    policy.encode(text, [MediaInput("same-key", "image", red)])  # the same pixels again: fine
    with pytest.raises(MmrlError, match="same-key.*different pixels"):
        policy.encode(text, [MediaInput("same-key", "image", blue)])
