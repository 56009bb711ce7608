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

import contextlib
import dataclasses
import os
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from mmrl.config import RunConfig
from mmrl.config.io import to_dict
from mmrl.engine.run_log import RunLog
from mmrl.run.folder import (
    RunState,
    check_run_folder,
    check_run_folder_shared,
    config_text,
    input_changes_refused,
    note_schedule_change,
    settings_differences,
    write_config,
)
from mmrl.run.helpers import (
    evaluated_on_training_data,
    load_split,
    no_training_samples,
    resolve_model,
    set_cpu_threads,
    shared_inputs,
    split_path,
)
from mmrl.run.inputs import absolute_paths, record_inputs
from mmrl_common.errors import MmrlError


def train(cfg: RunConfig, *, run_dir: Path, resume: bool = False, overwrite: bool = False,
          show_progress: bool = True, force_settings: bool = False) -> dict[str, Any]:
    """Run (or with ``resume`` continue) the stages in ``run_dir``; returns the summary. A session that ends
    with an error or Ctrl-C still adds its time to the run's total.

    The run holds ``run_dir``'s lock (:mod:`mmrl.run.lock`) from start to end: a second writer is refused. A
    folder that already holds a run needs ``resume`` (continue it) or ``overwrite`` (its contents moved aside
    into ``<name>.replaced-<time>``, then a new run); nothing in the folder is written before that is
    decided. Path settings are recorded absolute in ``config.yaml`` (a resume finds the model and data from any
    working folder), and the data files' content and the model's identity in ``inputs.json``
    (:mod:`mmrl.run.inputs`): a resume whose data or model changed is refused unless ``force_settings``."""
    from mmrl.engine.distributed import world
    from mmrl.run.lock import acquire_on_main

    lock = acquire_on_main(run_dir, world(), show=show_progress)
    states: list[RunState | RunLog] = []
    try:
        return _train(absolute_paths(cfg), run_dir=run_dir, resume=resume, overwrite=overwrite,
                      show_progress=show_progress, force_settings=force_settings, states=states)
    except BaseException:
        for state in states:  # the run's time so far; the trackers' files closed
            try:
                state.close() if isinstance(state, RunLog) else state.save()
            except (OSError, MmrlError):  # a full disk: the error that stopped the run is the one to say
                pass
        raise
    finally:
        if lock is not None:
            lock.release()


@dataclasses.dataclass
class Session:
    """What the phases of one session of ``mmrl train`` hand each other (each phase fills its part)."""

    cfg: RunConfig
    run_dir: Path
    world: Any
    show: bool
    changes: list[str]
    """The settings and inputs this resume changes (``--force-settings``), recorded once it has resumed."""
    cfg_text: str
    state: RunState
    log: RunLog | None = None
    threads: int = 1
    model_dir: Path = Path()
    train_samples: list[Any] = dataclasses.field(default_factory=list)
    eval_samples: list[Any] = dataclasses.field(default_factory=list)
    stages: dict[str, Any] = dataclasses.field(default_factory=dict)
    policy: Any = None
    trainer: Any = None


def _train(cfg: RunConfig, *, run_dir: Path, resume: bool, overwrite: bool, show_progress: bool,
           force_settings: bool, states: list[RunState | RunLog]) -> dict[str, Any]:
    """The session's phases, in order; each finished stage is recorded and skipped by a resume."""
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()  # weight-loading/saving bars would drown the run's own progress
    s = open_run_folder(cfg, run_dir, resume=resume, overwrite=overwrite, show=show_progress,
                        force_settings=force_settings, states=states)
    prepare_data(s)
    load_model(s)
    cold_start(s)
    from mmrl.engine.trainer import GRPOTrainer

    s.trainer = GRPOTrainer(cfg, s.policy, s.train_samples, run_dir=run_dir, eval_samples=s.eval_samples,
                            log=s.log, show_progress=s.show)
    evaluate_stage(s, "eval_before_rl")
    reinforce(s)
    evaluate_stage(s, "eval_after_rl")
    return report(s)


