"""The benchmark runner: resumable, batched, with media decoded in background threads.

``run_benchmark("mvbench", data_root, model)`` reads the benchmark (:mod:`data_pipelines.benchmarks`),
builds prompts under a :class:`~mmrl.benchmarks.protocols.Protocol`, generates greedily with
:class:`mmrl.engine.rollout.HFBackend` and writes into ``out``:

* ``predictions.jsonl`` — one line per question (its rendered prompt, the completion, the letter read and
  whether it is right), appended and flushed after every batch. A re-run with the
  same settings skips every question already there (an evaluation killed midway loses at most the batch in
  flight); different settings in the same folder are refused, so one file never mixes protocols.
* ``run.json`` — the settings; ``metrics.json`` — the scores and breakdowns; ``results.md`` — tables.

Decoding runs ahead of the model: a thread pool prepares (decodes, fits and renders) the next ``workers + 1``
batches while the current one generates, so the model does not wait on the decoder; ``metrics.json`` reports
how long it did wait (``timing.decode_wait_s``).
"""

from __future__ import annotations

import json
import os
import threading
import time
from collections import deque
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from data_pipelines.benchmarks import benchmarks, get_benchmark
from mmrl.benchmarks.media import BenchMediaPreparer
from mmrl.benchmarks.protocols import (
    Protocol,
    build_prompt,
    interleave_subtitles,
    make_protocol,
    subtitle_lines,
)
from mmrl.benchmarks.report import markdown
from mmrl.benchmarks.scoring import score_item, summarize
from mmrl.config import MediaConfig
from mmrl.model import MediaInput
from mmrl_common.errors import MmrlError

# settings that must match for a folder's predictions to be reused
_RESUME_KEYS = ("benchmark", "split", "model", "protocol", "subtitles", "checks")


@dataclass
class _Prepared:
    sample: Any
    text: str | None = None
    media: list[Any] | None = None
    prefill: str = ""
    error: str | None = None
    n_frames: int = 0
    raw: list[Any] | None = None  # the decoded media, before :meth:`_Workers.content` (for a check's re-ask)


def media_config(p: Protocol) -> MediaConfig:
    return MediaConfig(video_policy=p.video_policy, fps=p.fps, nframes=p.nframes, min_frames=4,
                       max_frames=p.max_frames if p.video_policy == "qwen" else (p.nframes or p.max_frames),
                       video_min_pixels=p.video_min_pixels, video_max_pixels=p.video_max_pixels,
                       image_min_pixels=min(16 * 28 * 28, p.image_max_pixels), image_max_pixels=p.image_max_pixels)


def read_predictions(path: Path) -> list[dict[str, Any]]:
    """The complete lines of ``predictions.jsonl``; a last line cut by a kill is dropped from the file."""
    if not path.is_file():
        return []
    raw = path.read_bytes()
    good: list[dict[str, Any]] = []
    kept = 0
    for line in raw.splitlines(keepends=True):
        if not line.endswith(b"\n"):
            break
        try:
            good.append(json.loads(line))
        except json.JSONDecodeError:
            break
        kept += len(line)
    if kept < len(raw):
        with open(path, "r+b") as fh:
            fh.truncate(kept)
    return good


def _check_settings(out: Path, settings: dict[str, Any]) -> None:
    path = out / "run.json"
    if path.is_file() and (out / "predictions.jsonl").is_file():
        old = json.loads(path.read_text())
        diff = [k for k in _RESUME_KEYS if old.get(k) != settings.get(k)]
        if diff:
            shown = "; ".join(f"{k}: {old.get(k)!r} -> {settings.get(k)!r}" for k in diff)
            raise MmrlError(f"{out} holds predictions made with other settings ({shown}); use another --out "
                            "or delete that folder to start over")
    path.write_text(json.dumps(settings, indent=2, default=str) + "\n")


