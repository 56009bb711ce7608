"""``mmrl train``, ``mmrl sft``, ``mmrl eval`` and ``mmrl config show``."""

from __future__ import annotations

import argparse
import dataclasses
import os
import re
import sys
from pathlib import Path
from typing import Any

from mmrl.run.helpers import evaluated_on_training_data
from mmrl.run.recipe import (
    OVERRIDE_HELP,
    REAL_MODEL_PRESET,
    config_from_args,
    covers,
    flat_keys,
    full_base,
    model_folder,
    own_model_base,
    recipe_published,
    setting_sources,
    with_training_settings,
)

EVAL_OVERRIDE_HELP = ("dotted config overrides, e.g. rollout.max_new_tokens=512 data.media.max_frames=32 "
                      "eval.min_options=4 prompt.answer_format=answer; they may stand anywhere among the flags "
                      "(mmrl config show lists every key)")


DATA_FORMS = ("a JSONL, JSON or Parquet file, a datasets folder, a Hub-style folder of shards or a quoted glob; "
              "PATH:SPLIT picks a split")


def _common(p: argparse.ArgumentParser, command: str = "train") -> None:
    from mmrl.config import task_names

    p.add_argument("--task", default=None,
                   help=f"built-in recipe (configs/*.yaml): {', '.join(task_names())}; default video-qa")
    p.add_argument("--config", default=None, metavar="YAML", help="a YAML file merged over the task recipe")
    p.add_argument("--model", default=None, metavar="DIR",
                   help="a Qwen2-VL / Qwen2.5-VL / Qwen3-VL / Qwen3-VL MoE / Qwen3.5 / Qwen3.5 MoE folder in Hugging Face format (default: a "
                        "tiny model that mmrl builds once and caches, as model.init says: the pre-trained toy base "
                        "model or random weights)")
    if command == "eval":
        p.add_argument("--data", default=None, metavar="FILE",
                       help="a dataset (data.train) whose held-out split is evaluated: data.val/data.test, or a "
                            "datasets folder's own test/validation split; the file itself is not: give the questions "
                            "to evaluate with --eval-data FILE (default: the toy world's held-out split)")
        p.add_argument("--eval-data", default=None, metavar="FILE",
                       help=f"the questions to evaluate ({DATA_FORMS})")
        p.add_argument("--out", default=None, metavar="DIR",
                       help="folder for metrics.json and predictions.jsonl (default: runs/eval-<time>; with "
                            "--benchmark runs/eval/<benchmark>-<model folder name>)")
    elif command == "sft":  # no evaluation: no --eval-data
        p.add_argument("--data", default=None, metavar="FILE",
                       help=f"training data, its reference answers the targets ({DATA_FORMS}; a folder with "
                            "splits: its train split; default: the toy world)")
        p.add_argument("--out", default=None, metavar="DIR",
                       help="run folder; the model is written to <out>/final (default: runs/<task>-<time>-sft)")
    else:
        p.add_argument("--data", default=None, metavar="FILE",
                       help=f"training data ({DATA_FORMS}; a folder with splits: its train split, and its test or "
                            "validation split evaluates unless --eval-data is given; default: the toy world)")
        p.add_argument("--eval-data", default=None, metavar="FILE",
                       help=f"held-out data for the evaluations before and after RL ({DATA_FORMS})")
        p.add_argument("--out", default=None, metavar="DIR", help="run folder (default: runs/<task>-<time>)")
    p.add_argument("--quiet", action="store_true", help="no progress bars")
    p.add_argument("overrides", nargs="*", metavar="KEY=VALUE",
                   help=EVAL_OVERRIDE_HELP if command == "eval" else OVERRIDE_HELP)


def _quiet_loading(quiet: bool) -> None:
    """No weight-loading bars from transformers with --quiet."""
    if quiet:
        from transformers.utils import logging as hf_logging

        hf_logging.disable_progress_bar()


