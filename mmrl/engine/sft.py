"""Supervised fine-tuning (the cold start): loss on the assistant's tokens only.

Targets are written in the run's answer format. With ``sft.target: random_answer`` the answer inside the
tags is drawn at random from the sample's valid answers (an option letter, yes/no, another sample's
answer), so the cold start teaches the *format* and nothing about which answer is right; RL must find
the answers. ``gold`` trains on the reference answers (ordinary SFT). ``reasoning`` trains on a reasoning trace and the
reference answer, ``<think>trace</think><answer>answer</answer>`` (the answer where the prompt template asks for it:
``\\boxed{answer}`` under ``ares-math``; a chain-of-thought cold start, as Video-R1's
and ARES's): the trace is the record's ``meta.rationale`` (a string as written; a list of sentences: a random
number of them per draw, so lengths vary), or for the toy world's records a random-length trace of true
observations (:mod:`data_pipelines.toy.rationales`). ``sft.mc_answer`` says whether gold and reasoning targets
answer a multiple-choice question with the letter or the option's text (the toy base model answers in words).
"""

from __future__ import annotations

import random
import string
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from tqdm import tqdm

from mmrl.config import RunConfig
from mmrl.config.prompt_templates import answer_markup
from mmrl.engine.media import MediaPreparer
from mmrl.engine.optim import lr_lambda, lr_scheduler
from mmrl.engine.prompts import encode_prompt
from mmrl.engine.run_log import RunLog
from mmrl.model import Policy
from mmrl_common.errors import MediaError, MmrlError
from mmrl_common.registry import Registry

THINK = "<think>I look at the media and compare it with the question.</think>"


def answer_text(sample: Any, mc_answer: str = "letter") -> str:
    """The reference answer as a target writes it; ``mc_answer`` (``sft.mc_answer``): a multiple-choice
    answer as its ``letter`` or its ``option`` text."""
    a = sample.answer
    if sample.problem_type == "temporal_grounding" and isinstance(a, (list, tuple)):
        return f"[{float(a[0]):.1f}, {float(a[1]):.1f}]"
    if mc_answer == "option":
        return sample.answer_text()
    return str(a)


def random_answer(sample: Any, pool: Sequence[Any], rng: random.Random) -> str:
    """An answer of the right form, chosen without looking at the reference."""
    if sample.problem_type == "multiple_choice" and sample.options:
        return rng.choice(string.ascii_uppercase[:len(sample.options)])
    if sample.problem_type == "yes_no":
        return rng.choice(["yes", "no"])
    same = [s for s in pool if s.problem_type == sample.problem_type]
    return answer_text(rng.choice(same or list(pool)))


def reasoning_target(sample: Any, rng: random.Random, mc_answer: str = "letter", template: str = "default") -> str:
    """``<think>trace</think><answer>answer</answer>`` for ``sft.target: reasoning`` (see the module docstring);
    the answer written as prompt template ``template`` asks (:func:`mmrl.config.prompt_templates.answer_markup`)."""
    from data_pipelines.toy.rationales import draw_trace, toy_rationale

    given = (sample.meta or {}).get("rationale")
    if isinstance(given, str) and given.strip():
        trace = given.strip()
    elif isinstance(given, list) and given and all(isinstance(x, str) for x in given):
        trace = draw_trace(given, rng, max_looks=0)
    else:
        trace = toy_rationale(sample, rng)
        if trace is None:
            raise MmrlError(f"sample {sample.id}: sft.target=reasoning needs meta.rationale (the reasoning to train "
                            "on: a string, or a list of sentences to draw from); add it to the records, use "
                            "sft.target=gold, or sft.steps=0 when the model already reasons")
    return f"<think>{trace}</think>{answer_markup(template, answer_text(sample, mc_answer))}"


def target_text(sample: Any, answer: str, answer_format: str, template: str = "default") -> str:
    body = answer_markup(template, answer)
    return body if answer_format == "answer" else THINK + body


@dataclass
class TargetContext:
    """What an SFT target sees besides the sample: the run configuration, the training samples (the pool a
    random answer is drawn from) and the cold start's random stream."""

    cfg: RunConfig
    pool: Sequence[Any]
    rng: random.Random


SFT_TARGETS: Registry[Callable[[Any, TargetContext], str]] = Registry("SFT target", "sft.target")
"""``sft.target`` names: ``fn(sample, ctx) -> the assistant text to train on`` (its end of turn is added)."""
register_target = SFT_TARGETS.register


@register_target("gold")
def gold_target(sample: Any, ctx: TargetContext) -> str:
    """The reference answer in the run's answer format."""
    return target_text(sample, answer_text(sample, ctx.cfg.sft.mc_answer), ctx.cfg.prompt.answer_format,
                       ctx.cfg.prompt.template)


@register_target("random_answer")
def random_answer_target(sample: Any, ctx: TargetContext) -> str:
    """An answer of the right form drawn without looking at the reference (teaches the format only)."""
    return target_text(sample, random_answer(sample, ctx.pool, ctx.rng), ctx.cfg.prompt.answer_format,
                       ctx.cfg.prompt.template)