class _Workers:
    """Prepares batches in background threads, one media preparer per thread."""

    def __init__(self, policy: Any, protocol: Protocol, subtitles: bool, workers: int, render: bool = True):
        self.policy, self.protocol, self.subtitles, self.renders = policy, protocol, subtitles, render
        self.spec = get_benchmark(protocol.benchmark)
        self.local = threading.local()
        self.pool = ThreadPoolExecutor(max_workers=workers, thread_name_prefix="mmrl-decode") if workers > 0 else None
        extra = {"total_pixels": protocol.total_pixels} if protocol.total_pixels else {}
        self.make_preparer = lambda: BenchMediaPreparer(media_config(protocol), family=policy.family, extra=extra)

    def submit(self, batch: list[Any]) -> Future:
        if self.pool is None:
            f: Future = Future()
            f.set_result(self.prepare(batch))
            return f
        return self.pool.submit(self.prepare, batch)

    def prepare(self, batch: list[Any]) -> list[_Prepared]:
        prep = getattr(self.local, "preparer", None)
        if prep is None:
            prep = self.local.preparer = self.make_preparer()
        out = []
        for s in batch:
            if s.meta.get("missing_media"):
                out.append(_Prepared(s, error=f"media not found: {s.meta['missing_media']}"))
                continue
            try:
                media = prep.prepare(s)
                if not self.renders:  # the answers build their own prompts from the decoded media
                    out.append(_Prepared(s, media=media, raw=media,
                                         n_frames=sum(len(m.timestamps or []) for m in media if m.kind == "video")))
                    continue
                rendered, items, prefill = self.render(s, media)
                frames = sum(len(m.timestamps or []) for m in media if m.kind == "video")
                out.append(_Prepared(s, rendered, items, prefill, n_frames=frames, raw=media))
            except MmrlError as exc:
                out.append(_Prepared(s, error=str(exc)))
        return out

    def render(self, s: Any, media: list[Any]) -> tuple[str, list[Any], str]:
        """The prompt as the model reads it (the pre-fill at its end), its media items in order, the pre-fill."""
        content, items, prefill, system = self.content(s, media)
        messages: list[dict[str, Any]] = []
        if system:
            messages.append({"role": "system", "content": [{"type": "text", "text": system}]})
        messages.append({"role": "user", "content": content})
        return self.policy.render(messages) + prefill, items, prefill

    def content(self, s: Any, media: list[Any]) -> tuple[list[dict[str, Any]], list[Any], str, str | None]:
        """The user turn's parts, the media items in their order, the pre-fill and the system text. With
        subtitles, as the benchmark's spec says (``subtitle_style``): ``lines`` — the lines shown at the frames'
        times in the prompt text (Video-MME; under lmms-eval at 32 frames spread over the video);
        ``interleaved`` — each frame an image, the cues between them (LongVideoBench's ``_i`` protocol)."""
        if not self.subtitles:
            system, text, prefill = build_prompt(s, self.protocol)
            return [{"type": m.kind} for m in media] + [{"type": "text", "text": text}], media, prefill, system
        cues = self.spec.subtitles(s)
        if self.spec.subtitle_style == "interleaved":
            system, text, prefill = build_prompt(s, self.protocol)
            video = next(m for m in media if m.kind == "video")
            frames = video.data.frames
            parts: list[dict[str, Any]] = []
            items: list[Any] = []
            for piece in interleave_subtitles(cues, [float(t) for t in video.timestamps]):
                if isinstance(piece, str):
                    parts.append({"type": "text", "text": piece})
                    continue
                from PIL import Image

                pixels = frames[piece].permute(1, 2, 0).contiguous().numpy()
                items.append(MediaInput(key=f"{video.key}|image{piece}", kind="image", data=Image.fromarray(pixels),
                                        timestamps=[float(video.timestamps[piece])]))
                parts.append({"type": "image"})
            return parts + [{"type": "text", "text": text}], items, prefill, system
        times = [t for m in media for t in (m.timestamps or [])]
        if self.protocol.name == "lmms-eval":  # videomme/utils.py: 32 frames spread over the whole video
            v = next(m for m in media if m.kind == "video").data
            times = [int(i) / v.video_fps for i in np.linspace(0, v.total_frames - 1, 32, dtype=int)]
        subs = subtitle_lines(cues, times)
        system, text, prefill = build_prompt(s, self.protocol, subtitles=subs)
        return [{"type": m.kind} for m in media] + [{"type": "text", "text": text}], media, prefill, system

    def close(self) -> None:
        if self.pool is not None:
            self.pool.shutdown(wait=False, cancel_futures=True)


@dataclass
class BenchmarkRun:
    """What every benchmark run starts from: the policy, the protocol, the output folder and the questions."""

    name: str
    policy: Any
    model_path: str
    protocol: Any
    out: Path
    data: Any
    samples: list[Any]


