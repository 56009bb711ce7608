"""The one place that decides a run's settings from what a command was given: the task recipe (and a recipe
file), the real-model preset and the model folder's own ``mmrl_eval.json`` for the model folder however it is
named (``--model DIR``, ``model.path=DIR``, ``model: {path: DIR}`` in a ``--config`` file), the user's
``--config`` file, the flags and the ``KEY=VALUE`` overrides, merged by :func:`mmrl.config.load_run_config`;
and where each resolved value came from (:func:`setting_sources`). ``mmrl train``, ``sft``, ``eval``,
``config show`` and ``compare`` (through :mod:`mmrl.cli.commands`) and the methods' own commands read it here."""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

OVERRIDE_HELP = ("dotted config overrides, e.g. train.steps=50 rollout.group_size=4 grpo.kl_coef=0.01; they may "
                 "stand anywhere among the flags (mmrl config show lists every key)")


def config_from_args(args: argparse.Namespace, extra: dict[str, Any] | None = None,
                     base: dict[str, Any] | None = None):
    """The run config a command's parsed ``args`` ask for: ``--task``/``--config``, the ``KEY=VALUE``
    overrides and the ``--model``/``--data``/``--eval-data``/``--out`` flags, over ``base`` (settings
    under the user's own, e.g. :func:`own_model_base`), with ``extra`` (nested config sections) merged in;
    with ``--resume`` the config the run in ``--out`` started with instead."""
    from mmrl.config import load_run_config, resume_run_config
    from mmrl.run.inputs import import_from_start_folder
    from mmrl_common.errors import MmrlError

    extra = flag_sections(args, extra)
    if getattr(args, "resume", False):  # continue with the settings the run started with
        if not args.out:
            raise MmrlError("--resume needs --out RUN_DIR (the folder of the run to continue)")
        saved = Path(args.out) / "config.yaml"
        if not saved.is_file():
            raise MmrlError(f"--resume: {args.out} holds no run (no config.yaml)")
        from mmrl.run.folder import check_saved_config

        check_saved_config(saved)  # a cut, empty or garbled config.yaml: said, not resumed with defaults
        import_from_start_folder(Path(args.out))  # the module rewards the first session found there
        return resume_run_config(saved, overrides=args.overrides, extra=extra)
    task, config, recipe = recipe_args(args)
    return load_run_config(task=task, config_file=config, overrides=args.overrides, extra=extra, base=base,
                           recipe_file=recipe)


def flag_sections(args: argparse.Namespace, extra: dict[str, Any] | None = None) -> dict[str, Any]:
    """The config sections the ``--model``/``--data``/``--eval-data``/``--out`` flags set, over ``extra``."""
    extra = dict(extra or {})
    if args.model:
        extra.setdefault("model", {})["path"] = args.model
    if args.data:
        extra.setdefault("data", {})["train"] = args.data
    if getattr(args, "eval_data", None):
        extra.setdefault("data", {})["test"] = args.eval_data
        extra.setdefault("eval", {})["split"] = "test"
    if args.out:
        extra["out"] = args.out
    return extra


