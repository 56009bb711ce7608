"""``mmrl train``: one run folder, stages in order, each resumable.

Stages: cold-start SFT (optional) -> evaluation before RL -> GRPO -> evaluation after RL -> report. The
run folder holds ``config.yaml`` and ``run_state.json`` (finished stages and their results). A run
restarted with ``--resume`` skips finished stages and continues RL from its latest checkpoint, so a
killed run ends with the same weights as one that was never interrupted.

Before anything trains, every media file of the data is checked (``data.check_media``): a bad one stops the
run at load with every problem listed as FILE:LINE, or with ``data.on_bad_sample=skip`` its record is left
out and named. The random-answer cold start (``sft.target: random_answer``, the toy demo's) never runs on a
model the user gave (``model.path``). Every model folder the run writes carries ``mmrl_eval.json`` (the
prompt, generation and media settings) so that ``mmrl eval --model`` evaluates it as it was trained.
"""

from __future__ import annotations

import contextlib
import json
import os
import time
from pathlib import Path
from typing import Any

import yaml

from mmrl.config import RunConfig
from mmrl.config_io import to_dict
from mmrl.run_inputs import (
    DATA_KEYS,
    MODEL_KEY,
    PATH_KEYS,
    absolute,
    absolute_paths,
    architecture_change,
    input_changes,
    read_inputs,
    record_inputs,
    same_content,
)
from mmrl.run_log import RunLog
from mmrl_common.errors import ConfigError, MmrlError


def resolve_model(cfg: RunConfig) -> Path:
    if cfg.model.path:
        return Path(cfg.model.path)
    if cfg.model.init == "toy_base":
        from mmrl.toy_base import BaseRecipe, ensure_toy_base

        return ensure_toy_base(BaseRecipe(family=cfg.model.tiny_family, seed=cfg.model.tiny_seed,
                                          size=tuple(cfg.model.tiny_size.items()),
                                          world=tuple(cfg.data.toy_world.items()), **cfg.model.toy_base))
    from mmrl.tiny_models import ensure_tiny

    return Path(ensure_tiny(cfg.model.tiny_family, seed=cfg.model.tiny_seed, **cfg.model.tiny_size))


def set_cpu_threads(setting: int | str, *, show: bool = True, earlier: int | None = None) -> int:
    """Set torch's CPU thread count from ``train.cpu_threads`` and return it.

    ``auto``: ``earlier`` (the count a resumed run started with, so that it continues exactly), else
    ``OMP_NUM_THREADS`` when it is set, else the cores this process may use minus the load of other
    processes (the 1-minute load average), at least 1. Measured on a 2-core machine beside other training
    runs (load average 4-6): a tiny-model RL step took 0.58 s with 1 thread and 7-12 s with 2."""
    import torch

    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    if setting == "auto" and earlier:
        n, why = int(earlier), "as when the run started"
    elif setting == "auto":
        if os.environ.get("OMP_NUM_THREADS", "").isdigit():
            n, why = int(os.environ["OMP_NUM_THREADS"]), "OMP_NUM_THREADS"
        else:
            busy = os.getloadavg()[0] if hasattr(os, "getloadavg") else 0.0
            n = max(1, min(cores, round(cores - busy)))
            why = f"{cores} cores, load {busy:.1f} from other processes"
    else:
        n, why = int(setting), "train.cpu_threads"
        if n < 1:
            raise ConfigError(f"train.cpu_threads={setting}: must be 'auto' or >= 1")
    torch.set_num_threads(n)
    if show:
        print(f"torch CPU threads: {n} ({why}; set train.cpu_threads=N to choose)", flush=True)
    return n


def load_split(cfg: RunConfig, split: str, *, show_progress: bool = True) -> tuple[list[Any], dict[str, Any]]:
    """The samples of a split (``train``, ``val``, ``test``), filtered by the run's task and type settings.

    Every media file is checked first (``data.check_media``); with ``data.on_bad_sample=skip`` the bad
    records are left out, printed (FILE:LINE: reason) and listed in ``info["skipped_records"]``."""
    from data_pipelines.loaders import load_samples

    path = split_path(cfg, split, show_progress=show_progress)
    if path is None:
        return [], {"split": split, "path": None}  # the report says there was none
    check = None if cfg.data.check_media == "none" else cfg.data.check_media
    result = load_samples(path, fmt=cfg.data.format, columns=cfg.data.columns or None,
                          media_root=cfg.data.media_root, on_bad_sample=cfg.data.on_bad_sample,
                          check_media=check or False, progress=show_progress,
                          skip_hint="pass data.on_bad_sample=skip",
                          max_question_chars=cfg.data.max_question_chars, role=split)
    samples = list(result.samples)
    left_out: dict[str, int] = {}  # good records the run's settings leave out, by setting
    if cfg.data.toy_tasks and cfg.data.train is None and getattr(cfg.data, split) is None:  # toy-world settings
        # never filter user data (nor the held-out split of a user's data.train folder)
        kept = [s for s in samples if s.meta.get("task") in cfg.data.toy_tasks]
        left_out["data.toy_tasks"], samples = len(samples) - len(kept), kept
    if cfg.data.problem_types:
        kept = [s for s in samples if s.problem_type in cfg.data.problem_types]
        left_out["data.problem_types"], samples = len(samples) - len(kept), kept
    skipped: dict[str, dict[str, Any]] = {}
    for p in result.problems:
        rec = skipped.setdefault(p.location(), {"where": p.location(), "id": p.sample_id, "reasons": []})
        rec["reasons"].append(p.reason)
    info = {"path": str(path), "split": split, "lines": result.lines, "blank_lines": result.blank_lines,
            "records": result.total, "loaded": len(result.samples), "used": len(samples), "skipped": result.skipped,
            "skipped_by": dict(result.skipped_by), "left_out": {k: n for k, n in left_out.items() if n},
            "skipped_records": list(skipped.values())}
    if skipped:
        from data_pipelines.loaders import numbering_note

        print(f"data.{split}: {result.skipped} bad record(s) of {result.total} left out "
              f"(data.on_bad_sample=skip):", flush=True)
        for p in result.problems:
            print(f"  {p}", flush=True)
        print(numbering_note(result.problems), end="", flush=True)
    return samples, info


