"""Padding-free micro-batches and micro-batches by a token budget (issue 37, part B).

Real tiny models of all three families (random weights), real processors, image and video prompts:

* packed log-prob passes (``Policy.padding_free``) give the padded batch's log-probs, entropies and every
  parameter's gradient (vision tower, merger, language model, LM head) within fp32 round-off, with sdpa (the
  rows the cost model picks, and one row: the layout flash attention gets on a GPU) and with eager, on the
  plain path and on the shared-prefix path (its first pass packed), under activation checkpointing too;
* the packed rows really are packed (fewer rows, no padding in one row; the shared path's prompts once, back
  to back) and each sequence's M-RoPE positions in them are its own, the ones it gets alone;
* the flash-attention arguments are the sequence lengths transformers itself reads off the positions;
* ``train.micro_batch_tokens``: micro-batches within the budget, in order, a longer row alone; every rank
  the same number of passes; one GRPO update by a token budget (packed) has the loss and gradients of the
  update by a row count (padded).
"""

from __future__ import annotations

import functools
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
import torch
from synthetic_media import image, prompt, video

from mmrl.config import TrainConfig, load_run_config
from mmrl.engine.batch import shared_prefixes
from mmrl.model import (
    FAMILIES,
    Policy,
    PolicyOptions,
    RankBinding,
    TokenSeq,
    checkpointing_switch,
    load_policy,
    packing,
    passes,
    shared_prefix,
)
from mmrl.model.types import has_linear_attention
from mmrl.toy.tiny_models import make_tiny
from mmrl_common.errors import ConfigError

# The families whose log-prob passes take mmrl's shortcuts (packing, the shared prefix); Qwen3.5's recurrent
# layers refuse them (mmrl.model.recurrent), measured in tests/test_qwen3_5.py
SHORTCUT_FAMILIES = tuple(f for f in FAMILIES if not has_linear_attention(f))


def answer(policy: Policy, n: int, seed: int) -> list[int]:
    """``n`` random text tokens and <|im_end|>."""
    g = torch.Generator().manual_seed(2000 + seed)
    return torch.randint(100, 1000, (n,), generator=g).tolist() + [policy.tokenizer.convert_tokens_to_ids("<|im_end|>")]


def group(policy: Policy, p: TokenSeq, lengths: list[int], seed: int) -> list[TokenSeq]:
    return [p.extend(answer(policy, n, seed + i), trained=True) for i, n in enumerate(lengths)]


