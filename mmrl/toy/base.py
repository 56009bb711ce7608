"""The toy base model: a tiny Qwen-VL that already sees, so RL on the toy world sharpens it as RL sharpens a
real Qwen-VL (rather than having to learn perception from a sparse reward).

It starts from the tiny random-weight model of :mod:`mmrl.toy.tiny_models` (same architecture and tokenizer)
and is pre-trained with the ordinary supervised loop (:func:`mmrl.engine.sft.run_sft`, loss on the answer tokens)
on the toy world's **pre-training split** (:mod:`data_pipelines.toy.pretrain`): requests to name what is
seen (colours, shapes, counts, directions, the order of flashes, a brief square's colour, a scan's finding),
on media of its own, never the RL and test splits' questions, option lists or answer letters. It answers
inside ``<answer></answer>`` with the thing seen ("red", "3", "left"); the multiple-choice questions of the
RL splits are new to it, and the accuracy reward reads an option's text as that option.

Built once and cached (``$MMRL_CACHE/toy-base/<family>-<hash>``, written atomically); ``mmrl models
make-toy-base`` builds it by hand, and a run with ``model.init: toy_base`` builds it on first use.

The demo's base (the ``video-qa`` recipe's) ships with mmrl (``mmrl/assets/toy-base/``, built once by
:func:`make_toy_base`, 4 MB): a build is not the same on every machine (another CPU's kernels round
differently over 600 steps), and the demo's gain depends on where it starts. (Its before-RL score still moves
with the CPU: the same weights scored 0.443 on one machine and 0.480 on two others, near-tie greedy answers.) A shipped base whose key is the recipe's is used as it is,
ahead of any cached build of the same key; ``mmrl models make-toy-base --out DIR`` still builds one.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import shutil
import tempfile
import time
from pathlib import Path
from typing import Any

# the recipe, its checks and keys (re-exported: they were defined here)
from mmrl.config.toy import (  # noqa: F401
    COUNTS,
    INFO_FILE,
    LATER_FIELDS,
    OVERRIDABLE,
    POINTER_BATCH,
    POINTER_ITEMS,
    POINTER_MIX,
    PRETRAIN_VERSION,
    BaseRecipe,
    base_dir,
    base_key,
    check_count,
    check_letter_share,
    check_overrides,
    check_tasks,
)


def pretrain_config(recipe: BaseRecipe) -> Any:
    """The run configuration of the pre-training (media budgets as the toy recipes, answers in tags)."""
    from mmrl.config import DataConfig, MediaConfig, PromptConfig, RunConfig, SFTConfig, TrainConfig

    media = MediaConfig(min_frames=recipe.max_frames, max_frames=recipe.max_frames,
                        video_min_pixels=recipe.video_pixels, video_max_pixels=recipe.video_pixels,
                        image_min_pixels=recipe.image_pixels, image_max_pixels=recipe.image_pixels)
    return RunConfig(data=DataConfig(media=media), prompt=PromptConfig(answer_format="answer"),
                     sft=SFTConfig(steps=recipe.steps, lr=recipe.lr, batch_size=recipe.batch_size,
                                   warmup_steps=recipe.warmup_steps, target="gold"),
                     train=TrainConfig(seed=recipe.seed))


def make_toy_base(out: str | Path, recipe: BaseRecipe | None = None, *, progress: bool = True) -> Path:
    """Build the toy base model into ``out`` (a Hugging Face folder with ``toy_base.json``; ``recipe``: the
    default base when None)."""
    recipe = recipe or BaseRecipe()
    import torch

    from data_pipelines.loaders import load_samples
    from data_pipelines.schema import Sample
    from data_pipelines.toy.pretrain import make_pretrain, pointer_drill
    from mmrl.engine.checkpoint import seed_everything
    from mmrl.engine.sft import run_sft
    from mmrl.model import load_policy
    from mmrl.model.weights import save_pretrained
    from mmrl.toy.tiny_models import make_tiny

    out = Path(out)
    t0 = time.perf_counter()
    work = Path(tempfile.mkdtemp(prefix=".toy-base-work-", dir=out.parent if out.parent.exists() else None))
    try:
        say = print if progress else (lambda *a, **k: None)
        say(f"toy base model: writing the pre-training split ({len(recipe.tasks)} tasks x {recipe.per_task})",
            flush=True)
        data = make_pretrain(work / "data", recipe.seed + 1, tasks=recipe.tasks, per_task=recipe.per_task,
                             letter_share=recipe.letter_share, world=dict(recipe.world), progress=progress)
        samples = load_samples(data).samples
        seed_everything(recipe.seed)
        start = make_tiny(recipe.family, work / "init", seed=recipe.seed, **dict(recipe.size))
        policy = load_policy(start, device="cpu")
        if recipe.pointer_steps:
            say(f"toy base model: pointer phase, {recipe.pointer_steps} steps on text-only lettered requests",
                flush=True)
            drill = [Sample.from_dict(r) for r in pointer_drill(POINTER_ITEMS, recipe.seed + 2)]
            cfg = pretrain_config(recipe)
            cfg = dataclasses.replace(cfg, sft=dataclasses.replace(cfg.sft, steps=recipe.pointer_steps,
                                                                   batch_size=POINTER_BATCH))
            run_sft(cfg, policy, drill, show_progress=progress, keep_encoded=True, desc="toy base pointer phase")
            # and a share of them among the descriptions: without it, the pre-training forgets the pointer (measured
            # 2026-11-25: 6000 pointer steps, then 2000 steps of descriptions alone: 0.38 on 100 held-out drill items)
            samples = samples + drill[:round(len(samples) * POINTER_MIX / (1 - POINTER_MIX))]
        say(f"toy base model: pre-training on {len(samples)} descriptions for {recipe.steps} steps "
            "(once; a few minutes on 2 CPU cores)", flush=True)
        t1 = time.perf_counter()
        last = run_sft(pretrain_config(recipe), policy, samples, show_progress=progress, keep_encoded=True,
                       desc="toy base pre-training")
        out.mkdir(parents=True, exist_ok=True)
        save_pretrained(out, policy.model)  # the family's published names and layout (what vLLM loads)
        policy.processor.save_pretrained(out)
        info = {"recipe": {**dataclasses.asdict(recipe), "size": dict(recipe.size), "world": dict(recipe.world)}, "key": base_key(recipe),
                "parameters": sum(p.numel() for p in policy.model.parameters()), "descriptions": len(samples),
                "final_loss": last.get("loss"), "pretrain_seconds": round(time.perf_counter() - t1, 1),
                "build_seconds": round(time.perf_counter() - t0, 1), "torch_threads": torch.get_num_threads(),
                "trained_on": "data_pipelines.toy.pretrain (descriptions; no RL/test question or option list"
                              + ("; lettered options in orders of its own)" if recipe.letter_share else
                                 " or answer letter)")
                              + ("; first a text-only pointer phase (lettered options, no media)"
                                 if recipe.pointer_steps else "")}
        (out / INFO_FILE).write_text(json.dumps(info, indent=2) + "\n")
    finally:
        shutil.rmtree(work, ignore_errors=True)
    say(f"toy base model: built in {time.perf_counter() - t0:.0f} s -> {out}", flush=True)
    return out


SHIPPED = Path(__file__).resolve().parents[1] / "assets" / "toy-base"


def shipped_base(recipe: BaseRecipe) -> Path | None:
    """The copy of ``recipe``'s base that ships with mmrl, if there is one (same family and key)."""
    path = SHIPPED / f"{recipe.family}-{base_key(recipe)}"
    return path if (path / INFO_FILE).is_file() else None


