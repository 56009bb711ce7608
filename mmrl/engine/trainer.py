"""The GRPO training loop.

One step (:meth:`GRPOTrainer.train_step` reads top to bottom): draw prompts -> roll out G episodes per
prompt -> rewards -> (dynamic sampling: more rounds until enough informative groups) -> sampler feedback ->
reference / old log-probs (KL in the reward) -> advantages -> token shaping -> update (mini-batches x PPO
epochs, micro-batches with exact gradient accumulation; a non-finite loss or gradient skips the optimizer
step) -> LR schedule. The step's sequences travel as one :class:`~mmrl.engine.batch.RolloutBatch`; plug-ins see it
at fixed points (:class:`~mmrl.engine.plugins.Callback`). A curriculum switches the pool, the rewards, GRPO
settings and the reference with :meth:`GRPOTrainer.set_stage`, saved and restored with the checkpoints.
"""

from __future__ import annotations

import contextlib
import copy
import dataclasses
import hashlib
import math
import shlex
import time
import warnings
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from tqdm import tqdm

from mmrl.config import RunConfig
from mmrl.config.io import to_dict
from mmrl.engine.batch import RolloutBatch, micro_batch_rows, update_plan
from mmrl.engine.checkpoint import (
    eval_settings,
    latest_checkpoint,
    load_reference,
    load_trainer_state,
    load_weights,
    publish_checkpoint,
    rng_state,
    save_model,
    set_rng_state,
    start_checkpoint,
    write_checkpoint,
)
from mmrl.engine.distributed import World
from mmrl.engine.distributed import world as current_world
from mmrl.engine.evaluate import evaluate, rollout_reward_columns
from mmrl.engine.health import health_plugin
from mmrl.engine.media import MediaPreparer
from mmrl.engine.memory import StagePeaks
from mmrl.engine.optim import (
    LrSchedule,
    lr_scheduler,
    make_updater,
    offload_in_rollouts,
    refresh_lr,
    set_peak_lr,
)
from mmrl.engine.plugins import StepContext, build_plugins
from mmrl.engine.prompts import encode_prompt
from mmrl.engine.rollout import (
    RolloutStrategy,
    SamplingParams,
    backend_from_config,
    get_environment,
    rollout_session,
    run_episodes,
)
from mmrl.engine.run_log import RunLog
from mmrl.engine.service import RolloutService
from mmrl.grpo import GroupAccumulator, compute_advantages, compute_policy_loss, global_counts
from mmrl.grpo.filters import overlong_keep_mask, soft_overlong_penalty
from mmrl.grpo.kl import kl_in_reward
from mmrl.grpo.shaping import ShapingInput
from mmrl.model import Policy, RankBinding, TokenSeq, router_loss
from mmrl.model.lora import AdapterReference, has_lora
from mmrl.model.sequence_parallel import check_policy as check_sequence_parallel
from mmrl_common.errors import ConfigError, MediaError, MmrlError

LOSS_TERMS = ("loss", "pg_loss", "kl_loss")


SKIP_WINDOW = 20
"""Optimizer steps over which ``train.max_skipped_updates_frac`` is judged (the latest ones)."""
SKIP_MIN_STEPS = 4
"""Fewest optimizer steps in that window before the run can be stopped for skipping (a lone skip at the start
never stops a run: more than half of 4 is 3)."""


class Diverged(MmrlError):
    """The run stopped itself: most of its recent optimizer steps were skipped as non-finite, or a step made
    the weights non-finite. Nothing after the last good checkpoint is saved."""


@dataclass
class PreparedPrompt:
    index: int
    sample: Any
    seq: TokenSeq
    media: list[Any]
    slot: int = 0  # its place in the round's draw (rollout.seed_per_prompt seeds by it)