def _recipe_hint(cfg, section: str, key: str) -> str:
    """For a path the task recipe itself names (a paper recipe's model or data): how to run it."""
    from mmrl.config import task_recipe

    if (task_recipe(cfg.task).get(section) or {}).get(key) != getattr(getattr(cfg, section), key):
        return ""
    flag = {"path": "--model DIR", "train": "--data FILE", "test": "--eval-data FILE"}.get(key, f"data.{key}=FILE")
    return (f"; it is the {cfg.task} recipe's own setting (configs/{cfg.task}.yaml is the paper's recipe): give "
            f"{flag} with your copy, or run the method on the toy world with its compare spec "
            f"(mmrl compare configs/compare/{cfg.task}.yaml)")


HUB_ID = re.compile(r"[A-Za-z0-9][\w.-]*/[A-Za-z0-9][\w.-]*")
"""A Hugging Face Hub model id (``Qwen/Qwen2.5-VL-3B-Instruct``): an owner and a name, one slash."""


def _hub_id_hint(path: str) -> str:
    """For a model path that is not there and reads as a Hub id: mmrl loads folders, so how to download it."""
    if not HUB_ID.fullmatch(path) or Path(path.split("/")[0]).exists():
        return ""
    local = f"models/{path.split('/')[1]}"
    return (f"; {path} looks like a Hugging Face Hub id, and mmrl loads a local folder: download it first "
            f"(huggingface-cli download {path} --local-dir {local}) and give --model {local}")


def _check_paths(cfg) -> None:
    from mmrl_common.errors import ConfigError

    if cfg.model.path and not Path(cfg.model.path).exists():
        raise ConfigError(f"model.path: folder not found: {cfg.model.path}{_recipe_hint(cfg, 'model', 'path')}"
                          f"{_hub_id_hint(str(cfg.model.path))}")
    if cfg.model.path:  # fail before the data are built or loaded
        from mmrl.model.folder import check_model_dir

        check_model_dir(cfg.model.path)
    from data_pipelines.loaders import dataset_exists

    for split in ("train", "val", "test"):  # the loaders' rule: a file or folder, PATH:SPLIT, a quoted glob
        path = getattr(cfg.data, split)
        if path and not dataset_exists(path):
            raise ConfigError(f"data.{split}: file not found: {path}{_recipe_hint(cfg, 'data', split)}")


def train_config(argv: list[str], extra: dict[str, Any] | None = None):
    """The config ``mmrl train ARGV`` runs with (the model folder's preset and settings included, however the
    folder is named), without printing: what ``mmrl compare`` checks an arm and a run folder against."""
    parser = argparse.ArgumentParser(prog="mmrl", add_help=False)
    add_train_parser(parser.add_subparsers(dest="command"))
    args = parser.parse_args(["train", *argv])
    return config_from_args(args, extra, base=own_model_base(args))


def own_model_config(args: argparse.Namespace, extra: dict[str, Any] | None = None, command: str = "train"):
    """The config of a command that trains ``--model DIR`` (``mmrl train``, ``mmrl sft``): the recipe with
    :func:`own_model_base` under the user's settings (``extra``: the command's own sections), and the lines
    saying which values the preset and the folder's settings changed and which published ones they left."""
    base = own_model_base(args)
    cfg = config_from_args(args, extra, base=base)
    if full_base(args):
        _say_changes(args, cfg, base or {}, extra=extra, command=command)
    return cfg


def _say_changes(args: argparse.Namespace, cfg: Any, base: dict[str, Any], *, extra: dict[str, Any] | None = None,
                 command: str = "train") -> None:
    """Print the settings that ``base`` (the preset, the folder's training settings) changed in the recipe, and
    the recipe's published values it left as they are (``key=value (source)``) where it would have changed them."""
    from mmrl.config import value_at
    from mmrl.config.io import describe, to_dict

    recipe_cfg = config_from_args(args, extra)
    recipe = {k: v for k, v, _ in describe(recipe_cfg)}
    changed = [f"{k}={v}" for k, v, _ in describe(cfg) if recipe.get(k) != v]
    full = flat_keys(full_base(args))
    kept = []
    for key, source in recipe_published(args).items():
        try:
            value = to_dict(value_at(cfg, key))
        except KeyError:
            continue
        if value == to_dict(value_at(recipe_cfg, key)) and any(
                covers(key, k) and (k != key or v != value) for k, v in full.items()):
            kept.append(f"{key}={value} ({source})")
    if args.quiet:
        return
    named = f"--model {args.model}" if args.model else f"model.path={model_folder(args)}"
    if changed:
        print(f"{command}: {named}: the real-model preset ({REAL_MODEL_PRESET.name}) and the folder's "
              f"training settings change the recipe: {' '.join(changed)} (a KEY=VALUE override wins; "
              "--recipe-settings keeps the recipe's values)", flush=True)
    if kept:
        print(f"{command}: {named}: the recipe's published values are kept over the preset: "
              f"{'; '.join(kept)}", flush=True)