def no_training_samples(cfg: RunConfig, info: dict[str, Any]) -> str:
    """Why a run has no training sample: every record bad (and skipped), or the settings that left out the good ones."""
    where = f"data.train {info['path']}" if cfg.data.train is not None else "the toy world's train split"
    if not info.get("loaded"):
        return (f"{where}: all {info['records']} records are bad and data.on_bad_sample=skip left each out (listed "
                f"above); fix them (mmrl data validate {info['path']} names each)")
    why = ", ".join(f"{key} left out {n}" for key, n in info["left_out"].items())
    return f"{where}: none of its {info['loaded']} good records is left ({why}); widen or drop those settings"


def split_path(cfg: RunConfig, split: str, *, show_progress: bool = True) -> str | None:
    """The data file of a split: the user's (``data.<split>``), None when the user gave training data but
    none for this split, or the toy world's, which is built here into the mmrl cache on first use."""
    from data_pipelines.loaders import dataset_exists, held_out_split

    path = getattr(cfg.data, split)
    if path is None:
        if cfg.data.train is not None:
            if split == "train":
                raise ConfigError("data.train is required")
            return held_out_split(cfg.data.train, split)  # --data FOLDER with a test split: that split
        from data_pipelines.toy import ensure_toy

        toy = ensure_toy(seed=cfg.data.toy_seed, size=cfg.data.toy_size or "default",
                         tasks=cfg.data.toy_tasks or None, world=cfg.data.toy_world, progress=show_progress)
        path = str(Path(toy) / f"{split}.jsonl")
    if not dataset_exists(path):  # a file or folder, PATH:SPLIT, or a glob of shards
        raise ConfigError(f"data.{split}: file not found: {path}")
    return str(path)


def shared_inputs(cfg: RunConfig) -> dict[str, str | Path | None]:
    """What every node of a run must see alike (on shared storage): the user's data and model."""
    files: dict[str, str | Path | None] = {f"data.{s}": getattr(cfg.data, s) for s in ("train", "val", "test")}
    files["data.media_root"] = cfg.data.media_root
    files["model.path"] = Path(cfg.model.path) / "config.json" if cfg.model.path else None
    return files


def check_run_folder_shared(w: Any, cfg_path: Path, text: str, *, wait_s: float = 10.0) -> None:
    """Every rank reads rank 0's ``config.yaml`` (``text``) from the run folder: the folder is on storage every
    node shares, where the other ranks' checkpoint files (their random states, ZeRO shards) must go too. A
    rank waits up to ``wait_s`` for a network file system to show the file; then every rank raises the
    same error if one does not see it."""
    if not w.active:
        return
    import socket

    deadline = time.monotonic() + wait_s
    while True:
        try:
            seen = cfg_path.read_text() == text
        except OSError:
            seen = False
        if seen or w.is_main or time.monotonic() > deadline:
            break
        time.sleep(0.2)
    views = w.gather((seen, socket.gethostname()))
    blind = [f"rank {r} (host {host})" for r, (ok, host) in enumerate(views) if not ok]
    if blind:
        raise MmrlError(f"the run folder {cfg_path.parent}: {', '.join(blind[:4])}{' ...' if len(blind) > 4 else ''} "
                        f"cannot read the config.yaml that rank 0 (host {views[0][1]}) wrote there; on several nodes "
                        "the run folder, the data and the model must be on storage every node shares (the same path "
                        "on each), while MMRL_CACHE and HOME are each node's own")


