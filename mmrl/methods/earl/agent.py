"""Agent loops outside the trainer's rollouts: multi-turn SFT targets, and evaluation through an environment.

* :func:`sft_sequence` -- what ``mmrl sft`` (and a run's cold start) trains on for a record with
  ``meta.sft_turns`` (assistant turns written by ``mmrl data earl-sft``), or, with ``rollout.environment``
  set and ``sft.target: gold``, on a demonstration the environment plays itself
  (``Environment.demonstration``; with ``prompt.answer_format: think_answer``, EARL's reasoning turns: a
  ``<think>`` before every call and before the answer). The turns are replayed through the environment: assistant turns are
  trained, the environment's turns (text and new frames) are masked out, exactly as in RL rollouts.
* :func:`evaluate_agent` -- greedy episodes through an environment on held-out samples: accuracy of the
  final answer, frames shown and selection rounds per answer, selection IoU where gold exists.
* the ``agent_eval`` plug-in -- runs :func:`evaluate_agent` at the end of training (and every ``every``
  steps) and logs ``agent_eval/*`` in ``metrics.jsonl``, so ``mmrl compare`` can read ``last:agent_eval/accuracy``
  (the trainer's own evaluation is single-turn); ``uniform_frames: [16, 32]`` adds single-turn evaluations
  with that many uniformly sampled frames (the uniform budget a plain model needs).
* :func:`run_benchmark_agent` -- ``mmrl eval --benchmark NAME --agent earl``: a public benchmark through the
  agent loop, beside the plain single-turn answer with the same initial frames.
"""

from __future__ import annotations

import dataclasses
import json
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from mmrl.benchmarks.runner import Answers
from mmrl.engine.evaluate import reward_columns, score_text, summarize
from mmrl.engine.plugins import Callback, register_plugin
from mmrl.engine.sft import register_sft_episode
from mmrl.model import Policy, TokenSeq
from mmrl.run.report import register_curve
from mmrl_common.errors import ConfigError, DataError, MmrlError

register_curve("agent_eval/accuracy", "Held-out accuracy through the agent loop (agent_eval)", "agent_eval.png")

AGENTS: dict[str, dict[str, Any]] = {
    "earl": {"environment": "select_frames", "environment_kwargs": {}, "max_turns": 4},
}
"""``--agent`` names: the environment, its settings and the turn limit (2 selections, the answer, and a
turn for the environment to see a third call)."""


# ------------------------------------------------------------------------------------------------ SFT
def replay(policy: Policy, prompt: TokenSeq, env: Any, turns: Sequence[str], *, where: str = "") -> TokenSeq:
    """``prompt`` followed by the assistant ``turns`` (trained) and the environment's answers to all but the
    last (masked), as the rollout loop builds them."""
    from mmrl.engine.rollout import observation_fragment

    im_end = policy.tokenizer.convert_tokens_to_ids("<|im_end|>")
    seq = prompt
    for k, text in enumerate(turns):
        ids = policy.tokenizer(text, add_special_tokens=False)["input_ids"] + [im_end]
        seq = seq.extend(ids, trained=True)
        if k == len(turns) - 1:
            break
        obs = env.step(text)
        if obs is None:
            raise DataError(f"{where}: turn {k + 1} of {len(turns)} ({text[:60]!r}) ended the episode "
                            f"({env.info.get('events', [{}])[-1].get('outcome', 'ended')}); only the last turn "
                            "may answer")
        frag = observation_fragment(policy, obs)
        seq = seq.extend(frag.ids, trained=False, mm_types=frag.mm_types, media=frag.media)
    return seq


def _check_grid(sample: Any, env: Any) -> None:
    want = sample.meta.get("sft_initial_timestamps")
    have = env.info.get("initial_timestamps")
    if want is None or have is None:
        return
    if len(want) != len(have) or any(abs(float(a) - float(b)) > 1e-3 for a, b in zip(want, have)):
        raise DataError(f"sample {sample.id}: meta.sft_turns were written for {len(want)} initial frames at "
                        f"{[round(float(t), 2) for t in want][:8]} s, but this run shows {len(have)} at "
                        f"{[round(float(t), 2) for t in have][:8]} s; re-run `mmrl data earl-sft` with the run's "
                        "frame settings (--frames), or set data.media to match")


