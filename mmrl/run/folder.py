"""The run folder between sessions: what a session may write there (``--resume``, ``--overwrite``), the
settings and inputs a resume differs in, the stages finished so far (``run_state.json``) and the check that
every node reads the folder rank 0 wrote.

Its lock is :mod:`mmrl.run.lock`'s, the inputs' fingerprint (``inputs.json``) :mod:`mmrl.run.inputs`'.
"""

from __future__ import annotations

import hashlib
import json
import time
from pathlib import Path
from typing import Any

import yaml

from mmrl.config import RunConfig
from mmrl.run.inputs import (
    DATA_KEYS,
    MODEL_KEY,
    PATH_KEYS,
    absolute,
    architecture_change,
    input_changes,
    read_inputs,
    same_content,
)
from mmrl_common.errors import ConfigError, MmrlError
from mmrl_common.file_digest import write_atomic
from mmrl_common.json_file import read_json_mapping


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
        self.data: dict[str, Any] = read_run_state(self.path) if self.path.exists() else {"stages": {}}
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
        from mmrl.engine.distributed import world

        if not world().is_main:  # rank 0 alone writes the run folder
            return
        self.data["elapsed_s"] = round(self.elapsed(), 1)
        write_atomic(self.path, json.dumps(self.data, indent=2, default=str))


def read_run_state(path: Path) -> dict[str, Any]:
    """A run's ``run_state.json`` (its finished stages and their results), checked: an unreadable, empty, cut or
    garbled one raises :class:`MmrlError` naming it and what to do (nothing in the folder is changed)."""
    data, why = read_json_mapping(path)
    if why is None and not isinstance(data.get("stages"), dict) or why == "does not hold a mapping":
        why = "does not hold a run's state (a mapping with its 'stages')"
    if why is not None:
        raise MmrlError(f"{path} {why}: the record of the run's finished stages is lost, so the run cannot continue "
                        "from it; nothing was changed. Put back a good copy of the file, or start the run afresh "
                        "(--overwrite moves this folder's contents aside)")
    return data


# ------------------------------------------------------------------------------------------ config.yaml
CONFIG_SEAL = "# mmrl: sha256 "
"""The start of ``config.yaml``'s last line: the sha256 of the lines above it (:func:`config_text`)."""


def config_text(cfg: RunConfig) -> str:
    """``config.yaml``'s text: the settings, then a comment line with their sha256, by which a resume knows the
    file whole (:func:`check_saved_config`)."""
    from mmrl.config.io import to_dict

    body = yaml.safe_dump(to_dict(cfg), sort_keys=False)
    return f"{body}{CONFIG_SEAL}{hashlib.sha256(body.encode()).hexdigest()} of the lines above; --resume checks it\n"


def write_config(run_dir: Path, text: str) -> None:
    """``config.yaml`` written whole or not at all (a temporary file renamed over it)."""
    write_atomic(run_dir / "config.yaml", text, fsync=True)


def check_saved_config(path: Path) -> None:
    """Whether a run's ``config.yaml`` is whole before a resume reads its settings from it: a file whose last
    line is mmrl's sha256 of the lines above (:func:`config_text`) must match it; one without (cut before that
    line, written by an earlier mmrl or by hand) must parse into a mapping with every section mmrl writes. An
    empty, cut, garbled or unreadable file raises :class:`MmrlError` naming it and what to do (nothing changed)."""
    from mmrl.config.io import to_dict

    fix = ("nothing was changed. Put back the run's config.yaml (a good copy, or the settings the run used written "
           "out in full: `mmrl config show` prints them), or start the run afresh (--overwrite)")
    try:
        text = path.read_text()
    except (OSError, UnicodeDecodeError) as exc:
        raise MmrlError(f"{path} cannot be read ({getattr(exc, 'strerror', None) or exc}): --resume reads the run's "
                        f"settings from it; {fix}") from None
    if not text.strip():
        raise MmrlError(f"{path} is empty (a write cut short?): --resume reads the run's settings from it; {fix}")
    body, _, last = text.rstrip("\n").rpartition("\n")
    if last.startswith(CONFIG_SEAL):
        want = last[len(CONFIG_SEAL):].split()[0] if last[len(CONFIG_SEAL):].split() else ""
        if hashlib.sha256((body + "\n").encode()).hexdigest() != want:
            raise MmrlError(f"{path} is not the file mmrl wrote (the sha256 on its last line does not match the "
                            "lines above: a flipped bit, or an edit): --resume would continue with settings the run "
                            f"did not use; {fix}. If you edited it on purpose, delete its last line")
        return
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        raise MmrlError(f"{path} is not valid YAML (cut short or garbled: {' '.join(str(exc).split())[:120]}); {fix}"
                        ) from None
    if not isinstance(data, dict):
        raise MmrlError(f"{path} does not hold a run's settings (its top level is not a mapping of sections); {fix}")
    missing = [k for k in to_dict(RunConfig()) if k not in data]
    if missing:
        raise MmrlError(f"{path} lacks the sections {', '.join(missing)} that mmrl writes (cut short?): --resume "
                        f"would continue with their defaults, not the run's settings; {fix}")


def default_run_dir(cfg: RunConfig) -> Path:
    return Path("runs") / f"{cfg.task}-{time.strftime('%Y%m%d-%H%M%S')}"


def settings_differences(saved: Path, cfg: RunConfig) -> list[str]:
    """The settings in which ``cfg`` differs from the run's saved ``config.yaml``, as ``key: old -> new``
    (``out``, the folder's name, is not a setting)."""
    from mmrl.config import resume_run_config
    from mmrl.config.io import describe

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


def input_changes_refused(run_dir: Path, cfg: RunConfig, *, force_settings: bool) -> list[str]:
    """A resume's data files and model against those the run started with (``inputs.json``): a difference is
    refused, naming the file and what to do, unless ``force_settings`` (then returned, to be recorded)."""
    from mmrl.engine.checkpoint import list_checkpoints

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


def check_run_folder(run_dir: Path, cfg: RunConfig, *, resume: bool, overwrite: bool, show: bool) -> None:
    """Whether this session may write ``run_dir`` (rank 0 decides, holding the folder's lock): a folder
    holding a run needs ``resume`` or ``overwrite``; ``resume`` needs the run's config.yaml, a checkpoint when
    the run wrote any (they may have been deleted), and an unfinished RL stage for a new ``train.steps``.
    With ``overwrite`` the old contents are moved aside here."""
    from mmrl.engine.checkpoint import list_checkpoints
    from mmrl.run.lock import clear_failed_start, move_aside, run_contents

    if resume and overwrite:
        raise ConfigError("--resume continues the run in the folder, --overwrite starts a new one there: pass one")
    found = run_contents(run_dir)
    if not resume:
        if not found:
            clear_failed_start(run_dir, show=show)  # a start that failed before its first step blocks nothing
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
    check_saved_config(run_dir / "config.yaml")
    read_inputs(run_dir)  # an unreadable inputs.json is said here, not taken for a run that recorded none
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
    from mmrl.engine.run_log import read_metrics

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


def note_schedule_change(saved: Path, cfg: RunConfig, run_dir: Path) -> None:
    """Say how a resume with other ``train.steps`` / warm-up / final LR settings reshapes the LR schedule."""
    from mmrl.engine.checkpoint import latest_checkpoint
    from mmrl.engine.optim import lr_lambda

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
