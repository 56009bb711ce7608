"""The ``mmrl`` command line.

Each command lives in a module with a function that adds its parser (``COMMANDS`` names it); the parser
sets ``func`` (called with the parsed namespace, returns an exit status). Modules are imported lazily only
for the command that runs, so ``mmrl --help`` stays fast.
"""

from __future__ import annotations

import argparse
import errno
import importlib
import os
import sys
from typing import Any

from mmrl import __version__
from mmrl_common.errors import MmrlError

# command name -> ("module:function" that adds its parser, its one-line help as that parser gives it: the listing
# shows it without importing the module; tests/test_cli_startup.py keeps the two equal)
COMMANDS: dict[str, tuple[str, str]] = {
    "train": ("mmrl.cli.commands:add_train_parser", "RL fine-tuning (GRPO) of a Qwen-VL model"),
    "sft": ("mmrl.cli.commands:add_sft_parser", "supervised fine-tuning (cold start), loss on assistant tokens only"),
    "eval": ("mmrl.cli.commands:add_eval_parser",
             "evaluate a model on a held-out split (accuracy per problem type and task)"),
    "data": ("", "validate, inspect, and generate datasets (make-toy)"),
    "models": ("mmrl.toy.base:add_models_parser",
               "build tiny Qwen-VL models offline (random weights or the toy base)"),
    "compare": ("mmrl.cli.compare:add_parser",
                "measure methods against plain GRPO: arms x seeds, one table with 95%% intervals"),
    "config": ("mmrl.cli.commands:add_config_parser",
               "print the resolved configuration: every key, its value and meaning"),
}


# ``mmrl data`` sub-commands that methods provide: name -> ("module:function" that adds it, its one-line help)
DATA_COMMANDS: dict[str, tuple[str, str]] = {
    "earl-sft": ("mmrl.methods.earl.trajectories:add_parser",
                 "EARL's action-aware SFT trajectories (reasoning, 0-2 frame selections, then the answer)"),
    "select-variance": ("mmrl.methods.temporal_r1:add_select_variance_parser",
                        "keep the training records whose K answers by the starting model disagree"),
}


# what the CLI offers of the methods by name (``mmrl eval --agent earl``, ``--check consistency``): (kind, name)
# -> the module that registers it, imported when asked for
METHOD_ENTRIES: dict[tuple[str, str], str] = {
    ("agent", "earl"): "mmrl.methods.earl",
    ("check", "consistency"): "mmrl.methods.acre",
    ("check", "shuffled_frames"): "mmrl.methods.tgrpo",
}


def load_method(kind: str, name: str) -> Any:
    """The module of :data:`METHOD_ENTRIES` for ``(kind, name)``, imported (None when the CLI offers none)."""
    target = METHOD_ENTRIES.get((kind, name))
    return importlib.import_module(target) if target else None


def add_data_parser(subparsers: argparse._SubParsersAction, only: str | None = None) -> argparse.ArgumentParser:
    """``mmrl data``: the data pipelines' own sub-commands and the methods' (:data:`DATA_COMMANDS`; the CLI is
    where the engine and the methods meet, by name). With ``only`` (the sub-command that runs), a method's
    sub-command other than that one is listed by its help line without importing the method."""
    from data_pipelines.cli import add_parser

    parser, sub = add_parser(subparsers)
    for name, (target, help_text) in DATA_COMMANDS.items():
        if only is not None and name != only:
            sub.add_parser(name, help=help_text)
            continue
        mod, func = target.split(":")
        getattr(importlib.import_module(mod), func)(sub)
    return parser