class RunState:
    def __init__(self, run_dir: Path):
        self.path = run_dir / "run_state.json"
        self.data: dict[str, Any] = json.loads(self.path.read_text()) if self.path.exists() else {"stages": {}}
        self.earlier_s = float(self.data.get("elapsed_s", 0.0))  # wall time of earlier sessions of this run
        self.t0 = time.perf_counter()

    def elapsed(self) -> float:
        """Wall seconds of this run over all its sessions (an interrupted session counts up to the last
        time the state was written)."""
        return self.earlier_s + time.perf_counter() - self.t0

    def done(self, stage: str) -> bool:
        return stage in self.data["stages"]

    def get(self, stage: str) -> Any:
        return self.data["stages"].get(stage)

    def finish(self, stage: str, result: Any) -> None:
        self.data["stages"][stage] = result
        self.save()

    def save(self) -> None:
        from mmrl.distributed import world

        if not world().is_main:  # rank 0 alone writes the run folder
            return
        self.data["elapsed_s"] = round(self.elapsed(), 1)
        tmp = self.path.with_suffix(".tmp")
        tmp.write_text(json.dumps(self.data, indent=2, default=str))
        tmp.replace(self.path)


def default_run_dir(cfg: RunConfig) -> Path:
    return Path("runs") / f"{cfg.task}-{time.strftime('%Y%m%d-%H%M%S')}"


def train(cfg: RunConfig, *, run_dir: Path, resume: bool = False, overwrite: bool = False,
          show_progress: bool = True, force_settings: bool = False) -> dict[str, Any]:
    """Run (or with ``resume`` continue) the stages in ``run_dir``; returns the summary. A session that ends
    with an error or Ctrl-C still adds its time to the run's total.

    The run holds ``run_dir``'s lock (:mod:`mmrl.run_lock`) from start to end: a second writer is refused. A
    folder that already holds a run needs ``resume`` (continue it) or ``overwrite`` (its contents moved aside
    into ``<name>.replaced-<time>``, then a new run); nothing in the folder is written before that is
    decided. Path settings are recorded absolute in ``config.yaml`` (a resume finds the model and data from any
    working folder), and the data files' content and the model's identity in ``inputs.json``
    (:mod:`mmrl.run_inputs`): a resume whose data or model changed is refused unless ``force_settings``."""
    from mmrl.distributed import world
    from mmrl.run_lock import acquire_on_main

    lock = acquire_on_main(run_dir, world(), show=show_progress)
    states: list[RunState | RunLog] = []
    try:
        return _train(absolute_paths(cfg), run_dir=run_dir, resume=resume, overwrite=overwrite,
                      show_progress=show_progress, force_settings=force_settings, states=states)
    except BaseException:
        for state in states:  # the run's time so far; the trackers' files closed
            state.close() if isinstance(state, RunLog) else state.save()
        raise
    finally:
        if lock is not None:
            lock.release()


def settings_differences(saved: Path, cfg: RunConfig) -> list[str]:
    """The settings in which ``cfg`` differs from the run's saved ``config.yaml``, as ``key: old -> new``
    (``out``, the folder's name, is not a setting)."""
    from mmrl.config import resume_run_config
    from mmrl.config_io import describe

    def show(v: Any) -> str:
        return yaml.safe_dump(v, default_flow_style=True, width=10_000).strip().removesuffix("...").strip()

    run_dir = saved.parent
    before = {k: v for k, v, _ in describe(resume_run_config(saved))}
    now = {k: v for k, v, _ in describe(cfg)}
    started_in = (read_inputs(run_dir) or {}).get("started_in")  # a run's relative paths (before mmrl saved them
    for k in PATH_KEYS:                                            # absolute) are the start folder's
        before[k], now[k] = absolute(before.get(k), k, started_in), absolute(now.get(k), k)
    moved = {k for k in (MODEL_KEY, *DATA_KEYS)  # the same content at another path: the same data, the same model
             if before.get(k) != now.get(k) and before.get(k) and same_content(run_dir, k, now.get(k))}
    return [f"{k}: {show(before.get(k, '(none)'))} -> {show(now.get(k, '(none)'))}"
            for k in dict.fromkeys([*before, *now]) if k != "out" and before.get(k) != now.get(k) and k not in moved]


def _input_changes(run_dir: Path, cfg: RunConfig, *, force_settings: bool) -> list[str]:
    """A resume's data files and model against those the run started with (``inputs.json``): a difference is
    refused, naming the file and what to do, unless ``force_settings`` (then returned, to be recorded)."""
    from mmrl.checkpoint import list_checkpoints

    blocked = architecture_change(run_dir, cfg) if list_checkpoints(run_dir) else None
    if blocked:  # --force-settings or not: weights of one shape do not load into another
        raise MmrlError(f"--resume: the checkpoints of {run_dir} cannot be loaded into this model: {blocked}. Resume "
                        "with the model the run started with, or start a new run (another --out) from this one")
    changes = input_changes(run_dir, cfg)
    if changes and not force_settings:
        raise MmrlError(f"--resume: the run in {run_dir} would continue on other data or another model than it "
                        f"started with: {'; '.join(changes)}. Put back what the run started with (inputs.json in the "
                        "run folder holds each file's size and sha256), pass --force-settings to continue on what "
                        "is there now (run_state.json and the report say from which step), or start a new run "
                        "(another --out, or --overwrite)")
    return changes