def loss_of(logp: torch.Tensor, ent: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Different weights per token, so a wrong row or position shows in the gradients."""
    w = torch.linspace(-1.0, 2.0, mask.numel(), device=mask.device).view(mask.shape) * mask
    return (logp * w).sum() + 0.3 * (ent * w.flip(-1)).sum()


class Layer0:
    """The (rows, width) of every call of the first decoder layer, and the attention mask it got."""

    def __init__(self, policy: Policy):
        self.calls: list[tuple[tuple[int, int], Any]] = []

        def hook(_m: Any, args: tuple, kwargs: dict) -> None:
            h = args[0] if args else kwargs["hidden_states"]
            mask = kwargs.get("attention_mask")
            self.calls.append((tuple(h.shape[:2]), None if mask is None else tuple(mask.shape)))

        self.handle = policy.base.language_model.layers[0].register_forward_pre_hook(hook, with_kwargs=True)

    def close(self) -> None:
        self.handle.remove()


def run(policy: Policy, seqs: list[TokenSeq], *, shared: bool, mode: str, **kw: Any):
    """One forward and backward; ``mode``: padded, packed (the rows the cost model picks) or one_row."""
    policy.configure(padding_free=mode != "padded")
    policy.configure(pack_one_row=True if mode == "one_row" else None)
    policy.model.zero_grad(set_to_none=True)
    probe = Layer0(policy)
    try:
        logp, ent, mask = policy.forward_logprobs(seqs, temperature=0.9, with_entropy=True, entropy_grad=True,
                                                  shared_prefix=shared, **kw)
        loss_of(logp, ent, mask).backward()
    finally:
        probe.close()
        policy.configure(padding_free=True, pack_one_row=None)
    grads = {n: p.grad.clone() for n, p in policy.model.named_parameters() if p.grad is not None}
    return logp.detach(), ent.detach(), mask, grads, probe.calls


def assert_same(policy: Policy, seqs: list[TokenSeq], *, shared: bool, modes=("packed", "one_row"),
                vision: bool = True, **kw: Any) -> dict[str, list]:
    """Every mode against the padded batch; returns each mode's first-layer calls."""
    ref_logp, ref_ent, ref_mask, ref_grads, padded_calls = run(policy, seqs, shared=shared, mode="padded", **kw)
    assert int(ref_mask.sum()) > 0
    calls = {"padded": padded_calls}
    for mode in modes:
        logp, ent, mask, got, calls[mode] = run(policy, seqs, shared=shared, mode=mode, **kw)
        assert torch.equal(mask, ref_mask)
        torch.testing.assert_close(logp, ref_logp, rtol=1e-5, atol=1e-5 * float(ref_logp.abs().max()))
        torch.testing.assert_close(ent, ref_ent, rtol=1e-5, atol=1e-5 * float(ref_ent.abs().max()))
        assert got.keys() == ref_grads.keys()
        if vision:  # the vision tower, its merger, the language model and the head all receive gradients
            assert any(n.startswith("model.visual.") and "merger" not in n for n in got)
            assert any("merger" in n for n in got)
        assert "lm_head.weight" in got and any("language_model.layers.0." in n for n in got)
        for name, g in ref_grads.items():  # fp32 round-off, relative to the gradient's own scale
            err = float((got[name] - g).abs().max())
            assert err <= 2e-5 * float(g.abs().max()) + 1e-9, f"{mode} {name}: max error {err}"
    return calls


# ------------------------------------------------------------------------------------------------ fixtures
@pytest.fixture(scope="module")
def folders(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root: Path = tmp_path_factory.mktemp("packing-models")
    return {family: make_tiny(family, root / family, seed=0) for family in FAMILIES}


@functools.cache
def _loaded(folder: Path, attn: str) -> Policy:
    policy = load_policy(folder, device="cpu", attn_implementation=attn)
    policy.set_trainable()  # vision tower, merger and language model all train
    policy.model.train()
    return policy


@pytest.fixture
def policy_of(folders: dict[str, Path]):
    def get(family: str, attn: str = "sdpa") -> Policy:
        p = _loaded(folders[family], attn)
        p.media.clear()
        p.configure(padding_free=True, pack_one_row=None)
        return p
    return get


def mixed_batch(policy: Policy, family: str, kind: str) -> list[TokenSeq]:
    """A long prompt's group of ragged completions, two short prompts' groups and a group of one."""
    if kind == "video":
        long = [video(family, "v-long", frames=8, side=8, seed=1)]
        short = [[video(family, "v1", frames=2, side=2, seed=2)], [video(family, "v2", frames=2, side=4, seed=3)]]
    else:
        long = [image(family, "i-long", w=8, h=6, seed=1)]
        short = [[image(family, "i1", w=2, h=2, seed=2)], [image(family, "i2", w=2, h=1, seed=3)]]
    pl = prompt(policy, long, "What happens here, and why?")
    p1, p2 = prompt(policy, short[0], "Colour?"), prompt(policy, short[1], "Count.")
    alone = prompt(policy, [image(family, "alone", seed=4)], "Alone?")
    assert len(pl) > 2 * max(len(p1), len(p2))  # short rows fit beside each other within the longest
    return (group(policy, pl, [3, 9, 1], seed=0) + group(policy, p1, [6, 2, 4], seed=10)
            + group(policy, p2, [5, 1], seed=20) + group(policy, alone, [7], seed=30))


# ------------------------------------------------------------------------------------------------ forward
@pytest.mark.parametrize("family", SHORTCUT_FAMILIES)
@pytest.mark.parametrize("kind", ["image", "video"])
def test_packed_equals_padded(policy_of, family: str, kind: str) -> None:
    """The plain path: values and every gradient as padded; the rows really are packed."""
    policy = policy_of(family)
    seqs = mixed_batch(policy, family, kind)
    vision = policy.video_token_id if kind == "video" else policy.image_token_id
    assert seqs[0].ids.count(vision) >= 16
    calls = assert_same(policy, seqs, shared=False)
    assert calls["padded"][0][0] == (len(seqs), max(len(s) for s in seqs))
    rows, width = calls["packed"][0][0]
    assert rows < len(seqs) and width == max(len(s) for s in seqs)  # short sequences share rows
    total = sum(len(s) for s in seqs)
    assert calls["one_row"][0] == ((1, total), (1, 1, total, total))  # no padding; a block-diagonal 4-D mask
    assert_same(policy, seqs, shared=False, modes=("one_row",), chunk_tokens=5)  # the chunked head: same rows


@pytest.mark.parametrize("family", SHORTCUT_FAMILIES)
@pytest.mark.parametrize("kind", ["image", "video"])
def test_shared_prefix_packed(policy_of, family: str, kind: str) -> None:
    """The shared-prefix path with its first pass packed: the group prompts and the group of one back to
    back, each prompt once; the continuations (pass 2, padded) read their prompt out of the packed rows."""
    policy = policy_of(family)
    seqs = mixed_batch(policy, family, kind)
    plan = shared_prefix.prefix_plan(seqs)
    assert plan is not None and [n > 0 for _, n in plan] == [True, True, True, False]
    policy.configure(shared_prefix_one_pass=False)  # the two passes (flash attention's; sdpa's where they cost less)
    try:
        calls = assert_same(policy, seqs, shared=True)
    finally:
        policy.configure(shared_prefix_one_pass=None)
    pass1 = sum(n for _, n in plan[:3]) + len(seqs[-1])
    assert calls["one_row"][0][0] == (1, pass1)  # each prompt once, no padding
    shared_rows = sum(len(rows) for rows, n in plan if n > 0)
    assert calls["one_row"][1][0][0] == shared_rows  # pass 2: one padded row per continuation
    assert calls["packed"][0][0][0] < len(plan)  # the two short prompts share a row


@pytest.mark.parametrize("family", SHORTCUT_FAMILIES)
def test_eager_attention(policy_of, family: str) -> None:
    """eager: an additive block-diagonal mask; images and videos in one micro-batch, both paths."""
    policy = policy_of(family, "eager")
    assert packing.attention_impl(policy.base.language_model) == "eager"
    seqs = mixed_batch(policy, family, "image")[:6] + mixed_batch(policy, family, "video")[:3]
    for shared in (False, True):
        assert_same(policy, seqs, shared=shared)


@pytest.mark.parametrize("family", ["qwen2_5_vl", "qwen3_vl"])
def test_activation_checkpointing(policy_of, family: str) -> None:
    policy = policy_of(family)
    seqs = mixed_batch(policy, family, "video")
    checkpointing_switch(policy.model, True)
    try:
        for shared in (False, True):
            assert_same(policy, seqs, shared=shared)
    finally:
        checkpointing_switch(policy.model, False)


@pytest.mark.parametrize("family", ["qwen2_5_vl", "qwen3_vl"])
def test_text_only_and_gradient_free(policy_of, family: str) -> None:
    """Text-only prompts (plain positions on every axis) beside an image group; the gradient-free passes of
    the reference and old log-probs pack too."""
    policy = policy_of(family)
    text = policy.encode(policy.render([{"role": "user", "content": [{"type": "text", "text": "Count to 3."}]}]))
    seqs = group(policy, text, [4, 2, 7], seed=3) + mixed_batch(policy, family, "image")[3:6]
    assert_same(policy, seqs, shared=False, vision=True)
    assert_same(policy, seqs, shared=True, vision=True)
    with policy.inference():
        policy.configure(padding_free=False)
        ref = policy.forward_logprobs(seqs, with_entropy=True)
        policy.configure(padding_free=True, pack_one_row=True)
        got = policy.forward_logprobs(seqs, with_entropy=True)
        policy.configure(pack_one_row=None)
    for a, b in zip(got[:2], ref[:2]):
        assert not a.requires_grad
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-5 * float(b.abs().max()))


@pytest.mark.parametrize("family", SHORTCUT_FAMILIES)
def test_positions_are_each_sequences_own(policy_of, family: str) -> None:
    """In the packed row, each sequence's M-RoPE positions are the ones it gets alone (the model's own rule,
    with Qwen2.5-VL's seconds per grid), and the text row restarts at 0; the language model's rotary
    embedding receives exactly those."""
    from synthetic_media import RopeProbe

    policy = policy_of(family)
    seqs = mixed_batch(policy, family, "video")
    batch = policy.pad(seqs, left=False)
    packed = passes.pack(policy, batch, policy.position_ids(batch, seqs), range(len(seqs)), [len(s) for s in seqs],
                          "flash_attention_2")
    assert packed.input_ids.shape == (1, sum(len(s) for s in seqs))
    for j, s in enumerate(seqs):
        alone = policy.position_ids(policy.pad([s], left=False), [s])[:, 0]
        lo, hi = int(packed.start[j]), int(packed.start[j]) + len(s)
        assert torch.equal(packed.position_ids[1:, 0, lo:hi], alone)
        assert torch.equal(packed.position_ids[0, 0, lo:hi], torch.arange(len(s)))
        assert packed.input_ids[0, lo:hi].tolist() == s.ids
    probe = RopeProbe(policy)
    try:
        policy.configure(pack_one_row=True)
        with policy.inference():
            policy.forward_logprobs(seqs, shared_prefix=False)
    finally:
        probe.close()
        policy.configure(pack_one_row=None)
    assert torch.equal(probe.seen[0], packed.position_ids[1:])


def test_flash_attention_arguments(policy_of) -> None:
    """The variable-length arguments flash attention gets (one row, no mask): the sequences' lengths in
    packed order, as transformers itself reads them off the text positions."""
    from transformers.modeling_flash_attention_utils import prepare_fa_kwargs_from_position_ids

    policy = policy_of("qwen2_5_vl")
    seqs = mixed_batch(policy, "qwen2_5_vl", "image")
    batch = policy.pad(seqs, left=False)
    lengths = [len(s) for s in seqs]
    packed = passes.pack(policy, batch, policy.position_ids(batch, seqs), range(len(seqs)), lengths, "flash_attention_2")
    kw = packed.model_kwargs("flash_attention_2", torch.bfloat16)
    assert kw["attention_mask"] is None
    (cu_q, cu_k), (max_q, max_k) = prepare_fa_kwargs_from_position_ids(packed.position_ids[0])
    assert kw["cu_seq_lens_q"].tolist() == cu_q.tolist() == cu_k.tolist() == [0, *torch.tensor(
        [lengths[j] for j in packed.order]).cumsum(0).tolist()]
    assert kw["max_length_q"] == kw["max_length_k"] == int(max_q) == int(max_k) == max(lengths)
    assert kw["cu_seq_lens_k"] is kw["cu_seq_lens_q"] and kw["cu_seq_lens_q"].dtype == torch.int32


def test_padded_when_off_or_unknown_attention(policy_of) -> None:
    policy = policy_of("qwen2_vl")
    assert passes.packing_impl(policy) == "sdpa"
    policy.configure(padding_free=False)
    assert passes.packing_impl(policy) is None
    policy.configure(padding_free=True)
    stub = SimpleNamespace(config=SimpleNamespace(_attn_implementation="flex_attention"))
    assert packing.attention_impl(stub) is None
    stub = SimpleNamespace(config=SimpleNamespace(_attn_implementation="flash_attention_2"))
    assert packing.attention_impl(stub) == "flash_attention_2"


# ------------------------------------------------------------------------------------------------ layouts
def test_layout_rows() -> None:
    lengths = [5, 9, 2, 7, 3, 1]
    assert packing.layout(lengths, one_row=True) == [[0, 1, 2, 3, 4, 5]]
    rows = packing.layout(lengths, one_row=False)  # capacity: the longest
    assert sorted(j for r in rows for j in r) == list(range(6))
    assert all(sum(lengths[j] for j in r) <= 9 for r in rows) and len(rows) == 3
    assert all(r == sorted(r) for r in rows)
    # attention-heavy rows (a tiny model): the longest as capacity; linear-heavy (a big one): one row
    assert len(packing.layout(lengths, one_row=False, cost=lambda w: w * (1.0 + 100.0 * w))) == 3
    # these fill rows of 9 exactly: fewer, longer rows have no fewer tokens and more attention
    assert len(packing.layout(lengths, one_row=False, cost=lambda w: w * (1e6 + w))) == 3
    lengths = [16, 9, 9, 1, 1, 1]  # rows of 16 hold 48 tokens, rows of 32 take 56, one row 37
    assert len(packing.layout(lengths, one_row=False, cost=lambda w: w * (1.0 + 100.0 * w))) == 3
    assert packing.layout(lengths, one_row=False, cost=lambda w: w * (1e6 + w)) == [[0, 1, 2, 3, 4, 5]]
    # never a larger mask than padding's (6 x 16 x 16): one row of 53 tokens would be 53 x 53
    lengths = [16, 9, 9, 9, 9, 1]
    rows = packing.layout(lengths, one_row=False, cost=lambda w: w * (1e6 + w))
    width = max(sum(lengths[j] for j in r) for r in rows)
    assert len(rows) * width ** 2 <= 6 * 16 ** 2 and len(rows) > 1


def test_row_cost_prefers_fewer_padded_tokens(policy_of) -> None:
    """By the tiny model's own sizes, rows about as long as the longest sequence; never more than padded."""
    policy = policy_of("qwen2_5_vl")
    cost = packing.row_cost(policy.base.language_model)
    lengths = [40, 150, 60, 35, 100, 45, 70, 30]
    rows = packing.layout(lengths, one_row=False, cost=cost)
    width = max(sum(lengths[j] for j in r) for r in rows)
    assert len(rows) * cost(width) <= len(lengths) * cost(max(lengths))
    assert len(rows) < len(lengths)


# ------------------------------------------------------------------------------------------------ token budget
def test_token_budget_chunks() -> None:
    rows = [10, 11, 12, 13, 14, 15, 16]
    lengths = [30, 50, 20, 120, 40, 40, 21]
    chunks = packing.token_budget_chunks(rows, lengths, 100)
    assert chunks == [[10, 11, 12], [13], [14, 15], [16]]
    assert [r for c in chunks for r in c] == rows  # order kept
    of = dict(zip(rows, lengths))
    assert all(sum(of[r] for r in c) <= 100 or len(c) == 1 for c in chunks)
    assert packing.token_budget_chunks(rows, lengths, 1) == [[r] for r in rows]  # every row alone
    assert packing.token_budget_chunks(rows, lengths, 10_000) == [rows]
    assert packing.token_budget_chunks([], [], 5) == []
    with pytest.raises(ValueError):
        packing.token_budget_chunks(rows, lengths, 0)


def test_token_budget_chunks_keep_a_group_whole_where_it_fits() -> None:
    rows = list(range(8))
    lengths = [30, 30, 30, 30, 30, 30, 200, 10]
    groups = [0, 0, 1, 1, 1, 2, 2, 3]
    # by rows alone group 1 would be cut after its first row (30 + 30 + 30 fits, the next does not)
    assert packing.token_budget_chunks(rows, lengths, 100) == [[0, 1, 2], [3, 4, 5], [6], [7]]
    chunks = packing.token_budget_chunks(rows, lengths, 100, groups=groups)
    # group 1 (90 tokens) starts a micro-batch of its own; group 2 (230) is longer than the budget: cut by rows
    assert chunks == [[0, 1], [2, 3, 4], [5], [6], [7]]
    assert [r for c in chunks for r in c] == rows
    assert packing.token_budget_chunks(rows, lengths, 10_000, groups=groups) == [rows]


def _stub_trainer(budget: int, size: int, rank: int, *, micro: int = 2):
    from mmrl.engine.distributed import World
    from mmrl.engine.trainer import GRPOTrainer

    stub = SimpleNamespace(cfg=SimpleNamespace(train=TrainConfig(micro_batch_size=micro, micro_batch_tokens=budget)),
                           world=World(rank=rank, size=size), _sp=None)  # no sequence-parallel group
    stub._chunks = functools.partial(GRPOTrainer._chunks, stub)
    stub._own_chunks = functools.partial(GRPOTrainer._own_chunks, stub)
    return stub


def test_trainer_chunks_by_budget_and_by_rows() -> None:
    lengths = [30, 50, 20, 120, 60, 60, 60, 5]
    batch = SimpleNamespace(seqs=[TokenSeq(ids=[1] * n, mm_types=[0] * n) for n in lengths],
                            group_index=torch.arange(8),  # a group of one each: the budget alone decides
                            extra={"rank": torch.tensor([0, 0, 0, 0, 1, 1, 1, 1])})
    t = _stub_trainer(100, 1, 0)
    assert t._own_chunks(batch, range(8)) == [([0, 1, 2], False), ([3], False), ([4], False), ([5], False),
                                              ([6, 7], False)]
    assert t._chunks(range(8)) == [[0, 1], [2, 3], [4, 5], [6, 7]]  # no batch: by rows (the step's counts)
    t = _stub_trainer(0, 1, 0, micro=3)  # off: by micro_batch_size, as before
    assert [c for c, _ in t._own_chunks(batch, range(8))] == [[0, 1, 2], [3, 4, 5], [6, 7]]
    # two ranks, each its own rows by the budget; the rank with fewer passes adds a dummy pass
    own = [_stub_trainer(100, 2, r)._own_chunks(batch, range(8)) for r in (0, 1)]
    assert own[0] == [([0, 1, 2], False), ([3], False), ([], True)]
    assert own[1] == [([4], False), ([5], False), ([6, 7], False)]


def test_config_fields() -> None:
    cfg = TrainConfig()
    assert cfg.micro_batch_tokens == 0 and cfg.padding_free is True and PolicyOptions.padding_free is True
    with pytest.raises(ConfigError):
        TrainConfig(micro_batch_tokens=-1)
    run = load_run_config("video-qa", overrides=["train.micro_batch_tokens=512", "train.padding_free=false"])
    assert run.train.micro_batch_tokens == 512 and run.train.padding_free is False


# ------------------------------------------------------------------------------------------------ one update
def _update_grads(trainer, batch) -> tuple[dict[str, torch.Tensor], dict[str, Any]]:
    """Gradients of one ``update`` (the optimizer step replaced by a capture: the weights stay) and its stats."""
    captured: dict[str, torch.Tensor] = {}

    def step() -> float:
        captured.update({n: p.grad.clone() for n, p in trainer.policy.model.named_parameters() if p.grad is not None})
        return 1.0

    trainer.updater.step = step
    stats = trainer.update(batch)
    assert stats["optimizer_steps"] == 1
    return captured, stats


def test_update_by_token_budget_equals_update_by_rows(tmp_path: Path, tmp_path_factory, monkeypatch) -> None:
    """One GRPO update (a KL reference, an entropy bonus, token-mean loss) by a token budget with packed
    passes has the loss and gradients of the update by a row count with padded passes."""
    from tiny_runs import TINY_RUN

    from mmrl.engine.trainer import GRPOTrainer
    from mmrl.run import load_split, resolve_model

    monkeypatch.setenv("MMRL_CACHE", str(tmp_path_factory.mktemp("cache")))
    cfg = load_run_config("video-qa", overrides=[
        *TINY_RUN, "grpo.kl_coef=0.05", "grpo.entropy_coef=0.01", "grpo.loss_agg=token-mean",
        "train.micro_batch_size=3", "rollout.max_new_tokens=12", "rollout.temperature=1.5"])
    samples, _ = load_split(cfg, "train", show_progress=False)
    policy = load_policy(resolve_model(cfg), device="cpu")
    policy.configure(logprob_chunk_tokens=cfg.train.logprob_chunk_tokens)
    trainer = GRPOTrainer(cfg, policy, samples, run_dir=tmp_path / "run", show_progress=False)
    with trainer.rollout_session():
        batch, _, _ = trainer.collect()
    # the random tiny model rarely ends early: completions cut to ragged lengths, as if they had stopped there
    for i, s in enumerate(batch.seqs):
        n = len(s) - 3 * (i % 4)
        batch.seqs[i] = TokenSeq(ids=s.ids[:n], mm_types=s.mm_types[:n], media=s.media, loss_mask=s.loss_mask[:n])
        batch.loss_mask[i, n:] = 0
    trainer.reference_pass(batch)
    trainer.compute_advantages(batch)
    trainer.shape_tokens(batch)
    lengths = [len(s) for s in batch.seqs]
    assert len(set(lengths)) > 1

    policy.configure(padding_free=False)
    by_rows, stats_rows = _update_grads(trainer, batch)
    row_chunks = trainer._chunks(range(len(batch)), batch)
    assert row_chunks == [list(range(i, min(i + 3, len(batch)))) for i in range(0, len(batch), 3)]

    budget = max(lengths) * 2 + 1
    cfg.train.micro_batch_tokens = budget
    policy.configure(padding_free=True)
    chunks = trainer._chunks(range(len(batch)), batch)
    assert chunks != row_chunks and [r for c in chunks for r in c] == list(range(len(batch)))
    # within the budget as the pass computes it: each group's shared prompt once, every row's tokens after it
    pre = shared_prefixes(batch, range(len(batch)))
    groups = [int(g) for g in batch.group_index]
    assert any(pre) and all(0 <= p < n for p, n in zip(pre, lengths))

    def computed(c: list[int]) -> int:
        return sum(pre[c[[groups[r] for r in c].index(g)]] for g in {groups[r] for r in c}) + \
            sum(lengths[r] - pre[r] for r in c)

    assert all(computed(c) <= budget for c in chunks)
    # each row counted whole (the rule before the shared prompt counted once) takes more passes
    whole = packing.token_budget_chunks(list(range(len(batch))), lengths, budget, groups=groups)
    assert len(chunks) < len(whole)
    by_budget, stats_budget = _update_grads(trainer, batch)

    assert by_rows.keys() == by_budget.keys() and "lm_head.weight" in by_rows
    # fp32 sums in another order (other micro-batches, other thread counts): up to ~2e-4 of a tensor's largest
    # gradient was measured with 2 threads (the LM head's, ~6e-6 at most); a wrong normalisation is off by ~100%
    top = max(float(g.abs().max()) for g in by_rows.values())
    for name, g in by_rows.items():
        err = float((by_budget[name] - g).abs().max())
        assert err <= 1e-3 * float(g.abs().max()) + 1e-5 * top, f"{name}: max error {err} (largest gradient {top})"
    for key in ("loss", "pg_loss", "kl_loss", "entropy"):
        assert key in stats_rows
        assert stats_budget[key] == pytest.approx(stats_rows[key], rel=1e-5, abs=1e-7), key


# ------------------------------------------------------------------------------------------------ one pass
@pytest.mark.parametrize("family", SHORTCUT_FAMILIES)
@pytest.mark.parametrize("kind", ["image", "video"])
def test_shared_prefix_in_one_pass(policy_of, family: str, kind: str) -> None:
    """The shared prefix as one packed pass: each group's prompt once, then its continuations, each seeing
    the prompt and itself; the values and every gradient of the padded batch, in the rows the cost model
    picks and in one row; the model is called once, on no more tokens than the two passes hold."""
    policy = policy_of(family)
    seqs = mixed_batch(policy, family, kind)
    plan = shared_prefix.prefix_plan(seqs)
    policy.configure(shared_prefix_one_pass=True)
    try:
        calls = assert_same(policy, seqs, shared=True)
    finally:
        policy.configure(shared_prefix_one_pass=None)
    # each prompt once, each continuation but its last token (whose hidden state predicts nothing)
    tokens = sum(n + sum(len(seqs[i]) - 1 - n for i in g) if n else sum(len(seqs[i]) - 1 for i in g) for g, n in plan)
    assert len(calls["one_row"]) == 1 and calls["one_row"][0][0] == (1, tokens)  # one call, no padding
    assert calls["one_row"][0][1] == (1, 1, tokens, tokens)
    assert len(calls["packed"]) == 1 and calls["packed"][0][0][0] <= len(plan)
    with policy.inference():  # the gradient-free passes (reference, old log-probs) too
        policy.configure(shared_prefix_one_pass=False)
        ref = policy.forward_logprobs(seqs, with_entropy=True, shared_prefix=True)
        policy.configure(shared_prefix_one_pass=True)
        got = policy.forward_logprobs(seqs, with_entropy=True, shared_prefix=True)
        policy.configure(shared_prefix_one_pass=None)
    for a, b in zip(got[:2], ref[:2]):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-5 * float(b.abs().max()))