def open_benchmark_run(name: str, data_root: str | os.PathLike[str], model: str | os.PathLike[str] | None, *,
                       policy: Any, dtype: str, protocol: str, frames: int | None, max_pixels: int | None,
                       prompt_template: str | None, max_new_tokens: int | None, split: str | None,
                       limit: int | None, out: str | os.PathLike[str] | None,
                       out_suffix: str | None = None, device: str = "auto", open_ended: bool = False) -> BenchmarkRun:
    """Read the benchmark's questions (first: a wrong folder fails before the model loads), load the model
    (unless ``policy`` is given), make the protocol and create ``out`` (default
    ``runs/eval/<benchmark>-<out_suffix or the model folder's name>``)."""
    from data_pipelines.benchmarks import load_benchmark
    from mmrl.model import load_policy

    if policy is None and model is None:
        raise MmrlError("give --model (a Hugging Face Qwen-VL folder)")
    if policy is None or model:
        model_path = str(Path(model).resolve())
    else:
        model_path = str(getattr(policy.model, "name_or_path", "policy"))
    out = Path(out) if out else Path("runs") / "eval" / f"{name}-{out_suffix or Path(model_path).name}"
    data = load_benchmark(name, data_root, split=split, media_cache=out / "media",
                          **({"open_ended": True} if open_ended else {}))  # for a judge (mmrl eval --judge)
    samples = data.samples[:limit] if limit else list(data.samples)
    out.mkdir(parents=True, exist_ok=True)
    if policy is None:
        policy = load_policy(model, dtype=dtype, device=device)
    proto = make_protocol(name, protocol, family=policy.family, frames=frames, max_pixels=max_pixels,
                          template=prompt_template, max_new_tokens=max_new_tokens)
    return BenchmarkRun(name, policy, model_path, proto, out, data, samples)


class Answers:
    """The extension point of :func:`run_benchmark`'s loop: how a batch of prepared questions becomes the records
    written to ``predictions.jsonl``. The runner opens the run, shares the questions among ranks, prepares their
    media in its workers, writes each batch's records, merges the ranks' parts and scores; an ``Answers`` builds
    the prompts, makes the answers and writes each question's record. The default (:class:`_Generate`) is the
    benchmark's own: the protocol's prompt, generated in batches, read by :func:`score_item`.

    ``modes``: the names of answer sets made side by side, each record carrying its ``mode``
    (``predictions.jsonl`` lists them mode by mode, each in the order answered, and :meth:`metrics` scores
    them); empty: one set, its records without a mode, scored by the runner. ``resume``: a re-run reuses the
    folder's predictions made with the same settings (``run.json``); False: every run starts over (no
    ``run.json``). ``render``: the workers render the protocol's prompt (``_Prepared.text``, ``.media``,
    ``.prefill``); False: they only decode (``_Prepared.raw``). ``engine_ranks``: consecutive ranks that share
    one engine (they answer the same questions). ``generate_s``: the seconds spent answering so far."""

    modes: tuple[str, ...] = ()
    resume: bool = True
    render: bool = True
    engine_ranks: int = 1
    generate_s: float = 0.0

    def answer(self, prepared: list[_Prepared], workers: _Workers) -> tuple[list[dict[str, Any]], int]:
        """The records of one batch (a question whose ``error`` is set has no media to answer from) and how many
        questions were answered."""
        raise NotImplementedError

    def metrics(self, run: BenchmarkRun, preds: dict[str, list[dict[str, Any]]], seconds: float) -> dict[str, Any]:
        """The metrics of a run with ``modes`` (``preds``: each mode's records, as in ``predictions.jsonl``),
        written to ``metrics.json``."""
        raise NotImplementedError


class _Generate(Answers):
    """The benchmark's own answers: each question's prompt under the protocol, generated in one call per batch
    (greedy) or per question (sampled), read by :func:`score_item`; the checks asked for run on each batch."""

    def __init__(self, engine: Any, policy: Any, proto: Protocol, name: str, seed: int,
                 checks: dict[str, tuple[Any, dict[str, Any]]]):
        self.engine, self.policy, self.proto, self.name, self.seed, self.checks = engine, policy, proto, name, seed, checks
        self.groups = get_benchmark(name).breakdowns

    def answer(self, prepared: list[_Prepared], workers: _Workers) -> tuple[list[dict[str, Any]], int]:
        from mmrl.engine.rollout import SamplingParams

        policy, proto, name, sampled = self.policy, self.proto, self.name, self.proto.temperature > 0
        ready, seqs = [], []
        for p in prepared:
            if p.error is None:
                try:
                    seqs.append(policy.encode(p.text, p.media))
                    ready.append(p)
                except MmrlError as exc:
                    p.error = str(exc)
        # a sampled protocol draws each question from its own stream (seed, question id): the answers do
        # not depend on the batch size, the rank or what was resumed
        params = [SamplingParams(max_new_tokens=proto.max_new_tokens, greedy=not sampled,
                                 temperature=proto.temperature if sampled else 1.0,
                                 seed=_question_seed(self.seed, p.sample.id) if sampled else None)
                  for p in ready]
        t0 = time.perf_counter()
        gens = _generate(self.engine, seqs, params, sampled)
        self.generate_s += time.perf_counter() - t0
        texts = {id(p): g[0].text for p, g in zip(ready, gens)}
        records = []
        for p in prepared:
            s = p.sample
            rec: dict[str, Any] = {"id": s.id, "problem_type": s.problem_type, "answer": s.answer,
                                   "answer_type": s.meta.get("answer_type"),
                                   "group": {g: (s.problem_type if g == "problem_type" else s.meta.get(g))
                                             for g in self.groups}}
            if p.error is not None:
                rec.update(completion=None, pred=None, parsed=False, correct=False, error=p.error,
                           n_options=len(s.options or []))
            else:
                rec["completion"] = texts[id(p)]
                rec.update(score_item(s, texts[id(p)], benchmark=name, prefill=p.prefill))
                rec["frames"] = p.n_frames
                rec["prompt"] = p.text  # as rendered, the media as their placeholder tokens
            records.append(rec)
        if self.checks and ready:
            t0 = time.perf_counter()
            answered = [r for r in records if r.get("error") is None]
            ask = _asker(self.engine, policy, workers, ready, name, proto.max_new_tokens)
            for check, kw in self.checks.values():
                check.benchmark([p.sample for p in ready], answered, ask, **kw)
            self.generate_s += time.perf_counter() - t0
        return records, len(ready)