def ensure_toy_base(recipe: BaseRecipe | None = None, *, progress: bool = True) -> Path:
    """The toy base model for ``recipe``: the copy shipped with mmrl when there is one (:func:`shipped_base`),
    else the cached build, built first if needed (atomically: build, then rename). One process builds it;
    others that need it at the same time (the runs of a parallel ``mmrl compare``, test workers) wait for that
    build on a lock file beside the cache instead of building it again."""
    import fcntl

    recipe = recipe or BaseRecipe()
    if shipped := shipped_base(recipe):
        return shipped
    final = base_dir(recipe)
    if (final / INFO_FILE).is_file():
        return final
    final.parent.mkdir(parents=True, exist_ok=True)
    with open(final.with_name(f".{final.name}.lock"), "w") as lock:
        try:
            fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            if progress:
                print(f"toy base model: another process is building {final}; waiting for it", flush=True)
            fcntl.flock(lock, fcntl.LOCK_EX)
        if (final / INFO_FILE).is_file():
            return final
        tmp = final.with_name(f".{final.name}.tmp-{os.getpid()}")
        shutil.rmtree(tmp, ignore_errors=True)
        try:
            make_toy_base(tmp, recipe, progress=progress)
            os.rename(tmp, final)  # under the lock: nobody else renames
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
    return final