@register_target("reasoning")
def reasoning(sample: Any, ctx: TargetContext) -> str:
    """A reasoning trace, then the reference answer (:func:`reasoning_target`)."""
    return reasoning_target(sample, ctx.rng, ctx.cfg.sft.mc_answer, ctx.cfg.prompt.template)


EpisodeBuilder = Callable[[RunConfig, Policy, Any, Any, list[Any]], Any]
SFT_EPISODES: list[EpisodeBuilder] = []
"""Multi-turn cold starts: ``fn(cfg, policy, sample, prompt, media) -> TokenSeq | None``, tried in order for
every sample (None: the sample trains a single answer). A method registers its own with
:func:`register_sft_episode` (EARL's frame-selection trajectories: :mod:`mmrl.methods.earl`)."""


def register_sft_episode(fn: EpisodeBuilder) -> EpisodeBuilder:
    if fn not in SFT_EPISODES:
        SFT_EPISODES.append(fn)
    return fn


def _episode(cfg: RunConfig, policy: Policy, sample: Any, prompt: Any, media: list[Any]) -> Any:
    for build in SFT_EPISODES:
        episode = build(cfg, policy, sample, prompt, media)
        if episode is not None:
            return episode
    if (sample.meta or {}).get("sft_turns") is not None:
        raise MmrlError(f"sample {sample.id}: the record has meta.sft_turns (a multi-turn trajectory) but no "
                        "method that trains on them is loaded; add imports=[mmrl.methods.earl] (or the method "
                        "whose tool wrote them)")
    return None


@dataclass
class SftCheckpoints:
    """How ``mmrl sft`` (:func:`mmrl.run.sft_run.sft_run`) stops and continues: ``stop_requested()`` (a signal's
    number, 0 while none came: :func:`mmrl.run.pipeline.stop_requests`) is read before each optimizer step; when
    it is set, :func:`run_sft` writes ``run_dir/checkpoint-<step>/`` (:func:`mmrl.engine.checkpoint.save_checkpoint`:
    the weights, or with LoRA the adapters, and ``trainer_state.pt`` with the optimizer, the scheduler, the data
    position and every random state) and returns, ``stopped_by`` set to the signal and ``step`` to the steps done.
    ``resume``: start from the folder's latest intact checkpoint (none: from step 0), so that the steps after it are
    those of a run never stopped. ``saved``: the checkpoint this session wrote (None: none). A signal during the
    last step lets it finish: the run ends, with nothing left to continue."""

    run_dir: Path
    stop_requested: Callable[[], int] = field(default=lambda: 0)
    resume: bool = False
    stopped_by: int = 0
    step: int = 0
    resumed_from: Path | None = None
    saved: Path | None = None