def cmd_train(args: argparse.Namespace) -> int:
    from mmrl.run import default_run_dir, train

    cfg = own_model_config(args)
    _check_paths(cfg)
    if args.resume:
        check_resume_settings(args, cfg)
    w = _join_world(cfg)
    same = evaluated_on_training_data(cfg)
    if same and (cfg.eval.before_rl or cfg.eval.after_rl or cfg.train.eval_every):
        print(f"warning: {same}", flush=True)
    run_dir = w.broadcast(Path(cfg.out) if cfg.out else default_run_dir(cfg))  # rank 0's folder name
    summary = train(cfg, run_dir=run_dir, resume=args.resume, overwrite=args.overwrite,
                    show_progress=not args.quiet, force_settings=args.force_settings)
    if not w.is_main:
        return 0
    before = (summary.get("eval_before_rl") or {}).get("accuracy")
    after = (summary.get("eval_after_rl") or {}).get("accuracy")
    if before is not None and after is not None:
        on = " (on the training data, not held out)" if same else ""
        print(f"accuracy before RL {before:.3f} -> after RL {after:.3f} ({after - before:+.3f}){on}")
        from mmrl.toy.demo_range import verdict

        if line := verdict(cfg, before, after):
            print(line)
    return 0


def check_resume_settings(args: argparse.Namespace, cfg: Any) -> None:
    """``--resume`` with settings other than the run's (KEY=VALUE overrides, --model, --data ...) is refused,
    naming each difference, unless ``--force-settings``; nothing is written either way. Every rank reads the
    same config.yaml and arguments, so all come to the same verdict. Paths compare as files (a path given again
    relative, or moved with the same content, is no difference); the content of the data and the model at the
    run's own paths is checked by :func:`mmrl.run.train` once it holds the run folder (``inputs.json``)."""
    from mmrl.run import settings_differences
    from mmrl_common.errors import MmrlError

    changes = settings_differences(Path(args.out) / "config.yaml", cfg)
    if changes and not args.force_settings:
        raise MmrlError(f"--resume: these settings differ from those the run in {args.out} started with (its "
                        f"config.yaml; run's value -> now): {'; '.join(changes)}. Resume without them to continue "
                        "as the run started, pass --force-settings to continue with the new values, or start a "
                        "new run (another --out, or --overwrite)")


def _join_world(cfg: Any) -> Any:
    """Under torchrun / accelerate launch: join the process group; rank 0 alone prints progress and messages
    (the others' errors still reach stderr)."""
    from mmrl.engine import distributed

    w = distributed.init(cfg.model.device, timeout_minutes=cfg.train.dist_timeout_minutes)
    if cfg.rollout.backend == "vllm":  # an engine's ranks inside one node, said before anything loads
        w.check_block(cfg.rollout.vllm.tensor_parallel_size)
    if not w.is_main:
        sys.stdout = open(os.devnull, "w")  # noqa: SIM115 (for the life of the process)
    return w


def cmd_sft(args: argparse.Namespace) -> int:
    from mmrl.run import default_run_dir
    from mmrl.run.sft_run import sft_run

    cfg = sft_config(args)
    _quiet_loading(args.quiet)
    _check_paths(cfg)
    if args.resume:
        _check_sft_resume_settings(args, cfg)
    run_dir = Path(cfg.out) if cfg.out else default_run_dir(cfg).with_name(default_run_dir(cfg).name + "-sft")
    result = sft_run(cfg, run_dir, overwrite=args.overwrite, show=not args.quiet, resume=args.resume)
    print(f"sft: {cfg.sft.steps} steps, last loss {result.get('loss', float('nan')):.4f}; model: {run_dir / 'final'}")
    return 0