def sft_sequence(cfg: Any, policy: Policy, sample: Any, prompt: TokenSeq, media: list[Any]) -> TokenSeq | None:
    """The multi-turn SFT sequence of ``sample`` (None: train the ordinary single answer)."""
    from mmrl.engine.rollout import get_environment
    from mmrl.engine.sft import answer_text

    turns = sample.meta.get("sft_turns")
    name = cfg.rollout.environment
    if turns is None and not (name and cfg.sft.target == "gold"):
        return None
    if not name:
        raise DataError(f"sample {sample.id}: the record has meta.sft_turns (a multi-turn trajectory) but "
                        "rollout.environment is not set; set it to the environment the turns were written for "
                        "(e.g. rollout.environment=select_frames)")
    env_cls = get_environment(name)
    env = env_cls(sample, media, **cfg.rollout.environment_kwargs)
    if turns is None:
        demo = getattr(env, "demonstration", None)
        if demo is None:
            return None
        turns = demo(answer_text(sample, cfg.sft.mc_answer), answer_format=cfg.prompt.answer_format)
        if turns is None:
            return None
        env = env_cls(sample, media, **cfg.rollout.environment_kwargs)
    if not isinstance(turns, list) or not turns or not all(isinstance(t, str) for t in turns):
        raise DataError(f"sample {sample.id}: meta.sft_turns must be a non-empty list of assistant turns "
                        f"(strings), got {turns!r}")
    _check_grid(sample, env)
    seq = replay(policy, prompt, env, turns, where=f"sample {sample.id}")
    want = sample.meta.get("sft_selected_timestamps")
    have = [sel["timestamps"] for sel in env.info.get("selections", [])]
    if want is not None and (len(want) != len(have) or any(
            len(a) != len(b) or any(abs(float(x) - float(y)) > 1e-3 for x, y in zip(a, b)) for a, b in zip(want, have))):
        raise DataError(f"sample {sample.id}: the selections in meta.sft_turns picked frames at {want} s when "
                        f"written, but at {have} s in this run (another max_new_frames or re-sampling setting?); "
                        "re-run `mmrl data earl-sft` with the run's rollout.environment_kwargs")
    return seq


register_sft_episode(sft_sequence)


# ------------------------------------------------------------------------------------------------ evaluation
def _with_frames(sample: Any, nframes: int) -> Any:
    media = [dataclasses.replace(m, sampling={**(m.sampling or {}), "nframes": int(nframes)})
             if m.type == "video" else m for m in sample.media]
    return dataclasses.replace(sample, media=media)