def setting_sources(args: argparse.Namespace) -> dict[str, str]:
    """Where each value of the config ``args`` resolve to comes from, by dotted key: the last layer that sets it,
    in the order :func:`mmrl.config.load_run_config` merges them: mmrl's default, the task recipe (a key its
    ``published:`` record names: the paper's value), a recipe file, the real-model preset, the model folder's
    ``mmrl_eval.json``, ``--config``, the flags, the ``KEY=VALUE`` overrides. A value no layer names but one
    changes (the format reward following ``prompt.answer_format``) is credited to that layer."""
    from mmrl.config import RunConfig, load_run_config, settings_file, task_recipe
    from mmrl.config.eval_settings import read_eval_settings
    from mmrl.config.io import describe, parse_override

    if getattr(args, "resume", False):
        saved = Path(args.out) / "config.yaml"
        return {key: f"the run's {saved}" for key, _, _ in describe(config_from_args(args))}
    task, config, recipe = recipe_args(args)
    for file in (recipe, config):
        task = task or (settings_file(file).get("task") if file else None)
    task = task or "video-qa"
    base = own_model_base(args) or {}
    folder = model_folder(args) if base else None
    from_folder = set(flat_keys(read_eval_settings(folder) or {})) if folder else set()
    published = recipe_published(args)
    extra = flag_sections(args)

    def sets(keys: Any, key: str) -> bool:
        return any(key == k or key.startswith((k + ".", k + "[")) for k in keys)

    def recipe_source(key: str) -> str:
        paper = next((src for k, src in published.items() if covers(k, key)), None)
        return f"published: {paper}" if paper else f"recipe {task}"

    def base_source(key: str) -> str:
        return ("the model folder's mmrl_eval.json" if sets(from_folder, key)
                else f"the real-model preset ({REAL_MODEL_PRESET.name})")

    recipe_keys = set(flat_keys(task_recipe(task))) | (set(flat_keys(settings_file(recipe))) if recipe else set())
    layers: list[tuple[Any, set[str], Any]] = [  # (the config so far, the keys the layer sets, its name)
        (RunConfig(), set(), "mmrl's default"),
        (load_run_config(task=task, recipe_file=recipe), recipe_keys, recipe_source),
        (load_run_config(task=task, base=base, recipe_file=recipe), set(flat_keys(base)), base_source),
        (load_run_config(task=task, config_file=config, base=base, recipe_file=recipe),
         set(flat_keys(settings_file(config))) if config else set(), f"--config {config}"),
        (load_run_config(task=task, config_file=config, extra=extra, base=base, recipe_file=recipe),
         set(flat_keys(extra)), "a flag (--model, --data, --eval-data, --out)"),
        (load_run_config(task=task, config_file=config, overrides=args.overrides, extra=extra, base=base,
                         recipe_file=recipe),
         {".".join(parse_override(o)[0]) for o in args.overrides}, "a KEY=VALUE override"),
    ]
    sources: dict[str, str] = {}
    before: dict[str, Any] = {}
    for cfg, keys, name in layers:
        now = {key: value for key, value, _ in describe(cfg)}
        for key, value in now.items():
            if sets(keys, key) or key not in before or before[key] != value:
                sources[key] = name(key) if callable(name) else name
        before = now
    return sources


def recipe_args(args: argparse.Namespace) -> tuple[str | None, str | None, str | None]:
    """``(task, user settings file, recipe file)`` for ``--task``/``--config``. ``--config configs/NAME.yaml``
    (a built-in recipe) is ``--task NAME``; another file with a ``published:``/``inherited:`` record is a recipe
    (:func:`mmrl.config.is_recipe_file`): both are read as ``--task`` reads its recipe, under the real-model
    preset, so ``--config configs/ares.yaml --model DIR`` trains as ``--task ares --model DIR`` does. Any other
    file is the user's own settings, over the preset."""
    from mmrl.config import CONFIG_DIR, is_recipe_file

    task, config = args.task, args.config
    if not config or not Path(config).is_file():
        return task, config, None
    path = Path(config).resolve()
    if path.parent == CONFIG_DIR.resolve() and task in (None, path.stem):
        return path.stem, None, None
    return (task, None, config) if is_recipe_file(config) else (task, config, None)


REAL_MODEL_PRESET = Path(__file__).resolve().parents[2] / "configs" / "presets" / "real-model.yaml"
REAL_MODEL_TRAIN_PRESET = REAL_MODEL_PRESET.with_name("real-model-train.yaml")  # `mmrl train`'s, not `mmrl sft`'s


REAL_MODEL_PARAMS = 100e6  # below this a --model folder is a tiny model; the toy recipes' values suit it


def estimated_params(model_dir: str | Path) -> float:
    """A model folder's parameter count from its config.json (transformer blocks and embeddings; rough)."""
    cfg = json.loads((Path(model_dir) / "config.json").read_text())
    text = cfg.get("text_config") or cfg
    h, layers = float(text.get("hidden_size", 0)), float(text.get("num_hidden_layers", 0))
    inter = float(text.get("intermediate_size", 4 * h))
    return layers * (4 * h * h + 3 * h * inter) + float(text.get("vocab_size", 0)) * h


def recipe_published(args: argparse.Namespace) -> dict[str, str]:
    """The published keys (dotted key -> source) of the recipe ``args`` name: ``--task``'s recipe file (with
    what an overlay inherits, :func:`mmrl.config.task_published`) and a ``--config`` file's own ``published:``
    record (configs/README.md)."""
    from mmrl.config import recipe_record, settings_file, task_published

    task, config, recipe = recipe_args(args)
    own: dict[str, str] = {}
    for file in (recipe, config):
        if file:
            task = task or settings_file(file).get("task")
            own = {**own, **recipe_record(file)}
    return {**task_published(task or "video-qa"), **own}


