"""Rollouts: a backend interface, the Hugging Face ``generate`` backend, and the multi-turn loop.

A backend turns token sequences into sampled continuations (:class:`~mmrl.model.Generation`). The HF
backend is built in; the vLLM backend (``vllm``, :mod:`mmrl.engine.backends.vllm`) implements the same
:class:`RolloutBackend` protocol.

Multi-turn episodes (frame selection, zoom-in) run through an :class:`~mmrl.engine.environments.Environment`: after
each assistant turn the environment reads the action text and returns an
:class:`~mmrl.engine.environments.Observation` (text and media, appended as a user turn whose tokens are masked out
of the loss) or ``None`` to end the episode.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from mmrl.config.backends import BACKENDS, register_backend  # noqa: F401 (register_backend: re-exported)
from mmrl.engine.environments import (  # noqa: F401  (get_environment, register_environment: re-exported)
    Environment,
    Observation,
    get_environment,
    register_environment,
)
from mmrl.model import Generation, Policy, TokenSeq


@dataclass
class SamplingParams:
    max_new_tokens: int = 64
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0
    stop: list[str] = field(default_factory=list)
    greedy: bool = False
    logprobs: bool = False
    """Keep the sampling log-probability of every generated token."""
    entropies: bool = False
    """Keep the entropy of the sampling distribution at every generated token."""
    seed: int | None = None
    """A random stream of the call's own (``rollout.seed_per_prompt``): the HF backend's caller seeds torch's
    generators with it; vLLM gives each request a seed drawn from it."""


class RolloutBackend(Protocol):
    def generate(self, seqs: Sequence[TokenSeq], *, n: int, params: SamplingParams) -> list[list[Generation]]:
        """``n`` continuations for each sequence, with per-token log-probabilities."""
        ...


def rollout_session(backend: Any) -> contextlib.AbstractContextManager:
    """A block of generation that every rank enters together (the trainer's rollouts and rewards of a step,
    an evaluation): the backend's ``session()`` where it has one (HF under ZeRO-3: the weights gathered once
    for the whole block; vLLM: the engine awake with the current weights), else nothing. Re-entrant: a
    session inside a session costs nothing."""
    session = getattr(backend, "session", None)
    return session() if session is not None else contextlib.nullcontext()


class HFBackend:
    """Generation with ``transformers`` ``generate`` on the training model itself (in eval mode, gradient
    checkpointing off, no grad: :meth:`Policy.inference`).

    Log-probabilities and entropies are kept when ``params`` asks (or ``record_logprobs``); each costs one
    float32 vocabulary row per generated token while generating, and the trainer does not need them.
    """

    def __init__(self, policy: Policy, max_batch: int = 64, record_logprobs: bool = False):
        self.policy = policy
        self.max_batch = max_batch
        self.record_logprobs = record_logprobs

    @contextlib.contextmanager
    def session(self) -> Iterator[None]:
        """The policy's weights whole for the block (ZeRO-3: gathered once, :meth:`Policy.generation_weights`)."""
        with self.policy.generation_weights():
            yield

    def generate(self, seqs: Sequence[TokenSeq], *, n: int, params: SamplingParams) -> list[list[Generation]]:
        out: list[list[Generation]] = []
        per_call = max(1, self.max_batch // max(1, n))
        with self.session(), self.policy.inference():
            for start in range(0, len(seqs), per_call):
                out.extend(self.policy.generate(
                    seqs[start:start + per_call], max_new_tokens=params.max_new_tokens,
                    temperature=params.temperature, top_p=params.top_p, top_k=params.top_k,
                    do_sample=not params.greedy, stop=params.stop, num_return_sequences=n,
                    with_logprobs=self.record_logprobs or params.logprobs, with_entropies=params.entropies))
        return out


BACKENDS.register("hf")(HFBackend)


@BACKENDS.register("vllm")
def _vllm_backend(policy: Policy, **kwargs: Any) -> RolloutBackend:
    """vLLM (:mod:`mmrl.engine.backends.vllm`); a clear error when vLLM is not installed."""
    from mmrl.engine.backends.vllm import VLLMBackend

    return VLLMBackend(policy, **kwargs)


def make_backend(name: str, policy: Policy, **kwargs: Any) -> RolloutBackend:
    return BACKENDS.get(name)(policy, **kwargs)


def backend_from_config(cfg: Any, policy: Policy, samples: Sequence[Any] | None = None) -> RolloutBackend:
    """The rollout backend of a run configuration (:class:`mmrl.config.RunConfig`): ``rollout.backend`` with
    its settings (``rollout.vllm`` for vLLM, its media limits sized for ``samples``: the run's records)."""
    r = cfg.rollout
    policy.configure(prefill_once=r.prefill_once)  # Policy.generate: each prompt computed once per group
    if r.backend == "vllm":
        from mmrl.engine.backends.vllm import settings_from_config

        return make_backend("vllm", policy, **settings_from_config(cfg, policy, samples))
    return make_backend(r.backend, policy)


# ------------------------------------------------------------------------------------------ episodes
@dataclass
class Episode:
    """One rollout of one prompt: the full token sequence and what happened."""

    sample: Any
    prompt: TokenSeq
    seq: TokenSeq
    turns: list[str] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)  # per loss-mask token, when the backend records them
    entropies: list[float] = field(default_factory=list)  # per loss-mask token, when asked for
    finished: bool = False  # last turn ended on EOS/stop (not cut by max_new_tokens)
    env: Environment | None = None

    @property
    def completion(self) -> str:
        """The final assistant turn (what answer rewards read)."""
        return self.turns[-1] if self.turns else ""

    @property
    def transcript(self) -> str:
        return "\n".join(self.turns)

    @property
    def response_length(self) -> int:
        return sum(self.seq.loss_mask)