def evaluate_agent(policy: Policy, backend: Any, preparer: Any, prompt: Any, samples: Sequence[Any], *,
                   environment: str | None, environment_kwargs: dict[str, Any] | None = None,
                   max_turns: int = 4, max_new_tokens: int = 64, stop: Sequence[str] = (),
                   batch_size: int = 16, nframes: int | None = None) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """Greedy episodes (through ``environment``, or single-turn when None) on ``samples``; ``nframes``
    replaces each video's initial frame count. Returns ``(metrics, predictions)``: ``accuracy`` (as
    :func:`mmrl.engine.evaluate.evaluate` scores it, on the final turn), ``frames`` (frames shown per answer),
    ``rounds`` (selection rounds per answer), ``iou`` (mean selection IoU over samples with gold),
    ``invalid_actions``, per-task accuracy. Under torchrun each rank plays its share of ``samples`` and every
    rank returns the metrics and predictions of all of them, in order."""
    from mmrl.engine.distributed import world
    from mmrl.engine.prompts import encode_prompt
    from mmrl.engine.rollout import SamplingParams, get_environment, rollout_session, run_episodes
    from rewards import get_reward
    from rewards.evidence import EvidenceSettings, gold_cells, selected_cells

    env_cls = get_environment(environment) if environment else None
    kwargs = dict(environment_kwargs or {})
    params = SamplingParams(max_new_tokens=max_new_tokens, greedy=True, stop=list(stop))
    accuracy = get_reward("accuracy")
    preds: list[dict[str, Any]] = []
    held = set(policy.media)
    w = world()
    tp = int(getattr(backend, "tensor_parallel_size", 1))  # a block of ranks shares one vLLM engine
    samples = w.shard(samples, tp)
    # every rank enters together (ZeRO-3: the weights gathered once, so shares of different sizes need no
    # matching calls; vLLM: the engine awake)
    try:
        with rollout_session(backend):
            for start in range(0, len(samples), batch_size):
                chunk = [_with_frames(s, nframes) if nframes else s for s in samples[start:start + batch_size]]
                encoded = [encode_prompt(policy, preparer, s, prompt) for s in chunk]
                media_of = {id(s): m for s, (_, m) in zip(chunk, encoded)}
                factory = (lambda s, m=media_of: env_cls(s, m[id(s)], **kwargs)) if env_cls else None
                episodes = run_episodes(policy, backend, [seq for seq, _ in encoded], chunk, n=1, params=params,
                                        environment=factory, max_turns=max_turns if env_cls else 1)
                texts = [ep.completion for ep in episodes]
                scores = accuracy(texts, **reward_columns(chunk))
                for s, ep, (_, media), score in zip(chunk, episodes, encoded, scores):
                    info = ep.env.info if ep.env is not None else {}
                    initial = sum(len(m.timestamps or []) for m in media if m.kind == "video")
                    gold = gold_cells(s.meta, info.get("initial_timestamps") or [], EvidenceSettings()) if info else None
                    chosen = selected_cells(info)
                    preds.append({"id": s.id, "task": s.meta.get("task"), "problem_type": s.problem_type,
                                  "n_options": len(s.options or []), "answer": s.answer, "turns": ep.turns,
                                  "completion": ep.completion, "score": float(score or 0.0),
                                  "frames": int(info.get("frames_shown", initial)), "rounds": int(info.get("rounds", 0)),
                                  "invalid_actions": int(info.get("invalid_actions", 0)),
                                  "iou": None if not gold else len(chosen & gold) / len(chosen | gold)})
                for key in [k for k in policy.media if k not in held]:
                    del policy.media[key]
    finally:
        for key in [k for k in policy.media if k not in held]:
            del policy.media[key]
    preds = w.unshard(preds, tp)
    metrics = summarize(preds)
    n = max(1, len(preds))
    ious = [p["iou"] for p in preds if p["iou"] is not None]
    metrics.update(frames=sum(p["frames"] for p in preds) / n, rounds=sum(p["rounds"] for p in preds) / n,
                   invalid_actions=sum(p["invalid_actions"] for p in preds) / n,
                   iou=sum(ious) / len(ious) if ious else None)
    return metrics, preds