def run_sft(cfg: RunConfig, policy: Policy, samples: Sequence[Any], *, log: RunLog | None = None,
            show_progress: bool = True, keep_encoded: bool = False, desc: str = "sft",
            checkpoints: SftCheckpoints | None = None) -> dict[str, float]:
    """``keep_encoded``: encode each sample's prompt and media once and keep them for the next epochs (fast
    when a small dataset is seen many times, e.g. the toy base model's pre-training; memory grows with the
    dataset's pixels). ``checkpoints``: stop at a step boundary with a checkpoint when asked, and continue from
    one (:class:`SftCheckpoints`); None: the cold start of ``mmrl train``, which keeps none."""
    s = cfg.sft
    if s.steps <= 0:
        return {}
    target = SFT_TARGETS.get(s.target)
    rng = random.Random(cfg.train.seed + 7)
    ctx = TargetContext(cfg, samples, rng)
    preparer = MediaPreparer(cfg.data.media, family=policy.family)
    params = [p for p in policy.model.parameters() if p.requires_grad]
    if not params:
        raise MmrlError("sft: nothing to train (every part of the model is frozen)")
    opt = torch.optim.AdamW(params, lr=s.lr)
    sched = lr_scheduler(opt, lr_lambda(s.warmup_steps, s.steps, 0.0, s.lr_schedule))
    eos = policy.tokenizer.convert_tokens_to_ids("<|im_end|>")
    order: list[int] = []
    encoded: dict[str, Any] = {}
    bad = 0
    first = 0
    if checkpoints is not None and checkpoints.resume:
        loop = _resume(checkpoints, policy, opt, sched)
        if loop is not None:
            first, order, bad = loop["step"], list(loop["order"]), int(loop["bad"])
            rng.setstate(_python_rng(loop["targets_rng"]))
            tqdm.write(f"resumed from {checkpoints.resumed_from} (SFT step {first} of {s.steps})")
    if log is not None:
        cut = log.last_step("sft")
        if cut > first and checkpoints is None:
            tqdm.write(f"cold start: the earlier session stopped at SFT step {cut} of {s.steps}; the cold start keeps "
                       "no checkpoints, so it runs again from step 0 (its earlier log rows are replaced)")
        log.truncate_after("sft", first)  # a cold start that was killed is redone from its first step
    policy.model.train()
    last = {}
    bar = tqdm(range(first, s.steps), desc=desc, unit="step", total=s.steps, initial=first,
               disable=not show_progress, dynamic_ncols=True)
    done = first
    for step in bar:
        if checkpoints is not None and (signum := checkpoints.stop_requested()):
            checkpoints.stopped_by = signum  # asked to stop (SIGTERM, SIGINT): the steps so far kept, here
            if step > first:  # (asked before this session's first step: its checkpoint, if any, is the one)
                checkpoints.saved = _save(checkpoints.run_dir, cfg, policy, step, opt, sched, order, bad, rng)
            break
        seqs = []
        while len(seqs) < s.batch_size:
            if not order:
                order = list(range(len(samples)))
                rng.shuffle(order)
            sample = samples[order.pop()]
            try:
                prompt, media = encoded.get(sample.id) or encode_prompt(policy, preparer, sample, cfg.prompt)
                if keep_encoded:
                    encoded[sample.id] = (prompt, media)
            except MediaError as exc:
                if cfg.data.on_bad_sample != "skip":
                    raise MmrlError(f"sample {sample.id}: {exc} (set data.on_bad_sample=skip to skip bad samples)"
                                    ) from exc
                bad += 1
                if bad > 10 * max(1, s.batch_size) + len(samples):
                    raise MmrlError("sft: too many unreadable samples; run `mmrl data validate` on the data") from exc
                continue
            episode = _episode(cfg, policy, sample, prompt, media)  # a method's multi-turn cold start
            if episode is not None:
                seqs.append(episode)
                continue
            text = target(sample, ctx)
            ids = policy.tokenizer(text, add_special_tokens=False)["input_ids"] + [eos]
            seqs.append(prompt.extend(ids, trained=True))
        logp, _, mask = policy.forward_logprobs(seqs)
        loss = -(logp * mask).sum() / mask.sum().clamp(min=1)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(params, cfg.train.max_grad_norm)
        lr = opt.param_groups[0]["lr"]  # the rate this step used (the scheduler then sets the next step's)
        opt.step()
        sched.step()
        if not keep_encoded:
            policy.media.clear()
        last = {"loss": float(loss.detach()), "lr": lr}
        bar.set_postfix(loss=f"{last['loss']:.3f}", refresh=False)  # drawn at the next update (mininterval)
        if log is not None:
            log.metrics("sft", step + 1, last)
        done = step + 1
    bar.close()
    if checkpoints is not None:
        checkpoints.step = done
    if keep_encoded:
        policy.media.clear()
    return last


def _save(run_dir: Path, cfg: RunConfig, policy: Policy, step: int, opt: torch.optim.Optimizer, sched: Any,
          order: list[int], bad: int, rng: random.Random) -> Path:
    """``checkpoint-<step>`` of an SFT run: the model, the optimizer and scheduler, the data position (the rest of
    this epoch's order, the unreadable samples met) and the targets' random stream; the global random states are
    added by :func:`mmrl.engine.checkpoint.write_checkpoint`. Only the newest is kept."""
    from mmrl.engine.checkpoint import eval_settings, save_checkpoint

    version, internal, gauss = rng.getstate()
    loop = {"step": step, "order": list(order), "bad": bad, "targets_rng": [version, list(internal), gauss]}
    return save_checkpoint(run_dir, step, policy.model, policy.processor,
                           {"optimizer": opt.state_dict(), "scheduler": sched.state_dict(), "sft": loop},
                           keep=1, settings=eval_settings(cfg))


def _resume(checkpoints: SftCheckpoints, policy: Policy, opt: torch.optim.Optimizer, sched: Any
            ) -> dict[str, Any] | None:
    """Load the run's latest intact checkpoint (its weights, optimizer, scheduler and random states) into this
    session; its SFT loop state (``step``, ``order``, ``bad``, ``targets_rng``), or None when the run has none."""
    from mmrl.engine.checkpoint import latest_checkpoint, load_trainer_state, load_weights, set_rng_state

    ckpt = latest_checkpoint(checkpoints.run_dir)
    if ckpt is None:
        return None
    state = load_trainer_state(ckpt)
    if "sft" not in state:
        raise MmrlError(f"{ckpt}: not a checkpoint of mmrl sft (its trainer_state.pt has no SFT position); resume "
                        "it with mmrl train --resume, or give mmrl sft another --out")
    load_weights(policy.model, ckpt)
    opt.load_state_dict(state["optimizer"])
    sched.load_state_dict(state["scheduler"])
    set_rng_state(state["rng"])
    checkpoints.resumed_from = ckpt
    return state["sft"]


def _python_rng(saved: list[Any]) -> tuple[Any, ...]:
    """A ``random.Random`` state as :meth:`random.Random.setstate` takes it, from its saved plain-data form."""
    version, internal, gauss = saved
    return version, tuple(internal), gauss