# ---------------------------------------------------------------------------------------------- the CLI
def add_models_parser(subparsers: Any) -> argparse.ArgumentParser:
    """``mmrl models``: ``make-tiny`` (:mod:`mmrl.toy.tiny_models`) and ``make-toy-base``."""
    from mmrl.toy.tiny_models import FAMILIES, add_parser, add_size_options

    parser, sub = add_parser(subparsers)
    base = sub.add_parser(
        "make-toy-base", help="build (or find) the toy base model: the tiny model pre-trained to name what it "
                              "sees in the toy world",
        description="Pre-train the tiny model on the toy world's description split (never the RL/test "
                    "questions, options or answer letters) and cache it; `model.init: toy_base` runs use it.")
    base.add_argument("--family", default="qwen2_5_vl", help=f"one of {', '.join(FAMILIES)} [qwen2_5_vl]")
    base.add_argument("--seed", type=int, default=0, help="weight and data seed [0]")
    base.add_argument("--letter-share", type=float, default=0.0, metavar="P",
                      help="share of word-list requests posed as lettered options, answered with the letter "
                           "(model.toy_base: {letter_share: P}) [0]")
    base.add_argument("--pointer-steps", type=int, default=None, metavar="N",
                      help="steps of a text-only pointer phase first (\"Pick the option red.\" with lettered options; "
                           "model.toy_base: {pointer_steps: N}) [0]")
    base.add_argument("--tasks", default=None, metavar="A,B",
                      help="toy tasks to pre-train on (model.toy_base: {tasks: [...]}) [all described tasks]")
    base.add_argument("--per-task", type=int, default=None, metavar="N",
                      help="pictures or videos per task (model.toy_base: {per_task: N}) [200]")
    base.add_argument("--steps", type=int, default=None, metavar="N",
                      help="pre-training steps (model.toy_base: {steps: N}) [2000]")
    base.add_argument("--out", default=None, metavar="DIR",
                      help="build it here (without --out: the copy shipped with mmrl where one has this recipe, "
                           "else the cache's, built once)")
    base.add_argument("--quiet", action="store_true", help="no progress output")
    add_size_options(base, "size of the tiny model it starts from (model.tiny_size; each size is its own base)")
    base.set_defaults(func=_cmd_make_toy_base)
    return parser


def _cmd_make_toy_base(args: argparse.Namespace) -> int:
    from mmrl.toy.tiny_models import check_family, size_options

    check_family(args.family)
    check_letter_share(args.letter_share, "--letter-share")
    given: dict[str, Any] = {"letter_share": args.letter_share}
    for key in ("pointer_steps", "per_task", "steps"):
        if getattr(args, key, None) is not None:
            check_count(getattr(args, key), "--" + key.replace("_", "-"), COUNTS[key])
            given[key] = getattr(args, key)
    if getattr(args, "tasks", None):
        given["tasks"] = tuple(t.strip() for t in args.tasks.split(",") if t.strip())
        check_tasks(given["tasks"], "--tasks")
    recipe = BaseRecipe(family=args.family, seed=args.seed, size=tuple(size_options(args).items()), **given)
    path = make_toy_base(Path(args.out), recipe, progress=not args.quiet) if args.out else \
        ensure_toy_base(recipe, progress=not args.quiet)
    print(path)
    return 0