@register_plugin("agent_eval")
class AgentEval(Callback):
    """Held-out evaluation through the run's environment (see the module docstring).

    Settings (defaults): ``every`` (0: only after the last step), ``before`` (true: also before RL, logged
    at the first step as ``agent_eval_before/*``), ``uniform_frames`` ([]: extra single-turn evaluations
    with these initial frame counts, ``agent_eval/uniform<N>/accuracy``), ``limit`` (null: every eval
    sample), ``environment`` (default: the run's ``rollout.environment``; ``none`` for single-turn),
    ``max_turns`` (default: the run's ``rollout.max_turns``). Results also go to ``agent_eval.json``.
    """

    SETTINGS = ("every", "before", "uniform_frames", "limit", "environment", "max_turns")

    def __init__(self, ctx: Any, **settings: Any):
        super().__init__(ctx, **settings)
        r = ctx.cfg.rollout
        self.every = int(settings.get("every", 0))
        self.before = bool(settings.get("before", True))
        self.uniform = [int(n) for n in settings.get("uniform_frames", [])]
        self.limit = settings.get("limit")
        env = settings.get("environment", r.environment)
        self.environment = None if env in (None, "none", "") else str(env)
        self.max_turns = int(settings.get("max_turns", r.max_turns))
        self.pending: dict[str, Any] = {}

    def _evaluate(self, *, nframes: int | None = None, environment: str | None = None) -> dict[str, Any]:
        t = self.ctx
        samples = t.eval_samples[:self.limit] if self.limit else t.eval_samples
        r = t.cfg.rollout
        metrics, _ = evaluate_agent(
            t.service.policy, t.service.backend, t.service.preparer, t.cfg.prompt, samples, environment=environment,
            environment_kwargs=r.environment_kwargs if environment == r.environment else {},
            max_turns=self.max_turns, max_new_tokens=t.cfg.eval.max_new_tokens or r.max_new_tokens,
            stop=r.stop, batch_size=t.cfg.eval.batch_size, nframes=nframes)
        return metrics

    def _all(self, prefix: str) -> dict[str, Any]:
        out: dict[str, Any] = {}
        m = self._evaluate(environment=self.environment)
        for key in ("accuracy", "frames", "rounds", "iou", "invalid_actions"):
            if m.get(key) is not None:
                out[f"{prefix}/{key}"] = m[key]
        for n in self.uniform:
            u = self._evaluate(nframes=n, environment=None)
            out[f"{prefix}/uniform{n}/accuracy"] = u["accuracy"]
        self._save(prefix, out)
        return out

    def _save(self, prefix: str, values: dict[str, Any]) -> None:
        from mmrl.engine.distributed import world

        if not world().is_main:  # under torchrun every rank holds the same values; rank 0 writes
            return
        path = self.ctx.run_dir / "agent_eval.json"
        data = json.loads(path.read_text()) if path.is_file() else {}
        data[f"{prefix}@{self.ctx.step}"] = values
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(data, indent=2) + "\n")

    def on_train_start(self) -> None:
        if self.before and self.ctx.step == 0 and self.ctx.eval_samples:
            self.pending = self._all("agent_eval_before")

    def on_step_end(self, step: int, stats: dict[str, Any]) -> None:
        stats.update(self.pending)
        self.pending = {}
        last = step >= self.ctx.cfg.train.steps
        if self.ctx.eval_samples and (last or (self.every and step % self.every == 0)):
            stats.update(self._all("agent_eval"))


# ------------------------------------------------------------------------------------------------ benchmarks
def run_benchmark_agent(benchmark: str, data_root: str | Path, model: str | Path | None = None, *, agent: str,
                        out: str | Path | None = None, protocol: str = "official", frames: int | None = None,
                        max_pixels: int | None = None, prompt_template: str | None = None,
                        max_new_tokens: int | None = None, batch_size: int = 8, limit: int | None = None,
                        split: str | None = None, dtype: str = "fp32", policy: Any = None,
                        backend: Any = None, video_layout: str = "video", think: bool = False) -> dict[str, Any]:
    """A benchmark through the ``agent`` loop (:data:`AGENTS`) and, beside it, the plain single answer on the
    same initial frames, both with the videos shown in ``video_layout`` (``prompt.video_layout``: as one
    video, or frame by frame with labels, as the model was trained); ``think``: the tool note asks for
    reasoning before each call and the answer (a model trained with ``prompt.answer_format: think_answer``). Writes ``predictions.jsonl`` (both) and
    ``metrics.json`` into ``out``; returns the metrics: ``agent_loop`` and ``baseline`` scores (the benchmark's
    own), with frames and rounds per answer. Under torchrun each rank plays its share of the questions; rank 0
    writes the files and every rank returns the metrics."""
    from mmrl.benchmarks.runner import run_benchmark

    if agent not in AGENTS:
        raise ConfigError(f"--agent {agent!r}: known agents are {', '.join(AGENTS)}")
    # the benchmark loop's own, with the agent's answers; decoded in the loop's thread (no decode workers),
    # no progress bar, every run starting over, each question's error counted wrong, as this loop always was
    return run_benchmark(
        benchmark, data_root, model, out=out, protocol=protocol, frames=frames, max_pixels=max_pixels,
        prompt_template=prompt_template, max_new_tokens=max_new_tokens, batch_size=batch_size, limit=limit,
        workers=0, split=split, dtype=dtype, policy=policy, show_progress=False, out_suffix=agent,
        answers=lambda run: _AgentAnswers(run, agent=agent, backend=backend, batch_size=batch_size,
                                          video_layout=video_layout, think=think))


