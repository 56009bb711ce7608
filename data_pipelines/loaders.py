"""Load sample records from JSONL, JSON, Parquet, CSV, a ``datasets.save_to_disk`` folder, a Hugging Face Hub
folder of shards, or a glob of files.

>>> result = load_samples("data/train.jsonl", on_bad_sample="skip")
>>> len(result.samples), result.skipped, [str(p) for p in result.problems]

Every bad record becomes a :class:`~data_pipelines.schema.Problem` at its place in the file: the 1-based
line for JSONL and CSV (``file:12: reason``), the 0-based record index for JSON, Parquet and ``datasets`` folders
(``file:record 3: reason``). A broken JSON line is a problem at that line, never a crash.
``on_bad_sample="raise"`` raises :class:`~mmrl_common.errors.DataError` listing them; ``"skip"`` keeps every
good record and counts the skipped ones.

A dataset is named by one string (:func:`locate_dataset`):

* a file (``train.jsonl``, ``train.parquet``..) or a ``datasets`` folder;
* a glob (``"shards/*.parquet"``): every file it matches, in name order, read as one dataset;
* a folder of data files as on the Hugging Face Hub (``data/train-00000-of-00002.parquet``.., a README.md
  beside them): its splits are named by the files' names as the Hub names them (:func:`dataset_splits`);
* ``PATH:SPLIT`` picks a split of a folder with several (a ``DatasetDict`` saved with ``save_to_disk`` or a
  Hub folder); the split's own folder of a ``DatasetDict`` works too (``folder/test``).

With several splits and none named, ``role`` (``"train"``, ``"val"``, ``"test"``: what the data is for) picks
``train``, or ``validation``/``test``; validation (:func:`iter_raw_records`) reads every split. Each record's
place names its own file: the shard or the split's folder. Arrow (Parquet, ``datasets``) gives every record of
a table the same struct fields, null where a record had none; those nulls are dropped from nested objects
(media items, their ``sampling``, ``meta``) so a record means what it meant when written (:func:`arrow_record`).

Record formats (our own, Video-R1, EasyR1, LLaVA/ShareGPT, see :mod:`data_pipelines.importers`) are detected from the
first record, or chosen with ``fmt`` (``"video-r1"``); ``fmt`` also accepts a file format (``"jsonl"``,
``"json"``, ``"parquet"``, ``"csv"``, ``"hf"``), or both joined by ``+`` (``"video-r1+json"``).
"""

from __future__ import annotations

import glob
import json
import re
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from mmrl_common.errors import DataError

from .importers import detect_record_format, get_importer, record_formats
from .schema import Problem, Sample, check_record, question_chars

DEFAULT_MAX_QUESTION_CHARS = 20_000
"""The longest prompt text a record may have (question plus the options' texts, in characters; the run setting
``data.max_question_chars``). 20,000 characters is about 5,000 tokens: ten times a long benchmark question with
its options, far below what takes minutes and gigabytes to tokenize and roll out (a 200,000-character question
did); a record over it is refused at load like any bad record."""
MAX_QUESTION_HINT = "raise the cap with data.max_question_chars=N (max_question_chars=N in load_samples)"

FILE_FORMATS = ("jsonl", "json", "parquet", "csv", "hf")
_EXT_FORMATS = {".jsonl": "jsonl", ".ndjson": "jsonl", ".json": "json", ".parquet": "parquet", ".pq": "parquet",
                ".csv": "csv"}


@dataclass
class RawRecord:
    """One record as read from a file, before conversion. ``error`` is set when it could not be read."""

    line: int | None
    unit: str  # "line" (1-based JSONL line) or "record" (0-based index)
    data: Any = None
    error: str | None = None
    file: Path | None = None  # the shard or split folder it came from (None: the dataset's path itself)
    split: str | None = None


@dataclass
class LoadResult:
    """What :func:`load_samples` read. ``locations[i]`` is ``file:line`` of ``samples[i]``. ``total`` counts
    records (a JSONL file's blank lines are none); ``lines`` is the number of lines of a JSONL file (None for
    other formats); ``skipped_by`` counts the skipped records by why (:data:`SKIP_KINDS`), each record once."""

    path: Path
    file_format: str
    record_format: str
    samples: list[Sample] = field(default_factory=list)
    locations: list[str] = field(default_factory=list)
    problems: list[Problem] = field(default_factory=list)
    skipped: int = 0
    total: int = 0
    base_dir: Path | None = None
    lines: int | None = None
    skipped_by: dict[str, int] = field(default_factory=dict)
    split: str | None = None
    files: list[Path] = field(default_factory=list)

    @property
    def blank_lines(self) -> int:
        """Blank lines of a JSONL file (read and passed over; no record)."""
        return 0 if self.lines is None else self.lines - self.total

    def __len__(self) -> int:
        return len(self.samples)

    def __iter__(self) -> Iterator[Sample]:
        return iter(self.samples)

    def summary(self) -> str:
        files = f"{len(self.files)} {self.file_format} files" if len(self.files) > 1 else f"{self.file_format} file"
        split = f", split {self.split}" if self.split else ""
        s = f"{self.path}: {len(self.samples)} of {self.total} records loaded ({self.record_format} records, " \
            f"{files}{split})"
        if self.skipped:
            s += f", {self.skipped} skipped ({len(self.problems)} problems)"
        return s


