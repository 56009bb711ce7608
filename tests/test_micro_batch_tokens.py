"""Group-sized micro-batches by a token budget (issue 58, part A).

* the budget counts what a pass computes: a group's shared prompt once, every row's own tokens after it (an
  8-row group of long prompts fits a budget of one prompt and eight answers, not eight whole rows), groups
  stay whole where they fit, a group larger than the budget is cut by rows and each piece pays its prompt;
* ``train.micro_batch_tokens: auto`` resolves when the config loads to max(16384, one whole group at the run's
  media caps and rollout settings); the real-model preset uses it, so ``mmrl train --model DIR`` at the
  README's settings runs a whole group a pass, and ``mmrl config show`` and the command print the number;
* a GPU run of a large model is told in tokens, not rows, when its passes are smaller than a group.
The loss and gradients under any split are checked in test_packing (by rows against by the budget)."""

from __future__ import annotations

import random
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
from tiny_runs import as_7b, module_cache, own_model  # noqa: F401 (module_cache is a fixture)

from mmrl import cli
from mmrl.config import AUTO_TOKENS_FLOOR, TrainConfig, auto_micro_batch_tokens, group_tokens, load_run_config
from mmrl.config.io import load_yaml
from mmrl.engine.batch import RolloutBatch, micro_batch_rows, shared_prefixes, update_plan
from mmrl.model import TokenSeq
from mmrl.model.packing import token_budget_chunks

PRESET = load_yaml(Path(__file__).resolve().parent.parent / "configs" / "presets" / "real-model.yaml")


def computed(chunk: list[int], lengths: dict[int, int], groups: dict[int, int], prefixes: dict[int, int]) -> int:
    """The tokens a pass over ``chunk`` computes: each group's prefix once, every row's tokens after it."""
    first = {}
    for r in chunk:
        first.setdefault(groups[r], r)
    return sum(prefixes[r] for r in first.values()) + sum(lengths[r] - prefixes[r] for r in chunk)


# ------------------------------------------------------------------------------------------------ the rule
def test_a_groups_shared_prefix_counts_once() -> None:
    rows = list(range(8))
    lengths, groups, prefixes = [110] * 8, [0] * 8, [100] * 8  # a 100-token prompt, 10-token answers
    # counted whole a row is 110 tokens: one row a pass; counted as computed the group is 100 + 8 x 10 = 180
    assert token_budget_chunks(rows, lengths, 200, groups=groups) == [[r] for r in rows]
    assert token_budget_chunks(rows, lengths, 200, groups=groups, prefixes=prefixes) == [rows]
    # two groups of four (140 tokens each): one a pass at 200, both at 280
    groups = [0] * 4 + [1] * 4
    assert token_budget_chunks(rows, lengths, 200, groups=groups, prefixes=prefixes) == [rows[:4], rows[4:]]
    assert token_budget_chunks(rows, lengths, 280, groups=groups, prefixes=prefixes) == [rows]
    # a group larger than the budget is cut by rows; each piece computes its prompt again
    chunks = token_budget_chunks(rows, lengths, 150, groups=[0] * 8, prefixes=prefixes)
    assert chunks == [rows[:5], rows[5:]]  # 100 + 5 x 10 = 150; then 100 + 3 x 10
    # a row longer than the budget alone
    assert token_budget_chunks(rows, lengths, 50, groups=[0] * 8, prefixes=prefixes) == [[r] for r in rows]
    with pytest.raises(ValueError, match="groups"):
        token_budget_chunks(rows, lengths, 200, prefixes=prefixes)
    with pytest.raises(ValueError, match="prefix"):
        token_budget_chunks(rows, lengths, 200, groups=[0] * 8, prefixes=[110] * 8)