class _AgentAnswers(Answers):
    """:func:`run_benchmark_agent`'s answers in the benchmark loop: per question, the ``agent_loop`` episode
    through the agent's environment (the tool note added to the protocol's system text) and the plain
    ``baseline`` answer on the same initial frames, both scored as the benchmark scores answers."""

    modes = ("agent_loop", "baseline")
    resume = False  # every run starts over
    render = False  # the prompts are built here, the videos in ``video_layout``

    def __init__(self, run: Any, *, agent: str, backend: Any, batch_size: int, video_layout: str, think: bool):
        from mmrl.engine.rollout import HFBackend, SamplingParams, get_environment
        from mmrl.methods.earl.environment import instructions

        self.agent, self.spec, self.policy, self.proto, self.name = agent, AGENTS[agent], run.policy, run.protocol, run.name
        self.env_cls = get_environment(self.spec["environment"])
        self.backend = backend or HFBackend(run.policy, max_batch=batch_size)
        self.engine_ranks = int(getattr(self.backend, "tensor_parallel_size", 1))  # ranks sharing one vLLM engine
        self.params = SamplingParams(max_new_tokens=run.protocol.max_new_tokens, greedy=True)
        self.video_layout = video_layout
        self.tool_note = instructions(think=think)  # a model trained with reasoning turns is asked to reason

    def answer(self, prepared: list[Any], workers: Any) -> tuple[list[dict[str, Any]], int]:
        from mmrl.benchmarks.protocols import build_prompt
        from mmrl.benchmarks.scoring import score_item
        from mmrl.engine.prompts import media_parts, with_layout
        from mmrl.engine.rollout import run_episodes

        policy, proto, name, spec = self.policy, self.proto, self.name, self.spec
        records: dict[str, list[dict[str, Any]]] = {mode: [] for mode in self.modes}
        ready, seqs, plain, media_of = [], [], [], {}
        for p in prepared:
            s = p.sample
            if p.error is not None:
                for recs in records.values():
                    recs.append({"id": s.id, "error": p.error, "correct": False, "parsed": False,
                                 "pred": None, "problem_type": s.problem_type, "answer": s.answer,
                                 "n_options": len(s.options or [])})
                continue
            media = with_layout(p.raw, self.video_layout)
            system, text, prefill = build_prompt(s, proto)
            parts, items = media_parts(media)
            content = [*parts, {"type": "text", "text": text}]
            for mode, sys_text in (("agent_loop", "\n".join(t for t in (system, self.tool_note) if t)),
                                   ("baseline", system)):
                messages = ([{"role": "system", "content": [{"type": "text", "text": sys_text}]}] if sys_text else [])
                messages.append({"role": "user", "content": content})
                seq = policy.encode(policy.render(messages) + prefill, items)
                (seqs if mode == "agent_loop" else plain).append(seq)
            ready.append((s, prefill, media))
            media_of[id(s)] = media
        if ready:
            group = [s for s, _, _ in ready]
            t0 = time.perf_counter()
            env_cls, env_kwargs = self.env_cls, spec["environment_kwargs"]
            runs = {
                "agent_loop": run_episodes(policy, self.backend, seqs, group, n=1, params=self.params,
                                           environment=lambda s, m=media_of: env_cls(s, m[id(s)], **env_kwargs),
                                           max_turns=spec["max_turns"]),
                "baseline": run_episodes(policy, self.backend, plain, group, n=1, params=self.params),
            }
            self.generate_s += time.perf_counter() - t0
            for mode, episodes in runs.items():
                for (s, prefill, media), ep in zip(ready, episodes):
                    info = ep.env.info if ep.env is not None else {}
                    initial = sum(len(m.timestamps or []) for m in media if m.kind == "video")
                    rec = {"id": s.id, "problem_type": s.problem_type, "answer": s.answer,
                           "answer_type": s.meta.get("answer_type"), "completion": ep.completion, "turns": ep.turns,
                           "frames": int(info.get("frames_shown", initial)), "rounds": int(info.get("rounds", 0))}
                    rec.update(score_item(s, ep.completion, benchmark=name, prefill=prefill))
                    records[mode].append(rec)
        return [{"mode": mode, **rec} for mode, recs in records.items() for rec in recs], len(ready)

    def metrics(self, run: Any, preds: dict[str, list[dict[str, Any]]], seconds: float) -> dict[str, Any]:
        """``agent_loop`` and ``baseline`` scores (the benchmark's own), with frames and rounds per answer."""
        from mmrl.benchmarks.scoring import summarize as summarize_benchmark

        result: dict[str, Any] = {"benchmark": run.name, "agent": self.agent, "out": str(run.out),
                                  "n": len(run.samples), "protocol": run.protocol.settings(), "seconds": seconds}
        for mode, recs in preds.items():
            ok = [r for r in recs if "error" not in r]
            n = max(1, len(ok))
            result[mode] = {"scores": summarize_benchmark(run.name, recs),
                            "frames_per_answer": sum(r["frames"] for r in ok) / n,
                            "rounds_per_answer": sum(r["rounds"] for r in ok) / n}
        return result