def open_run_folder(cfg: RunConfig, run_dir: Path, *, resume: bool, overwrite: bool, show: bool,
                    force_settings: bool, states: list[RunState | RunLog]) -> Session:
    """Phase 1, resolve: whether this session may write the run folder and with which settings (rank 0
    decides; every rank stops on a refusal), the service rewards reached, ``config.yaml`` written (a resume
    with other settings writes it once it has resumed), the run's state, log and CPU threads."""
    from mmrl.engine.checkpoint import seed_everything
    from mmrl.engine.distributed import world
    from rewards.remote import preflight_rewards

    w = world()
    show = show and w.is_main
    cfg_path = run_dir / "config.yaml"
    refusal, changes = None, []
    if w.is_main:  # rank 0, holding the folder's lock, decides; every rank stops on a refusal
        try:
            check_run_folder(run_dir, cfg, resume=resume, overwrite=overwrite, show=show)
            if resume:
                changes = settings_differences(cfg_path, cfg)
                changes += input_changes_refused(run_dir, cfg, force_settings=force_settings)
                note_schedule_change(cfg_path, cfg, run_dir)
        except MmrlError as exc:
            refusal = str(exc)
    refusal = w.broadcast(refusal)
    if refusal is not None:
        raise MmrlError(refusal)
    preflight_rewards(cfg.rewards, run_dir)  # service rewards (http, judge) reached before the folder is written
    run_dir.mkdir(parents=True, exist_ok=True)
    changes = w.broadcast(changes)
    if changes and show:
        print(f"resume: continuing with settings other than the run's ({'; '.join(changes)}); once the run has "
              "resumed, config.yaml records the new ones and run_state.json the changes", flush=True)
    cfg_text = config_text(cfg)  # the settings and their sha256, by which a resume knows the file whole
    if w.is_main and not changes:  # other settings are recorded once the run has resumed (session_begins)
        write_config(run_dir, cfg_text)
    check_run_folder_shared(w, cfg_path, w.broadcast(cfg_path.read_text() if w.is_main else None))
    s = Session(cfg=cfg, run_dir=run_dir, world=w, show=show, changes=changes, cfg_text=cfg_text,
                state=RunState(run_dir))
    states.append(s.state)
    s.log = RunLog(run_dir, report_to=cfg.train.report_to, config=to_dict(cfg), show=show)
    states.append(s.log)
    s.threads = set_cpu_threads(cfg.train.cpu_threads, show=show, earlier=s.state.data.get("torch_threads"))
    s.state.data["torch_threads"] = s.threads  # a resume continues with the same count (bitwise the same steps)
    s.state.save()
    seed_everything(cfg.train.seed)
    return s


def session_begins(s: Session) -> None:
    """A resume with other settings (``--force-settings``), once its checkpoint has loaded: config.yaml records
    them, run_state.json the changes and the step they apply from, inputs.json the data and model now. A
    session that fails before (data that do not load, a checkpoint that does not fit the model) leaves the run
    folder's record as it was, so the next resume is checked against what the run used."""
    from mmrl.engine.checkpoint import latest_checkpoint

    if not s.changes:
        return
    ckpt = latest_checkpoint(s.run_dir)
    if s.world.is_main:
        write_config(s.run_dir, s.cfg_text)
        record_inputs(s.run_dir, s.cfg, s.model_dir)
    s.state.data.setdefault("settings_changes", []).append(
        {"from_step": int(ckpt.name.split("-")[1]) if ckpt else 0, "changes": s.changes})
    s.state.save()