# ------------------------------------------------------------------------------------------ reading
def parse_fmt(fmt: str) -> tuple[str, str]:
    """``"auto"`` / ``"jsonl"`` / ``"video-r1"`` / ``"video-r1+json"`` -> (file format, record format)."""
    file_fmt, rec_fmt = "auto", "auto"
    for part in (p.strip().lower() for p in str(fmt or "auto").split("+")):
        if part in ("", "auto"):
            continue
        if part in FILE_FORMATS or part in ("datasets", "arrow"):
            file_fmt = "hf" if part in ("datasets", "arrow") else part
        else:
            try:
                rec_fmt = get_importer(part).name
            except DataError:
                raise DataError(f"unknown format {part!r}: file formats are {', '.join(FILE_FORMATS)}; record "
                                f"formats are {', '.join(record_formats())}") from None
    return file_fmt, rec_fmt


def detect_file_format(path: Path) -> str:
    """The file format of one file (by its extension) or folder (``hf`` for a ``datasets`` folder)."""
    if path.is_dir():
        if _is_hf_folder(path):
            return "hf"
        raise DataError(f"{path} is a folder but neither a `datasets.save_to_disk` folder (no dataset_info.json "
                        "or dataset_dict.json) nor a folder of .jsonl/.json/.parquet/.csv files")
    fmt = _EXT_FORMATS.get(path.suffix.lower())
    if fmt is None:
        raise DataError(f"{path}: cannot tell the format from the extension {path.suffix!r}; "
                        f"pass fmt= / --format with one of {', '.join(FILE_FORMATS)}")
    return fmt


# ------------------------------------------------------------------------------------ files and splits
ROLE_SPLITS = {"train": ("train",), "val": ("validation", "val", "valid", "dev", "test"),
               "test": ("test", "validation", "val", "valid", "dev")}
"""The split a dataset with several splits gives for each role (the first of these it has): training data
comes from ``train``, held-out data from the validation or test split."""
_GLOB_CHARS = ("*", "?", "[")
_SPLIT_NAME = re.compile(r"[\w.-]+")
_NOT_DATA = {"dataset_infos.json", "dataset_info.json", "dataset_dict.json", "state.json"}


@dataclass
class DataPart:
    """One file of a dataset (or one ``datasets`` folder) with its file format and split."""

    path: Path
    fmt: str
    split: str | None = None


def _is_glob(text: str) -> bool:
    return any(c in text for c in _GLOB_CHARS) and not Path(text).exists()


def _is_hf_folder(path: Path) -> bool:
    return any((path / name).exists() for name in ("dataset_info.json", "dataset_dict.json", "state.json"))


def split_spec(path: str | Path) -> tuple[Path, str | None]:
    """``"folder:test"`` -> (``folder``, ``"test"``); a path that exists, or has no ``:NAME`` after an
    existing path or a glob, comes back whole with no split."""
    text = str(path)
    if ":" in text and not Path(text).exists():
        base, _, name = text.rpartition(":")
        if base and _SPLIT_NAME.fullmatch(name) and (Path(base).exists() or _is_glob(base)):
            return Path(base), name
    return Path(text), None


def glob_files(pattern: str | Path) -> list[Path]:
    """The files a glob of shards matches (``**`` recursive), in name order."""
    return sorted(Path(p) for p in glob.glob(str(pattern), recursive=True) if Path(p).is_file())


def dataset_exists(path: str | Path) -> bool:
    """Whether ``path`` names data that is there: an existing file or folder (``PATH:SPLIT`` too), or a glob
    that matches a file."""
    base, _ = split_spec(path)
    if _is_glob(str(base)):
        return bool(glob_files(base))
    return base.exists()


def _glob_parts(pattern: Path, file_fmt: str) -> list[DataPart]:
    files = glob_files(pattern)
    if not files:
        raise DataError(f"{pattern}: no file matches this pattern; check the folder and the pattern (quoted, "
                        "so that mmrl and not the shell expands it)")
    return [DataPart(f, file_fmt if file_fmt != "auto" else detect_file_format(f)) for f in files]