def headline(result: dict[str, Any]) -> str:
    def pct(mode: str) -> str:
        acc = result[mode]["scores"].get("overall", {}).get("accuracy")
        return "–" if acc is None else f"{100 * acc:.1f}"

    a, b = result["agent_loop"], result["baseline"]
    return (f"{result['benchmark']} with --agent {result['agent']}: accuracy {pct('agent_loop')} using "
            f"{a['frames_per_answer']:.1f} frames and {a['rounds_per_answer']:.2f} selection rounds per answer; "
            f"plain answer on the same initial frames {pct('baseline')} ({b['frames_per_answer']:.1f} frames)")


def _trained_prompt(args: Any, cfg: Any, key: str) -> str:
    """``prompt.<key>`` (``video_layout``, ``answer_format``) for a benchmark: the value the model was trained
    with (its ``mmrl_eval.json``) unless the user's YAML or overrides set one; the benchmark's own protocol
    decides everything else."""
    from mmrl.config.eval_settings import read_eval_settings
    from mmrl.run.recipe import config_from_args

    trained = ((read_eval_settings(cfg.model.path) or {}).get("prompt") or {}).get(key) \
        if cfg.model.path and not getattr(args, "recipe_settings", False) else None
    if not trained or trained == getattr(cfg.prompt, key):
        return getattr(cfg.prompt, key)
    value = getattr(config_from_args(args, base={"prompt": {key: trained}}).prompt, key)
    if not args.quiet:
        print(f"eval: as the model was trained: prompt.{key}={value}", flush=True)
    return value


def _trained_layout(args: Any, cfg: Any) -> str:
    return _trained_prompt(args, cfg, "video_layout")