def flat_keys(tree: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, value in tree.items():
        dotted = f"{prefix}.{key}" if prefix else str(key)
        out.update(flat_keys(value, dotted) if isinstance(value, dict) and value else {dotted: value})
    return out


def covers(published: str, key: str) -> bool:
    """Whether published key ``published`` sets base key ``key`` (the same key, one inside it or around it)."""
    p, k = published.split("[")[0], key
    return p == k or k.startswith(p + ".") or p.startswith(k + ".")


def model_folder(args: argparse.Namespace) -> str | None:
    """The model folder a command's ``args`` name, however they name it: ``--model DIR``, a ``model.path=DIR``
    override, ``model: {path: DIR}`` in a ``--config`` file (or a recipe's own); None for a tiny model built by
    mmrl. Read from the settings resolved without the folder's own (which cannot name another folder)."""
    if args.model:
        return args.model
    return config_from_args(args).model.path or None


def full_base(args: argparse.Namespace) -> dict[str, Any]:
    """The real-model preset (a model of 100M+ parameters) and the folder's mmrl_eval.json, merged, for the
    model folder ``args`` name by any route (:func:`model_folder`); {} when neither applies."""
    from mmrl.config.eval_settings import read_eval_settings
    from mmrl.config.io import deep_merge, load_yaml
    from mmrl.model.folder import check_model_dir

    if getattr(args, "recipe_settings", False) or getattr(args, "resume", False):
        return {}
    folder = model_folder(args)
    if not folder or not Path(folder).is_dir():
        return {}  # _check_paths names the missing folder
    check_model_dir(folder)
    base: dict[str, Any] = {}
    if estimated_params(folder) >= REAL_MODEL_PARAMS:
        base = load_yaml(REAL_MODEL_PRESET)
        if getattr(args, "command", "train") != "sft":  # `mmrl train`'s (and `config show`'s), not `mmrl sft`'s
            base = deep_merge(base, load_yaml(REAL_MODEL_TRAIN_PRESET))
    return deep_merge(base, read_eval_settings(folder) or {})


def own_model_base(args: argparse.Namespace) -> dict[str, Any] | None:
    """``mmrl train`` and ``mmrl sft`` of a model folder, named by ``--model DIR``, ``model.path=DIR`` or a
    config's ``model: {path: DIR}`` (:func:`model_folder`): the real-model preset
    (``configs/presets/real-model.yaml``) for a model of 100M+ parameters, then the settings the folder was
    trained with (its ``mmrl_eval.json``), both under the user's own YAML, flags and overrides and without the
    keys the recipe publishes (its ``published:`` record: a paper's value wins over the preset; only toy values
    and our choices give way); None with ``--recipe-settings``, ``--resume`` or no model folder."""
    from mmrl.config.io import deep_merge

    base, published = full_base(args), recipe_published(args)
    kept: dict[str, Any] = {}
    for key, value in flat_keys(base).items():
        if not any(covers(p, key) for p in published):
            kept = deep_merge(kept, nested(key, value))
    return kept or None


def nested(key: str, value: Any) -> dict[str, Any]:
    for part in reversed(key.split(".")):
        value = {part: value}
    return value


def with_training_settings(args: argparse.Namespace, cfg):
    """``cfg`` with the settings the model was trained with (its ``mmrl_eval.json``) under the user's own
    YAML, flags and overrides; says which values they changed."""
    from mmrl.config.eval_settings import EVAL_SETTINGS_FILE, read_eval_settings
    from mmrl.config.io import describe

    settings = read_eval_settings(cfg.model.path)
    if not settings:
        return cfg
    trained = config_from_args(args, base=settings)
    before = {k: v for k, v, _ in describe(cfg)}
    changed = [f"{k}={v}" for k, v, _ in describe(trained) if before.get(k) != v]
    where = Path(cfg.model.path) / EVAL_SETTINGS_FILE
    if changed:
        print(f"eval: evaluating as the model was trained ({where}): {' '.join(changed)}; a KEY=VALUE override "
              "wins, --recipe-settings ignores them", flush=True)
    elif not args.quiet:
        print(f"eval: the model's training settings ({where}) equal the recipe's", flush=True)
    return trained