def _check_sft_resume_settings(args: argparse.Namespace, cfg: Any) -> None:
    """``mmrl sft --resume`` continues with the settings in the run's ``config.yaml``; other ones (KEY=VALUE
    overrides, --steps, --model, --data ...) are refused, naming each difference, and nothing is written."""
    from mmrl.run import settings_differences
    from mmrl_common.errors import MmrlError

    changes = settings_differences(Path(args.out) / "config.yaml", cfg)
    if changes:
        raise MmrlError(f"--resume: these settings differ from those the SFT run in {args.out} started with (its "
                        f"config.yaml; run's value -> now): {'; '.join(changes)}. Resume without them to continue "
                        "as the run started, or start afresh (--overwrite, or another --out)")


def sft_config(args: argparse.Namespace):
    """The config ``mmrl sft`` runs with: reference-answer targets, ``--steps`` (else sft.steps, else 100), and
    with ``--model DIR`` the settings ``mmrl train`` takes for that folder (:func:`own_model_config`)."""
    from mmrl_common.errors import ConfigError

    cfg = own_model_config(args, {"sft": {"target": "gold"}}, command="sft")
    if args.steps is not None and args.steps < 1:
        raise ConfigError(f"--steps={args.steps}: the cold start needs at least 1 optimizer step")
    steps = args.steps if args.steps is not None else cfg.sft.steps
    return dataclasses.replace(cfg, sft=dataclasses.replace(cfg.sft, steps=steps if steps > 0 else 100))


EVAL_FLAG_LOWS = {"limit": 1, "batch_size": 1, "frames": 1, "max_pixels": 1, "workers": 0}
"""The least value of each whole-number flag of ``mmrl eval`` (the settings they stand for are checked as
:data:`mmrl.config.RANGES` says; ``--benchmark`` takes some of them directly)."""


def _check_eval_flags(args: argparse.Namespace) -> None:
    from mmrl.config import Range, check_value

    for name, low in EVAL_FLAG_LOWS.items():
        check_value(f"--{name.replace('_', '-')}", getattr(args, name, None), Range(low, whole=True))


def cmd_eval(args: argparse.Namespace) -> int:
    _check_eval_flags(args)  # a bad --limit / --frames / ... is one line, whichever path evaluates
    if getattr(args, "resume_eval", False) and getattr(args, "agent", None):
        from mmrl_common.errors import ConfigError

        raise ConfigError("--resume continues mmrl eval on a held-out split or a --benchmark, not an --agent "
                          "evaluation; run it again without --resume")
    if getattr(args, "agent", None):  # a method's agent loop (EARL's): held-out split or --benchmark
        from mmrl.cli import load_method

        cfg = config_from_args(args)
        _join_world(cfg)  # under torchrun: each rank plays its share of the questions
        return load_method("agent", args.agent).cli_eval(args, cfg)
    if getattr(args, "benchmark", None):
        from mmrl.benchmarks import cli_run

        checks = _checks(args)  # under the benchmark's protocol (a check without a benchmark form is refused)
        cfg = config_from_args(args)
        _join_world(cfg)  # under torchrun: each rank answers its share of the questions
        return cli_run(args, cfg, checks=checks)
    from mmrl.run.eval_run import eval_run

    cfg = config_from_args(args)
    if cfg.model.path and not args.recipe_settings:
        cfg = with_training_settings(args, cfg)
    _quiet_loading(args.quiet)
    given = {"split": args.split or None, "limit": args.limit, "batch_size": args.batch_size}
    cfg = dataclasses.replace(cfg, eval=dataclasses.replace(  # checked as the settings are (mmrl.config.RANGES)
        cfg.eval, **{k: v for k, v in given.items() if v is not None}))
    _check_paths(cfg)
    w = _join_world(cfg)  # under torchrun: each rank answers its share of the questions
    if (same := evaluated_on_training_data(cfg)) and w.is_main:
        print(f"warning: {same}", flush=True)
    result = eval_run(cfg, w, checks=_checks(args), show=not args.quiet and w.is_main,
                      no_split=lambda: _check_eval_split(args, cfg, None), resume=args.resume_eval)
    if result is None:  # not rank 0
        return 0
    metrics, out = result
    print(_table(metrics))
    print(f"metrics and predictions: {out / 'metrics.json'}, {out / 'predictions.jsonl'}")
    return 0