def cli_eval(args: Any, cfg: Any) -> int:
    """``mmrl eval --agent NAME``: with ``--benchmark``, :func:`run_benchmark_agent`; otherwise the run's
    held-out split through the agent loop (:func:`evaluate_agent`) beside the plain single answer."""
    from mmrl.engine.distributed import world
    from mmrl.engine.media import MediaPreparer
    from mmrl.engine.rollout import backend_from_config
    from mmrl.model import load_policy
    from mmrl.run.helpers import load_split, resolve_model, set_cpu_threads

    spec = AGENTS.get(args.agent)
    if spec is None:
        raise ConfigError(f"--agent {args.agent!r}: known agents are {', '.join(AGENTS)}")
    if cfg.model.path and not getattr(args, "recipe_settings", False) and not getattr(args, "benchmark", None):
        from mmrl.run.recipe import with_training_settings

        cfg = with_training_settings(args, cfg)  # evaluate as the model was trained (its mmrl_eval.json)
    set_cpu_threads(cfg.train.cpu_threads, show=not args.quiet)
    if getattr(args, "benchmark", None):
        if not args.data_root:
            raise MmrlError("--benchmark needs --data-root DIR (the folder the benchmark was downloaded to)")
        layout = _trained_layout(args, cfg)
        result = run_benchmark_agent(
            args.benchmark, args.data_root, resolve_model(cfg), agent=args.agent, out=args.out,
            protocol=args.protocol, frames=args.frames, max_pixels=args.max_pixels,
            prompt_template=args.prompt_template, max_new_tokens=cfg.eval.max_new_tokens,
            batch_size=args.batch_size or cfg.eval.batch_size, limit=args.limit, split=args.split,
            dtype=cfg.model.dtype, video_layout=layout,
            think=_trained_prompt(args, cfg, "answer_format") == "think_answer")
        print(headline(result))
        print(f"results: {result['out']}")
        return 0
    if args.split:
        cfg = dataclasses.replace(cfg, eval=dataclasses.replace(cfg.eval, split=args.split))
    samples, _ = load_split(cfg, cfg.eval.split, show_progress=not args.quiet)
    samples = samples[:args.limit] if args.limit else samples
    policy = load_policy(resolve_model(cfg), dtype=cfg.model.dtype, device=cfg.model.device)
    preparer = MediaPreparer(cfg.data.media, family=policy.family)
    backend = backend_from_config(cfg, policy)
    common = {"max_new_tokens": cfg.eval.max_new_tokens or cfg.rollout.max_new_tokens, "stop": cfg.rollout.stop,
              "batch_size": args.batch_size or cfg.eval.batch_size}
    agent, preds = evaluate_agent(policy, backend, preparer, cfg.prompt, samples, environment=spec["environment"],
                                  environment_kwargs={**spec["environment_kwargs"], **cfg.rollout.environment_kwargs}
                                  if cfg.rollout.environment == spec["environment"] else spec["environment_kwargs"],
                                  max_turns=spec["max_turns"], **common)
    # the plain answer: the same prompt without the system message (it explains the tool), single turn
    bare = dataclasses.replace(cfg.prompt, system=None) if cfg.rollout.environment else cfg.prompt
    plain, _ = evaluate_agent(policy, backend, preparer, bare, samples, environment=None, **common)
    result = {"agent": args.agent, "agent_loop": agent, "baseline": plain}
    if cfg.out and world().is_main:
        out = Path(cfg.out)
        out.mkdir(parents=True, exist_ok=True)
        (out / "metrics.json").write_text(json.dumps(result, indent=2, default=str) + "\n")
        with (out / "predictions.jsonl").open("w") as fh:
            fh.writelines(json.dumps(p, default=str) + "\n" for p in preds)

    f = score_text
    print(f"--agent {args.agent}: accuracy {f(agent['accuracy'])} on {agent['n']} questions, {agent['frames']:.1f} "
          f"frames and {agent['rounds']:.2f} selection rounds per answer, selection IoU {f(agent['iou'])}; plain "
          f"answer on the same initial frames {f(plain['accuracy'])} ({plain['frames']:.1f} frames)")
    return 0
