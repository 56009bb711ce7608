"""The GRPO training loop.

One step: draw prompts (sampler) -> decode media -> roll out G episodes per prompt (HF generate or another
backend; multi-turn through an environment) -> rewards (weighted registry rewards, overlong shaping,
plug-in hooks) -> dynamic sampling (optional) -> advantages -> old/reference log-probs -> PPO-style
update over micro-batches with exact gradient accumulation, for ``ppo_epochs`` passes -> sampler and
plug-in updates, logging, evaluation and checkpoints on their schedules.
"""

from __future__ import annotations

import copy
import math
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from tqdm import tqdm

from mmrl.checkpoint import (
    latest_checkpoint,
    load_trainer_state,
    load_weights,
    save_checkpoint,
    set_rng_state,
)
from mmrl.config import RunConfig
from mmrl.config_io import to_dict
from mmrl.evaluate import evaluate
from mmrl.grpo import compute_advantages, compute_policy_loss, global_counts, informative_groups
from mmrl.grpo.filters import overlong_keep_mask, soft_overlong_penalty
from mmrl.grpo.kl import kl_in_reward
from mmrl.media import MediaPreparer
from mmrl.plugins import build_plugins
from mmrl.policy import Policy, TokenSeq
from mmrl.prompts import encode_prompt
from mmrl.rollout import Episode, SamplingParams, get_environment, make_backend, run_episodes
from mmrl.run_log import RunLog
from mmrl_common.errors import MediaError, MmrlError


@dataclass
class PreparedPrompt:
    index: int
    sample: Any
    seq: TokenSeq
    media: list[Any]


def lr_lambda(warmup: int, total: int, min_ratio: float):
    """Linear warm-up, then cosine decay to ``min_ratio`` of the peak at the last step."""
    def fn(step: int) -> float:
        if warmup > 0 and step < warmup:
            return (step + 1) / warmup
        progress = (step - warmup) / max(1, total - warmup)
        return min_ratio + (1 - min_ratio) * 0.5 * (1 + math.cos(math.pi * min(1.0, progress)))
    return fn


def sample_columns(samples: Sequence[Any]) -> dict[str, list[Any]]:
    """The reward columns of a list of samples (TRL style: one list per field)."""
    return {"id": [s.id for s in samples], "problem_type": [s.problem_type for s in samples],
            "question": [s.question for s in samples], "options": [s.options for s in samples],
            "answer": [s.answer for s in samples], "meta": [s.meta for s in samples]}


