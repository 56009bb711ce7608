"""``mmrl eval`` on a held-out split: the questions loaded (each rank checks its share of the media files),
the model loaded, every question answered (each rank its share), and ``metrics.json`` and
``predictions.jsonl`` written by rank 0 into the output folder: each whole or not at all (a temporary file
renamed), with the folder's lock (:mod:`mmrl.run.lock`) held from the start, so a second ``mmrl eval`` (or a
run) into the same ``--out`` is refused instead of both writing there. A model folder mmrl wrote is checked
against its digest before it loads (:func:`mmrl.run.helpers.resolve_model`).

SIGTERM or SIGINT (:func:`mmrl.run.pipeline.stop_requests`) stops it at the next batch boundary (every rank at
the same one): the questions answered so far are written whole to ``predictions.partial.jsonl`` (its first
line says it is partial: how many of how many questions, and the settings they were answered with), the
console says how far it got and the command that continues it, the lock is released and the process ends with
128 + the signal (143 for SIGTERM). The same command with ``--resume`` continues from that file: the settings,
the model and the questions must be the same (a difference is named and refused), the batches already answered
are taken from it, and ``metrics.json`` and ``predictions.jsonl`` come out as those of an evaluation never
stopped; the partial file is removed then. Without ``--resume`` a folder holding a partial evaluation is
refused, so nothing answered is thrown away unasked."""

from __future__ import annotations

import hashlib
import json
import shlex
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from mmrl.config import RunConfig
from mmrl_common.errors import MmrlError

PARTIAL_FILE = "predictions.partial.jsonl"
"""What an evaluation a signal stopped had answered: a header line ``{"partial": true, "done", "of",
"settings", "unreadable"}``, then one prediction row per line (as ``predictions.jsonl``'s)."""


def eval_run(cfg: RunConfig, w: Any, *, checks: dict[str, dict[str, Any]], show: bool,
             no_split: Callable[[], None], resume: bool = False) -> tuple[dict[str, Any], Path] | None:
    """Evaluate ``cfg``'s model on ``cfg.eval.split`` with the rank group ``w``; rank 0 gets the metrics and
    the output folder, the others None. ``no_split``: raises the command's error when the run names training
    data but no split to evaluate (every rank alike). ``resume``: continue the evaluation a signal stopped in
    the output folder (:data:`PARTIAL_FILE`). Stopped by a signal: :class:`mmrl.run.pipeline.Stopped`."""
    from mmrl.run.lock import acquire_on_main
    from mmrl.run.pipeline import stop_requests

    out = Path(cfg.out) if cfg.out else Path("runs") / f"eval-{time.strftime('%Y%m%d-%H%M%S')}"
    existed = out.exists()
    lock = acquire_on_main(out, w, show=show)  # one writer per folder: a second eval into --out is refused
    try:
        with stop_requests("stopping after the questions in flight, keeping the answers so far",
                           show=w.is_main) as asked:
            result = _evaluate(cfg, w, out, checks=checks, show=show, no_split=no_split, resume=resume,
                               stop_requested=asked)
            if result is None:
                return None
            write_outputs(out, *result)
            (out / PARTIAL_FILE).unlink(missing_ok=True)  # continued to the end: the whole is written now
        return result[0], out
    except BaseException:
        if lock is not None and not existed:  # a folder this command made and wrote nothing into: not left behind
            _remove_if_empty(out)
        raise
    finally:
        if lock is not None:
            lock.release()