def _check_eval_split(args: argparse.Namespace, cfg: Any, path: str | None) -> None:
    """``mmrl eval`` with training data (``--data`` / data.train) but no split to evaluate (``path``: the
    split's file, :func:`mmrl.run.split_path`; a dataset folder's own test split counts) would evaluate nothing:
    an error saying how to give the questions. (Evaluating the --data file instead would report accuracy on
    what may be the training data as if held out; the flag for it is one word away.)"""
    from mmrl_common.errors import ConfigError

    split = cfg.eval.split
    if path is not None:
        return
    given = f"--data {args.data}" if args.data else f"data.train={cfg.data.train}"
    raise ConfigError(f"eval: nothing to evaluate: {given} is the training data, and no {split} split is given "
                      f"(data.{split} is empty, and it has no {split} split of its own); give the questions to evaluate with --eval-data FILE (mmrl eval "
                      f"--eval-data {cfg.data.train} evaluates that file), or set data.{split}=FILE")


def _checks(args: argparse.Namespace) -> dict[str, dict[str, Any]]:
    """The evaluation checks asked for (``--check NAME``, and the old flags ``--consistency`` and
    ``--shuffled-frames``), each with ``--consistency-seed``; a method's check is loaded by name
    (:func:`mmrl.cli.load_method`), and one no loaded method registers is an error naming the known ones."""
    from mmrl.cli import load_method
    from mmrl.engine.evaluate import CHECKS

    names = list(dict.fromkeys([*(args.check or []), *(["consistency"] if args.consistency else []),
                                *(["shuffled_frames"] if args.shuffled_frames else [])]))
    for name in names:
        if name not in CHECKS:
            load_method("check", name)
        CHECKS.get(name)  # ConfigError naming the nearest and the known checks
    return {name: {"seed": args.consistency_seed} for name in names}


def _table(m: dict[str, Any]) -> str:
    from mmrl.engine.evaluate import CHECKS, describe_exclusions, score_text

    f = score_text
    rows = [f"accuracy {f(m['accuracy'])} on {m['n']} questions ({m['n_total']} evaluated, {m['skipped']} skipped)"]
    for k, v in m["by_problem_type"].items():
        how = (m.get("scored_as") or {}).get(k)
        rows.append(f"  {k:<22} {f(v)}" + (f"  ({how})" if how and k != "multiple_choice" else ""))
    for k, v in m["by_task"].items():
        rows.append(f"  task {k:<17} {f(v)}")
    for name, check in CHECKS.items():  # each check's section, in its own words
        if m.get(name) and check.describe is not None:
            rows.extend(check.describe(m[name]))
    return "\n".join(rows + describe_exclusions(m))


def add_train_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("train", help="RL fine-tuning (GRPO) of a Qwen-VL model",
                       description="Run a task recipe: optional cold start, evaluation before RL, GRPO, "
                                   "evaluation after RL, report.md. With no argument it trains a tiny model on the "
                                   "built-in toy videos.")
    _common(p)
    p.add_argument("--resume", action="store_true",
                   help="continue the run in --out from its latest checkpoint, with the settings it started with "
                        "(other settings are refused unless --force-settings)")
    p.add_argument("--overwrite", action="store_true",
                   help="--out holds a run: start a new one there, its old contents moved aside into "
                        "<out>.replaced-<time> (without --resume or --overwrite such a folder is refused)")
    p.add_argument("--force-settings", action="store_true",
                   help="with --resume: continue with settings that differ from the run's (each is printed and "
                        "recorded in run_state.json)")
    p.add_argument("--recipe-settings", action="store_true",
                   help="with a model folder (--model DIR, model.path=DIR or a config's model.path): keep the "
                        "recipe's (toy-sized) values instead of the real-model preset "
                        "(configs/presets/real-model.yaml: lr 1e-6, bf16, 2 fps up to 32 frames, Qwen's pixel "
                        "budgets, 768 new tokens, think/answer, KL 0.001) and the folder's own mmrl_eval.json")
    p.set_defaults(func=cmd_train)


