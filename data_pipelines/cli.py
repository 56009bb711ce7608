"""``mmrl data``: validate, inspect, make-toy (the methods add their own data commands: ``mmrl.cli``)."""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

from .loaders import DEFAULT_MAX_QUESTION_CHARS

PATH_HELP = ("a JSONL / JSON / Parquet / CSV file, a datasets.save_to_disk folder, a folder of data files as on the "
             "Hugging Face Hub (data/train-00000-of-00002.parquet ..), or a quoted glob ('shards/*.parquet'); "
             "PATH:SPLIT picks one split of a folder with several (train, test ..)")
MEDIA_ROOT_HELP = ("folder that relative media paths resolve against, as data.media_root in a run (default: the "
                   "folder of the data file, the folder given (a split's own folder: its datasets folder), or the "
                   "glob's folder)")
COLUMNS_HELP = ("source column -> record field, as data.columns in a run: a YAML/JSON mapping such as "
                "'{query: question, level: meta.difficulty}'")


def _positive(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        value = 0
    if value < 1:
        raise argparse.ArgumentTypeError(f"expected a whole number of at least 1, got {text!r}")
    return value


def _columns(text: str) -> dict[str, str]:
    """``--columns '{query: question}'`` as a mapping (argparse prints the error under the command's usage)."""
    import yaml

    try:
        value = yaml.safe_load(text)
    except yaml.YAMLError:
        value = None
    if not isinstance(value, dict) or not all(isinstance(k, str) and isinstance(v, str) for k, v in value.items()):
        raise argparse.ArgumentTypeError(f"expected a mapping of source column -> record field, such as "
                                         f"'{{query: question, level: meta.difficulty}}'; got {text!r}")
    return value


def add_parser(subparsers: argparse._SubParsersAction) -> tuple[argparse.ArgumentParser, argparse._SubParsersAction]:
    """``mmrl data`` with its sub-commands; returns the parser and its sub-commands (where the methods' data
    commands are added)."""
    parser = subparsers.add_parser("data", help="validate, inspect, and generate datasets (make-toy)",
                                   description="Validate, inspect, and generate datasets.")
    parser.set_defaults(func=lambda args: (parser.print_help(), 2)[1])
    sub = parser.add_subparsers(dest="data_command", metavar="SUBCOMMAND")

    v = sub.add_parser("validate", help="check every record and decode every media file",
                       description="Check every record and open every media file; print FILE:LINE: reason "
                                   "for each problem; exit 1 when any record is bad or there is none.")
    v.add_argument("path", help=PATH_HELP + "; with several splits and none named, every split is checked")
    v.add_argument("--media-root", default=None, help=MEDIA_ROOT_HELP)
    v.add_argument("--format", dest="fmt", default="auto",
                   help="file format (jsonl, json, parquet, csv, hf: a datasets folder) and/or record format "
                        "(native, video-r1, easyr1, sharegpt), e.g. video-r1+json (default: auto, from the file names "
                        "and the first record)")
    v.add_argument("--columns", default=None, metavar="MAPPING", type=_columns,
                   help=COLUMNS_HELP)
    v.add_argument("--max-question-chars", type=_positive, default=DEFAULT_MAX_QUESTION_CHARS, metavar="N",
                   help="the longest question (with its options) a record may have, in characters, as "
                        "data.max_question_chars in the run you will start (default "
                        f"{DEFAULT_MAX_QUESTION_CHARS:,})")
    v.add_argument("--no-progress", action="store_true", help="no progress bar")
    v.set_defaults(func=_validate)

    i = sub.add_parser("inspect", help="counts, media statistics and a PNG contact sheet",
                       description="Print counts by problem type / task / difficulty and media statistics, "
                                   "and write a PNG contact sheet of a few samples.")
    i.add_argument("path", help=PATH_HELP)
    i.add_argument("--out", default=None, help="folder for the contact sheet (default: <data folder>/inspect)")
    i.add_argument("--samples", type=int, default=6, help="samples (rows) on the contact sheet (default 6)")
    i.add_argument("--media-root", default=None, help=MEDIA_ROOT_HELP)
    i.add_argument("--format", dest="fmt", default="auto",
                   help="file and/or record format, as for validate (default: auto)")
    i.add_argument("--columns", default=None, metavar="MAPPING", type=_columns, help=COLUMNS_HELP)
    i.set_defaults(func=_inspect)

    t = sub.add_parser("make-toy", help="generate the toy world (MP4 videos, PNG scans, JSONL splits)",
                       description="Generate the procedural toy world into --out.")
    t.add_argument("--out", required=True, help="output folder (new, empty, or a previous toy world)")
    t.add_argument("--seed", type=int, default=0, help="generation seed (default 0)")
    t.add_argument("--size", default="default", choices=["small", "default"],
                   help="small: 8/4/4 records per task for train/val/test; default: 48/10/10")
    t.add_argument("--tasks", nargs="+", default=None, help="subset of tasks (default: all)")
    t.add_argument("--shuffle-options", action="store_true",
                   help="shuffle multiple-choice options per record (default: canonical order)")
    t.add_argument("--resolution", type=int, default=64, help="frame/image side in pixels (default 64)")
    t.add_argument("--no-progress", action="store_true", help="no progress bar")
    t.set_defaults(func=_make_toy)

    return parser, sub


def _validate(args: argparse.Namespace) -> int:
    from .validate import run_validate

    return run_validate(args.path, media_root=args.media_root, fmt=args.fmt, columns=args.columns,
                        progress=not args.no_progress, max_question_chars=args.max_question_chars)


def _inspect(args: argparse.Namespace) -> int:
    from .inspect import run_inspect

    return run_inspect(args.path, out=args.out, samples=args.samples, media_root=args.media_root, fmt=args.fmt,
                       columns=args.columns)


def _make_toy(args: argparse.Namespace) -> int:
    from .toy import make_toy

    t0 = time.perf_counter()
    out = make_toy(Path(args.out), args.seed, size=args.size, tasks=args.tasks,
                   shuffle_options=args.shuffle_options, resolution=args.resolution,
                   progress=not args.no_progress)
    print(f"wrote toy world to {out} in {time.perf_counter() - t0:.1f} s "
          f"(train.jsonl, val.jsonl, test.jsonl, manifest.json, README.md)", file=sys.stdout)
    return 0