def prepare_data(s: Session) -> None:
    """Phase 2, prepare the data: the model folder and the splits built on each node first (tiny model, toy
    world), the inputs' fingerprint recorded, every media file checked (each rank its share), the held-out
    split limited, the rewards from outside mmrl tried on one training sample."""
    cfg, w = s.cfg, s.world
    w.check_same_files(shared_inputs(cfg))  # several nodes: the same data and model on each
    with w.node_first():  # each node's local rank 0 builds the node's cache (tiny model, toy world) first
        s.model_dir = resolve_model(cfg)
        for split in ("train", cfg.eval.split):
            split_path(cfg, split, show_progress=s.show)
    if w.is_main and not s.changes:  # what the next resume checks: the data's content and the model's identity
        record_inputs(s.run_dir, cfg, s.model_dir)
    with w.spread_media_checks():  # every rank checks its share of the media files; the verdicts gathered
        s.train_samples, train_info = load_split(cfg, "train", show_progress=s.show)
        s.eval_samples, eval_info = load_split(cfg, cfg.eval.split, show_progress=s.show)
    if cfg.eval.before_rl or cfg.eval.after_rl or cfg.train.eval_every:  # a held-out file with no question: said
        from mmrl.engine.evaluate import require_questions

        require_questions(s.eval_samples, eval_info)
    if cfg.eval.limit:
        s.eval_samples = s.eval_samples[:cfg.eval.limit]
        if len(s.eval_samples) < eval_info.get("used", 0):  # the report counts what is evaluated
            eval_info["left_out"]["eval.limit"] = eval_info["used"] - len(s.eval_samples)
            eval_info["used"] = len(s.eval_samples)
    if not s.train_samples:
        raise MmrlError(no_training_samples(cfg, train_info))
    check_rewards(cfg, s.train_samples[0])
    s.stages["data"] = {"train": train_info, "eval": eval_info}


def load_model(s: Session) -> None:
    """Phase 3, load the model: built already partitioned under ZeRO-3 on several ranks (unless a cold start
    trains the whole model on each rank first), the run's training settings and LoRA applied."""
    from mmrl.engine.distributed import device_for
    from mmrl.engine.optim import zero3_sharded_loading
    from mmrl.model import load_policy

    cfg = s.cfg
    trained_first = cfg.sft.steps > 0 and not (cfg.sft.target == "random_answer" and cfg.model.path)
    with zero3_sharded_loading(cfg.train, s.world, bf16=cfg.model.dtype == "bf16") if not trained_first \
            else contextlib.nullcontext(False):
        s.policy = load_policy(s.model_dir, dtype=cfg.model.dtype, attn_implementation=cfg.model.attn_implementation,
                               device=device_for(cfg.model.device))
    if s.show:
        for line in gpu_advice(cfg, s.policy):
            print(f"warning: {line}", flush=True)
    lora_info = configure_policy(s.policy, cfg)
    if lora_info is not None and s.show:
        from mmrl.model.lora import describe

        print(describe(lora_info, cfg.model.lora), flush=True)
    if s.show:
        print(f"run folder: {s.run_dir}\nmodel: {s.model_dir} ({s.policy.family}, "
              f"{sum(p.numel() for p in s.policy.model.parameters()) / 1e6:.2f}M parameters)\n"
              f"data: {len(s.train_samples)} train, {len(s.eval_samples)} {cfg.eval.split} samples", flush=True)