def _hub_splits(folder: Path, file_fmt: str) -> dict[str | None, list[DataPart]]:
    """The data files of a folder by split, named as the Hugging Face Hub names them (``data/train-0000..``,
    ``test.jsonl``, ``train/``.. and everything ``train`` when no file names a split)."""
    from datasets.data_files import EmptyDatasetError, get_data_patterns, resolve_pattern

    try:
        patterns = get_data_patterns(str(folder))
    except EmptyDatasetError:  # no file at all
        patterns = {}
    wanted = {file_fmt} if file_fmt != "auto" else set(FILE_FORMATS)
    splits: dict[str | None, list[DataPart]] = {}
    for name, pats in patterns.items():
        files: set[Path] = set()
        for pat in pats:
            try:
                files.update(Path(p) for p in resolve_pattern(pat, str(folder)))
            except FileNotFoundError:
                continue
        parts = [DataPart(f, _EXT_FORMATS[f.suffix.lower()], str(name)) for f in sorted(files)
                 if _EXT_FORMATS.get(f.suffix.lower()) in wanted and f.name not in _NOT_DATA]
        if file_fmt != "auto":
            parts = [DataPart(p.path, file_fmt, p.split) for p in parts]
        if parts:
            splits[str(name)] = parts
    if not splits:
        kinds = f".{file_fmt} " if file_fmt != "auto" else ".jsonl, .json, .parquet or .csv "
        raise DataError(f"{folder} is a folder with no {kinds}files (nor a `datasets.save_to_disk` folder): give "
                        "a data file, a folder of them (as on the Hugging Face Hub) or a glob such as "
                        f"'{folder}/*.parquet'")
    return splits


def dataset_splits(path: Path, file_fmt: str = "auto") -> dict[str | None, list[DataPart]]:
    """The files of the dataset at ``path`` (no ``:SPLIT``) by split name; the one key None when it has no
    splits (a file, a glob, a ``datasets`` folder of one dataset)."""
    if _is_glob(str(path)):
        return {None: _glob_parts(path, file_fmt)}
    if not path.is_dir():
        return {None: [DataPart(path, file_fmt if file_fmt != "auto" else detect_file_format(path))]}
    if (path / "dataset_dict.json").exists() and file_fmt in ("auto", "hf"):
        try:
            names = json.loads((path / "dataset_dict.json").read_text(encoding="utf-8"))["splits"]
        except (ValueError, KeyError, TypeError) as exc:
            raise DataError(f"{path / 'dataset_dict.json'}: cannot read the split names ({exc}); is the "
                            "folder a complete datasets.save_to_disk folder?") from exc
        return {str(n): [DataPart(path / str(n), "hf", str(n))] for n in names}
    if _is_hf_folder(path) and file_fmt in ("auto", "hf"):
        return {None: [DataPart(path, "hf")]}
    return _hub_splits(path, file_fmt)


def choose_parts(path: str | Path, file_fmt: str = "auto", *, split: str | None = None, role: str | None = None,
                 every: bool = False) -> tuple[list[DataPart], str | None]:
    """The files to read of the dataset ``path`` (``PATH:SPLIT`` allowed) and the split they are: the split
    named (in ``path`` or ``split``), the only one, the one for ``role`` (:data:`ROLE_SPLITS`), or with
    ``every`` all of them (split None). Several splits and none chosen: :class:`DataError` naming them and
    how to choose."""
    base, named = split_spec(path)
    named = named or split
    splits = dataset_splits(base, file_fmt)
    names = [n for n in splits if n is not None]
    how = "as in its dataset_dict.json" if (base / "dataset_dict.json").exists() else \
        "by file name, as on the Hugging Face Hub"
    if not names:
        if named:
            raise DataError(f"{base} has no splits (one dataset); give it without ':{named}'")
        return splits[None], None
    if named:
        if named not in splits:
            raise DataError(f"{base} has no split {named!r}; its splits ({how}) are {', '.join(names)}: "
                            f"{_choose_hint(base, names, _similar_split(named, names))}")
        return splits[named], named
    if len(names) == 1:
        return splits[names[0]], names[0]
    for name in ROLE_SPLITS.get(role or "", ()):
        if name in splits:
            return splits[name], name
    if every:
        return [p for n in names for p in splits[n]], None
    what = f" and none for {role}" if role else ""
    held_out = next((n for n in names if n != "train"), None) if role in ("val", "test") else None
    raise DataError(f"{base} holds the splits {', '.join(names)} ({how}){what}; name the one to use: "
                    f"{_choose_hint(base, names, held_out, role)}")


_SPLIT_KINDS = (("train", "training"), ("validation", "val", "valid", "dev"), ("test", "testing", "eval", "evaluation"))