class GRPOTrainer:
    def __init__(self, cfg: RunConfig, policy: Policy, train_samples: Sequence[Any], *, run_dir: Path,
                 eval_samples: Sequence[Any] = (), log: RunLog | None = None, show_progress: bool = True):
        from rewards import CombinedReward

        self.cfg = cfg
        self.policy = policy
        self.run_dir = run_dir
        self.train_samples = list(train_samples)
        self.eval_samples = list(eval_samples)
        self.log = log or RunLog(run_dir)
        self.world = current_world()
        self.context = StepContext(self)  # what plug-ins and samplers see of the run
        self.show_progress = show_progress and self.world.is_main
        self.step = 0
        self._draws = 0  # rollout calls within the step (seeds of rollout.seed_per_prompt)
        self._fresh, self._gap = False, [0.0, 0.0]  # per update (see update())
        self._mem = StagePeaks(policy.device)  # this step's peak memory by stage (see train_step())
        self.skipped_samples = 0  # over every rank
        self._bad_in_a_row = 0  # this rank's unreadable samples since its last good one
        self.skipped_updates = 0
        self.recent_updates: list[bool] = []  # the latest optimizer steps, True where skipped (SKIP_WINDOW)
        self.stop_requested: Callable[[], int] = lambda: 0  # a signal's number when asked to stop (mmrl.run)
        self.stopped_by = 0  # the signal that stopped train() at a step boundary (0: it ran to the end)
        self.save_seconds: list[float] = []  # each checkpoint written in this session
        policy.configure(share_vision_features=cfg.model.share_vision_features)
        self.preparer = MediaPreparer(cfg.data.media, family=policy.family)
        self.backend = backend_from_config(cfg, policy, [*self.train_samples, *self.eval_samples])
        self.service = RolloutService.from_config(policy, cfg, backend=self.backend, preparer=self.preparer)
        r = cfg.rollout
        self.rollout_strategy: RolloutStrategy = run_episodes  # a plug-in may swap it (ctx.set_rollout_strategy)
        self.params = SamplingParams(max_new_tokens=r.max_new_tokens, temperature=r.temperature, top_p=r.top_p,
                                     top_k=r.top_k, stop=list(r.stop), logprobs=r.record_logprobs,
                                     entropies=r.record_entropies)
        self.env_cls = get_environment(r.environment) if r.environment else None
        self._tp = int(getattr(self.backend, "tensor_parallel_size", 1))  # ranks per rollout engine
        # train.sequence_parallel_size: this rank's group (None: off); a group rolls out its prompts together, as one
        # data-parallel rank, and spreads each sample's tokens over its ranks in the log-prob passes
        self._sp = self.world.sequence_group(cfg.train.sequence_parallel_size)
        sp_size = self._sp.size if self._sp is not None else 1
        if sp_size > 1:
            check_sequence_parallel(policy, sp_size)
            if self._tp > 1 and self._tp != sp_size:
                raise ConfigError(f"train.sequence_parallel_size={sp_size} with rollout.vllm.tensor_parallel_size="
                                  f"{self._tp}: a sequence-parallel group must be one rollout engine's ranks; use "
                                  "the same size for both, or one of them 1")
        self._block = max(self._tp, sp_size)  # ranks that roll out the same prompts
        self._sp_lead = self._sp is None or self._sp.rank == 0  # counts its group's rows and statistics once
        self._base_grpo = cfg.grpo
        self._base_rewards = [to_dict(spec) for spec in cfg.rewards]
        self.rewards = CombinedReward(self._base_rewards)
        self.shaper = cfg.grpo.build_shaper()
        # the stage: the training pool (indices into train_samples), rewards and GRPO overrides
        self.stage: dict[str, Any] = {"name": "default", "index": 0, "pool": None, "rewards": None, "grpo": None,
                                      "peak_lr": None}
        self.pool = list(range(len(self.train_samples)))
        self.sampler = self._make_sampler()
        # a mixture-of-experts policy's router load-balancing loss, added to the policy loss (0: off)
        self.router_aux_coef = router_loss.resolve_coef(cfg.model.router_aux_loss_coef, policy.model)
        if self.router_aux_coef > 0 and self._sp is not None:
            raise ConfigError(f"train.sequence_parallel_size={self._sp.size}: the router load-balancing loss "
                              f"(model.router_aux_loss_coef={self.router_aux_coef:g}) is a function of every token's "
                              "routing, which a rank of the group sees a slice of; set model.router_aux_loss_coef=0")
        if not any(p.requires_grad for p in policy.model.parameters()):
            raise MmrlError("nothing to train: model.freeze_vision, freeze_merger and freeze_llm are all on")
        t = cfg.train
        self._check_world()
        self.ref: Policy | AdapterReference | None = None
        self.ref_is_start = True  # the reference equals the run's starting model (not stored in checkpoints)
        ref_model = None
        if cfg.grpo.uses_reference:  # before the updater: ZeRO-3 shards the policy in place
            if has_lora(policy.model):
                self.reset_reference()
            else:
                ref_model = self._reference_copy()
        # backward, gradient sum over ranks, clipping and the AdamW step (fp32 master weights under bf16)
        self.updater = make_updater(policy.model, t, self.world, bf16=cfg.model.dtype == "bf16")
        self.optimizer = self.updater.optimizer
        # rollout.vllm.offload_optimizer: the fp32 masters and AdamW moments in host memory while the vLLM engine
        # is awake (every rollout session: the step's rollouts and rewards, evaluations), back for the update
        self.offload_in_rollouts = offload_in_rollouts(
            cfg.rollout.vllm.offload_optimizer, backend=cfg.rollout.backend, deepspeed=t.deepspeed,
            device=policy.device, lora=has_lora(policy.model), sleep_mode=cfg.rollout.vllm.enable_sleep_mode)
        if self.offload_in_rollouts:
            self.backend.around_sessions(self.updater.state_in_host_memory)
        # DeepSpeed over several ranks: ZeRO-3 gathers each module's weights at each of its calls, so every rank
        # must make the same module calls in every pass, forward and backward; ZeRO-2 reduces gradients as they
        # appear, so every rank must produce gradients for the same parameters. The policy's RankBinding makes
        # the passes so (a dummy vision input where a rank has no media, as many LM-head calls as the rank that
        # needs the most, both shared-prefix passes); generation gathers the weights once per rollout session.
        invariant = ("calls" if self._zero3() else "gradients") if self.world.active and cfg.train.deepspeed else None
        sharded = self.updater.partitioned  # ZeRO-3: how generation and the weight readers get whole weights
        policy.bind_ranks(RankBinding(
            invariant=invariant, max_int=self.world.max_int,
            gather_for_generation=self.updater.gathered_for_generation if sharded else None,
            gather_params=self.updater.gather_params if sharded else None, sequence_group=self._sp))
        if ref_model is not None:  # a copy of the model (not LoRA's adapters-off view of the policy)
            self.ref = self.policy.reference(self.updater.wrap_reference(ref_model))
        # train.lr_schedule over train.steps; a curriculum stage may restart it (set_stage)
        self.lr_schedule = LrSchedule(t.lr_schedule, t.warmup_steps, t.steps, t.min_lr_ratio)
        self.scheduler = lr_scheduler(self.optimizer, self.lr_schedule)
        self.plugins = build_plugins(cfg.plugins, self.context)
        health = health_plugin(self.context, cfg.train.health_window)  # warnings when the run cannot be learning
        if health is not None:
            self.plugins.setdefault("run_health", health)

    def use_rollout_strategy(self, strategy: RolloutStrategy) -> None:
        """Roll out the training prompts with ``strategy`` from now on (:meth:`StepContext.set_rollout_strategy`)."""
        self.rollout_strategy = strategy

    def _zero3(self) -> bool:
        return bool(self.world.active and getattr(self.updater, "stage", 0) == 3)

    def _check_world(self) -> None:
        """What data parallelism needs of the settings, said before anything runs."""
        w, t = self.world, self.cfg.train
        if not w.active:
            return
        _, blocks, _ = w.block(self._block)
        if t.prompts_per_step < blocks:
            raise ConfigError(f"train.prompts_per_step={t.prompts_per_step} is below the {blocks} rollout ranks: each "
                              f"rolls out whole prompts; use at least {blocks}")

    # ------------------------------------------------------------------------------------ stages
    def _make_sampler(self):
        from data_pipelines.samplers import make_sampler

        d = self.cfg.data
        seed = self.cfg.train.seed + 1000 * int(self.stage["index"])
        sampler = make_sampler(d.sampler, [self.train_samples[i] for i in self.pool], seed=seed, **d.sampler_kwargs)
        sampler.attach(self.context)
        return sampler

    def set_stage(self, name: str, *, pool: Sequence[str] | Callable[[Any], bool] | None = None,
                  rewards: Sequence[Any] | None = None, grpo: dict[str, Any] | None = None,
                  reset_reference: bool = False, reset_optimizer: bool = False, lr: float | None = None,
                  restart_schedule: bool | None = None, schedule_steps: int | None = None) -> None:
        """Switch the curriculum stage at a step boundary (call it from a plug-in's ``on_step_end``).

        ``pool``: the training samples from now on, as sample ids or a predicate on samples (None: all);
        ``rewards``: the reward entries (``{name, weight, kwargs, label}``) from now on (None: the run's);
        ``grpo``: GRPO settings that differ from the run's (e.g. ``{"kl_coef": 0.01}``);
        ``reset_reference``: make the KL reference a copy of the current policy (created if there is none);
        ``reset_optimizer``: drop the optimizer's state (AdamW's moments and step counts), as a new run
        started from the current weights would have it; ``lr``: the peak learning rate from now on (the
        run's schedule goes on at its position, scaled to this peak: :func:`mmrl.engine.optim.set_peak_lr`);
        ``restart_schedule`` [None: as ``reset_optimizer``]: the learning-rate schedule (``train.lr_schedule``
        with ``train.warmup_steps``) begins again here, as in a new run: warm-up from this step, then its
        decay over ``schedule_steps`` steps (None: to the run's last step), so the stage's first step after
        the warm-up trains at the peak rate. The sampler starts afresh over the new pool. Everything is saved with the checkpoints and restored
        on ``--resume`` (the optimizer and the schedule as they are, with no second reset).
        """
        if lr is not None and not (isinstance(lr, (int, float)) and math.isfinite(lr) and lr > 0):
            raise ConfigError(f"stage {name!r}: lr must be a positive number, got {lr!r}")
        if callable(pool):
            ids: list[str] | None = [s.id for s in self.train_samples if pool(s)]
        else:
            ids = None if pool is None else [str(i) for i in pool]
        stage = {"name": str(name), "index": int(self.stage["index"]) + 1, "pool": ids,
                 "rewards": [to_dict(r) if dataclasses.is_dataclass(r) else r for r in rewards]
                 if rewards is not None else None,
                 "grpo": dict(grpo) if grpo else None}
        if restart_schedule is None:
            restart_schedule = reset_optimizer
        if schedule_steps is not None and not (isinstance(schedule_steps, int) and schedule_steps > 0):
            raise ConfigError(f"stage {name!r}: schedule_steps must be a positive number of steps, got {schedule_steps!r}")
        # where the learning-rate schedule starts (kept with the stage, for a resume and for the later stages)
        stage["lr_restart"] = ({"start": int(self.scheduler.last_epoch), "steps": schedule_steps}
                               if restart_schedule else self.stage.get("lr_restart"))
        stage["peak_lr"] = float(lr) if lr is not None else self.stage.get("peak_lr")  # None: train.lr
        self._apply_stage(stage)
        if reset_reference:
            self.reset_reference()
        if reset_optimizer:
            self.updater.reset_state()
        if lr is not None:
            set_peak_lr(self.scheduler, float(lr))
        elif restart_schedule:
            refresh_lr(self.scheduler)  # the next step's rate: the restarted schedule's first
        tqdm.write(f"stage {stage['name']!r} from step {self.step}: {len(self.pool)} training samples")

    def _apply_stage(self, stage: dict[str, Any]) -> None:
        from rewards import CombinedReward

        where = f"stage {stage['name']!r}"
        if stage["pool"] is None:
            pool = list(range(len(self.train_samples)))
        else:
            index = {s.id: i for i, s in enumerate(self.train_samples)}
            missing = [i for i in stage["pool"] if i not in index]
            if missing:
                raise MmrlError(f"{where}: sample ids not in the training set: {', '.join(missing[:5])}")
            pool = [index[i] for i in stage["pool"]]
        if not pool:
            raise MmrlError(f"{where}: the training pool is empty")
        try:
            grpo = dataclasses.replace(self._base_grpo, **(stage["grpo"] or {}))
        except TypeError as exc:
            raise ConfigError(f"{where}: {exc}") from exc
        combined = CombinedReward(stage["rewards"] if stage["rewards"] is not None else self._base_rewards,
                                  where=f"{where} rewards")
        combined.load_state_dict(self.rewards.state_dict())  # stateful rewards of the same label carry over
        self.stage, self.pool, self.rewards = stage, pool, combined
        restart = stage.get("lr_restart")
        if restart:
            self.lr_schedule.restart(restart["start"], restart["steps"])
        # a new config object: one a plug-in or a component read before the switch stays as it was
        self.cfg = dataclasses.replace(self.cfg, grpo=grpo)
        self.shaper = grpo.build_shaper()
        self.sampler = self._make_sampler()
        if grpo.uses_reference and self.ref is None:
            self.reset_reference()

    def _reference_copy(self) -> torch.nn.Module:
        """A copy of the policy's model for the KL reference. A model loaded already partitioned (ZeRO-3 on
        several ranks, :func:`mmrl.engine.optim.zero3_sharded_loading`) cannot be copied: the reference is loaded
        again, partitioned, from the folder the policy came from (this happens only at the run's start, before
        any update, with no cold start in the run). The copy is frozen, in eval mode."""
        from mmrl.engine.optim import is_sharded, zero3_sharded_loading
        from mmrl.model import load_policy

        model = self.policy.model
        if not is_sharded(model):
            copied = copy.deepcopy(model)
        else:
            args = self.policy.load_args
            with zero3_sharded_loading(self.cfg.train, self.world, bf16=self.cfg.model.dtype == "bf16"):
                copied = load_policy(args["path"], dtype=args["dtype"], device=args["device"],
                                     attn_implementation=args["attn_implementation"]).model
        copied.eval()
        for p in copied.parameters():
            p.requires_grad_(False)
        return copied

    def reset_reference(self) -> None:
        """Make the KL reference a copy of the current policy, creating it when there is none. With LoRA
        no copy of the model is made: the reference is the policy with its adapters disabled (the base
        model), or, reset after the adapters trained, with the adapter weights of now swapped in for its
        passes (:class:`mmrl.model.lora.AdapterReference`)."""
        if has_lora(self.policy.model):
            self.ref = AdapterReference.of_current(self.policy)
        elif self.ref is None:  # the policy's processor, options and media store (same keys)
            self.ref = self.policy.reference(self._reference_copy())
        elif self._zero3():
            raise MmrlError("a KL reference reset mid-run (a curriculum stage's reset_reference) is not supported "
                            "under ZeRO-3 yet: use train.deepspeed=zero2, or a stage without reset_reference")
        else:
            self.ref.model.load_state_dict(self.policy.model.state_dict())
        self.ref_is_start = self.step == 0

    # ------------------------------------------------------------------------------------ one step
    def train_step(self) -> dict[str, Any]:
        t0 = time.perf_counter()
        self._draws = 0
        vision0 = self.policy.media.vision_calls
        sync0 = float(getattr(self.backend, "sync_seconds", 0.0))
        host = getattr(self.updater, "host", None)  # the optimizer state's trips (rollout.vllm.offload_optimizer)
        moved0 = (host.bytes_moved, host.seconds) if self.offload_in_rollouts else (0, 0.0)
        self._mem = StagePeaks(self.policy.device)
        self._mem.start("rollout")
        with self.rollout_session():
            batch, drawn, stats = self.collect()  # rollouts and rewards, over dynamic-sampling rounds
        self._mem.stop("rollout")
        if len(drawn):
            self.sampler.update(drawn)
        stats.update(self.sampler.metrics())  # the sampler's own per-step numbers (empty for most)
        stats.update(self.reward_metrics(drawn))
        stats["curriculum_stage"] = self.stage["name"]  # the stage this step ran in
        stats["time/rollout_s"] = time.perf_counter() - t0
        # the weight push to a separate engine (vLLM) happens as the rollout session opens: its share
        stats["time/sync_s"] = float(getattr(self.backend, "sync_seconds", 0.0)) - sync0
        if self.offload_in_rollouts:  # GB moved to host memory (and back) this step, and the copies' time
            stats["offload/gb"] = (host.bytes_moved - moved0[0]) / 1e9
            stats["time/offload_s"] = host.seconds - moved0[1]
        if batch is not None:
            t1 = time.perf_counter()
            self._mem.call("reference", self.reference_pass, batch)
            t2 = time.perf_counter()
            stats["time/reference_s"] = t2 - t1
            self.compute_advantages(batch)
            self.shape_tokens(batch)
            stats.update(self.update(batch))
            stats["time/update_s"] = time.perf_counter() - t2
            stats["tokens/trained"] = int(sum(len(s) for s in batch.seqs))
            self._sync_backend()  # a separate rollout engine (vLLM) gets the new weights
            self._hook("after_update", batch, stats)
        else:
            stats["skipped_update"] = 1
        # the rate this step's optimizer steps used (its last; a step with no update: the rate it had), not the
        # next step's that the scheduler is about to set
        stats.setdefault("lr", self.optimizer.param_groups[0]["lr"])
        with warnings.catch_warnings():  # a skipped update is not a misordered optimizer/scheduler call
            warnings.simplefilter("ignore", UserWarning)
            self.scheduler.step()  # the schedule follows the steps, skipped updates included
        stats.update(self.step_metrics(drawn, batch))
        stats["time/step_s"] = time.perf_counter() - t0
        # peak memory by stage (rank 0's): rollout (with rewards), reference (log-prob passes before the
        # update), update (the largest micro-batch's forward and backward), optimizer_step; peak_gb the largest
        stats.update(self._mem.metrics())
        self._log_rollouts(batch if batch is not None else drawn)
        stats["vision_calls"] = self.policy.media.vision_calls - vision0  # tower runs this step (all passes)
        self.policy.clear_media()  # the step's media and their cached vision features
        return stats

    def _sync_backend(self) -> None:
        sync = getattr(self.backend, "after_update", None)
        if sync is not None:
            sync(self.policy)

    def rollout_session(self) -> contextlib.AbstractContextManager:
        """A block of generation on every rank at once (:func:`mmrl.engine.rollout.rollout_session`): the weights
        gathered once under ZeRO-3, the vLLM engine awake with the current weights."""
        return rollout_session(self.backend)

    def _hook(self, name: str, *args: Any) -> None:
        for plugin in self.plugins.values():
            getattr(plugin, name)(*args)

    # ------------------------------------------------------------------------------------ rollouts
    def collect(self) -> tuple[RolloutBatch | None, RolloutBatch, dict[str, Any]]:
        """``(batch to train on or None, every drawn group, stats)``. With dynamic sampling, rounds are
        drawn until ``prompts_per_step`` informative groups or ``max_draws`` extra rounds."""
        g, target = self.cfg.grpo, self.cfg.train.prompts_per_step
        if not g.dynamic_sampling:
            batch = self.rollout_round(target)  # empty when every drawn sample was skipped
            return (batch if len(batch) else None), batch, {"groups_dropped": 0, "generation_rounds": 1}
        acc: GroupAccumulator[tuple[RolloutBatch, list[int]]] = GroupAccumulator(
            target_groups=target, max_draws=g.max_draws, tol=g.dynamic_sampling_tol,
            band=None if g.dynamic_sampling_band is None else tuple(g.dynamic_sampling_band))
        rounds: list[RolloutBatch] = []
        while acc.needs_more():
            batch = self.rollout_round(target - len(acc.groups))
            rounds.append(batch)
            groups = list(batch.groups())
            acc.add([(batch, rows) for rows in groups], [batch.rewards[rows] for rows in groups])
        kept = [b.select(rows) for b, rows in acc.groups]
        stats = {"groups_dropped": acc.dropped, "generation_rounds": acc.rounds}
        drawn = [b for b in rounds if len(b)]
        return ((RolloutBatch.concat(kept) if kept else None), (RolloutBatch.concat(drawn) if drawn else rounds[0]),
                stats)

    def rollout_round(self, n_prompts: int) -> RolloutBatch:
        """Draw ``n_prompts`` prompts, roll out G episodes each, score them."""
        return self.rollout_prompts(self.sampler.draw(n_prompts))

    def rollout_prompts(self, indices: Sequence[int], *, n: int | None = None, hooks: bool = True
                        ) -> RolloutBatch:
        """Roll out ``n`` (default: the group size) episodes for each of the sampler's prompts ``indices``
        with the current policy and score them with the stage's rewards. Samplers that re-score their pool
        (variance-aware sampling) call this with ``hooks=False``: no plug-in sees those rollouts."""
        n = n or self.cfg.rollout.group_size
        indices = list(indices)
        # this rank's contiguous share of the prompts (may be empty); the ranks of a tensor-parallel engine's
        # block (rollout.vllm.tensor_parallel_size) share one share, so they call the engine in lockstep; so do
        # the ranks of a sequence-parallel group (train.sequence_parallel_size), each generating the same
        # rollouts (same prompts, same seeds; one copy is kept) and encoding the same media for its passes
        tp = self._block
        index, count, _ = self.world.block(tp)
        mine = World(rank=index, size=count).share(len(indices))
        with self.rollout_session():
            prompts, skipped = self.prepare([indices[i] for i in mine], first_slot=mine.start)
            draw, self._draws = self._draws, self._draws + 1
            if self.cfg.rollout.seed_per_prompt:  # each prompt from a random stream of its own
                episodes = []
                for p in prompts:
                    seed = self._rollout_seed(draw, p.slot)
                    with _seeded(seed, self.policy.device):
                        episodes += self._episodes([p], n, seed=seed)
            else:
                episodes = self._episodes(prompts, n) if prompts else []
            batch = RolloutBatch.from_episodes(episodes, [p.index for p in prompts], n)
            # who trains each row: its rank, or in a block, the member the row's group falls to (contiguous); a
            # sequence-parallel group trains its rows together (recorded as its first rank)
            groups = max(1, batch.n_groups)
            spread = 1 if self._sp is not None else tp
            batch.extra["rank"] = index * tp + batch.group_index * spread // groups
            if hooks and len(batch):
                self._hook("after_rollout", batch)
            self.score(batch)
        if self.world.active:  # every rank gets the whole scored batch, in draw order (one copy per block)
            parts = self.world.gather((batch, skipped))[::tp]
            skipped = sum(k for _, k in parts)
            shares = [b for b, _ in parts if len(b)]
            batch = RolloutBatch.concat(shares) if shares else batch
        self.skipped_samples += skipped
        if hooks and len(batch):  # plug-ins see the whole batch, as in one process (the same state on every rank)
            self._hook("after_rewards", batch)
        return batch

    def _episodes(self, prompts: list[PreparedPrompt], n: int, *, seed: int | None = None):
        params = self.params if seed is None else dataclasses.replace(self.params, seed=seed)
        return self.rollout_strategy(
            self.policy, self.backend, [p.seq for p in prompts], [p.sample for p in prompts],
            n=n, params=params, environment=self._environment(prompts),
            max_turns=self.cfg.rollout.max_turns)

    def _rollout_seed(self, draw: int, slot: int) -> int:
        key = f"{self.cfg.train.seed}/{self.step}/{draw}/{slot}".encode()
        return int.from_bytes(hashlib.sha256(key).digest()[:8], "little") & (2**63 - 1)

    MAX_BAD_IN_A_ROW = 50

    def prepare(self, indices: Sequence[int], *, first_slot: int = 0) -> tuple[list[PreparedPrompt], int]:
        """Encode the drawn prompts (``first_slot``: the first one's place in the round's draw); returns them
        and the number skipped. A bad sample (unreadable media, or media the processor rejects) stops the run,
        or with ``on_bad_sample: skip`` is left out of this step, named, and not replaced (the same rule on 1
        or N ranks, so the run does not depend on the number of ranks); a step with no prompt left trains on
        nothing (``skipped_update``)."""
        out: list[PreparedPrompt] = []
        skipped = 0
        for slot, i in enumerate(indices, start=first_slot):
            sample = self.sampler.samples[i]
            try:
                seq, media = encode_prompt(self.policy, self.preparer, sample, self.cfg.prompt)
            except MediaError as exc:
                if self.cfg.data.on_bad_sample != "skip":
                    raise MmrlError(f"sample {sample.id}: {exc} (set data.on_bad_sample=skip to skip bad samples)"
                                    ) from exc
                skipped += 1
                self._bad_in_a_row += 1
                if self._bad_in_a_row > self.MAX_BAD_IN_A_ROW:
                    raise MmrlError(f"{self._bad_in_a_row} unreadable samples in a row; run `mmrl data validate` on "
                                    "the data") from exc
                tqdm.write(f"skipping sample {sample.id}: {exc}")
                continue
            self._bad_in_a_row = 0
            out.append(PreparedPrompt(i, sample, seq, media, slot))
        return out, skipped

    def _environment(self, prompts: list[PreparedPrompt]):
        if self.env_cls is None:
            return None
        by_id = {id(p.sample): p for p in prompts}
        kwargs = self.cfg.rollout.environment_kwargs
        return lambda sample: self.env_cls(sample, by_id[id(sample)].media, **kwargs)

    def score(self, batch: RolloutBatch) -> None:
        """``batch.rewards`` and ``batch.reward_components`` (plus the DAPO soft overlong penalty)."""
        if not len(batch):  # a rank whose share of the prompts is empty
            batch.rewards = torch.zeros(0)
            batch.reward_components = {}
            return
        columns, data_columns, messages = rollout_reward_columns(
            batch, self.cfg.prompt, step=self.step, max_steps=self.cfg.train.steps, stage=self.stage["name"])
        columns["rollout_service"] = self.service
        result = self.rewards.compute(batch.completions, columns, messages=messages, dataset_columns=data_columns)
        rewards = torch.tensor(result.total, dtype=torch.float32)
        components = {k: torch.tensor(v, dtype=torch.float32) for k, v in result.components.items()}
        g = self.cfg.grpo
        if g.overlong_penalty:
            pen = soft_overlong_penalty(batch.response_length, g.max_response_length, g.overlong_cache,
                                        g.overlong_penalty_factor)
            rewards = rewards + pen
            components["overlong_penalty"] = pen
        batch.rewards, batch.reward_components = rewards, components

    # ------------------------------------------------------------------------------------ before the update
    def _minibatches(self, batch: RolloutBatch) -> list[list[int]]:
        """The optimizer steps' mini-batches (:meth:`RolloutBatch.minibatches`: groups dealt round-robin, so
        every rank trains a share of every optimizer step)."""
        return batch.minibatches(self.cfg.grpo.ppo_mini_batch_size)

    def _chunks(self, rows: Sequence[int], batch: RolloutBatch | None = None) -> list[list[int]]:
        """Micro-batches of ``rows`` (:func:`mmrl.engine.batch.micro_batch_rows`: the one rule, which plug-ins see
        through :meth:`update_plan`)."""
        return micro_batch_rows(rows, self.cfg.train, batch)

    def update_plan(self, batch: RolloutBatch) -> list[list[list[int]]]:
        """The update of ``batch`` as one process runs it (:func:`mmrl.engine.batch.update_plan`): per optimizer step,
        its micro-batches' rows (under data parallelism each rank runs micro-batches of its own rows)."""
        return update_plan(batch, self.cfg)

    def _logprobs(self, policy: Policy, batch: RolloutBatch, *, entropies: bool = False
                  ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """(N, L) log-probs (and entropies) of the batch's tokens under ``policy``, gradient-free."""
        logps = torch.zeros(len(batch), batch.width)
        ents = torch.zeros(len(batch), batch.width) if entropies else None
        with policy.inference():
            for idx, dummy in self._own_chunks(batch, range(len(batch))):
                seqs, width = batch.micro_batch(idx) if not dummy else ([self._dummy_seq()], 2)
                lp, ent, _ = policy.forward_logprobs(seqs, temperature=self.cfg.rollout.temperature,
                                                     with_entropy=entropies)
                if dummy or not self._sp_lead:  # a sequence-parallel group's rows: filled once, by its first rank
                    continue
                logps[idx, :width] = lp.float().cpu()
                if ents is not None:
                    ents[idx, :width] = ent.float().cpu()
        if self.world.active:  # each rank filled the rows it rolled out
            self.world.sum_(logps)
            if ents is not None:
                self.world.sum_(ents)
        return logps, ents

    def _own_chunks(self, batch: RolloutBatch, rows: Sequence[int]) -> list[tuple[list[int], bool]]:
        """Micro-batches of the ``rows`` this rank rolled out (their media are encoded here), as
        ``(rows, dummy)``. Every rank gets the same number: a rank with fewer (or none: dynamic sampling may
        keep no group of a rank) adds dummy passes (``([], True)``: a two-token text sequence whose result is
        unused, :meth:`_dummy_seq`) so that the ranks' collectives line up."""
        rows = list(rows)
        if not self.world.active:
            return [(c, False) for c in self._chunks(rows, batch)]
        owner = batch.extra["rank"]
        # every rank holds the whole batch (its lengths too), so each computes every rank's chunks alike; the ranks
        # of a sequence-parallel group run the same chunks (each a slice of their tokens)
        sp = self._sp.size if self._sp is not None else 1
        per_rank = [self._chunks([i for i in rows if int(owner[i]) // sp == r], batch)
                    for r in range(self.world.size // sp)]
        mine = [(c, False) for c in per_rank[self.world.rank // sp]]
        most = max(len(c) for c in per_rank)
        return mine + [([], True)] * (most - len(mine))

    def _dummy_seq(self) -> TokenSeq:
        """The sequence of a dummy pass: two text tokens, the second trained (its loss is multiplied by 0)."""
        pad = self.policy.pad_id
        return TokenSeq(ids=[pad, pad], mm_types=[0, 0], loss_mask=[0, 1])

    def reference_pass(self, batch: RolloutBatch) -> None:
        """Reference log-probs (when there is a reference), the pre-update policy's log-probs when the update
        or the shaper needs them, and the KL folded into the reward (``kl_in_reward``)."""
        g = self.cfg.grpo
        needs = set(getattr(self.shaper, "requires", ()))
        off_policy = g.ppo_epochs > 1 or len(self._minibatches(batch)) > 1
        if self.ref is not None:
            batch.ref_logprobs = self._logprobs(self.ref, batch)[0]
        kl_to_reward = g.kl_in_reward and self.ref is not None and g.kl_coef > 0
        want_old = off_policy or "logprobs" in needs or kl_to_reward
        want_ent = "entropies" in needs and batch.entropies is None
        if want_old or want_ent:
            old, ent = self._logprobs(self.policy, batch, entropies=want_ent)
            batch.old_logprobs = old if want_old else None
            if want_ent:
                batch.entropies = ent
        if kl_to_reward:
            new, seq_kl = kl_in_reward(batch.rewards, batch.old_logprobs, batch.ref_logprobs, batch.loss_mask,
                                       g.kl_coef, g.kl_reward_estimator, clamp=g.kl_clamp)
            batch.rewards = new
            batch.reward_components["kl_penalty"] = -g.kl_coef * seq_kl
            if not off_policy and "logprobs" not in needs:
                batch.old_logprobs = None  # on-policy: the update uses its own detached log-probs

    def compute_advantages(self, batch: RolloutBatch) -> None:
        g = self.cfg.grpo
        batch.advantages = compute_advantages(batch.rewards, group_index=batch.group_index,
                                              estimator=g.advantage_estimator, eps=g.adv_eps,
                                              components=batch.reward_components, extra=batch.extra)
        if g.overlong_filter:
            keep = overlong_keep_mask(batch.response_length, batch.finished, g.max_response_length)
            batch.loss_mask = batch.loss_mask * keep[:, None].to(batch.loss_mask.dtype)
        self._hook("after_advantages", batch)

    def shape_tokens(self, batch: RolloutBatch) -> None:
        """Run the token shaper once on the whole batch (its mask decides the step's token counts)."""
        mask = batch.loss_mask
        adv = batch.advantages if batch.advantages.dim() == 2 else batch.advantages[:, None] * mask
        out = self.shaper(ShapingInput(
            advantages=adv * mask, mask=mask, logp=batch.old_logprobs, old_logp=batch.old_logprobs,
            entropies=batch.entropies, cfg=self.cfg.grpo, group_index=batch.group_index, rewards=batch.rewards,
            components=batch.reward_components, extra=batch.extra, batch=batch))
        batch.advantages = out.advantages
        if out.mask is not None:
            batch.loss_mask = out.mask.to(mask.dtype)
        if out.weights is not None:
            batch.token_loss_weights = batch.token_loss_weights * out.weights
        if out.kl_weights is not None:
            batch.token_kl_weights = batch.token_kl_weights * out.kl_weights

    # ------------------------------------------------------------------------------------ the update
    def update(self, batch: RolloutBatch) -> dict[str, Any]:
        """``ppo_epochs`` passes over the batch's mini-batches, one optimizer step per mini-batch. A loss or
        gradient norm that is not finite skips that optimizer step (counted in ``skipped_updates``)."""
        g = self.cfg.grpo
        minis = self._minibatches(batch)
        self.policy.model.train()
        norms: list[float] = []
        # the step's statistics stay on the device until the update ends (_UpdateSums: one read for them all)
        self._fresh, self._sums = True, _UpdateSums()
        n_updates = g.ppo_epochs * len(minis)
        work: list[int] = []  # the tokens this rank trained in each optimizer step (dummy passes: none)
        lr_used = self.optimizer.param_groups[0]["lr"]
        poison = self._poison_non_finite()
        for _epoch in range(g.ppo_epochs):
            for mini in minis:
                work.append(0)
                # the counts the loss is normalised by: the whole mini-batch's, over every rank
                counts = global_counts([batch.tokens("loss_mask", idx, batch.micro_batch(idx)[1])
                                        for idx in self._chunks(mini)])
                self.updater.zero_grad()
                self._sums.new_step()
                for idx, dummy in self._own_chunks(batch, mini):
                    work[-1] += 0 if dummy else sum(len(batch.seqs[i]) for i in idx)
                    self._micro_step(batch, idx, counts, self._sums, n_updates, dummy=dummy, poison=poison)
                # the optimizer step's one check: every micro-batch's loss finite, on every rank
                finite = self.world.all_true(self._sums.all_finite())
                lrs = [group["lr"] for group in self.optimizer.param_groups]
                lr_used = lrs[0]
                lr_ok = all(math.isfinite(lr) and lr >= 0 for lr in lrs)  # one a plug-in set: never stepped
                # DeepSpeed steps a non-finite step too: its poisoned gradients make it skip and clear ZeRO's
                # partitions (_poison_non_finite); the local updater's are dropped by zero_grad below
                step = lr_ok and (finite or poison)
                grad_norm = self._mem.call("optimizer_step", self.updater.step) if step else None
                self.policy.weights_changed()  # cached vision features of a trainable tower are stale now
                self._fresh = False
                if grad_norm is not None:
                    norms.append(grad_norm)
                    self._check_weights(lrs)
                else:
                    self.skipped_updates += 1
                    why = "non-finite loss or gradient" if lr_ok else f"learning rate {lrs[0]} is not a finite number >= 0"
                    tqdm.write(f"step {self.step + 1}: {why}; optimizer step skipped ({self.skipped_updates} so far)")
                self.recent_updates = [*self.recent_updates, grad_norm is None][-SKIP_WINDOW:]
                self.updater.zero_grad()
        sums, gap_sum, gap_tokens = self._sums.read()
        if not self._sp_lead:  # the ranks of a sequence-parallel group computed the same loss: counted once
            sums, gap_sum, gap_tokens = {k: 0.0 for k in sums}, 0.0, 0.0
        stats: dict[str, Any] = dict(self.world.sum_stats(sums))
        if batch.rollout_logprobs is not None:  # mean |training - rollout| log-prob per token
            gap = self.world.sum_stats({"sum": gap_sum, "tokens": gap_tokens})
            stats["rollout_logprob_gap"] = gap["sum"] / max(1.0, gap["tokens"])
            if self.world.active:  # each rank's own engine: the worst rank's mean
                stats["rollout_logprob_gap/worst_rank"] = max(self.world.gather(gap_sum / max(1.0, gap_tokens)))
        stats["grad_norm"] = sum(norms) / len(norms) if norms else float("nan")
        stats["optimizer_steps"] = len(norms)
        stats["lr"] = lr_used  # the rate of the step's last optimizer step
        stats["skipped_updates"] = self.skipped_updates
        stats.update(balance_stats(self.world.gather(work) if self.world.active else [work]))
        adv = batch.advantages
        seq_adv = adv if adv.dim() == 1 else (adv * batch.loss_mask).sum(-1) / batch.loss_mask.sum(-1).clamp(min=1)
        stats["advantage_abs"] = float(seq_adv.abs().mean())
        stats["reward_std"] = float(torch.stack([batch.rewards[rows].std(unbiased=False)
                                                 for rows in batch.groups()]).mean())
        return stats

    def _check_weights(self, lrs: list[float]) -> None:
        """After an optimizer step: every trainable weight finite, on every rank; else the run stops here,
        before the weights reach a rollout or a checkpoint (the last checkpoint keeps the last good ones).
        Under ZeRO-3 each rank holds no whole parameter here, so this checks nothing there."""
        groups: dict[tuple, list[torch.Tensor]] = {}
        for p in self.policy.model.parameters():
            if p.requires_grad and p.numel():
                groups.setdefault((p.device, p.dtype), []).append(p.detach())
        # the largest magnitude of each weight, a few fused calls for all of them (one isfinite per weight was
        # ~5 operations each, ~4,000 launches a step at a 3B model's 800 weights): finite exactly when every
        # element is (a NaN propagates through the max, an infinity is the max)
        flags = [torch.isfinite(torch.stack(torch._foreach_norm(ps, float("inf")))).all().cpu() for ps in groups.values()]
        ok = bool(torch.stack(flags).all()) if flags else True
        if not self.world.all_true(ok):
            raise Diverged(f"step {self.step + 1}: an optimizer step (learning rate {lrs[0]:.3g}) made weights NaN "
                           "or infinite; the run stops before they reach a rollout or a checkpoint. "
                           f"{self._resume_hint()}")

    def skipping_verdict(self) -> str | None:
        """Why the run must stop, when more than ``train.max_skipped_updates_frac`` of its latest optimizer steps
        (:data:`SKIP_WINDOW`, judged from :data:`SKIP_MIN_STEPS`) were skipped as non-finite; else None."""
        recent, frac = self.recent_updates[-SKIP_WINDOW:], self.cfg.train.max_skipped_updates_frac
        skipped = sum(recent)
        if len(recent) < SKIP_MIN_STEPS or skipped <= frac * len(recent):
            return None
        return (f"stopped at step {self.step} of {self.cfg.train.steps}: {skipped} of the last {len(recent)} optimizer "
                f"steps were skipped because the loss or the gradient was not finite ({self.skipped_updates} skipped "
                f"in all; train.max_skipped_updates_frac={frac}). The run is diverging: lower train.lr (now "
                f"{self.cfg.train.lr:g}) or look for a reward or loss term that gives NaN. {self._resume_hint()}")

    def _resume_hint(self) -> str:
        ckpt = latest_checkpoint(self.run_dir)
        if ckpt is None:
            return "No checkpoint was written; start a new run with other settings."
        lower = f"{self.cfg.train.lr / 10:g}"  # a new value is a setting other than the run's: --force-settings
        return (f"{ckpt.name} holds the last good weights: continue from it with a lower learning rate, e.g. "
                f"`mmrl train --out {shlex.quote(str(self.run_dir))} --resume --force-settings train.lr={lower}`, "
                "or start a new run.")

    def _poison_non_finite(self) -> bool:
        """Whether a non-finite loss goes through backward as NaN times itself (every gradient it reaches NaN)
        and the optimizer step is still called. DeepSpeed: its engine reduces each backward's gradients into
        ZeRO's own partitions, which ``engine.zero_grad`` (the parameters' ``.grad``) does not clear; its
        ``step`` does, when it finds them non-finite (deepspeed/runtime/zero/stage_1_and_2.py ``step``: the
        overflow branch drops them, and ``micro_step_id`` restarts), and skips the update on every rank. So a
        step skipped without calling it would carry the earlier micro-batches' gradients into the next one;
        a poisoned step leaves none (measured on ZeRO-2 and ZeRO-3: the next step equals a clean one). The
        local updater's gradients are the parameters' own, set to None by ``zero_grad`` after a skip."""
        return bool(getattr(self.cfg.train, "deepspeed", None))

    def _micro_step(self, batch: RolloutBatch, idx: list[int], counts: Any, sums: _UpdateSums,
                    n_updates: int, *, dummy: bool = False, poison: bool = False) -> None:
        """Forward and backward of one micro-batch, with no host round-trip of its own: its loss's finiteness
        joins ``sums.ok``, a flag on the device that :meth:`update` reads once per optimizer step (a non-finite
        loss still goes through backward; the step is then skipped and its gradients dropped), and its
        statistics join ``sums`` as device tensors, counted only while every loss of the optimizer step so far
        is finite (as when a non-finite micro-batch ended the step's loop). ``poison`` (DeepSpeed,
        :meth:`_poison_non_finite`): a non-finite loss goes through backward as NaN times itself. A ``dummy``
        pass only keeps the ranks' collectives in step: its loss is zero."""
        g = self.cfg.grpo
        self._mem.start("update")
        if dummy:
            logp, _, _ = self.policy.forward_logprobs([self._dummy_seq()], temperature=self.cfg.rollout.temperature,
                                                      with_entropy=True, entropy_grad=bool(g.entropy_coef))
            self.updater.backward(torch.nan_to_num(logp).sum() * 0.0)
            return
        seqs, width = batch.micro_batch(idx)
        routers = router_loss.RouterLogits(self.policy.model) if self.router_aux_coef > 0 else None
        with routers or contextlib.nullcontext():
            logp, ent, _ = self.policy.forward_logprobs(seqs, temperature=self.cfg.rollout.temperature,
                                                        with_entropy=True, entropy_grad=bool(g.entropy_coef))
        dev = logp.device

        def tok(name: str) -> torch.Tensor | None:
            t = batch.tokens(name, idx, width)
            return None if t is None else t.to(dev)

        adv = batch.advantages
        adv = adv[idx].to(dev) if adv.dim() == 1 else tok("advantages")
        mask = tok("loss_mask")
        loss_weights = tok("loss_weights")
        rollout_logp = tok("rollout_logprobs")
        gap = None
        if rollout_logp is not None:  # the rollout engine's probabilities against the trainer's
            diff = (logp.detach() - rollout_logp).masked_fill(mask == 0, 0.0)
            gap = diff.abs().sum() / mask.sum().clamp(min=1)
            if g.tis_cap > 0:
                old = tok("old_logprobs")
                ratio = torch.exp((old if old is not None else logp.detach()) - rollout_logp).clamp(max=g.tis_cap)
                loss_weights = loss_weights * ratio.masked_fill(mask == 0, 0.0)
        elif g.tis_cap > 0:
            raise ConfigError("grpo.tis_cap needs the rollout engine's log-probs: set rollout.record_logprobs=true")
        loss, st = compute_policy_loss(
            logp, tok("old_logprobs"), adv, mask, g, ref_logp=tok("ref_logprobs"), entropies=ent,
            global_tokens=counts.tokens, global_seqs=counts.seqs, loss_weights=loss_weights,
            kl_weights=tok("kl_weights") if batch.ref_logprobs is not None else None)
        # this micro-batch's share of the mini-batch's tokens, in fp64 on the device (no host round-trip)
        tokens = mask.detach().sum().double()
        share = tokens / max(1.0, counts.tokens)
        if routers is not None:  # this micro-batch's share of the mini-batch's mean, as its policy loss is
            aux = routers.loss()
            loss = loss + self.router_aux_coef * aux.to(loss.dtype) * share.to(loss.dtype)
            st["router_aux_loss"] = aux.detach()
        finite = torch.isfinite(loss.detach())
        sums.join(finite)
        if poison:  # x 1, or x NaN: NaN on every gradient it reaches (0 x NaN is NaN too), no host round-trip
            loss = loss * torch.where(finite, 1.0, float("nan")).to(loss.dtype)
        self.updater.backward(loss)
        self._mem.stop("update")  # forward and backward: the micro-batch's peak
        if gap is not None and self._fresh:  # before any optimizer step of this batch: the rollout's weights
            sums.add_gap(gap.detach().double() * tokens, tokens)
        # loss terms are already this micro-batch's share of the step's loss: they add up; the other statistics
        # are micro-batch means: weighted by the micro-batch's tokens
        sums.add({k: (v.detach().double() if k in LOSS_TERMS else v.detach().double() * share) / n_updates
                  for k, v in st.items() if k != "n_tokens"})

    # ------------------------------------------------------------------------------------ logging
    @staticmethod
    def reward_metrics(drawn: RolloutBatch) -> dict[str, Any]:
        """Mean reward and components over every drawn group (kept by dynamic sampling or not)."""
        stats: dict[str, Any] = {"reward": float(drawn.rewards.mean())}
        groups = list(drawn.groups())
        if groups:  # the share of groups GRPO can learn from: their total rewards are not all equal
            stats["informative_groups"] = sum(
                float(drawn.rewards[rows].max() - drawn.rewards[rows].min()) > 1e-6 for rows in groups) / len(groups)
        for k, v in drawn.reward_components.items():
            stats[f"reward/{k}"] = float(v.mean())
        for k, v in drawn.extra.get("reward_metrics", {}).items():  # a reward's log_metric (TRL)
            stats[f"reward_metric/{k}"] = v
        return stats

    def step_metrics(self, drawn: RolloutBatch, batch: RolloutBatch | None) -> dict[str, Any]:
        stats: dict[str, Any] = {}
        if batch is not None:
            stats["response_length"] = float(batch.response_length.float().mean())
            stats["truncated_frac"] = float((~batch.finished).float().mean())
        stats["skipped_samples"] = self.skipped_samples
        return stats

    def _log_rollouts(self, batch: RolloutBatch) -> None:
        n = min(self.cfg.train.log_rollouts, len(batch))
        if n <= 0:
            return
        adv = batch.advantages
        records = []
        for i in range(n):
            a = None if adv is None else float(adv[i] if adv.dim() == 1 else adv[i][batch.loss_mask[i] > 0].mean())
            records.append({
                "id": batch.samples[i].id, "answer": batch.samples[i].answer,
                "prompt": self.policy.prompt_text(batch.seqs[i]), "turns": batch.turns[i],
                "rewards": {k: float(v[i]) for k, v in batch.reward_components.items()},
                "advantage": a, "response_length": int(batch.response_length[i]),
            })
        self.log.rollouts("rl", self.step + 1, records)  # the step being taken (metrics use the same number)

    def _summary_line(self, stats: dict[str, Any]) -> str:
        parts = [f"step {self.step}/{self.cfg.train.steps}", f"reward {stats['reward']:.3f}"]
        for key, label in (("reward/accuracy", "acc"), ("reward/format", "format"), ("response_length", "len"),
                           ("entropy", "entropy"), ("kl", "kl"), ("eval/accuracy", "eval acc"),
                           ("time/step_s", "s/step")):
            if isinstance(stats.get(key), (int, float)):
                parts.append(f"{label} {stats[key]:.3f}" if key != "response_length" else f"{label} {stats[key]:.1f}")
        return "  ".join(parts)

    # ------------------------------------------------------------------------------------ checkpoints
    def state_dict(self) -> dict[str, Any]:
        return {"optimizer": self.updater.state_dict(), "scheduler": self.scheduler.state_dict(),
                "sampler": self.sampler.state_dict(), "skipped_samples": self.skipped_samples,
                "skipped_updates": self.skipped_updates, "recent_updates": list(self.recent_updates),
                "stage": self.stage,
                "reference": None if self.ref is None else ("start" if self.ref_is_start else "stored"),
                "rewards": self.rewards.state_dict(),  # stateful rewards (e.g. a running-quantile remap)
                "plugins": {k: p.state_dict() for k, p in self.plugins.items()}}

    def resume(self) -> bool:
        """Load the latest checkpoint of this run, if there is one; True when resumed."""
        ckpt = latest_checkpoint(self.run_dir)
        if ckpt is None:
            self.log.truncate_after("rl", 0)  # a run killed before its first checkpoint starts RL afresh
            return False
        state = load_trainer_state(ckpt)
        # the stage and the reference first: a reference equal to the starting model is copied from the
        # policy before the checkpoint's weights replace them
        if state.get("stage") and state["stage"]["index"] > 0:
            self._apply_stage(state["stage"])
        if state.get("reference") and self.ref is None:
            self.reset_reference()
        if state.get("reference") == "stored":
            from mmrl.engine.checkpoint import load_reference_adapters
            if isinstance(self.ref, AdapterReference):  # LoRA: the reference's adapter weights
                stored = load_reference_adapters(ckpt)
                if stored is None:
                    raise MmrlError(f"{ckpt}: the KL reference's adapter weights are missing")
                self.ref.restore(stored)
            else:
                load_reference(self.ref.model, ckpt)
        self.ref_is_start = state.get("reference") != "stored"
        self.step = int(state["step"])
        if self.cfg.train.deepspeed:  # DeepSpeed restores the weights with its optimizer shards
            self.updater.load_files(ckpt)
        else:
            load_weights(self.policy.model, ckpt)
        self.updater.load_state_dict(state["optimizer"])
        self._sync_backend()
        self.scheduler.load_state_dict(state["scheduler"])
        if "peak_lr" in self.stage or self.stage["index"] == 0:  # (a stage of an older checkpoint: its own peak)
            # the peak is the stage's or train.lr, the schedule this run's settings (both may have been changed
            # with --force-settings): the next step's rate from them, at the restored position
            set_peak_lr(self.scheduler, self.stage.get("peak_lr") or self.cfg.train.lr)
        self.sampler.load_state_dict(state["sampler"])
        self.skipped_samples = state.get("skipped_samples", 0)
        self.skipped_updates = state.get("skipped_updates", 0)
        self.recent_updates = list(state.get("recent_updates", []))
        self.rewards.load_state_dict(state.get("rewards") or {})
        for k, p in self.plugins.items():
            p.load_state_dict(state.get("plugins", {}).get(k, {}))
        own_rng = ckpt / f"rng_state_rank{self.world.rank}.pt"  # several ranks: each its own random state
        set_rng_state(torch.load(own_rng, weights_only=True) if self.world.active and own_rng.is_file()
                      else state["rng"])
        self.log.truncate_after("rl", self.step)
        tqdm.write(f"resumed from {ckpt} (step {self.step})")
        return True

    def save(self) -> Path:
        """A checkpoint (with LoRA: the adapters, PEFT format, and the reference's adapter weights when the
        reference is not the start). Rank 0 writes the model and the trainer state, every rank its own
        optimizer shard (DeepSpeed, in one process too) and random state; the folder is renamed once all
        are written. Under ZeRO-3 the weights reach rank 0 one module at a time (:meth:`weights_on_main`).

        Logs a ``checkpoint`` line in ``metrics.jsonl`` at this step (rank 0's ``memory/save_gb``, on CUDA
        ``memory/save_reserved_gb`` and ``memory/save_host_gb``, see :class:`mmrl.engine.memory.StagePeaks`, and
        ``time/save_s``), once every file is written and before the folder is renamed: a run resumed from
        this checkpoint has the line, one resumed from an earlier one drops it with the steps after that."""
        ref = None
        if self.ref is not None and not self.ref_is_start:
            ref = self.ref.stored() if isinstance(self.ref, AdapterReference) else self.ref.model
        w = self.world
        tmp = start_checkpoint(self.run_dir, self.step) if w.is_main else None
        tmp = w.broadcast(tmp)
        t0, peaks = time.perf_counter(), StagePeaks(self.policy.device)
        with peaks.stage("save"):
            state = self.state_dict()  # the optimizer's tensors themselves: streamed to host as they are written
            weights = self.weights_on_main(adapters_only=has_lora(self.policy.model))
            with w.all_or_none(f"writing checkpoint-{self.step}"):  # rank 0 failing: every rank stops at once
                if w.is_main:
                    write_checkpoint(tmp, self.step, self.policy.model, self.policy.processor, state,
                                     reference=ref, settings=eval_settings(self.cfg), weights=weights)
            del state, weights
            self.updater.save_files(tmp)
            with w.all_or_none(f"writing checkpoint-{self.step}'s random state"):  # (all ranks meet here)
                if w.active:
                    torch.save(rng_state(), tmp / f"rng_state_rank{w.rank}.pt")
        self.log.metrics("checkpoint", self.step, {**peaks.metrics(overall=False),
                                                   "time/save_s": time.perf_counter() - t0})
        final = None
        with w.all_or_none(f"publishing checkpoint-{self.step}"):
            if w.is_main:
                final = publish_checkpoint(self.run_dir, self.step, keep=self.cfg.train.keep_checkpoints)
        return w.broadcast(final)

    def weights_on_main(self, *, adapters_only: bool = False, merged: bool = False) -> dict[str, torch.Tensor] | None:
        """Under ZeRO-3: the model's whole weights (``adapters_only``: the LoRA adapters; ``merged``: LoRA
        merged in, base names) gathered one module at a time, kept on rank 0 as CPU tensors (every rank must
        call it; the others get None). Without ZeRO-3 None: the live model is read directly."""
        from mmrl.model.weights import adapter_names, collect_on_main, stream_weights

        if not self.updater.partitioned:
            return None
        stream = stream_weights(self.policy.model, gather=self.updater.gather_params, merge_lora=merged,
                                select=adapter_names if adapters_only else None)
        return collect_on_main(stream, is_main=self.world.is_main)

    def export(self, folder: Path) -> None:
        """The final model as a Hugging Face folder (:func:`mmrl.engine.checkpoint.save_model`), written by rank 0;
        under ZeRO-3 gathered one module at a time (every rank calls it)."""
        lora = has_lora(self.policy.model)
        merged = self.weights_on_main(merged=True)
        adapters = self.weights_on_main(adapters_only=True) if lora else None
        with self.world.all_or_none(f"writing {folder.name}/"):  # every rank stops when rank 0's write fails
            if self.world.is_main:
                save_model(folder, self.policy.model, self.policy.processor, eval_settings(self.cfg),
                           weights=merged, adapter_weights=adapters)

    # ------------------------------------------------------------------------------------ loop
    def run_eval(self, tag: str) -> dict[str, Any]:
        metrics, _ = evaluate(
            self.service, self.eval_samples,
            max_new_tokens=self.cfg.eval.max_new_tokens or self.cfg.rollout.max_new_tokens,
            batch_size=self.cfg.eval.batch_size, min_options=self.cfg.eval.min_options, desc=tag,
            show_progress=self.show_progress)
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
            verdict = self.skipping_verdict()
            if verdict is not None:  # every rank alike: the skips are decided on every rank together
                bar.close()
                raise Diverged(verdict)
            bar.set_postfix(reward=f"{stats['reward']:.2f}", acc=f"{stats.get('reward/accuracy', float('nan')):.2f}",
                            len=f"{stats.get('response_length', 0):.0f}", refresh=False)  # drawn by update()
            bar.update(1)
            if t.log_every and self.step % t.log_every == 0 and self.show_progress:
                tqdm.write(self._summary_line(stats))
            saved = (t.save_every and self.step % t.save_every == 0) or self.step == t.steps
            # a stop asked for by a signal (SIGTERM, SIGINT), on any rank: every rank stops after this step,
            # with its checkpoint (the ranks agree here, at the step boundary, so none waits in a collective)
            stop = self.world.max_int(self.stop_requested())
            if saved or stop:
                t0 = time.perf_counter()
                self.save()
                self.save_seconds.append(round(time.perf_counter() - t0, 3))
            if stop:
                self.stopped_by = stop
                break
        bar.close()


class _UpdateSums:
    """One update's statistics, kept on the device as fp64 tensors and read once when the update ends
    (:meth:`read`), instead of a host round-trip per statistic and micro-batch. ``ok`` is the current optimizer
    step's flag (every loss so far finite); a micro-batch's values are added only while it holds, so the sums
    are those of the micro-batches before the step's first non-finite loss. The additions are in the order and
    precision the host's float sums had (fp64), so the values are the same to the last bit."""

    def __init__(self) -> None:
        self.ok: torch.Tensor | None = None
        self.sums: dict[str, torch.Tensor] = {}
        self.seen: dict[str, torch.Tensor] = {}  # whether a key got a value (kept only then, as before)
        self.gap: list[torch.Tensor] = []  # the rollout/training log-prob gap: |diff| sum, tokens

    def new_step(self) -> None:
        """An optimizer step begins: no loss of it seen yet."""
        self.ok = None

    def join(self, finite: torch.Tensor) -> None:
        self.ok = finite if self.ok is None else self.ok & finite

    def all_finite(self) -> bool:
        """The optimizer step's one host read: every loss of its micro-batches finite (no loss: True)."""
        return True if self.ok is None else bool(self.ok)

    def _masked(self, value: torch.Tensor) -> torch.Tensor:
        return value if self.ok is None else torch.where(self.ok, value, torch.zeros_like(value))

    def add(self, values: dict[str, torch.Tensor]) -> None:
        for k, v in values.items():
            self.sums[k] = self._masked(v) if k not in self.sums else self.sums[k] + self._masked(v.to(self.sums[k].device))
            ok = self.ok if self.ok is not None else torch.ones((), dtype=torch.bool, device=v.device)
            self.seen[k] = ok if k not in self.seen else self.seen[k] | ok.to(self.seen[k].device)

    def add_gap(self, diff_sum: torch.Tensor, tokens: torch.Tensor) -> None:
        parts = [self._masked(diff_sum), self._masked(tokens)]
        self.gap = parts if not self.gap else [a + b.to(a.device) for a, b in zip(self.gap, parts)]

    def read(self) -> tuple[dict[str, float], float, float]:
        """``(sums, gap sum, gap tokens)`` as Python floats: one transfer for all of them."""
        keys = list(self.sums)
        values = [self.sums[k] for k in keys] + [self.seen[k].double() for k in keys] + self.gap
        if not values:
            return {}, 0.0, 0.0
        dev = values[0].device
        flat = torch.stack([v.to(dev) for v in values]).tolist()
        n = len(keys)
        sums = {k: flat[i] for i, k in enumerate(keys) if flat[n + i]}
        gap_sum, gap_tokens = (flat[2 * n], flat[2 * n + 1]) if self.gap else (0.0, 0.0)
        return sums, gap_sum, gap_tokens


def balance_stats(work: list[list[int]]) -> dict[str, float]:
    """How evenly the ranks shared the update, from ``work[rank][k]``: the tokens each rank trained in
    optimizer step ``k``. ``balance/tokens_max_over_mean``: the busiest rank's tokens over the mean, averaged
    over the optimizer steps (1.0: even; N on N ranks: one rank did all the work); ``balance/idle_rank_steps``:
    the (rank, optimizer step) pairs in which a rank trained nothing while another did."""
    ratios, idle = [], 0
    for step in zip(*work):
        mean = sum(step) / len(step)
        if mean > 0:
            ratios.append(max(step) / mean)
            idle += sum(1 for t in step if t == 0)
    return {"balance/tokens_max_over_mean": sum(ratios) / len(ratios) if ratios else 1.0,
            "balance/idle_rank_steps": idle}


@contextlib.contextmanager
def _seeded(seed: int, device: torch.device) -> Iterator[None]:
    """A block that draws from torch's generators seeded with ``seed`` and leaves them as they were."""
    with torch.random.fork_rng(devices=[device] if device.type == "cuda" else []):
        torch.manual_seed(seed)
        yield