def _check_run_folder(run_dir: Path, cfg: RunConfig, *, resume: bool, overwrite: bool, show: bool) -> None:
    """Whether this session may write ``run_dir`` (rank 0 decides, holding the folder's lock): a folder
    holding a run needs ``resume`` or ``overwrite``; ``resume`` needs the run's config.yaml, a checkpoint when
    the run wrote any (they may have been deleted), and an unfinished RL stage for a new ``train.steps``.
    With ``overwrite`` the old contents are moved aside here."""
    from mmrl.checkpoint import list_checkpoints
    from mmrl.run_lock import move_aside, run_contents

    if resume and overwrite:
        raise ConfigError("--resume continues the run in the folder, --overwrite starts a new one there: pass one")
    found = run_contents(run_dir)
    if not resume:
        if not found:
            return
        if not overwrite:
            raise MmrlError(f"{run_dir} already holds a run; pass --resume to continue it, or --overwrite to start "
                            f"afresh (its contents are moved aside into {run_dir.name}.replaced-<time>), or choose "
                            f"another --out (found: {', '.join(found[:6])}{' ...' if len(found) > 6 else ''})")
        aside = move_aside(run_dir)
        if show and aside is not None:
            print(f"--overwrite: the earlier run in {run_dir} moved aside into {aside} (delete it when it is no "
                  "longer needed); starting afresh", flush=True)
        return
    if not (run_dir / "config.yaml").is_file():
        raise MmrlError(f"--resume: {run_dir} holds no run (no config.yaml)")
    stages = RunState(run_dir).data["stages"]
    if "rl" in stages:  # a finished RL stage is never extended: refuse before config.yaml is rewritten
        done = int(stages["rl"].get("steps", 0))
        asked = ((yaml.safe_load((run_dir / "config.yaml").read_text()) or {}).get("train") or {}).get("steps")
        if cfg.train.steps != asked:
            raise MmrlError(f"{run_dir}: RL finished its {done} steps: train.steps={cfg.train.steps} does not "
                            f"extend (or shorten) a finished run; start a new run from its model (--model "
                            f"{run_dir / 'final'})")
        return
    if list_checkpoints(run_dir):
        return
    from mmrl.run_log import read_metrics

    saved = [r.get("step") for r in read_metrics(run_dir) if r.get("stage") == "checkpoint"
             and not (run_dir / f".tmp-checkpoint-{r.get('step')}").exists()]  # a save cut short is no loss
    if (run_dir / "latest").exists() or saved:
        said = [f"metrics.jsonl logs checkpoints at steps {', '.join(map(str, saved))}"] if saved else []
        if (run_dir / "latest").exists():
            said.append(f"'latest' names {(run_dir / 'latest').read_text().strip() or 'nothing'}")
        raise MmrlError(f"--resume: no checkpoint found in {run_dir}: it looked for checkpoint-<step>/trainer_state"
                        f".pt, and the run wrote checkpoints ({'; '.join(said)}) that are gone; put one back to "
                        "continue from it, or pass --overwrite (without --resume) to start the run afresh")
    if show and any(r.get("stage") == "rl" for r in read_metrics(run_dir)):
        print(f"resume: no checkpoint in {run_dir} (the run stopped before it saved one, train.save_every="
              f"{cfg.train.save_every}): RL starts again from step 0", flush=True)