def _similar_split(named: str, names: list[str]) -> str | None:
    """The split of ``names`` a user who typed ``named`` most likely means (``dev`` -> ``validation``)."""
    import difflib

    for kind in _SPLIT_KINDS:
        if named.lower() in kind:
            for name in names:
                if name.lower() in kind:
                    return name
    close = difflib.get_close_matches(named, names, n=1)
    return close[0] if close else None


def _choose_hint(base: Path, names: list[str], pick: str | None = None, role: str | None = None) -> str:
    pick = pick or next((n for n in ("train", "test") if n in names), names[0])
    folder = f", or its folder {base / pick}" if (base / pick / "state.json").exists() else ""
    flag, key = ("--eval-data", f"data.{role}") if role in ("val", "test") else ("--data", "data.train")
    return f"{base}:{pick} (e.g. {flag} {base}:{pick}, {key}={base}:{pick}){folder}"


def held_out_split(path: str | Path, role: str) -> str | None:
    """``PATH:SPLIT`` of the split of the training data ``path`` that holds the held-out data for ``role``
    (``"val"``, ``"test"``: :data:`ROLE_SPLITS`), when ``path`` is a folder with several splits and names none
    or ``train`` (``--data folder``, ``folder:train`` or the train split's own folder ``folder/train``, whose
    ``test`` split evaluates); None otherwise."""
    base, named = split_spec(path)
    if named not in (None, "train") or _is_glob(str(base)) or not base.is_dir():
        return None
    if named is None and base.name == "train" and (parent := split_folder_parent(base)) is not None:
        base = parent  # the train split's own folder (my_dd/train): its DatasetDict's held-out split, as my_dd:train
    try:
        names = [n for n in dataset_splits(base) if n is not None]
    except DataError:
        return None
    if len(names) < 2:
        return None
    pick = next((n for n in ROLE_SPLITS.get(role, ()) if n in names and n != "train"), None)
    return f"{base}:{pick}" if pick else None


def iter_raw_records(path: Path, file_fmt: str, *, split: str | None = None,
                     role: str | None = None) -> Iterator[RawRecord]:
    """Yield the records of a dataset one by one, with their line (JSONL) or index (others) and the file they
    are in. With several splits and none chosen (``split``, ``PATH:SPLIT``, ``role``), every split's."""
    parts, _ = choose_parts(path, file_fmt, split=split, role=role, every=True)
    yield from iter_parts(parts)


def iter_parts(parts: list[DataPart]) -> Iterator[RawRecord]:
    """The records of ``parts`` in turn, each with its file and split."""
    for part in parts:
        for raw in _iter_file(part.path, part.fmt):
            raw.file, raw.split = part.path, part.split
            yield raw


def _iter_file(path: Path, file_fmt: str) -> Iterator[RawRecord]:
    if file_fmt == "jsonl":
        yield from _iter_jsonl(path)
    elif file_fmt == "json":
        yield from _iter_json(path)
    elif file_fmt == "parquet":
        yield from _iter_parquet(path)
    elif file_fmt == "csv":
        yield from _iter_csv(path)
    elif file_fmt == "hf":
        yield from _iter_hf(path)
    else:
        raise DataError(f"unknown file format {file_fmt!r}; use one of {', '.join(FILE_FORMATS)}")


_MEDIA_COLUMNS = ("media", "images", "videos")


def arrow_record(record: Any) -> Any:
    """A record read from Arrow (Parquet, ``datasets``) as it was written. Arrow gives all records of a table
    the same struct fields, null where a record had none (``{"fps": 2}`` beside ``{"nframes": 4}`` comes back
    as ``{"fps": 2, "nframes": None}``): the nulls of nested objects are left out (top-level columns stay as
    they are). A media column that ``datasets`` stores as a ``Sequence`` of items comes back as one object of
    lists (``{"type": [..], "path": [..]}``): it is turned back into the list of items."""

    def strip(value: Any) -> Any:
        if isinstance(value, Mapping):
            return {k: strip(v) for k, v in value.items() if v is not None}
        if isinstance(value, list):
            return [strip(v) for v in value]
        return value

    if not isinstance(record, Mapping):
        return record
    out = {}
    for key, value in record.items():
        if key in _MEDIA_COLUMNS and isinstance(value, Mapping) and value \
                and all(isinstance(v, list) for v in value.values()) \
                and len({len(v) for v in value.values()}) == 1:
            value = [dict(zip(value, items)) for items in zip(*value.values())]
        out[key] = strip(value)
    return out