def _evaluate(cfg: RunConfig, w: Any, out: Path, *, checks: dict[str, dict[str, Any]], show: bool,
              no_split: Callable[[], None], resume: bool, stop_requested: Callable[[], int]
              ) -> tuple[dict[str, Any], list[dict[str, Any]]] | None:
    from mmrl.engine.distributed import device_for
    from mmrl.engine.evaluate import EvalStopped, evaluate, require_questions
    from mmrl.engine.service import RolloutService
    from mmrl.model import load_policy
    from mmrl.run.helpers import load_split, resolve_model, set_cpu_threads, split_path
    from mmrl.run.pipeline import Stopped

    set_cpu_threads(cfg.train.cpu_threads, show=show)
    with w.node_first():  # each node's local rank 0 builds the node's cache (toy world) first
        held_out = split_path(cfg, cfg.eval.split, show_progress=show)
    if held_out is None:
        no_split()
    with w.spread_media_checks():  # every rank checks its share of the media files
        samples, info = load_split(cfg, cfg.eval.split, show_progress=show)
    require_questions(samples, info)  # an empty file, or one the settings filter to nothing: said, not 0 of 0
    with w.node_first():  # ... and the tiny model, once the questions are known; a damaged final/ named here
        model_dir = resolve_model(cfg)
    if cfg.eval.limit:
        samples = samples[:cfg.eval.limit]
    settings = _settings(cfg, checks, model_dir, samples) if w.is_main else None
    earlier = _earlier_on_main(out, w, settings, resume=resume)
    policy = load_policy(model_dir, dtype=cfg.model.dtype, attn_implementation=cfg.model.attn_implementation,
                         device=device_for(cfg.model.device))
    try:
        metrics, preds = evaluate(  # unreadable media: stop naming the file, or with data.on_bad_sample=skip leave out
            RolloutService.from_config(policy, cfg), samples,
            max_new_tokens=cfg.eval.max_new_tokens or cfg.rollout.max_new_tokens, batch_size=cfg.eval.batch_size,
            min_options=cfg.eval.min_options, show_progress=show, checks=checks,
            skip_bad=cfg.data.on_bad_sample == "skip", stop_requested=stop_requested, earlier=earlier)
    except EvalStopped as stop:
        if w.is_main:
            done = _write_partial(out, settings, stop.progress, of=len(samples))
            import signal

            print(f"stopped by {signal.Signals(stop.signum).name} after {done} of {len(samples)} questions; their "
                  f"answers kept in {out / PARTIAL_FILE}. Continue with: {_resume_command(out)}",
                  file=sys.stderr, flush=True)
        raise Stopped(stop.signum) from None
    if not w.is_main:
        return None
    return metrics, preds


def _settings(cfg: RunConfig, checks: dict[str, dict[str, Any]], model_dir: Path, samples: list[Any]
              ) -> dict[str, Any]:
    """What the answers in a partial evaluation depend on: every setting (paths absolute; ``out`` aside), the
    checks, the model's identity and the questions (their ids, in order)."""
    from mmrl.config.io import describe
    from mmrl.run.inputs import absolute_flat, model_identity

    flat = {k: v for k, v in absolute_flat({k: v for k, v, _ in describe(cfg)}).items() if k != "out"}
    model = model_identity(model_dir)
    ids = "\n".join(str(s.id) for s in samples)
    return json.loads(json.dumps({"config": flat, "checks": checks, "model": model,
                                  "questions": {"n": len(samples),
                                                "ids_sha256": hashlib.sha256(ids.encode()).hexdigest()}},
                                 default=str))


def _earlier_on_main(out: Path, w: Any, settings: dict[str, Any] | None, *, resume: bool) -> Any:
    """Rank 0 reads what a stopped evaluation left in ``out`` (:data:`PARTIAL_FILE`) and decides whether this one
    may go on; every rank gets the answers to reuse (None: none), or the same refusal."""
    from mmrl.engine.evaluate import EvalProgress

    found, refusal = None, None
    if w.is_main:
        try:
            found = _read_partial(out, settings, resume=resume)
        except MmrlError as exc:
            refusal = str(exc)
    refusal, found = w.broadcast((refusal, found))
    if refusal is not None:
        raise MmrlError(refusal)
    return None if found is None else EvalProgress(*found)