def _train(cfg: RunConfig, *, run_dir: Path, resume: bool, overwrite: bool, show_progress: bool,
           force_settings: bool, states: list[RunState | RunLog]) -> dict[str, Any]:
    from transformers.utils import logging as hf_logging

    from mmrl.checkpoint import eval_settings, latest_checkpoint, load_weights, save_model, seed_everything
    from mmrl.distributed import device_for, world
    from mmrl.model import load_policy
    from mmrl.optim import zero3_sharded_loading
    from mmrl.report import write_report
    from mmrl.sft import run_sft
    from mmrl.trainer import Diverged, GRPOTrainer
    from rewards.remote import preflight_rewards

    hf_logging.disable_progress_bar()  # weight-loading/saving bars would drown the run's own progress
    w = world()
    show_progress = show_progress and w.is_main
    cfg_path = run_dir / "config.yaml"
    refusal, changes = None, []
    if w.is_main:  # rank 0, holding the folder's lock, decides; every rank stops on a refusal
        try:
            _check_run_folder(run_dir, cfg, resume=resume, overwrite=overwrite, show=show_progress)
            if resume:
                changes = settings_differences(cfg_path, cfg)
                changes += _input_changes(run_dir, cfg, force_settings=force_settings)
                _note_schedule_change(cfg_path, cfg, run_dir)
        except MmrlError as exc:
            refusal = str(exc)
    refusal = w.broadcast(refusal)
    if refusal is not None:
        raise MmrlError(refusal)
    preflight_rewards(cfg.rewards, run_dir)  # service rewards (http, judge) reached before the folder is written
    run_dir.mkdir(parents=True, exist_ok=True)
    changes = w.broadcast(changes)
    if changes and show_progress:
        print(f"resume: continuing with settings other than the run's ({'; '.join(changes)}); once the run has "
              "resumed, config.yaml records the new ones and run_state.json the changes", flush=True)
    cfg_text = yaml.safe_dump(to_dict(cfg), sort_keys=False)
    if w.is_main and not changes:  # other settings are recorded once the run has resumed (session_begins)
        cfg_path.write_text(cfg_text)
    check_run_folder_shared(w, cfg_path, w.broadcast(cfg_path.read_text() if w.is_main else None))
    state = RunState(run_dir)
    states.append(state)

    def session_begins() -> None:
        """A resume with other settings (``--force-settings``), once its checkpoint has loaded: config.yaml
        records them, run_state.json the changes and the step they apply from, inputs.json the data and model
        now. A session that fails before (data that do not load, a checkpoint that does not fit the model)
        leaves the run folder's record as it was, so the next resume is checked against what the run used."""
        if not changes:
            return
        ckpt = latest_checkpoint(run_dir)
        if w.is_main:
            cfg_path.write_text(cfg_text)
            record_inputs(run_dir, cfg, model_dir)
        state.data.setdefault("settings_changes", []).append(
            {"from_step": int(ckpt.name.split("-")[1]) if ckpt else 0, "changes": changes})
        state.save()

    log = RunLog(run_dir, report_to=cfg.train.report_to, config=to_dict(cfg), show=show_progress)
    states.append(log)
    threads = set_cpu_threads(cfg.train.cpu_threads, show=show_progress, earlier=state.data.get("torch_threads"))
    state.data["torch_threads"] = threads  # a resume continues with the same count (bitwise the same steps)
    state.save()

    seed_everything(cfg.train.seed)
    w.check_same_files(shared_inputs(cfg))  # several nodes: the same data and model on each
    with w.node_first():  # each node's local rank 0 builds the node's cache (tiny model, toy world) first
        model_dir = resolve_model(cfg)
        for split in ("train", cfg.eval.split):
            split_path(cfg, split, show_progress=show_progress)
    if w.is_main and not changes:  # what the next resume checks: the data's content and the model's identity
        record_inputs(run_dir, cfg, model_dir)
    with w.spread_media_checks():  # every rank checks its share of the media files; the verdicts gathered
        train_samples, train_info = load_split(cfg, "train", show_progress=show_progress)
        eval_samples, eval_info = load_split(cfg, cfg.eval.split, show_progress=show_progress)
    if cfg.eval.before_rl or cfg.eval.after_rl or cfg.train.eval_every:  # a held-out file with no question: said
        from mmrl.evaluate import require_questions

        require_questions(eval_samples, eval_info)
    if cfg.eval.limit:
        eval_samples = eval_samples[:cfg.eval.limit]
        if len(eval_samples) < eval_info.get("used", 0):  # the report counts what is evaluated
            eval_info["left_out"]["eval.limit"] = eval_info["used"] - len(eval_samples)
            eval_info["used"] = len(eval_samples)
    if not train_samples:
        raise MmrlError(no_training_samples(cfg, train_info))
    check_rewards(cfg, train_samples[0])
    # ZeRO-3 on several ranks: the model is built already partitioned, unless this run has a cold start (the
    # SFT stage trains the whole model on each rank)
    cold_start = cfg.sft.steps > 0 and not (cfg.sft.target == "random_answer" and cfg.model.path)
    with zero3_sharded_loading(cfg.train, w, bf16=cfg.model.dtype == "bf16") if not cold_start \
            else contextlib.nullcontext(False):
        policy = load_policy(model_dir, dtype=cfg.model.dtype, attn_implementation=cfg.model.attn_implementation,
                             device=device_for(cfg.model.device))
    if show_progress:
        for line in gpu_advice(cfg, policy):
            print(f"warning: {line}", flush=True)
    lora_info = configure_policy(policy, cfg)
    if lora_info is not None and show_progress:
        from mmrl.model.lora import describe

        print(describe(lora_info, cfg.model.lora), flush=True)
    stages: dict[str, Any] = {"data": {"train": train_info, "eval": eval_info}}
    if show_progress:
        print(f"run folder: {run_dir}\nmodel: {model_dir} ({policy.family}, "
              f"{sum(p.numel() for p in policy.model.parameters()) / 1e6:.2f}M parameters)\n"
              f"data: {len(train_samples)} train, {len(eval_samples)} {cfg.eval.split} samples", flush=True)

    # Stage 1: cold start.
    sft_dir = run_dir / "sft-model"
    if cfg.sft.steps > 0 and cfg.sft.target == "random_answer" and cfg.model.path:
        why = ("not run: sft.target=random_answer trains on random answers to teach a random-weight model the "
               "answer format (the toy demo's cold start) and never runs on a model you give (model.path)")
        stages["sft"] = {"skipped": why}
        print(f"cold start {why}. For a cold start on your model use `mmrl sft --model DIR --data FILE "
              f"--steps N` (gold answers), or add sft.target=gold sft.steps=N to this command.", flush=True)
    elif cfg.sft.steps > 0:
        if state.done("sft") and (sft_dir / "config.json").exists():
            load_weights(policy.model, sft_dir)
        else:
            t0 = time.perf_counter()
            seed_everything(cfg.train.seed + 1)
            result = run_sft(cfg, policy, train_samples, log=log, show_progress=show_progress)
            if w.is_main:
                save_model(sft_dir, policy.model, policy.processor, eval_settings(cfg))
            state.finish("sft", {**result, "steps": cfg.sft.steps, "target": cfg.sft.target,
                                 "seconds": round(time.perf_counter() - t0, 1)})
        stages["sft"] = state.get("sft")

    trainer = GRPOTrainer(cfg, policy, train_samples, run_dir=run_dir, eval_samples=eval_samples, log=log,
                          show_progress=show_progress)

    # Stage 2: evaluation before RL (on the weights RL starts from).
    if cfg.eval.before_rl and eval_samples:
        if not state.done("eval_before_rl"):
            if latest_checkpoint(run_dir) is not None:
                raise MmrlError(f"{run_dir}: checkpoints exist but no pre-RL evaluation; start a new run")
            state.finish("eval_before_rl", _timed(trainer.run_eval, "eval before RL"))
        _print_eval("before RL", state.get("eval_before_rl"), show_progress)

    # Stage 3: RL.
    if not state.done("rl"):
        seed_everything(cfg.train.seed + 2)
        try:
            with stop_on_signals(trainer, run_dir, show=w.is_main):  # SIGTERM, SIGINT: at a step boundary
                trainer.resume()
                session_begins()
                trainer.train()
        except Diverged as exc:  # most updates skipped as non-finite: the report says so, the run fails
            stages["rl"] = {"steps": trainer.step, "seconds": _rl_seconds(run_dir),
                            "skipped_updates": trainer.skipped_updates, "stopped": str(exc)}
            state.save()
            if w.is_main:
                write_report(run_dir, _summary(cfg, run_dir, model_dir, state, stages, threads))
            raise
        trainer.export(run_dir / "final")  # ZeRO-3: one module at a time, to rank 0
        state.finish("rl", {"steps": trainer.step, "seconds": _rl_seconds(run_dir),
                            "skipped_samples": trainer.skipped_samples, "skipped_updates": trainer.skipped_updates,
                            "checkpoint_seconds": trainer.save_seconds})
    else:  # a new train.steps was refused at the start (_check_run_folder)
        with trainer.updater.full_weights(modify=True):  # ZeRO-3: into the gathered weights
            load_weights(policy.model, run_dir / "final")
        session_begins()
    stages["rl"] = state.get("rl")

    # Stage 4: evaluation after RL.
    if cfg.eval.after_rl and eval_samples:
        if not state.done("eval_after_rl"):
            state.finish("eval_after_rl", _timed(trainer.run_eval, "eval after RL"))
        _print_eval("after RL", state.get("eval_after_rl"), show_progress)

    summary = _summary(cfg, run_dir, model_dir, state, stages, threads)
    state.save()
    if w.is_main:
        report = write_report(run_dir, summary)
        if show_progress:
            print(f"report: {report}")
    log.close()
    return summary