def cold_start(s: Session) -> None:
    """Phase 4, the cold start (``sft.steps``): SFT once, its weights reloaded by a resume; never the random-answer
    target on a model the user gave."""
    from mmrl.engine.checkpoint import (
        eval_settings,
        load_weights,
        save_model,
        seed_everything,
        verify_model_folder,
    )
    from mmrl.engine.sft import run_sft

    cfg, state = s.cfg, s.state
    sft_dir = s.run_dir / "sft-model"
    if cfg.sft.steps > 0 and cfg.sft.target == "random_answer" and cfg.model.path:
        why = ("not run: sft.target=random_answer trains on random answers to teach a random-weight model the "
               "answer format (the toy demo's cold start) and never runs on a model you give (model.path)")
        s.stages["sft"] = {"skipped": why}
        print(f"cold start {why}. For a cold start on your model use `mmrl sft --model DIR --data FILE "
              f"--steps N` (gold answers), or add sft.target=gold sft.steps=N to this command.", flush=True)
    elif cfg.sft.steps > 0:
        if state.done("sft") and (sft_dir / "config.json").exists():
            verify_model_folder(sft_dir)  # a cut or changed sft-model/ is named, not loaded
            load_weights(s.policy.model, sft_dir)
        else:
            t0 = time.perf_counter()
            seed_everything(cfg.train.seed + 1)
            result = run_sft(cfg, s.policy, s.train_samples, log=s.log, show_progress=s.show)
            with s.world.all_or_none("writing sft-model/"):
                if s.world.is_main:
                    save_model(sft_dir, s.policy.model, s.policy.processor, eval_settings(cfg))
            state.finish("sft", {**result, "steps": cfg.sft.steps, "target": cfg.sft.target,
                                 "seconds": round(time.perf_counter() - t0, 1)})
        s.stages["sft"] = state.get("sft")


EVAL_STAGES = {"eval_before_rl": ("before_rl", "before RL"), "eval_after_rl": ("after_rl", "after RL")}


def evaluate_stage(s: Session, stage: str) -> None:
    """Phases 5 and 7, the evaluations before RL (on the weights RL starts from) and after it, each once."""
    setting, tag = EVAL_STAGES[stage]
    if not (getattr(s.cfg.eval, setting) and s.eval_samples):
        return
    if not s.state.done(stage):
        if stage == "eval_before_rl":
            from mmrl.engine.checkpoint import latest_checkpoint

            if latest_checkpoint(s.run_dir) is not None:
                raise MmrlError(f"{s.run_dir}: checkpoints exist but no pre-RL evaluation; start a new run")
        s.state.finish(stage, _timed(s.trainer.run_eval, f"eval {tag}"))
    _print_eval(tag, s.state.get(stage), s.show)


def reinforce(s: Session) -> None:
    """Phase 6, RL: from the latest checkpoint, stopping cleanly on SIGTERM/SIGINT; a diverged run writes its
    report and fails; the final weights exported. A finished RL stage reloads ``final/`` instead."""
    from mmrl.engine.checkpoint import load_weights, seed_everything, verify_model_folder
    from mmrl.engine.trainer import Diverged
    from mmrl.run.report import write_report

    cfg, run_dir, trainer, state = s.cfg, s.run_dir, s.trainer, s.state
    if not state.done("rl"):
        seed_everything(cfg.train.seed + 2)
        try:
            with stop_on_signals(trainer, run_dir, show=s.world.is_main):  # SIGTERM, SIGINT: at a step boundary
                trainer.resume()
                session_begins(s)
                trainer.train()
        except Diverged as exc:  # most updates skipped as non-finite: the report says so, the run fails
            s.stages["rl"] = {"steps": trainer.step, "seconds": _rl_seconds(run_dir),
                              "skipped_updates": trainer.skipped_updates, "stopped": str(exc)}
            state.save()
            if s.world.is_main:
                write_report(run_dir, _summary(s))
            raise
        trainer.export(run_dir / "final")  # ZeRO-3: one module at a time, to rank 0
        state.finish("rl", {"steps": trainer.step, "seconds": _rl_seconds(run_dir),
                            "skipped_samples": trainer.skipped_samples, "skipped_updates": trainer.skipped_updates,
                            "checkpoint_seconds": trainer.save_seconds})
    else:  # a new train.steps was refused at the start (check_run_folder)
        verify_model_folder(run_dir / "final")
        with trainer.updater.full_weights(modify=True):  # ZeRO-3: into the gathered weights
            load_weights(s.policy.model, run_dir / "final")
        session_begins(s)
    s.stages["rl"] = state.get("rl")