def _iter_jsonl(path: Path) -> Iterator[RawRecord]:
    with open(path, "rb") as fh:
        for lineno, raw in enumerate(fh, start=1):
            try:
                text = raw.decode("utf-8")
            except UnicodeDecodeError as exc:
                yield RawRecord(lineno, "line", error=f"line is not valid UTF-8 ({exc.reason} at byte "
                                                      f"{exc.start}); re-save the file as UTF-8")
                continue
            if not text.strip():
                continue
            text = text.rstrip("\r\n")
            try:
                yield RawRecord(lineno, "line", json.loads(text))
            except json.JSONDecodeError as exc:
                where = (f"at the end of the line (column {exc.pos + 1}): the record is cut short"
                         if exc.pos >= len(text.rstrip()) else f"at column {exc.pos + 1}")
                yield RawRecord(lineno, "line", error=f"broken JSON: {exc.msg} {where}; a JSONL file needs one "
                                                      "complete JSON object per line")


def _iter_json(path: Path) -> Iterator[RawRecord]:
    try:
        with open(path, encoding="utf-8") as fh:
            text = fh.read()
        if not text.strip():  # an empty file: no records
            return
        data = json.loads(text)
    except json.JSONDecodeError as exc:
        yield RawRecord(exc.lineno, "line", error=f"broken JSON: {exc.msg} at column {exc.colno}; fix the "
                                                  "file (nothing after this point can be read)")
        return
    except UnicodeDecodeError as exc:
        yield RawRecord(None, "line", error=f"file is not valid UTF-8 ({exc.reason}); re-save it as UTF-8")
        return
    if isinstance(data, Mapping):
        for key in ("data", "samples", "records"):
            if isinstance(data.get(key), list):
                data = data[key]
                break
        else:
            yield RawRecord(None, "record", error="a JSON dataset must be a list of records or an object with "
                                                  f"a 'data' list; found an object with keys {list(data)[:8]}")
            return
    if not isinstance(data, list):
        yield RawRecord(None, "record", error=f"a JSON dataset must be a list of records, got "
                                              f"{type(data).__name__}")
        return
    for i, rec in enumerate(data):
        yield RawRecord(i, "record", rec)


def _iter_csv(path: Path) -> Iterator[RawRecord]:
    """The rows of a CSV file (a header row names the columns), each at its 1-based line. Every cell is text; an
    empty cell is no value (null); a cell holding a JSON list or object (``media``, ``options``, ``meta``) is
    decoded as it is in Parquet; ``data.columns`` renames the columns as for any other format."""
    import csv

    with open(path, encoding="utf-8-sig", newline="") as fh:
        try:
            reader = csv.reader(fh)
            header: list[str] | None = None
            start = 1
            for row in reader:
                if header is None:
                    header = [h.strip() for h in row]
                    if not any(header):
                        raise DataError(f"{path}:1: the first line must name the columns (id,problem_type,"
                                        "question,answer,..); it is empty")
                    start = reader.line_num + 1
                    continue
                line, start = start, reader.line_num + 1
                if not any(cell.strip() for cell in row):
                    continue
                if len(row) != len(header):
                    yield RawRecord(line, "line", error=f"the row has {len(row)} cells but the header names "
                                                        f"{len(header)} columns; quote cells that hold a comma "
                                                        "(\"a, b\") and give every row each column")
                    continue
                yield RawRecord(line, "line", {k: (v if v.strip() else None) for k, v in zip(header, row) if k})
        except UnicodeDecodeError as exc:
            yield RawRecord(None, "line", error=f"file is not valid UTF-8 ({exc.reason}); re-save it as UTF-8")
        except csv.Error as exc:
            yield RawRecord(reader.line_num, "line", error=f"cannot read the CSV row ({exc}); fix the quoting")


def _iter_parquet(path: Path) -> Iterator[RawRecord]:
    import pyarrow.parquet as pq

    if path.stat().st_size == 0:  # an empty file: no records
        return
    try:
        pf = pq.ParquetFile(path)
    except Exception as exc:  # pyarrow raises several types for unreadable files
        raise DataError(f"{path}: cannot read Parquet file ({exc}); is it complete and really Parquet?") from exc
    i = 0
    for batch in pf.iter_batches(batch_size=1024):
        for rec in batch.to_pylist():
            yield RawRecord(i, "record", arrow_record(rec))
            i += 1