def _summary(cfg: RunConfig, run_dir: Path, model_dir: Path, state: RunState, stages: dict[str, Any],
             threads: int) -> dict[str, Any]:
    """What ``summary.json`` and the report hold (``stages``: each stage's result so far)."""
    return {
        "task": cfg.task, "run_dir": str(run_dir), "model": str(model_dir), "eval_split": cfg.eval.split,
        "eval_min_options": cfg.eval.min_options,
        "eval_before_rl": state.get("eval_before_rl"), "eval_after_rl": state.get("eval_after_rl"),
        "stages": stages, "wall_seconds": round(state.elapsed(), 1), "torch_threads": threads,
        "settings_changes": state.data.get("settings_changes") or [],
    }


class Stopped(SystemExit):
    """``mmrl train`` stopped on a signal; its exit status is 128 + the signal's number, as a shell reports a
    process the signal ended: 143 for SIGTERM, 130 for SIGINT (Ctrl-C)."""

    def __init__(self, signum: int):
        super().__init__(128 + signum)
        self.signum = signum


STOP_SIGNALS = ("SIGTERM", "SIGINT")
"""The signals after which RL stops at its next step boundary with a checkpoint (:func:`stop_on_signals`)."""


@contextlib.contextmanager
def stop_on_signals(trainer: Any, run_dir: Path, *, show: bool = True) -> Any:
    """RL inside stops cleanly on SIGTERM (what schedulers send before they kill a job) or SIGINT (Ctrl-C):
    the first one lets the step in flight finish; at that step's boundary every rank agrees to stop
    (``World.max_int`` of the signal: a rank that got none stops at the same step), a checkpoint is
    written, the console says at which step the run stopped and how to resume, and the process ends with
    status 128 + the signal (:class:`Stopped`: 143 SIGTERM, 130 SIGINT). A second signal stops at once, as
    before: SIGINT with ``KeyboardInterrupt``, SIGTERM with :class:`Stopped` (143), no checkpoint. The
    handlers are installed only in the main thread, and the earlier ones restored on leaving."""
    import signal
    import sys
    import threading

    got: list[int] = []

    def on_signal(signum: int, _frame: Any) -> None:
        name = signal.Signals(signum).name
        if got:  # the second: at once
            _say(show, f"\n{name} again: stopping at once, without a checkpoint\n")
            if signum == signal.SIGINT:
                raise KeyboardInterrupt
            raise Stopped(signum)
        got.append(signum)
        _say(show, f"\n{name}: stopping after the step in flight, with a checkpoint (send it again to stop at "
                   "once)\n")

    main = threading.current_thread() is threading.main_thread()
    signums = [getattr(signal, name) for name in STOP_SIGNALS]
    previous = {sig: signal.signal(sig, on_signal) for sig in signums} if main else {}
    trainer.stop_requested = lambda: got[0] if got else 0
    try:
        yield
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
        trainer.stop_requested = lambda: 0
    if trainer.stopped_by:
        name = signal.Signals(trainer.stopped_by).name
        if show:
            print(f"stopped by {name} at step {trainer.step} of {trainer.cfg.train.steps}; checkpoint-{trainer.step} "
                  f"written. Continue with: mmrl train --out {run_dir} --resume", file=sys.stderr, flush=True)
        raise Stopped(trainer.stopped_by)