def test_the_rule_on_random_batches() -> None:
    rng = random.Random(0)
    for _ in range(300):
        n = rng.randint(1, 30)
        groups = sorted(rng.randint(0, 6) for _ in range(n))
        prompt = {g: rng.randint(1, 200) for g in set(groups)}
        shared = {g: rng.random() < 0.8 and groups.count(g) > 1 for g in set(groups)}
        lengths = [prompt[g] + rng.randint(1, 60) for g in groups]
        prefixes = [prompt[g] if shared[g] else 0 for g in groups]
        rows = [10 + i for i in range(n)]
        budget = rng.randint(20, 900)
        chunks = token_budget_chunks(rows, lengths, budget, groups=groups, prefixes=prefixes)
        assert [r for c in chunks for r in c] == rows
        of = dict(zip(rows, lengths))
        group_of, prefix_of = dict(zip(rows, groups)), dict(zip(rows, prefixes))
        assert all(computed(c, of, group_of, prefix_of) <= budget or len(c) == 1 for c in chunks)
        for g in set(groups):  # a group that fits the budget is never split
            members = [r for r in rows if group_of[r] == g]
            if computed(members, of, group_of, prefix_of) <= budget:
                assert sum(set(members) <= set(c) for c in chunks) == 1
        # prefixes of 0 are the rule that counts every row whole
        assert token_budget_chunks(rows, lengths, budget, groups=groups, prefixes=[0] * n) == \
            token_budget_chunks(rows, lengths, budget, groups=groups)
        # counting the shared prefix once never takes more passes
        assert len(chunks) <= len(token_budget_chunks(rows, lengths, budget, groups=groups))