def _read_partial(out: Path, settings: dict[str, Any] | None, *, resume: bool
                  ) -> tuple[list[dict[str, Any]], list[dict[str, Any]]] | None:
    """The prediction rows and unreadable questions of the partial evaluation in ``out``, checked against this
    one's ``settings``; None to start afresh. A partial evaluation without ``resume``, ``resume`` without one, a
    damaged file or other settings: :class:`MmrlError` saying what to do."""
    path = out / PARTIAL_FILE
    if not path.is_file():
        if not resume:
            return None
        finished = " (its metrics.json is a finished evaluation: run without --resume to evaluate again)" \
            if (out / "metrics.json").is_file() else ""
        raise MmrlError(f"--resume: {out} holds no evaluation stopped midway (no {PARTIAL_FILE}){finished}; run "
                        "without --resume to start one")
    try:
        lines = path.read_text().splitlines()
        head = json.loads(lines[0])
        rows = [json.loads(line) for line in lines[1:]]
        if not (isinstance(head, dict) and head.get("partial") is True and isinstance(head.get("settings"), dict)):
            raise ValueError("its first line is not the header mmrl writes")
    except (OSError, ValueError, IndexError) as exc:
        raise MmrlError(f"{path} cannot be read ({str(exc).splitlines()[0][:120] if str(exc) else 'empty'}): it holds "
                        "the answers of an evaluation stopped midway; delete it to evaluate afresh (nothing else "
                        "was changed)") from None
    if not resume:
        raise MmrlError(f"{out} holds an evaluation stopped after {head.get('done')} of {head.get('of')} questions "
                        f"({PARTIAL_FILE}); continue it with --resume (the same command), or delete that file or "
                        "choose another --out to start afresh")
    old = head["settings"]
    diff = _differences(old, settings or {})
    if diff:
        raise MmrlError(f"--resume: the evaluation stopped in {out} was made with other settings ({'; '.join(diff)}); "
                        "continue it with the settings it started with, or delete its "
                        f"{PARTIAL_FILE} (or choose another --out) to start afresh")
    return rows, list(head.get("unreadable") or [])


def _differences(old: dict[str, Any], now: dict[str, Any]) -> list[str]:
    """The differences between two :func:`_settings`, in words (``key: before -> now``)."""
    from mmrl.run.inputs import model_difference

    out = []
    before, after = old.get("config") or {}, now.get("config") or {}
    out += [f"{k}: {before.get(k, '(none)')} -> {after.get(k, '(none)')}"
            for k in dict.fromkeys([*before, *after]) if before.get(k) != after.get(k)]
    if old.get("checks") != now.get("checks"):
        out.append(f"checks: {old.get('checks')} -> {now.get('checks')}")
    why = model_difference(old.get("model") or {}, now.get("model") or {})
    if why:
        out.append(f"the model: {why}")
    if old.get("questions") != now.get("questions"):
        q = old.get("questions") or {}
        out.append(f"the questions: {q.get('n')} then, {(now.get('questions') or {}).get('n')} now"
                   + ("" if q.get("n") != (now.get("questions") or {}).get("n") else ", other ones or in another order"))
    return out


def _write_partial(out: Path, settings: dict[str, Any] | None, progress: Any, *, of: int) -> int:
    """:data:`PARTIAL_FILE` written whole (a temporary file renamed); the number of questions done."""
    from mmrl_common.file_digest import write_atomic

    done = len(progress.predictions) + len(progress.unreadable)
    head = {"partial": True, "done": done, "of": of, "settings": settings, "unreadable": progress.unreadable}
    write_atomic(out / PARTIAL_FILE, "".join(json.dumps(r, default=str) + "\n"
                                             for r in [head, *progress.predictions]))
    return done


def _resume_command(out: Path) -> str:
    """The command that continues a stopped evaluation: this one with ``--resume`` (as typed, when this process
    is the ``mmrl`` command; else in words)."""
    argv = sys.argv
    if Path(argv[0]).name not in ("mmrl", "__main__.py") or "eval" not in argv[1:]:
        return f"the same mmrl eval command with --resume (--out {out})"
    words = ["mmrl", *argv[1:]]
    if "--out" not in words and not any(w.startswith("--out=") for w in words):
        words += ["--out", str(out)]  # (the default folder is named by the time it started)
    return shlex.join(words if "--resume" in words else [*words, "--resume"])


def write_outputs(out: Path, metrics: dict[str, Any], preds: list[dict[str, Any]]) -> None:
    """``metrics.json`` and ``predictions.jsonl``, each written whole (a temporary file renamed); the predictions
    first, so a ``metrics.json`` is never beside another evaluation's predictions."""
    from mmrl_common.file_digest import write_atomic

    out.mkdir(parents=True, exist_ok=True)
    write_atomic(out / "predictions.jsonl", "".join(json.dumps(p, default=str) + "\n" for p in preds))
    write_atomic(out / "metrics.json", json.dumps(metrics, indent=2) + "\n")


def _remove_if_empty(folder: Path) -> None:
    """Remove ``folder`` when it holds nothing but the lock file (an evaluation that failed before writing)."""
    from mmrl.run.lock import LOCK_NAME

    try:
        if {p.name for p in folder.iterdir()} <= {LOCK_NAME}:
            (folder / LOCK_NAME).unlink(missing_ok=True)
            folder.rmdir()
    except OSError:
        pass