class GRPOTrainer:
    def __init__(self, cfg: RunConfig, policy: Policy, train_samples: Sequence[Any], *, run_dir: Path,
                 eval_samples: Sequence[Any] = (), log: RunLog | None = None, show_progress: bool = True):
        from data_pipelines.samplers import make_sampler
        from rewards import CombinedReward

        self.cfg = cfg
        self.policy = policy
        self.run_dir = run_dir
        self.train_samples = list(train_samples)
        self.eval_samples = list(eval_samples)
        self.log = log or RunLog(run_dir)
        self.show_progress = show_progress
        self.step = 0
        self.skipped_samples = 0
        policy.share_vision_features = cfg.model.share_vision_features
        self.preparer = MediaPreparer(cfg.data.media, family=policy.family)
        self.sampler = make_sampler(cfg.data.sampler, self.train_samples, seed=cfg.train.seed,
                                    **cfg.data.sampler_kwargs)
        self.rewards = CombinedReward([to_dict(r) for r in cfg.rewards])
        self.backend = make_backend(cfg.rollout.backend, policy)
        self.params = SamplingParams(
            max_new_tokens=cfg.rollout.max_new_tokens, temperature=cfg.rollout.temperature,
            top_p=cfg.rollout.top_p, top_k=cfg.rollout.top_k, stop=list(cfg.rollout.stop))
        self.env_cls = get_environment(cfg.rollout.environment) if cfg.rollout.environment else None
        self.shaper = cfg.grpo.build_shaper()
        self.ref: Policy | None = None
        if cfg.grpo.uses_reference:
            self.ref = self._make_reference()
        params = [p for p in policy.model.parameters() if p.requires_grad]
        if not params:
            raise MmrlError("nothing to train: model.freeze_vision, freeze_merger and freeze_llm are all on")
        t = cfg.train
        self.optimizer = torch.optim.AdamW(params, lr=t.lr, betas=tuple(t.adam_betas), weight_decay=t.weight_decay)
        self.scheduler = torch.optim.lr_scheduler.LambdaLR(
            self.optimizer, lr_lambda(t.warmup_steps, t.steps, t.min_lr_ratio))
        self.plugins = build_plugins(cfg.plugins, self)

    # ------------------------------------------------------------------------------------ reference
    def _make_reference(self) -> Policy:
        ref_model = copy.deepcopy(self.policy.model).eval()
        for p in ref_model.parameters():
            p.requires_grad_(False)
        ref = Policy(ref_model, self.policy.processor)
        ref.media = self.policy.media  # same encoded media, same keys
        ref.share_vision_features = self.policy.share_vision_features
        return ref

    def reset_reference(self) -> None:
        """Make the KL reference a copy of the current policy (curricula call this between stages)."""
        if self.ref is not None:
            self.ref.model.load_state_dict(self.policy.model.state_dict())

    # ------------------------------------------------------------------------------------ prompts
    def prepare(self, indices: Sequence[int]) -> list[PreparedPrompt]:
        """Encode the drawn prompts; a bad sample is skipped and replaced when ``on_bad_sample: skip``."""
        out: list[PreparedPrompt] = []
        queue = list(indices)
        attempts = 0
        while queue:
            i = queue.pop(0)
            sample = self.train_samples[i]
            try:
                seq, media = encode_prompt(self.policy, self.preparer, sample, self.cfg.prompt)
            except MediaError as exc:
                if self.cfg.data.on_bad_sample != "skip":
                    raise MmrlError(f"sample {sample.id}: {exc} (set data.on_bad_sample=skip to skip bad samples)"
                                    ) from exc
                self.skipped_samples += 1
                attempts += 1
                if attempts > 10 * max(1, len(indices)):
                    raise MmrlError("too many unreadable samples in a row; run `mmrl data validate` on the data"
                                    ) from exc
                tqdm.write(f"skipping sample {sample.id}: {exc}")
                queue.extend(self.sampler.draw(1))
                continue
            out.append(PreparedPrompt(i, sample, seq, media))
        return out

    def _environment(self, prompts: list[PreparedPrompt]):
        if self.env_cls is None:
            return None
        by_id = {id(p.sample): p for p in prompts}
        kwargs = self.cfg.rollout.environment_kwargs
        return lambda sample: self.env_cls(sample, by_id[id(sample)].media, **kwargs)

    # ------------------------------------------------------------------------------------ rollouts
    def rollout(self, prompts: list[PreparedPrompt]) -> list[Episode]:
        return run_episodes(
            self.policy, self.backend, [p.seq for p in prompts], [p.sample for p in prompts],
            n=self.cfg.rollout.group_size, params=self.params, environment=self._environment(prompts),
            max_turns=self.cfg.rollout.max_turns)

    def score(self, episodes: list[Episode]) -> tuple[torch.Tensor, dict[str, list[float]]]:
        samples = [ep.sample for ep in episodes]
        columns: dict[str, Any] = sample_columns(samples)
        columns["transcript"] = [ep.transcript for ep in episodes]
        columns["env_info"] = [dict(ep.env.info) if ep.env is not None else {} for ep in episodes]
        columns["trainer_state"] = {"step": self.step}
        columns["policy"] = self.policy
        result = self.rewards.compute([ep.completion for ep in episodes], columns)
        rewards = torch.tensor(result.total, dtype=torch.float32)
        components = dict(result.components)
        g = self.cfg.grpo
        if g.overlong_penalty:
            lengths = torch.tensor([ep.response_length for ep in episodes])
            pen = soft_overlong_penalty(lengths, g.max_response_length, g.overlong_cache, g.overlong_penalty_factor)
            rewards = rewards + pen
            components["overlong_penalty"] = pen.tolist()
        for plugin in self.plugins.values():
            rewards = plugin.on_rewards(episodes, rewards, components)
        return rewards, components

    # ------------------------------------------------------------------------------------ one step
    def train_step(self) -> dict[str, Any]:
        cfg, g = self.cfg, self.cfg.grpo
        t0 = time.perf_counter()
        G = cfg.rollout.group_size
        target = cfg.train.prompts_per_step
        episodes: list[Episode] = []
        rewards_l: list[torch.Tensor] = []
        components: dict[str, list[float]] = {}  # of the kept groups (rollouts log)
        drawn_components: dict[str, list[float]] = {}  # of every drawn group (step metrics)
        prompt_indices: list[int] = []
        group_rewards: list[list[float]] = []  # every drawn group, kept or not (the sampler learns from all)
        drawn_indices: list[int] = []
        draws = dropped = 0
        while True:
            prompts = self.prepare(self.sampler.draw(target - len(prompt_indices) if g.dynamic_sampling else target))
            eps = self.rollout(prompts)
            rew, comp = self.score(eps)
            for p, r in zip(prompts, rew.view(-1, G)):
                drawn_indices.append(p.index)
                group_rewards.append(r.tolist())
            for k, v in comp.items():
                drawn_components.setdefault(k, []).extend(v)
            keep = informative_groups(rew, group_size=G, tol=g.dynamic_sampling_tol) if g.dynamic_sampling \
                else torch.ones(len(prompts), dtype=torch.bool)
            for gi, p in enumerate(prompts):
                if not keep[gi]:
                    dropped += 1
                    continue
                prompt_indices.append(p.index)
                episodes.extend(eps[gi * G:(gi + 1) * G])
                rewards_l.append(rew[gi * G:(gi + 1) * G])
                for k, v in comp.items():
                    components.setdefault(k, []).extend(v[gi * G:(gi + 1) * G])
            draws += 1
            if not g.dynamic_sampling or len(prompt_indices) >= target or draws > g.max_draws:
                break
        self.sampler.update(drawn_indices, group_rewards)
        stats: dict[str, Any] = {"groups_dropped": dropped, "generation_rounds": draws}
        t_roll = time.perf_counter()
        if episodes:
            stats.update(self._update(episodes, torch.cat(rewards_l)))
        else:
            stats["skipped_update"] = 1
        all_rewards = [r for grp in group_rewards for r in grp]
        stats["reward"] = sum(all_rewards) / max(1, len(all_rewards))
        for k, v in drawn_components.items():
            stats[f"reward/{k}"] = sum(v) / max(1, len(v))
        if episodes:
            lengths = [ep.response_length for ep in episodes]
            stats["response_length"] = sum(lengths) / len(lengths)
            stats["truncated_frac"] = sum(not ep.finished for ep in episodes) / len(episodes)
        stats["lr"] = self.scheduler.get_last_lr()[0]
        stats["skipped_samples"] = self.skipped_samples
        stats["time/rollout_s"] = t_roll - t0
        stats["time/step_s"] = time.perf_counter() - t0
        self._log_rollouts(episodes, components)
        self.policy.media.clear()
        return stats

    def _update(self, episodes: list[Episode], rewards: torch.Tensor) -> dict[str, Any]:
        cfg, g = self.cfg, self.cfg.grpo
        G = cfg.rollout.group_size
        seqs = [ep.seq for ep in episodes]
        mb = max(1, cfg.train.micro_batch_size)
        chunks = [list(range(i, min(i + mb, len(seqs)))) for i in range(0, len(seqs), mb)]
        stats: dict[str, Any] = {}

        # reference log-probs (and KL folded into the reward, if so configured)
        ref_logps: list[torch.Tensor | None] = [None] * len(chunks)
        if self.ref is not None:
            with torch.no_grad():
                for ci, idx in enumerate(chunks):
                    ref_logps[ci] = self.ref.forward_logprobs([seqs[i] for i in idx],
                                                              temperature=cfg.rollout.temperature)[0]
        if self.ref is not None and g.kl_in_reward:
            with torch.no_grad():
                kl_terms = []
                for ci, idx in enumerate(chunks):
                    lp, _, mask = self.policy.forward_logprobs([seqs[i] for i in idx],
                                                               temperature=cfg.rollout.temperature)
                    kl_terms.append(kl_in_reward(torch.zeros(len(idx), device=lp.device), lp, ref_logps[ci], mask,
                                                 g.kl_coef, g.kl_estimator)[0].cpu())
                rewards = rewards + torch.cat(kl_terms)

        advantages = compute_advantages(rewards, group_size=G, estimator=g.advantage_estimator, eps=g.adv_eps)

        masks = [self.policy.pad([seqs[i] for i in idx], left=False)["loss_mask"].clone() for idx in chunks]
        if g.overlong_filter:
            for ci, idx in enumerate(chunks):
                lengths = torch.tensor([episodes[i].response_length for i in idx])
                eos = torch.tensor([episodes[i].finished for i in idx])
                keep = overlong_keep_mask(lengths, eos, g.max_response_length)
                masks[ci] = masks[ci] * keep.to(masks[ci].device)[:, None]
        for m in masks:
            m[:, 0] = 0
        counts = global_counts(masks)

        old_logps: list[torch.Tensor | None] = [None] * len(chunks)
        if g.ppo_epochs > 1:
            with torch.no_grad():
                for ci, idx in enumerate(chunks):
                    old_logps[ci] = self.policy.forward_logprobs([seqs[i] for i in idx],
                                                                 temperature=cfg.rollout.temperature)[0]

        self.policy.model.train()
        trainable = [p for p in self.policy.model.parameters() if p.requires_grad]
        sums: dict[str, float] = {}
        for _epoch in range(g.ppo_epochs):
            self.optimizer.zero_grad(set_to_none=True)
            for ci, idx in enumerate(chunks):
                logp, ent, _ = self.policy.forward_logprobs([seqs[i] for i in idx],
                                                            temperature=cfg.rollout.temperature, with_entropy=True)
                loss, st = compute_policy_loss(
                    logp, old_logps[ci], advantages[idx].to(logp.device), masks[ci], g, ref_logp=ref_logps[ci],
                    entropies=ent,
                    global_tokens=counts.tokens, global_seqs=counts.seqs, shaper=self.shaper)
                loss.backward()
                weight = float(masks[ci].sum()) / max(1.0, counts.tokens)
                for k, v in st.items():
                    if k in ("n_tokens", "n_pg_tokens"):
                        continue
                    sums[k] = sums.get(k, 0.0) + float(v) * weight / g.ppo_epochs
            grad_norm = torch.nn.utils.clip_grad_norm_(trainable, self.cfg.train.max_grad_norm)
            self.optimizer.step()
        self.scheduler.step()
        stats.update(sums)
        stats["grad_norm"] = float(grad_norm)
        stats["advantage_abs"] = float(advantages.abs().mean())
        stats["reward_std"] = float(rewards.view(-1, G).std(dim=1, unbiased=False).mean())
        self._last_advantages = advantages
        return stats

    def _log_rollouts(self, episodes: list[Episode], components: dict[str, list[float]]) -> None:
        n = min(self.cfg.train.log_rollouts, len(episodes))
        if n <= 0:
            return
        adv = getattr(self, "_last_advantages", None)
        records = []
        for i in range(n):
            ep = episodes[i]
            records.append({
                "id": ep.sample.id, "answer": ep.sample.answer, "turns": ep.turns,
                "rewards": {k: v[i] for k, v in components.items()},
                "advantage": float(adv[i]) if adv is not None and i < len(adv) else None,
                "response_length": ep.response_length,
            })
        self.log.rollouts("rl", self.step + 1, records)  # the step being taken (metrics use the same number)

    # ------------------------------------------------------------------------------------ loop
    def _summary_line(self, stats: dict[str, Any]) -> str:
        parts = [f"step {self.step}/{self.cfg.train.steps}", f"reward {stats['reward']:.3f}"]
        for key, label in (("reward/accuracy", "acc"), ("reward/format", "format"), ("response_length", "len"),
                           ("entropy", "entropy"), ("kl", "kl"), ("eval/accuracy", "eval acc"),
                           ("time/step_s", "s/step")):
            if isinstance(stats.get(key), (int, float)):
                parts.append(f"{label} {stats[key]:.3f}" if key != "response_length" else f"{label} {stats[key]:.1f}")
        return "  ".join(parts)

    def state_dict(self) -> dict[str, Any]:
        return {"optimizer": self.optimizer.state_dict(), "scheduler": self.scheduler.state_dict(),
                "sampler": self.sampler.state_dict(), "skipped_samples": self.skipped_samples,
                "plugins": {k: p.state_dict() for k, p in self.plugins.items()},
                "ref": self.ref.model.state_dict() if self.ref is not None else None}

    def resume(self) -> bool:
        """Load the latest checkpoint of this run, if there is one; True when resumed."""
        ckpt = latest_checkpoint(self.run_dir)
        if ckpt is None:
            self.log.truncate_after("rl", 0)  # a run killed before its first checkpoint starts RL afresh
            return False
        state = load_trainer_state(ckpt)
        load_weights(self.policy.model, ckpt)
        self.optimizer.load_state_dict(state["optimizer"])
        self.scheduler.load_state_dict(state["scheduler"])
        self.sampler.load_state_dict(state["sampler"])
        self.skipped_samples = state.get("skipped_samples", 0)
        for k, p in self.plugins.items():
            p.load_state_dict(state.get("plugins", {}).get(k, {}))
        if self.ref is not None and state.get("ref") is not None:
            self.ref.model.load_state_dict(state["ref"])
        self.step = int(state["step"])
        set_rng_state(state["rng"])
        self.log.truncate_after("rl", self.step)
        tqdm.write(f"resumed from {ckpt} (step {self.step})")
        return True

    def save(self) -> Path:
        return save_checkpoint(self.run_dir, self.step, self.policy.model, self.policy.processor,
                               self.state_dict(), keep=self.cfg.train.keep_checkpoints)

    def run_eval(self, tag: str) -> dict[str, Any]:
        metrics, _ = evaluate(
            self.policy, self.eval_samples, prompt=self.cfg.prompt, preparer=self.preparer,
            max_new_tokens=self.cfg.eval.max_new_tokens or self.cfg.rollout.max_new_tokens,
            batch_size=self.cfg.eval.batch_size, min_options=self.cfg.eval.min_options, desc=tag,
            stop=self.cfg.rollout.stop,
            show_progress=self.show_progress)
        self.policy.media.clear()
        return metrics

    def train(self) -> None:
        t = self.cfg.train
        for plugin in self.plugins.values():
            plugin.on_train_start()
        bar = tqdm(total=t.steps, initial=self.step, desc="rl", unit="step", disable=not self.show_progress,
                   dynamic_ncols=True)
        while self.step < t.steps:
            stats = self.train_step()
            self.step += 1
            for plugin in self.plugins.values():
                plugin.on_step_end(self.step, stats)
            if t.eval_every and self.step % t.eval_every == 0 and self.step < t.steps and self.eval_samples:
                ev = self.run_eval(f"eval@{self.step}")
                stats["eval/accuracy"] = ev["accuracy"]
            self.log.metrics("rl", self.step, stats)
            bar.set_postfix(reward=f"{stats['reward']:.2f}", acc=f"{stats.get('reward/accuracy', float('nan')):.2f}",
                            len=f"{stats.get('response_length', 0):.0f}")
            bar.update(1)
            if t.log_every and self.step % t.log_every == 0 and self.show_progress:
                tqdm.write(self._summary_line(stats))
            if (t.save_every and self.step % t.save_every == 0) or self.step == t.steps:
                self.save()
        bar.close()