def long_prompt_batch(prompt: int = 4189, answers: tuple[int, ...] = (512,) * 8, groups: int = 2) -> RolloutBatch:
    """``groups`` groups of rows that share a ``prompt``-token prompt (vision tokens in it) with answers of
    ``answers`` tokens: the README's real settings have 4,189-token prompts (4,096 of them vision tokens)."""
    seqs = []
    for g in range(groups):
        ids = [1000 + g] + [7] * (prompt - 1)
        types = [0] * 50 + [2] * (prompt - 93) + [0] * 43  # vision tokens inside the prompt
        head = TokenSeq(ids=ids, mm_types=types, media=[f"clip-{g}"])
        for i, n in enumerate(answers):
            seqs.append(head.extend([100 + i] + [5] * (n - 1), trained=True))
    n, width = len(seqs), max(len(s) for s in seqs)
    mask = torch.zeros(n, width)
    for i, s in enumerate(seqs):
        mask[i, :len(s)] = torch.tensor(s.loss_mask, dtype=torch.float32)
    return RolloutBatch(samples=[None] * n, prompt_index=[i // len(answers) for i in range(n)],
                        group_index=torch.arange(n) // len(answers), seqs=seqs, completions=[""] * n,
                        turns=[[] for _ in range(n)], env_info=[{} for _ in range(n)],
                        finished=torch.ones(n, dtype=torch.bool), loss_mask=mask)


def test_the_readme_group_fits_its_pass() -> None:
    batch = long_prompt_batch()
    rows = list(range(len(batch)))
    assert shared_prefixes(batch, rows) == [4189] * 16
    whole = [len(s) for s in batch.seqs]
    one_group = 4189 + 8 * 512
    assert one_group < AUTO_TOKENS_FLOOR < sum(whole[:8])  # ~8.3k computed; ~37.6k if every row counted whole
    train = TrainConfig(micro_batch_tokens=AUTO_TOKENS_FLOOR)
    assert micro_batch_rows(rows, train, batch) == [rows[:8], rows[8:]]  # a group a pass
    train = TrainConfig(micro_batch_tokens=2 * one_group)
    assert micro_batch_rows(rows, train, batch) == [rows]  # both groups in one pass
    # shared_prefix off: every row runs whole, and is counted so
    train = TrainConfig(micro_batch_tokens=AUTO_TOKENS_FLOOR, shared_prefix=False)
    assert len(micro_batch_rows(rows, train, batch)) == 6  # three rows of 4.7k a pass
    # plug-ins read the same plan (update_plan)
    cfg = SimpleNamespace(grpo=SimpleNamespace(ppo_mini_batch_size=None, ppo_epochs=2),
                          train=TrainConfig(micro_batch_tokens=AUTO_TOKENS_FLOOR))
    assert update_plan(batch, cfg) == [[rows[:8], rows[8:]]] * 2


# ------------------------------------------------------------------------------------------------ auto
def test_auto_is_the_larger_of_verls_default_and_one_group() -> None:
    cfg = load_run_config("video-qa", base=PRESET)
    group, how = group_tokens(cfg)
    # the preset's media: 32 frames at 256 x 28 x 28 pixels (2 frames a temporal patch): 4,096 vision tokens
    assert group == 4096 + 1024 + cfg.rollout.group_size * cfg.rollout.max_new_tokens and "4,096 vision" in how
    assert cfg.train.micro_batch_tokens == max(AUTO_TOKENS_FLOOR, group) == AUTO_TOKENS_FLOOR >= group
    # long answers: one whole group
    cfg = load_run_config("video-qa", base=PRESET, overrides=["rollout.max_new_tokens=4096"])
    assert cfg.train.micro_batch_tokens == group_tokens(cfg)[0] == 4096 + 1024 + 8 * 4096
    assert auto_micro_batch_tokens(cfg)[0] == cfg.train.micro_batch_tokens
    # any recipe may ask for it; a number or 0 (rows) wins over the preset's auto
    assert load_run_config("video-qa", overrides=["train.micro_batch_tokens=auto"]).train.micro_batch_tokens == \
        AUTO_TOKENS_FLOOR
    assert load_run_config("video-qa", base=PRESET, overrides=["train.micro_batch_tokens=0"]).train.micro_batch_tokens \
        == 0
    with pytest.raises(Exception, match="micro_batch_tokens"):
        load_run_config("video-qa", overrides=["train.micro_batch_tokens=many"])


def test_the_readme_commands_run_a_whole_group_a_pass(tmp_path: Path, module_cache, capsys) -> None:  # noqa: F811
    big = as_7b(own_model(tmp_path / "model"))
    # the README's one-GPU 3B command (its settings after --model)
    argv = ["--task", "video-qa", "--model", str(big), "model.dtype=bf16", "model.gradient_checkpointing=true",
            "train.prompts_per_step=8", "train.lr=1e-6", "rollout.max_new_tokens=512",
            "prompt.answer_format=think_answer"]
    assert cli.main(["config", "show", *argv]) == 0
    shown = capsys.readouterr().out
    assert f"\ntrain.micro_batch_tokens: {AUTO_TOKENS_FLOOR}\n" in shown
    cfg = load_run_config("video-qa", base=PRESET, overrides=["rollout.max_new_tokens=512"])
    assert group_tokens(cfg)[0] <= cfg.train.micro_batch_tokens  # a group at the caps fits one pass

    import mmrl.run

    seen = []
    mp = pytest.MonkeyPatch()
    mp.setattr(mmrl.run, "train", lambda cfg, **_: seen.append(cfg) or {})
    try:
        assert cli.main(["train", *argv]) == 0
    finally:
        mp.undo()
    assert seen[0].train.micro_batch_tokens == AUTO_TOKENS_FLOOR
    assert f"train.micro_batch_tokens={AUTO_TOKENS_FLOOR}" in capsys.readouterr().out  # the command says it


def test_gpu_advice_speaks_of_tokens() -> None:
    from mmrl.run import gpu_advice

    model = SimpleNamespace(parameters=lambda: [torch.empty(3 << 30, device="meta")])  # 3.2B, no memory
    policy = SimpleNamespace(device=torch.device("cuda"), model=model)
    rows = load_run_config("video-qa", base=PRESET, overrides=["train.micro_batch_tokens=0",
                                                               "train.micro_batch_size=2"])
    (line,) = gpu_advice(rows, policy)
    assert "train.micro_batch_size=2" in line and f"train.micro_batch_tokens=auto gives {AUTO_TOKENS_FLOOR:,}" in line
    assert "1-4 is usual" not in line
    small = load_run_config("video-qa", base=PRESET, overrides=["train.micro_batch_tokens=4096"])
    (line,) = gpu_advice(small, policy)
    assert "less than one group" in line and "11,264" in line
    assert gpu_advice(load_run_config("video-qa", base=PRESET), policy) == []  # auto: a whole group, nothing to say
    assert gpu_advice(rows, SimpleNamespace(device=torch.device("cpu"), model=policy.model)) == []
    sdpa = load_run_config("video-qa", base=PRESET, overrides=["model.attn_implementation=sdpa"])
    (line,) = gpu_advice(sdpa, policy)  # once per window: the preset's varlen named
    assert "model.attn_implementation=sdpa" in line and "model.attn_implementation=varlen" in line