def build_parser(only: str | None = None, sub_only: str | None = None) -> argparse.ArgumentParser:
    """The ``mmrl`` parser. ``only``: the command that runs; the others are listed by their help line without
    importing their modules (``""``: none runs, as for ``mmrl --help``); None builds every command.
    ``sub_only``: the same for the sub-commands of ``mmrl data``."""
    parser = argparse.ArgumentParser(
        prog="mmrl",
        description="RL fine-tuning of Qwen-VL models on images and videos.",
    )
    parser.add_argument("--version", action="version", version=f"mmrl {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name, (module, help_text) in COMMANDS.items():
        if only is not None and name != only:
            sub.add_parser(name, help=help_text)
            continue
        if name == "data":
            add_data_parser(sub, only=sub_only if only is not None else None)
            continue
        mod, func = module.split(":")
        getattr(importlib.import_module(mod), func)(sub)
    return parser


def _command_parser(parser: argparse.ArgumentParser, argv: list[str]) -> argparse.ArgumentParser:
    """The parser of the (sub-)command ``argv`` names (``mmrl data validate`` -> validate's), for its usage."""
    for token in argv:
        subs = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
        if subs and token in subs[0].choices:
            parser = subs[0].choices[token]
    return parser


def parse(parser: argparse.ArgumentParser, argv: list[str]) -> argparse.Namespace:
    """Parse ``argv``; KEY=VALUE overrides may stand anywhere among the flags (``train.steps=5 --quiet
    data.on_bad_sample=skip``), and an argument no command takes is an error under that command's usage."""
    args, extra = parser.parse_known_args(argv)
    if hasattr(args, "overrides"):
        kv = [a for a in extra if "=" in a and not a.startswith("-")]
        args.overrides = [*(args.overrides or []), *kv]
        extra = [a for a in extra if a not in kv]
    if extra:
        _command_parser(parser, argv).error(f"unrecognized arguments: {' '.join(extra)}")
    return args


def quiet_third_party() -> None:
    """Drop DeepSpeed's "Setting accelerator to CPU" warning, printed on stdout whenever anything imports
    deepspeed (accelerate does, inside every ``save_pretrained``) on a machine without a GPU: it says nothing
    about the run. A filter on DeepSpeed's logger (which DeepSpeed's own set-up keeps); deepspeed is not
    imported here, and its other messages still print."""
    import logging

    ds = logging.getLogger("DeepSpeed")
    if not any(getattr(f, "mmrl", False) for f in ds.filters):
        def no_cpu_notice(record: logging.LogRecord) -> bool:
            return "Setting accelerator to CPU" not in record.getMessage()

        no_cpu_notice.mmrl = True  # type: ignore[attr-defined]
        ds.addFilter(no_cpu_notice)


PROGRESS_INTERVAL_NO_TTY = 60  # seconds between progress-bar updates when stderr is a file or a pipe


def calm_progress_bars(stream: Any = None) -> None:
    """When stderr is not a terminal (``mmrl train ... 2> log``, nohup, a compare run's train.log), progress bars
    update once a minute instead of several times a second, so a log file gets a few ``\\r`` updates instead of
    thousands (tqdm reads TQDM_MININTERVAL when it is imported, so :func:`main` calls this first; the variable
    reaches the processes mmrl starts too, and a value the user set wins)."""
    import os

    stream = sys.stderr if stream is None else stream
    if not (hasattr(stream, "isatty") and stream.isatty()):
        os.environ.setdefault("TQDM_MININTERVAL", str(PROGRESS_INTERVAL_NO_TTY))


IO_FAULT_HINTS = {
    errno.ENOSPC: "free space on that disk (df -h), or give another --out, and run again",
    errno.EDQUOT: "free space within your disk quota (quota -s), or write elsewhere, and run again",
    errno.EFBIG: "the file grew past the file-size limit (ulimit -f) or what the filesystem allows: raise the "
                 "limit or write elsewhere, and run again",
    errno.EROFS: "the filesystem is mounted read-only: write elsewhere (--out, MMRL_CACHE) and run again",
    errno.EACCES: "check the permissions of that file and its folders (ls -l), or write elsewhere",
    errno.EPERM: "check the permissions and attributes of that file and its folders (ls -l, lsattr)",
}
"""The I/O faults :func:`main` reports as one line (what the errno means, the file and what to do)."""


def io_fault(exc: BaseException) -> str | None:
    """One line for an :class:`OSError` of :data:`IO_FAULT_HINTS` (``exc`` or what it was raised from):
    the path (the error's own, else the file that the innermost frame was writing: a ``Path`` or an open
    file among its locals), the cause and a hint; None for any other error."""
    seen: set[int] = set()
    err: BaseException | None = exc
    while err is not None and id(err) not in seen:
        seen.add(id(err))
        if isinstance(err, OSError) and err.errno in IO_FAULT_HINTS:
            break
        err = err.__cause__ or err.__context__
    else:
        return None
    if not isinstance(err, OSError) or err.errno not in IO_FAULT_HINTS:
        return None
    path = err.filename if err.filename is not None else _path_in_frames(err.__traceback__)
    name = errno.errorcode.get(err.errno, str(err.errno))
    where = f"{os.fsdecode(path)}: " if path is not None else "(the file was not named by the system) "
    return f"{where}{err.strerror or os.strerror(err.errno)} ({name}); {IO_FAULT_HINTS[err.errno]}"


def _path_in_frames(tb: Any) -> Any:
    """The path of the file being written where an error without a file name was raised: the first
    ``os.PathLike`` or open file's name among the locals of the innermost frames."""
    import io

    frames = []
    while tb is not None:
        frames.append(tb.tb_frame)
        tb = tb.tb_next
    for frame in reversed(frames):
        for value in frame.f_locals.values():
            if isinstance(value, io.IOBase) and isinstance(getattr(value, "name", None), (str, bytes)):
                return value.name
            if isinstance(value, os.PathLike):
                return os.fspath(value)
    return None


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    quiet_third_party()
    calm_progress_bars()
    words = [a for a in argv if not a.startswith("-")]
    command = words[0] if words else None
    # only the command that runs (and its sub-command) is built: ``mmrl --help`` imports no command's module
    parser = build_parser(only=command if command in COMMANDS else "",
                          sub_only=words[1] if command == "data" and len(words) > 1 else "")
    args = parse(parser, argv)
    if not getattr(args, "func", None):
        parser.print_help()
        return 0 if not argv else 2
    try:
        code = int(args.func(args) or 0)
    except MmrlError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    except Exception as exc:
        fault = io_fault(exc) or _collective_fault(exc)
        if fault is None:
            raise
        print(f"error: {fault}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130
    except SystemExit:  # a run stopped by a signal at a step boundary (mmrl.run.Stopped): every rank agreed
        _leave_process_group()
        raise
    _leave_process_group()
    return code


def _collective_fault(exc: Exception) -> str | None:
    """Under torchrun: a collective outside :class:`~mmrl.engine.distributed.World` (the optimizer's gradient
    sum, DeepSpeed's) that timed out or lost a rank, as one line naming train.dist_timeout_minutes."""
    if "torch.distributed" not in sys.modules:
        return None
    from mmrl.engine.distributed import collective_failure, world

    w = world()
    if w.size < 2:
        return None
    return collective_failure(exc, rank=w.rank, size=w.size, timeout_minutes=w.timeout_minutes)


def _leave_process_group() -> None:
    """A command that joined a process group leaves it (vLLM's engines first: they sit on it)."""
    if "torch.distributed" in sys.modules:
        from mmrl.engine.distributed import finish

        if "mmrl.engine.backends.vllm" in sys.modules:
            sys.modules["mmrl.engine.backends.vllm"].close_engines()
        finish()