def _say(show: bool, text: str) -> None:
    """Write to stderr from a signal handler (``os.write``: no buffered stream is re-entered)."""
    if show:
        with contextlib.suppress(OSError):
            os.write(2, text.encode())


def configure_policy(policy: Any, cfg: RunConfig) -> Any:
    """The run's training settings on a loaded policy, as ``mmrl train`` sets them (log-prob passes, what
    trains, LoRA adapters injected in place, activation checkpointing); LoRA's description or None."""
    from mmrl.model import PolicyOptions, checkpointing_switch

    policy.configure(PolicyOptions.from_config(cfg))
    policy.set_trainable(vision=not cfg.model.freeze_vision, merger=not cfg.model.freeze_merger,
                         llm=not cfg.model.freeze_llm)

    lora_info = None
    if cfg.model.lora is not None:  # adapters injected in place; only they train from here on
        from mmrl.model.lora import apply_lora

        lora_info = apply_lora(policy, cfg.model.lora)
    if cfg.model.gradient_checkpointing:
        checkpointing_switch(policy.model, True)
    return lora_info


def check_rewards(cfg: RunConfig, sample: Any) -> None:
    """Call the rewards brought from outside mmrl (``trl:NAME``, ``module.function``) on one training sample with
    its reference answer as the completion, before the model loads: a reward that cannot read mmrl's columns
    fails here, in seconds, with the sample named (not after the model loaded and the evaluation ran)."""
    from mmrl.evaluate import RewardState, dataset_columns, prompt_messages, reward_columns
    from rewards import CombinedReward
    from rewards.registry import REWARDS, RewardSpec

    outside = [s for s in cfg.rewards if isinstance(s, RewardSpec) and isinstance(s.name, str)
               and REWARDS.canonical(s.name) is None]
    if not outside:
        return
    answer = sample.answer if not isinstance(sample.answer, (list, tuple)) else ", ".join(map(str, sample.answer))
    text = (f"<think>checking</think><answer>{answer}</answer>" if cfg.prompt.answer_format == "think_answer"
            else f"<answer>{answer}</answer>")
    columns: dict[str, Any] = reward_columns([sample])
    columns.update(prompts=[prompt_messages(sample, cfg.prompt)], completion_ids=[[]], transcript=[text],
                   env_info=[None], entropies=None, trainer_state=RewardState(0, cfg.train.steps, "default"),
                   log_extra=lambda *a: None, log_metric=lambda *a: None)
    combined = CombinedReward(outside, where="rewards")
    try:
        combined.compute([text], columns, messages=[[{"role": "assistant", "content": text}]],
                         dataset_columns=dataset_columns([sample]))
    except MmrlError as exc:
        raise MmrlError(f"{exc} (checked on the first training sample, {sample.id}, with its reference answer as "
                        "the completion, before the model loads; the reward reads the columns id, problem_type, "
                        "question, options, answer, meta and each meta key)") from None