def add_sft_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("sft", help="supervised fine-tuning (cold start), loss on assistant tokens only",
                       description="Supervised fine-tuning on the reference answers (sft.target=gold; loss on the "
                                   "assistant tokens only); the model is written to <out>/final with the settings "
                                   "it was trained with (mmrl_eval.json), for mmrl train --model and mmrl eval. "
                                   "With --model DIR the settings are chosen as mmrl train chooses them. "
                                   "SIGTERM or Ctrl-C stops it after the step in flight with a checkpoint; "
                                   "--resume continues from there.")
    _common(p, "sft")
    p.add_argument("--steps", type=int, default=None,
                   help="optimizer steps (default: sft.steps when above 0, else 100)")
    p.add_argument("--recipe-settings", action="store_true",
                   help="with a model folder (--model DIR, model.path=DIR or a config's model.path): keep the "
                        "recipe's (toy-sized) values instead of the real-model preset "
                        "(configs/presets/real-model.yaml, for a model of 100M+ parameters) and the folder's own "
                        "mmrl_eval.json")
    p.add_argument("--overwrite", action="store_true",
                   help="--out holds a run: start afresh there, its old contents moved aside into "
                        "<out>.replaced-<time> (without it or --resume such a folder is refused)")
    p.add_argument("--resume", action="store_true",
                   help="continue the SFT run in --out that a signal stopped (SIGTERM, Ctrl-C), from its "
                        "checkpoint, with the settings it started with (its config.yaml; other settings are refused)")
    p.set_defaults(func=cmd_sft)


def cmd_config(args: argparse.Namespace) -> int:
    """Print every key of the resolved configuration with its value and meaning."""
    import textwrap

    import yaml

    from mmrl.config.io import describe

    cfg = config_from_args(args, base=own_model_base(args))  # what `mmrl train` with these flags runs with
    sources = setting_sources(args) if getattr(args, "sources", False) else {}
    for key, value, meaning in describe(cfg):
        shown = yaml.safe_dump(value, default_flow_style=True, width=10_000, sort_keys=False).strip()
        shown = shown[:-4].rstrip() if shown.endswith("\n...") else shown.removesuffix("...").strip()
        print(f"{key}: {shown}" + (f"    [{sources[key]}]" if key in sources else ""))
        if meaning:
            print(textwrap.fill(meaning, width=108, initial_indent="    ", subsequent_indent="    "))
    return 0


def add_config_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("config", help="print the resolved configuration: every key, its value and meaning",
                       description="Print the configuration mmrl train runs with for the same flags (task "
                                   "recipe, with a model folder the real-model preset and the folder's own "
                                   "settings, --config, flags and KEY=VALUE overrides merged): every key, its value "
                                   "and its meaning; --sources says where each value comes from.")
    csub = p.add_subparsers(dest="config_command", metavar="SUBCOMMAND")
    show = csub.add_parser("show", help="every key with its value and meaning",
                           description="Every key of the resolved configuration with its value and meaning.")
    _common(show)
    show.add_argument("--resume", action="store_true", help="show the configuration of the run in --out")
    show.add_argument("--sources", action="store_true",
                      help="after each value, in brackets, where it comes from: mmrl's default, the recipe, the "
                           "paper (a published value), the real-model preset, the model folder's mmrl_eval.json, "
                           "--config, a flag or a KEY=VALUE override")
    show.add_argument("--recipe-settings", action="store_true",
                      help="with --model: the recipe's values instead of the real-model preset's and the folder's "
                           "own mmrl_eval.json (as mmrl train --recipe-settings)")
    show.set_defaults(func=cmd_config)
    p.set_defaults(func=lambda args: (p.print_help(), 2)[1])