def run_benchmark(
    benchmark: str, data_root: str | os.PathLike[str], model: str | os.PathLike[str] | None = None, *,
    out: str | os.PathLike[str] | None = None, protocol: str = "official", frames: int | None = None,
    max_pixels: int | None = None, prompt_template: str | None = None, max_new_tokens: int | None = None,
    batch_size: int = 8, limit: int | None = None, workers: int = 2, split: str | None = None,
    subtitles: bool = False, dtype: str = "fp32", policy: Any = None, show_progress: bool = True,
    on_batch: Callable[[int], None] | None = None, backend: str = "hf", vllm: dict[str, Any] | None = None,
    on_bad_sample: str = "raise", seed: int = 0, device: str = "auto",
    checks: dict[str, dict[str, Any]] | None = None, answers: Callable[[BenchmarkRun], Answers] | None = None,
    out_suffix: str | None = None, judge: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """Evaluate ``model`` (a Hugging Face Qwen-VL folder, or an already loaded ``policy``) on ``benchmark``.

    Returns the metrics written to ``out/metrics.json``. ``on_batch(n_written)`` is called after each batch
    is on disk (for progress hooks and tests). ``backend``: ``hf`` or ``vllm`` (``vllm``: the engine's
    settings, :class:`mmrl.engine.backends.vllm.VLLMBackend`'s keywords; its ``max_model_len`` defaults to a bound
    from the protocol's frames and pixels).

    A question whose video is missing or unreadable never stops the run: it is recorded with its error and
    counted wrong (``on_bad_sample="raise"``, the default, as ``data.on_bad_sample``) or left out of the scores
    (``"skip"``); either way ``metrics.json`` and ``results.md`` list it. Under torchrun each rank answers
    its share of the questions into ``predictions.rank<R>.jsonl``; rank 0 merges them into
    ``predictions.jsonl`` and scores (every rank returns the metrics).

    ``checks``: ``{name: settings}`` of evaluation checks (:func:`mmrl.engine.evaluate.register_check`, e.g. ACRE's
    ``consistency``) to run on each batch too, under this protocol; their fields land in the prediction records,
    their sections in ``metrics[name]`` and ``results.md``. Only checks with a benchmark form can run here.

    ``answers``: the loop's extension point, called with the opened :class:`BenchmarkRun`: the
    :class:`Answers` that turn each batch of prepared questions into records (default: the protocol's prompt
    generated under ``backend``); with its ``modes``, several answer sets scored side by side by its own
    ``metrics``. ``out_suffix``: the default ``out`` folder's suffix (default: the model folder's name).

    ``judge``: :mod:`rewards.judge`'s settings (``base_url``, ``model``, ...): the benchmark's open-ended
    questions are kept (MMVU's) and scored by the judge model (:mod:`mmrl.benchmarks.judged`); the judge
    is reached before the model loads, and the report names its model and prompt beside the score.
    """
    from mmrl.engine.distributed import world
    from mmrl.run.lock import acquire_on_main
    from mmrl.run.pipeline import stop_requests

    t_start = time.perf_counter()
    w = world()
    spec = get_benchmark(benchmark)
    _check_options(spec, protocol=protocol, subtitles=subtitles, on_bad_sample=on_bad_sample)
    runs = _bench_checks(checks or {})
    judge_settings = None
    if judge is not None:
        from mmrl.benchmarks.judged import prepare_judge

        judge_settings = prepare_judge(judge)
    with w.main_first():
        run = open_benchmark_run(spec.name, data_root, model, policy=policy, dtype=dtype, protocol=protocol,
                                 frames=frames, max_pixels=max_pixels, prompt_template=prompt_template,
                                 max_new_tokens=max_new_tokens, split=split, limit=limit, out=out,
                                 out_suffix=out_suffix, device=device, open_ended=judge is not None)
    answerer = answers(run) if answers is not None else None
    settings = {"benchmark": spec.name, "split": run.data.info.get("split"),
                "data_root": str(Path(data_root).resolve()), "model": run.model_path,
                "protocol": run.protocol.settings(), "subtitles": subtitles}
    if runs:
        settings["checks"] = {k: v for k, (_, v) in runs.items()}
    if judge_settings is not None:
        settings["judge"] = {"base_url": judge_settings.base_url, "model": judge_settings.model}
    lock = acquire_on_main(run.out, w, show=show_progress)  # one writer per folder, as mmrl eval's held-out split
    try:
        done, parts = _earlier_answers(w, run.out, settings, fresh=answerer is not None and not answerer.resume)
        if answerer is None:
            answerer = _Generate(_engine(run, backend, batch_size, vllm), run.policy, run.protocol, spec.name, seed,
                                 runs)
        with stop_requests("stopping after the batch in flight, keeping the answers so far", show=w.is_main) as asked:
            timing = _answer_all(w, run, answerer, done, batch_size=batch_size, workers=workers, subtitles=subtitles,
                                 show_progress=show_progress, on_batch=on_batch, stop_requested=asked)
        w.barrier()  # (a rank a signal stopped waits here for the others' batches in flight: every rank's file whole)
        _stop_if_asked(w, run, answerer, timing, len(done))
        metrics: dict[str, Any] = {}
        if w.is_main and answerer.modes:
            _merge_parts(run.out, run.samples, tuple(answerer.modes))
            rows = read_predictions(run.out / "predictions.jsonl")
            metrics = answerer.metrics(run, {m: [p for p in rows if p.get("mode") == m] for m in answerer.modes},
                                       time.perf_counter() - t_start)
            (run.out / "metrics.json").write_text(json.dumps(metrics, indent=2, default=str) + "\n")
        elif w.is_main:
            if w.active or parts:
                _merge_parts(run.out, run.samples)
            timing.update(generate_s=answerer.generate_s, workers=workers, batch_size=batch_size, ranks=w.size)
            metrics = _score(spec, run, settings, runs, timing, on_bad_sample=on_bad_sample, limit=limit,
                             judge_settings=judge_settings, t_start=t_start)
        return w.broadcast(metrics)
    finally:
        if lock is not None:
            lock.release()


def _check_options(spec: Any, *, protocol: str, subtitles: bool, on_bad_sample: str) -> None:
    """The options of :func:`run_benchmark` that this benchmark cannot take: one error each."""
    if subtitles and spec.subtitles is None:
        raise MmrlError(f"--subtitles applies to {' and '.join(b.name for b in benchmarks() if b.subtitles)} only")
    if subtitles and spec.subtitle_style == "interleaved" and protocol == "lmms-eval":
        raise MmrlError(f"--protocol lmms-eval reproduces lmms-eval's {spec.lmms_task} task, which has no "
                        f"subtitles; for {spec.title}'s interleaved subtitles use --protocol official --subtitles")
    if on_bad_sample not in ("raise", "skip"):
        raise MmrlError(f"on_bad_sample must be 'raise' or 'skip', got {on_bad_sample!r}")


def _earlier_answers(w: Any, out: Path, settings: dict[str, Any], *, fresh: bool
                     ) -> tuple[dict[str, dict[str, Any]], list[Path]]:
    """The answers an earlier run of the same settings left in ``out`` (``fresh``: none, its files removed;
    other settings are refused by :func:`_check_settings`), by id, and the ranks' part files found."""
    pred_path = out / "predictions.jsonl"
    if w.is_main:
        if not fresh:
            _check_settings(out, settings)
        else:  # every run starts over
            for path in [pred_path, *out.glob("predictions.rank*.jsonl")]:
                path.unlink(missing_ok=True)
    w.barrier()
    parts = sorted(out.glob("predictions.rank*.jsonl"))
    done = {p["id"]: p for path in [pred_path, *parts] for p in read_predictions(path) if not p.get("error")}
    w.barrier()  # every rank has read the files before any appends to them
    return done, parts


def _stop_if_asked(w: Any, run: BenchmarkRun, answerer: Answers, timing: dict[str, Any], resumed: int) -> None:
    """A signal stopped the answering on some rank (``timing["stopped_by"]``): every rank ends with
    :class:`mmrl.run.pipeline.Stopped` (128 + the signal), rank 0 saying how many questions are answered (their
    records kept in the folder's predictions files, which a re-run continues from, unless ``answerer`` starts
    over every time) and the command to continue."""
    import shlex
    import signal
    import sys

    from mmrl.run.pipeline import Stopped

    signum = w.max_int(timing.get("stopped_by", 0))
    if not signum:
        return
    answered = resumed + sum(w.gather(timing["written_this_run"])[::max(1, answerer.engine_ranks)])
    if w.is_main:
        name = signal.Signals(signum).name
        if not answerer.resume:
            print(f"stopped by {name} after {answered} of {len(run.samples)} questions; this evaluation keeps no "
                  "partial answers: run it again to start over", file=sys.stderr, flush=True)
        else:
            words = ["mmrl", *sys.argv[1:]] if Path(sys.argv[0]).name in ("mmrl", "__main__.py") else []
            again = shlex.join(words if "--resume" in words else [*words, "--resume"]) if words else \
                f"the same mmrl eval --benchmark command (--out {run.out})"
            print(f"stopped by {name} after {answered} of {len(run.samples)} questions; their answers kept in "
                  f"{run.out} (predictions*.jsonl). Continue with: {again}", file=sys.stderr, flush=True)
    raise Stopped(signum)


def _engine(run: BenchmarkRun, backend: str, batch_size: int, vllm: dict[str, Any] | None) -> Any:
    """The rollout backend that answers the protocol's prompts: transformers' generate, or vLLM with a
    ``max_model_len`` bound from the protocol's frames and pixels unless ``vllm`` sets one."""
    from mmrl.engine.rollout import HFBackend, make_backend

    if backend == "vllm":
        return make_backend("vllm", run.policy,
                            **{"max_model_len": protocol_max_len(run.protocol, run.policy), **(vllm or {})})
    return HFBackend(run.policy, max_batch=batch_size)


def _answer_all(w: Any, run: BenchmarkRun, answerer: Any, done: dict[str, Any], *, batch_size: int, workers: int,
                subtitles: bool, show_progress: bool, on_batch: Callable[[int], None] | None,
                stop_requested: Callable[[], int] | None = None) -> dict[str, Any]:
    """Answer this rank's share of the questions not done yet, batch by batch, the next batches' media decoded
    by ``workers`` threads meanwhile; each batch's records appended to the rank's file and synced before the
    next. ``stop_requested`` (a signal's number, 0 while none came) is read before each batch: set, the loop
    ends there (``stopped_by``). Returns the loop's timing and counts."""
    from tqdm import tqdm

    out, samples, policy = run.out, run.samples, run.policy
    todo = w.shard([s for s in samples if s.id not in done], answerer.engine_ranks)
    resumed = len({s.id for s in samples} & done.keys())
    my_path = out / "predictions.jsonl" if not w.active else out / f"predictions.rank{w.rank}.jsonl"
    batches = [todo[i:i + batch_size] for i in range(0, len(todo), batch_size)]
    bar = tqdm(total=len(samples), initial=resumed, desc=f"{run.name} eval", unit="q",
               disable=not show_progress or not w.is_main, dynamic_ncols=True)
    pool = _Workers(policy, run.protocol, subtitles, max(0, workers), render=answerer.render)
    generated, written, wait_s, stopped_by = 0, 0, 0.0, 0
    pending: deque[Future] = deque()
    it = iter(batches)
    try:
        for batch in it:
            pending.append(pool.submit(batch))
            if len(pending) > max(0, workers):
                break
        with open(my_path, "a", encoding="utf-8") as fh:
            while pending:
                if stop_requested is not None and (stopped_by := stop_requested()):
                    break  # the batches written so far are whole: a re-run continues after them
                t0 = time.perf_counter()
                prepared = pending.popleft().result()
                wait_s += time.perf_counter() - t0
                nxt = next(it, None)
                if nxt is not None:
                    pending.append(pool.submit(nxt))
                records, answered = answerer.answer(prepared, pool)
                policy.media.clear()
                fh.writelines(json.dumps(rec, default=str) + "\n" for rec in records)
                fh.flush()
                os.fsync(fh.fileno())
                generated += answered
                written += len(prepared)
                bar.update(len(prepared) * w.size)
                if on_batch is not None:
                    on_batch(generated)
    finally:
        pool.close()
        bar.close()
    return {"decode_wait_s": wait_s, "generated_this_run": generated, "resumed": resumed, "written_this_run": written,
            "stopped_by": stopped_by}


def _score(spec: Any, run: BenchmarkRun, settings: dict[str, Any], runs: dict[str, tuple[Any, dict[str, Any]]],
           timing: dict[str, Any], *, on_bad_sample: str, limit: int | None, judge_settings: Any,
           t_start: float) -> dict[str, Any]:
    """Rank 0: the merged predictions scored (the open-ended ones by the judge), each check summarised, and
    ``metrics.json`` and ``results.md`` written; the metrics."""
    out, samples, name = run.out, run.samples, spec.name
    final = {p["id"]: p for p in read_predictions(out / "predictions.jsonl")}
    preds = [final[s.id] for s in samples if s.id in final]
    failures = [{"id": p["id"], "error": p["error"]} for p in preds if p.get("error")]
    scored = [p for p in preds if not (on_bad_sample == "skip" and p.get("error"))]
    if judge_settings is not None:
        from mmrl.benchmarks.judged import judge_open

        judge_open(scored, samples, judge_settings, out)
    scores = summarize(name, scored, judge=judge_settings.describe() if judge_settings is not None else None)
    t = timing
    metrics = {
        "benchmark": name, "title": spec.title, "model": run.model_path, "out": str(out),
        "split": run.data.info.get("split"), "data_root": settings["data_root"], "n": len(scored),
        "n_available": len(run.data.samples), "limit": limit, "protocol": run.protocol.settings(),
        "protocol_text": run.protocol.describe(), "subtitles": settings["subtitles"], "dataset_info": run.data.info,
        "scores": scores, "on_bad_sample": on_bad_sample, "media_failures": failures,
        "timing": {"seconds": time.perf_counter() - t_start, "generate_s": t["generate_s"], "decode_wait_s": t["decode_wait_s"],
                   "generated_this_run": t["generated_this_run"], "resumed": t["resumed"], "workers": t["workers"],
                   "batch_size": t["batch_size"], "ranks": t["ranks"]},
    }
    text = markdown(metrics)
    for cname, (check, _) in runs.items():
        metrics[cname] = check.summarize(scored)
        metrics.setdefault("checks", {})[cname] = check.describe(metrics[cname]) if check.describe else []
        text += "\n".join(["", f"## {cname.replace('_', ' ')}", "", *metrics["checks"][cname], ""])
    (out / "metrics.json").write_text(json.dumps(metrics, indent=2, default=str) + "\n")
    (out / "results.md").write_text(text + "\n")
    return metrics


def _bench_checks(checks: dict[str, dict[str, Any]]) -> dict[str, tuple[Any, dict[str, Any]]]:
    """The registered evaluation checks asked for, each with its settings; one without a benchmark form is an
    error that says where it does run."""
    from mmrl.engine.evaluate import CHECKS

    out = {}
    for name, settings in checks.items():
        check = CHECKS.get(name)
        if check.benchmark is None:
            raise MmrlError(f"the evaluation check {name!r} has no benchmark form (it runs on a held-out split: "
                            f"`mmrl eval --eval-data FILE --check {name}`); benchmark checks: "
                            + (", ".join(k for k in CHECKS.names() if CHECKS.get(k).benchmark) or "none loaded"))
        out[name] = (check, dict(settings or {}))
    return out


def _asker(engine: Any, policy: Any, workers: _Workers, ready: list[_Prepared], benchmark: str,
           max_new_tokens: int) -> Callable[[list[tuple[int, Any, str]]], list[dict[str, Any]]]:
    """A check's ``ask`` (see :class:`mmrl.engine.evaluate.EvalCheck`) for one batch: each request's sample text under
    this protocol with ``ready[i]``'s media (decoded once), the answer forced to begin with the prefix, greedy
    in one call; the answer (the prefix and what followed it) read as the benchmark reads answers."""
    from mmrl.engine.rollout import SamplingParams

    def ask(requests: list[tuple[int, Any, str]]) -> list[dict[str, Any]]:
        if not requests:
            return []
        texts, seqs, prefills = [], [], []
        for i, sample, prefix in requests:
            rendered, items, prefill = workers.render(sample, ready[i].raw or [])
            texts.append(rendered + prefix)
            prefills.append(prefill)
            seqs.append(policy.encode(texts[-1], items))
        gens = _generate(engine, seqs, [SamplingParams(max_new_tokens=max_new_tokens, greedy=True)], False)
        out = []
        for (_, sample, prefix), text, prefill, g in zip(requests, texts, prefills, gens):
            answer = prefix + g[0].text  # the forced start is part of the answer
            read = score_item(sample, answer, benchmark=benchmark, prefill=prefill)
            out.append({"completion": answer, "pred": read.get("pred"), "prompt": text})
        return out

    return ask


def _question_seed(seed: int, qid: str) -> int:
    import zlib

    return (int(seed) * 1_000_003 + zlib.crc32(str(qid).encode())) % (2**31)


def _generate(engine: Any, seqs: list[Any], params: list[Any], sampled: bool) -> list[Any]:
    """Greedy: one call for the batch. Sampled: one call per question under its own seed (the HF backend draws
    from torch's generator, which is seeded here; vLLM seeds each request from ``params.seed``)."""
    import torch

    if not seqs:
        return []
    if not sampled:
        return engine.generate(seqs, n=1, params=params[0])
    out = []
    for seq, prm in zip(seqs, params):
        torch.manual_seed(prm.seed)
        out.extend(engine.generate([seq], n=1, params=prm))
    return out


def _merge_parts(out: Path, samples: list[Any], modes: tuple[str, ...] = ()) -> None:
    """Fold every rank's ``predictions.rank<R>.jsonl`` into ``predictions.jsonl`` in question order (an answer
    beats an error for the same question), then remove the parts. With ``modes``: mode by mode, each in the
    order the records were written, rank after rank (ranks sharing an engine wrote the same records: kept once)."""
    pred_path = out / "predictions.jsonl"
    parts = sorted(out.glob("predictions.rank*.jsonl"), key=lambda p: int(p.name.split(".")[1][len("rank"):]))
    by_id: dict[tuple[Any, str], dict[str, Any]] = {}
    for path in [pred_path, *parts]:
        for p in read_predictions(path):
            key = (p.get("mode"), p["id"])
            if key not in by_id or by_id[key].get("error"):
                by_id[key] = p
    if modes:
        rows = sorted(by_id.values(), key=lambda p: modes.index(p["mode"]))
    else:
        order = {s.id: i for i, s in enumerate(samples)}
        rows = sorted(by_id.values(), key=lambda p: order.get(p["id"], len(order)))
    tmp = pred_path.with_name(".predictions.jsonl.tmp")
    with open(tmp, "w", encoding="utf-8") as fh:
        for p in rows:
            fh.write(json.dumps(p, default=str) + "\n")
        fh.flush()
        os.fsync(fh.fileno())
    os.replace(tmp, pred_path)
    for path in parts:
        path.unlink()


def protocol_max_len(proto: Protocol, policy: Any) -> int:
    """A vLLM ``max_model_len`` for a protocol: its most video tokens (frames and pixels per frame, or the
    total-pixel cap), one image at its pixel cap, 4,096 tokens of text (subtitles included) and the answer."""
    import math

    vc = policy.base.visual.config
    px = (int(vc.patch_size) * int(getattr(vc, "spatial_merge_size", 2))) ** 2
    frames = proto.nframes or proto.max_frames
    video = math.ceil(frames / int(vc.temporal_patch_size)) * math.ceil(proto.video_max_pixels / px)
    if proto.total_pixels:
        video = min(video, math.ceil(proto.total_pixels / px))
    return 4096 + video + math.ceil(proto.image_max_pixels / px) + proto.max_new_tokens


def headline(metrics: dict[str, Any]) -> str:
    s = metrics["scores"]
    if get_benchmark(metrics["benchmark"]).scoring == "closed_open":
        c, o = s["closed"], s["open"]
        f = (lambda v: "–" if v is None else f"{100 * v:.1f}")
        return (f"{metrics['title']}: closed accuracy {f(c['accuracy'])} (LLaVA-Med hit {f(c['hit'])}, n={c['n']}), "
                f"open recall {f(o['recall'])} (n={o['n']})")
    o, h = s["overall"], s["headline"]
    f = (lambda v: "–" if v is None else f"{100 * v:.1f}")
    beside = "; ".join(f"{k} {f(v['value'])}" for k, v in s.get("beside", {}).items())
    failed = metrics.get("media_failures") or []
    media = (f"; {len(failed)} without readable media "
             f"({'left out' if metrics.get('on_bad_sample') == 'skip' else 'counted wrong'})") if failed else ""
    judged = ""
    if s.get("judge"):
        op = s["open_ended"]
        judged = (f"; open-ended {f(op['accuracy'])} (n={op['n']}, judged {op['judged']}, failed {op['failed']}) "
                  f"judged by {s['judge']['model']} at {s['judge']['base_url']}")
    return (f"{metrics['title']}: {f(h['value'])} ({h['metric']}: {h['convention']}); {beside}; "
            f"unparsed {o['unparsed']} of {o['n']}{media}{judged}")