def gpu_advice(cfg: RunConfig, policy: Any) -> list[str]:
    """What a run on a GPU is set up to waste or run out of: fp32 weights, no activation checkpointing,
    micro-batches smaller than a group (rows, or a token budget under one group at the run's caps) or an attention
    that calls once per vision window, for a model of billions of parameters (one line each; nothing on a CPU)."""
    from mmrl.config import auto_micro_batch_tokens, group_tokens

    if policy.device.type != "cuda":
        return []
    n = sum(p.numel() for p in policy.model.parameters())
    size = f"{n / 1e9:.1f}B" if n >= 1e9 else f"{n / 1e6:.0f}M"
    out = []
    if cfg.model.dtype == "fp32":
        out.append(f"model.dtype=fp32 on a GPU: the {size} model trains at a fraction of bf16 speed and needs 16 "
                   f"bytes a parameter before activations ({16 * n / 1e9:.0f} GB); model.dtype=bf16 keeps fp32 master "
                   "weights, so small learning rates still move every weight")
    if n >= 1e9 and not cfg.model.gradient_checkpointing:
        out.append(f"model.gradient_checkpointing is off for a {size} model: a video micro-batch's activations can "
                   "take tens of GB; set model.gradient_checkpointing=true")
    tokens = int(cfg.train.micro_batch_tokens)
    if n >= 1e9 and (tokens == 0 or tokens < group_tokens(cfg)[0]):
        auto, why = auto_micro_batch_tokens(cfg)
        now = (f"train.micro_batch_size={cfg.train.micro_batch_size} sequences per forward/backward for a {size} "
               "model" if tokens == 0 else
               f"train.micro_batch_tokens={tokens} for a {size} model is less than one group at this run's caps "
               f"({group_tokens(cfg)[1]}): a group's passes each recompute its shared prompt, and")
        out.append(f"{now}: a pass of a few thousand tokens keeps the GPU waiting on the host; "
                   f"train.micro_batch_tokens=auto gives {auto:,} tokens a pass ({why}), whole groups with their "
                   "shared prompt counted once (the loss is the same for any split; activations grow with the "
                   "tokens of a pass)")
    if n >= 1e9 and cfg.model.attn_implementation in ("sdpa", "eager"):
        out.append(f"model.attn_implementation={cfg.model.attn_implementation} for a {size} model: the vision tower "
                   "calls attention once per window (7,232 calls a forward at 4,096 vision tokens) and packed passes "
                   "attend over a whole row; model.attn_implementation=varlen makes one call per layer (torch's "
                   "varlen_attn, no extra package) with the same results")
    return out


def _timed(fn: Any, *args: Any) -> dict[str, Any]:
    t0 = time.perf_counter()
    return {**fn(*args), "seconds": round(time.perf_counter() - t0, 1)}


def _rl_seconds(run_dir: Path) -> float:
    """Seconds spent in RL steps over every session of the run (resumed parts included)."""
    from mmrl.run_log import read_metrics

    return round(sum(r.get("time/step_s") or 0.0 for r in read_metrics(run_dir) if r.get("stage") == "rl"), 1)


def _note_schedule_change(saved: Path, cfg: RunConfig, run_dir: Path) -> None:
    """Say how a resume with other ``train.steps`` / warm-up / final LR settings reshapes the LR schedule."""
    from mmrl.checkpoint import latest_checkpoint
    from mmrl.optim import lr_lambda

    if not saved.is_file():
        return
    old = (yaml.safe_load(saved.read_text()) or {}).get("train", {})
    new = cfg.train
    keys = ("steps", "warmup_steps", "min_lr_ratio", "lr", "lr_schedule")
    changed = [k for k in keys if k in old and old[k] != getattr(new, k)]
    ckpt = latest_checkpoint(run_dir)
    if not changed or ckpt is None:
        return
    step = int(ckpt.name.split("-")[1])
    before = float(old.get("lr", new.lr)) * lr_lambda(int(old.get("warmup_steps", new.warmup_steps)),
                                                      int(old.get("steps", new.steps)),
                                                      float(old.get("min_lr_ratio", new.min_lr_ratio)),
                                                      str(old.get("lr_schedule", "cosine")))(step)
    after = new.lr * lr_lambda(new.warmup_steps, new.steps, new.min_lr_ratio, new.lr_schedule)(step)
    what = ", ".join(f"train.{k} {old[k]} -> {getattr(new, k)}" for k in changed)
    print(f"resume: {what}: the learning-rate schedule is recomputed for the new settings; at step {step} the "
          f"learning rate goes from {before:.3g} to {after:.3g} ({new.lr_schedule} to step {new.steps})", flush=True)


def _print_eval(tag: str, metrics: dict[str, Any] | None, show: bool) -> None:
    from mmrl.evaluate import describe_exclusions

    if not show or not metrics:
        return
    acc = metrics.get("accuracy")
    acc_s = f"{acc:.3f}" if isinstance(acc, float) else "n/a"
    print(f"eval {tag}: accuracy {acc_s} on {metrics.get('n')} questions", flush=True)
    for line in describe_exclusions(metrics):
        print(line, flush=True)
