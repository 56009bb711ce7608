"""Supervised fine-tuning (the cold start): loss on the assistant's tokens only.

Targets are written in the run's answer format. With ``sft.target: random_answer`` the answer inside the
tags is drawn at random from the sample's valid answers (an option letter, yes/no, another sample's
answer), so the cold start teaches the *format* and nothing about which answer is right; RL must find
the answers. ``gold`` trains on the reference answers (ordinary SFT). ``reasoning`` trains on a reasoning trace and the
reference answer, ``<think>trace</think><answer>answer</answer>`` (a chain-of-thought cold start, as Video-R1's
and ARES's): the trace is the record's ``meta.rationale`` (a string as written; a list of sentences: a random
number of them per draw, so lengths vary), or for the toy world's records a random-length trace of true
observations (:mod:`data_pipelines.toy.rationales`). ``sft.mc_answer`` says whether gold and reasoning targets
answer a multiple-choice question with the letter or the option's text (the toy base model answers in words).
"""

from __future__ import annotations

import random
import string
from collections.abc import Sequence
from typing import Any

import torch
from tqdm import tqdm

from mmrl.config import RunConfig
from mmrl.media import MediaPreparer
from mmrl.policy import Policy
from mmrl.prompts import encode_prompt
from mmrl.run_log import RunLog
from mmrl.trainer import lr_lambda
from mmrl_common.errors import MediaError, MmrlError

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


def reasoning_target(sample: Any, rng: random.Random, mc_answer: str = "letter") -> str:
    """``<think>trace</think><answer>answer</answer>`` for ``sft.target: reasoning`` (see the module docstring)."""
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
    return f"<think>{trace}</think><answer>{answer_text(sample, mc_answer)}</answer>"


def target_text(sample: Any, answer: str, answer_format: str) -> str:
    body = f"<answer>{answer}</answer>"
    return body if answer_format == "answer" else THINK + body


def run_sft(cfg: RunConfig, policy: Policy, samples: Sequence[Any], *, log: RunLog | None = None,
            show_progress: bool = True, keep_encoded: bool = False, desc: str = "sft") -> dict[str, float]:
    """``keep_encoded``: encode each sample's prompt and media once and keep them for the next epochs (fast
    when a small dataset is seen many times, e.g. the toy base model's pre-training; memory grows with the
    dataset's pixels)."""
    from mmrl.agent import sft_sequence

    s = cfg.sft
    if s.steps <= 0:
        return {}
    rng = random.Random(cfg.train.seed + 7)
    preparer = MediaPreparer(cfg.data.media, family=policy.family)
    params = [p for p in policy.model.parameters() if p.requires_grad]
    if not params:
        raise MmrlError("sft: nothing to train (every part of the model is frozen)")
    opt = torch.optim.AdamW(params, lr=s.lr)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lr_lambda(s.warmup_steps, s.steps, 0.0))
    eos = policy.tokenizer.convert_tokens_to_ids("<|im_end|>")
    order: list[int] = []
    encoded: dict[str, Any] = {}
    bad = 0
    if log is not None:
        log.truncate_after("sft", 0)  # a cold start that was killed is redone from its first step
    policy.model.train()
    last = {}
    bar = tqdm(range(s.steps), desc=desc, unit="step", disable=not show_progress, dynamic_ncols=True)
    for step in bar:
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
            episode = sft_sequence(cfg, policy, sample, prompt, media)  # multi-turn records (mmrl.agent)
            if episode is not None:
                seqs.append(episode)
                continue
            if s.target == "reasoning":
                text = reasoning_target(sample, rng, s.mc_answer)
            else:
                answer = (answer_text(sample, s.mc_answer) if s.target == "gold"
                          else random_answer(sample, samples, rng))
                text = target_text(sample, answer, cfg.prompt.answer_format)
            ids = policy.tokenizer(text, add_special_tokens=False)["input_ids"] + [eos]
            seqs.append(prompt.extend(ids, trained=True))
        logp, _, mask = policy.forward_logprobs(seqs)
        loss = -(logp * mask).sum() / mask.sum().clamp(min=1)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(params, cfg.train.max_grad_norm)
        opt.step()
        sched.step()
        if not keep_encoded:
            policy.media.clear()
        last = {"loss": float(loss.detach()), "lr": sched.get_last_lr()[0]}
        bar.set_postfix(loss=f"{last['loss']:.3f}")
        if log is not None:
            log.metrics("sft", step + 1, last)
    if keep_encoded:
        policy.media.clear()
    return last
