"""The rollout service: the one way anything other than the main rollout generates.

ACRE's re-ask with shuffled options, a sampler re-scoring prompts, held-out evaluation: each gives samples
(and optional changes), and the service

1. builds the prompts with the run's media preparer and prompt settings (the same ``encode_prompt`` as
   training), applying the changes: another option order, another question or user text, other media;
2. generates through the run's backend in inference mode (eval, gradient checkpointing off, no grad),
   greedy or sampled, ``n`` per sample;
3. returns the completions with their parsed answers (for multiple choice: the option letter, restricted
   to the options shown), and on request the per-token log-probabilities and entropies;
4. frees the media it encoded (media the policy already held, e.g. the current step's, stay).

Rewards receive it as the ``rollout_service`` column; plug-ins as ``trainer.service``.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from mmrl.config import PromptConfig
from mmrl.engine.media import MediaPreparer
from mmrl.engine.prompts import build_messages, encode_prompt, media_parts, with_layout
from mmrl.engine.rollout import RolloutBackend, SamplingParams
from mmrl.model import MediaInput, Policy, TokenSeq


@dataclass
class Ask:
    """Changes to one sample's prompt (every field optional)."""

    options: list[str] | None = None
    """Another option list (e.g. the same options shuffled); the parsed answer is a letter of this list."""
    question: str | None = None
    """Another question text (the template, options and answer-format instruction stay)."""
    user_text: str | None = None
    """The whole user text instead of the template (the media are still shown first)."""
    media: list[MediaInput] | None = None
    """Other decoded media instead of the sample's own (give each a key of its own)."""
    prefix: str | None = None
    """The start of the assistant turn (e.g. ``"<think>...</think><answer>"``: answer again from a given
    reasoning trace); the policy continues after it. ``Answer.text`` is the continuation; the parsed answer
    reads the prefix and the continuation together."""


@dataclass
class Answer:
    """One generated completion."""

    text: str
    answer: str | None
    """The parsed answer: the option letter for multiple choice (None when none is named), else the text
    inside ``<answer></answer>`` (or the completion without its reasoning)."""
    token_ids: list[int]
    finished: bool
    options: list[str] | None = None
    logprobs: list[float] = field(default_factory=list)
    entropies: list[float] = field(default_factory=list)


def parse_answer(text: str, sample: Any, options: Sequence[str] | None) -> str | None:
    """The answer a completion gives, read the way the rewards read it."""
    from rewards import extract_answer, extract_choice

    inner = extract_answer(text)
    if sample.problem_type == "multiple_choice" and options:
        return extract_choice(inner, list(options))
    return inner or None


class RolloutService:
    def __init__(self, policy: Policy, backend: RolloutBackend, preparer: MediaPreparer, prompt: PromptConfig,
                 *, max_new_tokens: int = 64, temperature: float = 1.0, top_p: float = 1.0, top_k: int = 0,
                 stop: Sequence[str] = ()):
        self.policy = policy
        self.backend = backend
        self.preparer = preparer
        self.prompt = prompt
        self.defaults = SamplingParams(max_new_tokens=max_new_tokens, temperature=temperature, top_p=top_p,
                                       top_k=top_k, stop=list(stop))
        self.calls = 0  # generate calls served (for tests and logs)
        self.evaluation: dict[str, Any] = {}
        """Settings every :func:`mmrl.engine.evaluate.evaluate` through this service applies unless the caller gives
        its own (plug-ins set them, e.g. ``{"consistency": {...}}`` from the ``eval_consistency`` plug-in)."""

    @classmethod
    def from_config(cls, policy: Policy, cfg: Any, *, backend: RolloutBackend | None = None,
                    preparer: MediaPreparer | None = None) -> RolloutService:
        """The service of a run configuration (:class:`mmrl.config.RunConfig`): its backend, media,
        prompt and rollout settings."""
        from mmrl.engine.rollout import backend_from_config

        r = cfg.rollout
        service = cls(policy, backend or backend_from_config(cfg, policy),
                      preparer or MediaPreparer(cfg.data.media, family=policy.family), cfg.prompt,
                      max_new_tokens=cfg.eval.max_new_tokens or r.max_new_tokens, temperature=r.temperature,
                      top_p=r.top_p, top_k=r.top_k, stop=r.stop)
        service.evaluation["skip_bad"] = cfg.data.on_bad_sample == "skip"  # unreadable media: as the data loads
        return service

    def encode(self, sample: Any, ask: Ask | None = None) -> tuple[TokenSeq, list[MediaInput]]:
        """The prompt tokens of ``sample`` with ``ask``'s changes (media are registered with the policy)."""
        ask = ask or Ask()
        if ask.question is not None:
            sample = dataclasses.replace(sample, question=ask.question)
        if ask.media is None and ask.user_text is None and not ask.prefix:
            return encode_prompt(self.policy, self.preparer, sample, self.prompt, options=ask.options)
        media = with_layout(ask.media if ask.media is not None else self.preparer.prepare(sample),
                            self.prompt.video_layout)
        parts, items = media_parts(media)
        messages = build_messages(sample, self.prompt, parts, options=ask.options)
        if ask.user_text is not None:
            messages[-1]["content"][-1] = {"type": "text", "text": ask.user_text}
        return self.policy.encode(self.policy.render(messages) + (ask.prefix or ""), items), media

    def generate(self, samples: Sequence[Any], asks: Sequence[Ask | None] | None = None, *, n: int = 1,
                 greedy: bool = True, max_new_tokens: int | None = None, temperature: float | None = None,
                 logprobs: bool = False, entropies: bool = False) -> list[list[Answer]]:
        """``n`` answers for each sample (with its ``asks`` entry applied); one list per sample."""
        samples = list(samples)
        asks = list(asks) if asks is not None else [None] * len(samples)
        if len(asks) != len(samples):
            raise ValueError(f"{len(asks)} asks for {len(samples)} samples")
        if not samples:
            return []
        params = dataclasses.replace(
            self.defaults, greedy=greedy, logprobs=logprobs, entropies=entropies,
            max_new_tokens=max_new_tokens or self.defaults.max_new_tokens,
            temperature=self.defaults.temperature if temperature is None else temperature, stop=list(self.defaults.stop))
        held = set(self.policy.media)
        try:
            with self.policy.inference():
                seqs = [self.encode(s, a)[0] for s, a in zip(samples, asks)]
                gens = self.backend.generate(seqs, n=n, params=params)
        finally:
            for key in [k for k in self.policy.media if k not in held]:
                del self.policy.media[key]
        self.calls += 1
        out: list[list[Answer]] = []
        for sample, ask, group in zip(samples, asks, gens):
            options = ask.options if ask is not None and ask.options is not None else sample.options
            prefix = (ask.prefix or "") if ask is not None else ""
            out.append([Answer(text=g.text, answer=parse_answer(prefix + g.text, sample, options),
                               token_ids=list(g.token_ids),
                               finished=g.finished, options=options, logprobs=list(g.logprobs),
                               entropies=list(g.entropies)) for g in group])
        return out

    def ask(self, sample: Any, ask: Ask | None = None, **kwargs: Any) -> list[Answer]:
        """``generate`` for one sample."""
        return self.generate([sample], [ask], **kwargs)[0]