def report(s: Session) -> dict[str, Any]:
    """Phase 8, the report: ``summary.json`` and the report's pages written by rank 0; the summary returned."""
    from mmrl.run.report import write_report

    summary = _summary(s)
    s.state.save()
    if s.world.is_main:
        path = write_report(s.run_dir, summary)
        if s.show:
            print(f"report: {path}")
    s.log.close()
    return summary


def _summary(s: Session) -> dict[str, Any]:
    """What ``summary.json`` and the report hold (``stages``: each stage's result so far)."""
    cfg, run_dir, model_dir, state, stages, threads = s.cfg, s.run_dir, s.model_dir, s.state, s.stages, s.threads
    return {
        "task": cfg.task, "run_dir": str(run_dir), "model": str(model_dir), "eval_split": cfg.eval.split,
        "eval_min_options": cfg.eval.min_options, "eval_on_training_data": evaluated_on_training_data(cfg),
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
"""The signals after which a command stops at its next boundary (RL's step, SFT's step, an evaluation's batch)
and keeps what it did (:func:`stop_requests`)."""


@contextlib.contextmanager
def stop_requests(doing: str, *, show: bool = True) -> Iterator[Callable[[], int]]:
    """Inside, SIGTERM (what schedulers send before they kill a job) or SIGINT (Ctrl-C) asks the work to stop at
    its next boundary: the first signal is said on stderr (``doing``: what happens now, e.g. "stopping after the
    step in flight, with a checkpoint") and read through the callable yielded (its number; 0 while none came),
    which the work polls at its boundaries. A second signal stops at once: SIGINT with ``KeyboardInterrupt``,
    SIGTERM with :class:`Stopped` (143). The handlers are installed only in the main thread, and the earlier
    ones restored on leaving. ``mmrl train`` (:func:`stop_on_signals`), ``mmrl sft`` and ``mmrl eval`` use it."""
    import signal
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
        _say(show, f"\n{name}: {doing} (send it again to stop at once)\n")

    main = threading.current_thread() is threading.main_thread()
    signums = [getattr(signal, name) for name in STOP_SIGNALS]
    previous = {sig: signal.signal(sig, on_signal) for sig in signums} if main else {}
    try:
        yield lambda: got[0] if got else 0
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)


@contextlib.contextmanager
def stop_on_signals(trainer: Any, run_dir: Path, *, show: bool = True) -> Any:
    """RL inside stops cleanly on SIGTERM or SIGINT (:func:`stop_requests`): the first one lets the step in
    flight finish; at that step's boundary every rank agrees to stop (``World.max_int`` of the signal: a rank
    that got none stops at the same step), a checkpoint is written, the console says at which step the run
    stopped and how to resume, and the process ends with status 128 + the signal (:class:`Stopped`: 143
    SIGTERM, 130 SIGINT). A second signal stops at once, as before, no checkpoint."""
    import signal
    import sys

    with stop_requests("stopping after the step in flight, with a checkpoint", show=show) as asked:
        trainer.stop_requested = asked
        try:
            yield
        finally:
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
    from mmrl.engine.evaluate import RewardState, dataset_columns, prompt_messages, reward_columns
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
    from mmrl.engine.run_log import read_metrics

    return round(sum(r.get("time/step_s") or 0.0 for r in read_metrics(run_dir) if r.get("stage") == "rl"), 1)


def _print_eval(tag: str, metrics: dict[str, Any] | None, show: bool) -> None:
    from mmrl.engine.evaluate import describe_exclusions

    if not show or not metrics:
        return
    acc = metrics.get("accuracy")
    acc_s = f"{acc:.3f}" if isinstance(acc, float) else "n/a"
    print(f"eval {tag}: accuracy {acc_s} on {metrics.get('n')} questions", flush=True)
    for line in describe_exclusions(metrics):
        print(line, flush=True)