def _iter_hf(path: Path) -> Iterator[RawRecord]:
    """The records of one ``datasets.save_to_disk`` folder of one dataset (a split's folder of a
    ``DatasetDict``: :func:`dataset_splits` names them)."""
    import datasets

    try:
        state = json.loads((path / "state.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        state = None
    if isinstance(state, dict) and state.get("_data_files") == []:  # saved with no rows: no records
        return
    try:
        ds = datasets.load_from_disk(str(path))
    except Exception as exc:  # datasets raises FileNotFoundError / ValueError variants
        raise DataError(f"{path}: cannot load with datasets.load_from_disk ({exc}); is the folder complete?") \
            from exc
    if isinstance(ds, datasets.DatasetDict):  # found by dataset_splits: only if the folder changed meanwhile
        raise DataError(f"{path} holds the splits {', '.join(ds)}; name one as {path}:{next(iter(ds))}")
    for i, rec in enumerate(ds):
        yield RawRecord(i, "record", arrow_record(rec))


# ------------------------------------------------------------------------------------------ loading
def apply_columns(record: Mapping[str, Any], columns: Mapping[str, str] | None) -> dict[str, Any]:
    """Rename keys ``source -> field``; a target ``"meta.key"`` puts the value in ``meta``."""
    if not columns:
        return dict(record)
    out: dict[str, Any] = {}
    moved_meta: dict[str, Any] = {}
    for key, value in record.items():
        target = columns.get(key, key)
        if target.startswith("meta."):
            moved_meta[target[5:]] = value
        else:
            out[target] = value
    if moved_meta:
        meta = out.get("meta")
        if isinstance(meta, str):
            try:
                meta = json.loads(meta) if meta.strip() else {}
            except ValueError:
                meta = {"meta": meta}
        out["meta"] = {**(meta if isinstance(meta, Mapping) else {}), **moved_meta}
    return out


@dataclass
class CheckedRecord:
    """One record after conversion and checks: ``sample`` is None when it could not be built."""

    line: int | None
    unit: str
    location: str
    sample: Sample | None
    problems: list[Problem]
    file: str = ""  # the file (shard, split folder) the record is in


class RecordChecker:
    """Turns raw records into samples with their problems: importer, schema checks, duplicate ids and
    (optionally) media checks. Shared by :func:`load_samples` and ``mmrl data validate``."""

    def __init__(self, path: Path, *, record_format: str = "auto", columns: Mapping[str, str] | None = None,
                 base_dir: Path | None = None, media: str | None = None, progress: bool = False,
                 max_question_chars: int | None = DEFAULT_MAX_QUESTION_CHARS,
                 cap_hint: str = MAX_QUESTION_HINT, decoding: Mapping[str, Any] | None = None) -> None:
        self.path = path
        self.decoding = dict(decoding or {})  # check_files' decoder and decode_timeout (a run's data.media)
        self.max_question_chars = max_question_chars  # None: no cap
        self.cap_hint = cap_hint
        self.progress = progress  # a progress bar while media files are checked
        self.record_format = record_format
        self.columns = columns
        self.base_dir = base_dir
        self.media = media  # None, "exists" or "decode"
        self.seen_ids: dict[tuple[str | None, str], str] = {}  # (split, id) -> where first seen
        self.media_cache: dict[tuple[str, str], str | None] = {}

    def run(self, records: Iterator[RawRecord]) -> Iterator[CheckedRecord]:
        if not self.media:
            for raw in records:
                yield self.check(raw)
        else:  # every record first, then all media files at once (in parallel, cached)
            checked = [self.check(raw) for raw in records]
            self.check_media(checked)
            yield from checked
        if self.record_format == "auto":
            self.record_format = "native"

    def check_media(self, checked: list[CheckedRecord]) -> None:
        """Add a problem to each record with a missing or unreadable media file."""
        from .media_check import check_samples_media

        good = [c for c in checked if c.sample is not None]
        reasons = check_samples_media([c.sample for c in good], self.base_dir, decode=(self.media == "decode"),
                                      cache=self.media_cache, progress=self.progress, **self.decoding)
        for c, found in zip(good, reasons):
            c.problems.extend(Problem(c.file, c.line, c.sample.id, "media", r, c.unit) for r in found)

    def check(self, raw: RawRecord) -> CheckedRecord:
        file = str(raw.file if raw.file is not None else self.path)
        where = Problem(file, raw.line, None, "", "", raw.unit).location()
        problems: list[Problem] = []
        sample: Sample | None = None
        if raw.error is not None:
            problems.append(Problem(file, raw.line, None, "json", raw.error, raw.unit))
        elif not isinstance(raw.data, Mapping):
            problems.append(Problem(file, raw.line, None, "structure",
                                    f"record must be a JSON object, got {type(raw.data).__name__}", raw.unit))
        else:
            record = apply_columns(raw.data, self.columns)
            if self.record_format == "auto":
                self.record_format = detect_record_format(record) or "native"
            try:
                native = get_importer(self.record_format).convert(record, raw.line or 0)
            except DataError as exc:
                problems.append(Problem(file, raw.line, _id_of(record), "import",
                                        f"cannot import {self.record_format} record: {exc}", raw.unit))
            else:
                sample, problems = check_record(native, file=file, line=raw.line, unit=raw.unit)
        if sample is not None and self.max_question_chars is not None:
            chars = question_chars(sample.question, sample.options)
            if chars > self.max_question_chars:
                problems.append(Problem(file, raw.line, sample.id, "length",
                                        f"question and options are {chars:,} characters, over the cap of "
                                        f"{self.max_question_chars:,}; shorten the record, or {self.cap_hint}",
                                        raw.unit))
        if sample is not None:  # ids are unique within a split (train and test may both have a "q1")
            key = (raw.split, sample.id)
            if key in self.seen_ids:
                problems.append(Problem(file, raw.line, sample.id, "duplicate",
                                        f"duplicate id (first used at {self.seen_ids[key]}); "
                                        "ids must be unique", raw.unit))
            else:
                self.seen_ids[key] = where
        return CheckedRecord(raw.line, raw.unit, where, sample, problems, file)


def locate_dataset(path: str | Path, fmt: str = "auto", media_root: str | Path | None = None
                   ) -> tuple[Path, str, str, Path]:
    """``(path, file format, record format, media base folder)`` of a dataset (a file, a folder, a glob,
    ``PATH:SPLIT``: see the module docstring); DataError if it is missing. The media base folder is
    ``media_root``, else the folder given (of a split's own folder ``my_dd/train``, the ``DatasetDict`` folder
    ``my_dd``, as for ``my_dd:train``: :func:`split_folder_parent`), the file's folder, or a glob's folder
    (``shards`` of ``shards/*.parquet``)."""
    path = Path(path)
    base, _ = split_spec(path)
    file_fmt, rec_fmt = parse_fmt(fmt)
    if _is_glob(str(base)):
        formats = {p.fmt for p in _glob_parts(base, file_fmt)}  # DataError when nothing matches
        root = Path(*[part for part in _until_glob(base.parts)])
    elif not base.exists():
        raise DataError(f"dataset not found: {path}")
    else:
        formats = {p.fmt for parts in dataset_splits(base, file_fmt).values() for p in parts} \
            if file_fmt == "auto" else {file_fmt}
        root = base if base.is_dir() else base.parent
        root = split_folder_parent(root) or root
    if len(formats) > 1:
        raise DataError(f"{base} holds {' and '.join(sorted(formats))} files; give the files of one format (a glob "
                        "such as '*.parquet') or choose one with --format / data.format")
    base_dir = Path(media_root) if media_root is not None else root
    return path, formats.pop(), rec_fmt, base_dir


def split_folder_parent(path: Path) -> Path | None:
    """The ``DatasetDict.save_to_disk`` folder whose split ``path`` is (``my_dd`` of ``my_dd/train``: its
    ``dataset_dict.json`` lists the folder's name), else None. Media paths of a split's folder resolve against
    that folder, as they do for ``my_dd`` and ``my_dd:train``: one split means one thing however it is named."""
    parent = path.parent
    if path == parent or not _is_hf_folder(path) or not (parent / "dataset_dict.json").is_file():
        return None
    try:
        names = json.loads((parent / "dataset_dict.json").read_text(encoding="utf-8"))["splits"]
    except (OSError, ValueError, KeyError, TypeError):
        return None
    return parent if isinstance(names, list) and path.name in map(str, names) else None


def _until_glob(parts: tuple[str, ...]) -> list[str]:
    out = []
    for part in parts:
        if any(c in part for c in _GLOB_CHARS):
            break
        out.append(part)
    return out or ["."]


def load_samples(
    path: str | Path,
    *,
    fmt: str = "auto",
    columns: Mapping[str, str] | None = None,
    media_root: str | Path | None = None,
    on_bad_sample: str = "raise",
    check_media: bool | str = False,
    split: str | None = None,
    role: str | None = None,
    resolve_paths: bool = True,
    progress: bool = False,
    skip_hint: str = "pass on_bad_sample='skip'",
    max_question_chars: int | None = DEFAULT_MAX_QUESTION_CHARS,
    decoding: Mapping[str, Any] | None = None,
) -> LoadResult:
    """Read every record of ``path`` into :class:`Sample` objects.

    ``columns`` maps source column names to record fields (``{"query": "question", "level":
    "meta.difficulty"}``). Relative media paths resolve against ``media_root`` if given, else the dataset
    file's folder (the folder itself for a ``datasets`` folder, its ``DatasetDict`` folder for a split's own
    folder); with ``resolve_paths`` the loaded samples carry the resolved paths. ``check_media``: ``False``; ``True``/``"exists"`` (each file exists and is
    not empty); ``"decode"`` (each file is opened and decoded, as ``mmrl data validate`` does; ``decoding``:
    ``{"decoder", "decode_timeout"}`` as a run's ``data.media`` sets them).
    ``split`` picks a split of a dataset with several (a ``DatasetDict`` folder, a Hub folder), as ``PATH:SPLIT``
    does; else ``role`` (``"train"``, ``"val"``, ``"test"``) picks the split for that use (:data:`ROLE_SPLITS`);
    several splits and neither: :class:`DataError` naming them. ``result.split`` is the split read. Media files are checked all at once, in parallel,
    and the verdicts cached (:func:`~data_pipelines.media_check.check_files`); ``progress`` shows a bar.
    The error of ``on_bad_sample="raise"`` lists every problem; ``skip_hint`` is how its last line tells
    the caller to skip them instead (``mmrl train`` says ``data.on_bad_sample=skip``). A record whose question
    and options are longer than ``max_question_chars`` characters (None: no cap) is a bad record. A file with
    no records at all raises :class:`DataError` ("FILE has no records"), whatever ``on_bad_sample`` says.
    """
    if on_bad_sample not in ("raise", "skip"):
        raise ValueError(f"on_bad_sample must be 'raise' or 'skip', got {on_bad_sample!r}")
    path, file_fmt, rec_fmt, base_dir = locate_dataset(path, fmt, media_root)
    parts, chosen = choose_parts(path, file_fmt, split=split, role=role)
    result = LoadResult(path=path, file_format=file_fmt, record_format=rec_fmt, base_dir=base_dir, split=chosen,
                        files=[p.path for p in parts])
    mode = "exists" if check_media is True else (check_media or None)
    checker = RecordChecker(path, record_format=rec_fmt, columns=columns, base_dir=base_dir, media=mode,
                            progress=progress, max_question_chars=max_question_chars, decoding=decoding)
    for checked in checker.run(iter_parts(parts)):
        result.total += 1
        sample = checked.sample
        if checked.problems or sample is None:
            result.problems.extend(checked.problems)
            result.skipped += 1
            why = skip_kind(checked.problems)
            result.skipped_by[why] = result.skipped_by.get(why, 0) + 1
            continue
        if resolve_paths:
            for item in sample.media:
                if not item.is_remote():
                    item.path = str(item.resolve(base_dir))
        result.samples.append(sample)
        result.locations.append(checked.location)
    result.record_format = checker.record_format
    label = path if chosen is None or split_spec(path)[1] else f"{path}:{chosen}"  # the split read named
    if result.total == 0:
        raise DataError(no_records_message(label))
    if file_fmt == "jsonl":  # numbered as _iter_jsonl numbers them (FILE:N), blank lines included
        result.lines = 0
        for part in parts:
            with open(part.path, "rb") as fh:
                result.lines += sum(1 for _ in fh)
    if result.problems and on_bad_sample == "raise":
        shown = "\n".join(f"  {p}" for p in result.problems)
        raise DataError(f"{result.skipped} bad record(s) of {result.total} in {label}:\n{shown}\n"
                        f"{numbering_note(result.problems)}"
                        f"fix them, or {skip_hint} to load the good records and skip these")
    return result


NO_RECORDS = ("has no records (an empty file, only blank lines, an empty list or table); give a file with at "
              "least one record")
"""What a data file with no records is told, after its path."""


def no_records_message(path: str | Path) -> str:
    return f"{path} {NO_RECORDS}"


SKIP_KINDS = {"json": "broken JSON", "fields": "bad fields", "duplicate": "duplicate id",
              "media": "bad media"}
"""Why a record is skipped, as :attr:`LoadResult.skipped_by` counts it, and how reports name it."""


def skip_kind(problems: list[Problem]) -> str:
    """The one reason a record with ``problems`` counts as skipped for (a key of :data:`SKIP_KINDS`): a line
    that cannot be read, else a bad field (any non-media problem), else a duplicate id, else bad media."""
    kinds = {p.kind for p in problems}
    if "json" in kinds:
        return "json"
    if kinds - {"media", "duplicate"} or not kinds:
        return "fields"
    return "duplicate" if "duplicate" in kinds else "media"


def numbering_note(problems: list[Problem]) -> str:
    """A line saying how the places in ``problems`` count (empty when they are all JSONL lines)."""
    if any(p.unit == "record" and p.line is not None for p in problems):
        return ("(FILE:record N is the record's 0-based index in the JSON list, Parquet table or datasets "
                "folder; FILE:N is the 1-based line of a JSONL file)\n")
    return ""


def _id_of(record: Mapping[str, Any]) -> str | None:
    for key in ("id", "problem_id"):
        if record.get(key) is not None:
            return str(record[key])
    return None


def write_jsonl(path: str | Path, samples: list[Sample] | list[dict[str, Any]]) -> Path:
    """Write samples (or native dicts) as JSONL, one per line, keys in schema order (byte-stable)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "w", encoding="utf-8", newline="\n") as fh:
        for s in samples:
            d = s.to_dict() if isinstance(s, Sample) else s
            fh.write(json.dumps(d, ensure_ascii=False) + "\n")
    return path