def add_eval_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("eval", help="evaluate a model on a held-out split (accuracy per problem type and task)",
                       description="Answer every held-out question with the model, print the accuracy per "
                                   "problem type and task, and write metrics.json and predictions.jsonl (one line "
                                   "per question: the model's answer, the reference, the score) to --out. A model "
                                   "folder written by mmrl is evaluated with the settings it was trained with "
                                   "(its mmrl_eval.json).")
    _common(p, "eval")
    p.add_argument("--split", choices=["val", "test"], default=None,
                   help="the held-out split of the data (default eval.split; --eval-data sets test)")
    p.add_argument("--limit", type=int, default=None, help="evaluate at most this many questions")
    p.add_argument("--batch-size", type=int, default=None, help="questions per generate call (default eval.batch_size)")
    p.add_argument("--recipe-settings", action="store_true",
                   help="use the recipe's prompt, generation and media settings instead of those the model was "
                        "trained with (its mmrl_eval.json, used by default)")
    p.add_argument("--check", action="append", default=None, metavar="NAME",
                   help="also run a method's evaluation check (repeatable): consistency (ACRE: every "
                        "multiple-choice question asked again with its options shuffled, continuing the model's own "
                        "reasoning: OSCR, the five answer cases, accuracy with shuffled options, letter balance), "
                        "shuffled_frames (T-GRPO: every video question answered again from its frames in a random "
                        "order: accuracy with shuffled frames and the gap, per task), or one a loaded module "
                        "registers (mmrl.engine.evaluate.register_check); with --benchmark, consistency runs under the "
                        "benchmark's own protocol")
    p.add_argument("--resume", dest="resume_eval", action="store_true",
                   help="continue the evaluation in --out that a signal stopped (SIGTERM, Ctrl-C) from the answers "
                        "it kept (predictions.partial.jsonl), with the same command and settings; with --benchmark "
                        "a re-run always continues from the predictions in its folder")
    p.add_argument("--consistency", action="store_true", help="the same as --check consistency")
    p.add_argument("--shuffled-frames", action="store_true", help="the same as --check shuffled_frames")
    p.add_argument("--consistency-seed", type=int, default=0,
                   help="seed of the checks' permutations (default 0)")
    b = p.add_argument_group("public benchmarks (with --benchmark)")
    b.add_argument("--benchmark", default=None, metavar="NAME",
                   help="mvbench, videomme, longvideobench, mmvu, vqa-rad, slake, pathvqa or toy")
    b.add_argument("--data-root", default=None, metavar="DIR", help="the benchmark folder as downloaded")
    b.add_argument("--protocol", choices=["official", "qwen", "lmms-eval"], default="official",
                   help="official: each benchmark's own frames/prompt/scoring (default); qwen: the Qwen2.5-VL "
                        "report's video setting (2 fps, <=768 frames, <=24,576 video tokens); lmms-eval: what "
                        "lmms-eval runs for Qwen2.5-VL (32 of the frames decoded at 2 fps, its task prompts and "
                        "token caps), to line a number up with a paper that used it (README: the protocols)")
    b.add_argument("--frames", type=int, default=None, help="frames per video (overrides the protocol)")
    b.add_argument("--max-pixels", type=int, default=None, help="pixel budget per frame / image")
    b.add_argument("--prompt-template", default=None, metavar="NAME|FORMAT",
                   help="official, direct, reasoning, or a format string with {question} {options} {instruction}")
    b.add_argument("--workers", type=int, default=2, help="background media-decoding threads (0: decode inline)")
    b.add_argument("--subtitles", action="store_true",
                   help="videomme: the subtitle lines at the sampled frames; longvideobench: subtitles interleaved "
                        "with the frames (its _i protocol)")
    b.add_argument("--judge", default=None, metavar="BASE_URL,MODEL",
                   help="score the open-ended questions (MMVU's) with a judge model at an OpenAI-compatible "
                        "endpoint, e.g. http://127.0.0.1:8000/v1,Qwen/Qwen2.5-7B-Instruct (rewards/judge.py)")
    b.add_argument("--judge-key-env", default=None, metavar="NAME",
                   help="the environment variable holding the judge's API key (sent as a Bearer token)")
    b.add_argument("--lmms-eval", action="store_true",
                   help="run the checkpoint through lmms-eval instead (needs pip install 'mmrl[eval]')")
    p.add_argument("--agent", choices=["earl"], default=None,
                   help="answer through an agent loop: earl (select_frames, re-sampling around the selected frames, "
                        "at most 2 rounds); reports frames and selection rounds per answer beside the plain answer "
                        "on the same initial frames (with or without --benchmark)")
    p.set_defaults(func=cmd_eval)