def test_one_pass_with_one_token_continuations(policy_of) -> None:
    """Continuations of a single token (their log-prob reads the prompt's last hidden state alone) and a row
    of a single trained token without a group."""
    policy = policy_of("qwen2_5_vl")
    p = prompt(policy, [image("qwen2_5_vl", "one", seed=5)], "Yes or no?")
    alone = prompt(policy, [image("qwen2_5_vl", "alone", seed=6)], "Alone?")
    seqs = group(policy, p, [0, 4, 0], seed=40) + group(policy, alone, [0], seed=50)
    assert [len(s) - len(p) for s in seqs[:3]] == [1, 5, 1]
    policy.configure(shared_prefix_one_pass=True)
    try:
        calls = assert_same(policy, seqs, shared=True)
    finally:
        policy.configure(shared_prefix_one_pass=None)
    assert calls["one_row"][0][0] == (1, len(p) + 4 + len(alone))


def test_one_pass_chosen_by_cost(policy_of) -> None:
    """Short continuations of a short prompt: one pass (the second pass's own work outweighs the extra
    attention); long ones of a long prompt: two (one pass would compute every continuation's attention over
    the whole row). Never where every rank must make the same calls, nor with padding-free passes off."""
    policy = policy_of("qwen2_5_vl")

    def rows(prompt: int, answers: list[int]) -> tuple[list[tuple[list[int], int]], list[list[int]]]:
        return [(list(range(len(answers))), prompt)], [[0] * (prompt + a) for a in answers]

    short, long = rows(40, [16] * 8), rows(2000, [1000] * 8)
    assert shared_prefix.use_one_pass(policy, *short) and not shared_prefix.use_one_pass(policy, *long)
    policy.bind_ranks(RankBinding(invariant="calls"))
    try:
        assert not shared_prefix.use_one_pass(policy, *short)
    finally:
        policy.bind_ranks(RankBinding(invariant=None))
    policy.configure(padding_free=False)
    assert not shared_prefix.use_one_pass(policy, *short)
