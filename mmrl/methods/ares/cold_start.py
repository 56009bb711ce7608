"""ARES's adaptive cold start (AdaCS): reasoning traces whose length follows the question's difficulty.

``sft.target: adaptive_reasoning`` (with ``imports: [mmrl.methods.ares]``). For every question:

1. its pass rate ``p``: the record's ``meta.pass_rate`` when it has one (AdaCS estimates it offline), else
   estimated once, the first time the cold start meets the question, from ``adacs_samples`` (8, as AdaCS)
   sampled answers of the model being cold-started, graded by the ``accuracy`` reward;
2. ``adacs_candidates`` candidate targets (:func:`mmrl.engine.sft.reasoning_target`: the record's
   ``meta.rationale`` sentences or the toy world's true observations, drawn at random lengths);
3. the target length ``L(p) = (1 - p) * L(0) + p * L(1)`` (:func:`rewards.ares.adacs_target_length`) and
   the candidate whose token length is closest to it (ties: the first drawn).

AdaCS takes ``L(0)``/``L(1)`` as the median lengths of a teacher's responses to the pass-rate-0 and
pass-rate-1 questions and selects among those responses; here the candidates are drawn traces, so ``L(0)``
and ``L(1)`` are the longest and the shortest candidate of the question itself (our adaptation: a question
never solved gets its longest trace, one always solved its shortest). The two settings are read from
``plugins.ares`` (the recipe's one place for ARES's settings).
"""

from __future__ import annotations

import random
import weakref
from collections.abc import Sequence
from typing import Any

from mmrl.engine.sft import TargetContext, reasoning_target, register_sft_episode, register_target
from mmrl.model import Policy
from mmrl_common.errors import MmrlError
from rewards.accuracy import accuracy
from rewards.ares import adacs_target_length

TARGET = "adaptive_reasoning"
DEFAULTS = {"adacs_samples": 8, "adacs_candidates": 16}

_state: weakref.WeakKeyDictionary[Policy, dict[str, Any]] = weakref.WeakKeyDictionary()


def settings(cfg: Any) -> dict[str, int]:
    given = (cfg.plugins or {}).get("ares") or {}
    out = {k: given.get(k, v) for k, v in DEFAULTS.items()}
    for k, v in out.items():
        if not isinstance(v, int) or v < 1:
            raise MmrlError(f"plugins.ares.{k}={v!r}: must be an integer >= 1")
    return out


def pick_by_length(candidates: Sequence[str], lengths: Sequence[int], pass_rate: float) -> str:
    """The candidate whose length is closest to ``L(p)`` between the longest (p = 0) and shortest (p = 1)."""
    target = adacs_target_length(pass_rate, max(lengths), min(lengths))
    best = min(range(len(candidates)), key=lambda i: (abs(lengths[i] - target), i))
    return candidates[best]


def adaptive_target(sample: Any, pass_rate: float, rng: random.Random, tokenizer: Any, k: int,
                    mc_answer: str = "letter", template: str = "default") -> str:
    """The AdaCS target of one question with pass rate ``pass_rate`` (module docstring, steps 2-3); the answer
    written as prompt template ``template`` asks."""
    cands = [reasoning_target(sample, rng, mc_answer, template) for _ in range(k)]
    lengths = [len(tokenizer(c, add_special_tokens=False)["input_ids"]) for c in cands]
    return pick_by_length(cands, lengths, pass_rate)


def record_pass_rate(sample: Any) -> float | None:
    p = (sample.meta or {}).get("pass_rate")
    if p is None:
        return None
    if not isinstance(p, (int, float)) or not 0.0 <= float(p) <= 1.0:
        raise MmrlError(f"sample {sample.id}: meta.pass_rate={p!r} must be a number in [0, 1]")
    return float(p)


def estimate_pass_rate(cfg: Any, policy: Policy, sample: Any, prompt: Any, n: int) -> float:
    """The share of ``n`` sampled answers of ``policy`` that the ``accuracy`` reward counts right."""
    r = cfg.rollout
    with policy.inference():
        gens = policy.generate([prompt], max_new_tokens=r.max_new_tokens, temperature=r.temperature,
                               top_p=r.top_p, top_k=r.top_k, stop=r.stop, num_return_sequences=n,
                               with_logprobs=False)[0]
    scores = accuracy([g.text for g in gens], problem_type=[sample.problem_type] * n,
                      answer=[sample.answer] * n, options=[sample.options] * n, meta=[sample.meta or {}] * n)
    return sum(float(s or 0.0) for s in scores) / n


@register_target(TARGET)
def adaptive_reasoning(sample: Any, ctx: TargetContext) -> str:
    """Registered so that ``sft.target`` accepts the name; every sample is built by :func:`adacs_episode`
    (it needs the tokenizer and, for a record without ``meta.pass_rate``, the model)."""
    raise MmrlError(f"sample {sample.id}: sft.target={TARGET} is built by the ARES cold-start episode; "
                    "no other method's cold-start episode may come before it (imports order)")


@register_sft_episode
def adacs_episode(cfg: Any, policy: Policy, sample: Any, prompt: Any, media: list[Any]) -> Any:
    """The cold start's sequence for ``sft.target: adaptive_reasoning`` (None for any other target)."""
    if cfg.sft.target != TARGET:
        return None
    s = settings(cfg)
    st = _state.setdefault(policy, {"rng": random.Random(cfg.train.seed + 11), "pass_rate": {}})
    p = record_pass_rate(sample)
    if p is None:
        if sample.id not in st["pass_rate"]:
            st["pass_rate"][sample.id] = estimate_pass_rate(cfg, policy, sample, prompt, s["adacs_samples"])
        p = st["pass_rate"][sample.id]
    text = adaptive_target(sample, p, st["rng"], policy.tokenizer, s["adacs_candidates"], cfg.sft.mc_answer,
                           cfg.prompt.template)
    eos = policy.tokenizer.convert_tokens_to_ids("<|im_end|>")
    ids = policy.tokenizer(text, add_special_tokens=False)["input_ids"] + [eos]
    return prompt.extend(ids, trained=True)