def observation_fragment(policy: Policy, obs: Observation) -> TokenSeq:
    """Tokens for an environment observation, rendered as a user turn followed by the assistant header."""
    placeholders = {"image": "<|vision_start|><|image_pad|><|vision_end|>",
                    "video": "<|vision_start|><|video_pad|><|vision_end|>"}
    text = obs.text
    for m in obs.media:
        slot = "{" + m.kind + "}"
        text = text.replace(slot, placeholders[m.kind], 1) if slot in text else text + placeholders[m.kind]
    rendered = f"\n<|im_start|>user\n{text}<|im_end|>\n<|im_start|>assistant\n"
    return policy.encode(rendered, obs.media)


def run_episodes(
    policy: Policy, backend: RolloutBackend, prompts: Sequence[TokenSeq], samples: Sequence[Any], *,
    n: int, params: SamplingParams, environment: Callable[[Any], Environment | None] | None = None,
    max_turns: int = 1,
) -> list[Episode]:
    """Roll out ``n`` episodes per prompt; multi-turn when an environment factory is given.

    Episodes come back grouped by prompt (``n`` consecutive episodes per prompt).
    """
    first = backend.generate(prompts, n=n, params=params)
    episodes: list[Episode] = []
    for prompt, sample, gens in zip(prompts, samples, first):
        for g in gens:
            ep = Episode(sample=sample, prompt=prompt, seq=prompt)
            _append_turn(ep, g)
            ep.env = environment(sample) if environment is not None else None
            episodes.append(ep)
    for _turn in range(1, max_turns):
        active: list[Episode] = []
        for ep in episodes:
            if ep.env is None or isinstance(ep.env, _Done):
                continue
            obs = ep.env.step(ep.completion)
            if obs is None:
                ep.env = _Done(ep.env)
                continue
            im_end = policy.tokenizer.convert_tokens_to_ids("<|im_end|>")
            if ep.seq.ids[-1] != im_end:  # the turn was cut (length, stop string): close it, untrained
                ep.seq = ep.seq.extend([im_end], trained=False)
            frag = observation_fragment(policy, obs)
            ep.seq = ep.seq.extend(frag.ids, trained=False, mm_types=frag.mm_types, media=frag.media)
            active.append(ep)
        if not active:
            break
        gens = backend.generate([ep.seq for ep in active], n=1, params=params)
        for ep, g in zip(active, gens):
            _append_turn(ep, g[0])
    for ep in episodes:
        if isinstance(ep.env, _Done):
            ep.env = ep.env.inner
    return episodes


class RolloutStrategy(Protocol):
    """How the trainer turns prompts into episodes: :func:`run_episodes` by default; a plug-in may install
    another (:meth:`mmrl.engine.plugins.StepContext.set_rollout_strategy`), e.g. one that calls the backend again
    on ``prompt.extend(prefix, trained=True)`` to continue an earlier rollout from a prefix. Contract: the
    same arguments as :func:`run_episodes`, and ``n`` episodes per prompt back, grouped by prompt in prompt
    order (the group a GRPO advantage is normalised over)."""

    def __call__(self, policy: Policy, backend: RolloutBackend, prompts: Sequence[TokenSeq],
                 samples: Sequence[Any], *, n: int, params: SamplingParams,
                 environment: Callable[[Any], Environment | None] | None = None, max_turns: int = 1
                 ) -> list[Episode]: ...


class _Done(Environment):
    """Marks an episode whose environment ended it; keeps the real environment for its info."""

    def __init__(self, inner: Environment):
        self.inner = inner
        self.info = inner.info


def _append_turn(ep: Episode, g: Generation) -> None:
    ep.seq = ep.seq.extend(g.token_ids, trained=True)
    ep.turns.append(g.text)
    ep.logprobs.extend(g.logprobs)
    ep.entropies.extend(g.entropies)
    ep.finished = g.finished
