"""Load sample records from JSONL, JSON, Parquet, or a ``datasets.save_to_disk`` folder.

>>> result = load_samples("data/train.jsonl", on_bad_sample="skip")
>>> len(result.samples), result.skipped, [str(p) for p in result.problems]

Every bad record becomes a :class:`~data_pipelines.schema.Problem` at its place in the file: the 1-based
line for JSONL (``file:12: reason``), the 0-based record index for JSON, Parquet and ``datasets`` folders
(``file:record 3: reason``). A broken JSON line is a problem at that line, never a crash.
``on_bad_sample="raise"`` raises :class:`~mmrl_common.errors.DataError` listing them; ``"skip"`` keeps every
good record and counts the skipped ones.

Record formats (our own, Video-R1, EasyR1, see :mod:`data_pipelines.importers`) are detected from the
first record, or chosen with ``fmt`` (``"video-r1"``); ``fmt`` also accepts a file format (``"jsonl"``,
``"json"``, ``"parquet"``, ``"hf"``), or both joined by ``+`` (``"video-r1+json"``).
"""

from __future__ import annotations

import json
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

FILE_FORMATS = ("jsonl", "json", "parquet", "hf")
_EXT_FORMATS = {".jsonl": "jsonl", ".ndjson": "jsonl", ".json": "json", ".parquet": "parquet", ".pq": "parquet"}


@dataclass
class RawRecord:
    """One record as read from a file, before conversion. ``error`` is set when it could not be read."""

    line: int | None
    unit: str  # "line" (1-based JSONL line) or "record" (0-based index)
    data: Any = None
    error: str | None = None


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

    @property
    def blank_lines(self) -> int:
        """Blank lines of a JSONL file (read and passed over; no record)."""
        return 0 if self.lines is None else self.lines - self.total

    def __len__(self) -> int:
        return len(self.samples)

    def __iter__(self) -> Iterator[Sample]:
        return iter(self.samples)

    def summary(self) -> str:
        s = f"{self.path}: {len(self.samples)} of {self.total} records loaded ({self.record_format} records, " \
            f"{self.file_format} file)"
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
    if path.is_dir():
        if (path / "dataset_info.json").exists() or (path / "dataset_dict.json").exists() \
                or (path / "state.json").exists():
            return "hf"
        raise DataError(f"{path} is a folder but not a `datasets.save_to_disk` folder (no dataset_info.json "
                        "or dataset_dict.json); give a .jsonl/.json/.parquet file or such a folder")
    fmt = _EXT_FORMATS.get(path.suffix.lower())
    if fmt is None:
        raise DataError(f"{path}: cannot tell the format from the extension {path.suffix!r}; "
                        f"pass fmt= / --format with one of {', '.join(FILE_FORMATS)}")
    return fmt


def iter_raw_records(path: Path, file_fmt: str, *, split: str | None = None) -> Iterator[RawRecord]:
    """Yield the records of a file one by one, with their line (JSONL) or index (others)."""
    if file_fmt == "jsonl":
        yield from _iter_jsonl(path)
    elif file_fmt == "json":
        yield from _iter_json(path)
    elif file_fmt == "parquet":
        yield from _iter_parquet(path)
    elif file_fmt == "hf":
        yield from _iter_hf(path, split)
    else:
        raise DataError(f"unknown file format {file_fmt!r}; use one of {', '.join(FILE_FORMATS)}")


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
            data = json.load(fh)
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


def _iter_parquet(path: Path) -> Iterator[RawRecord]:
    import pyarrow.parquet as pq

    try:
        pf = pq.ParquetFile(path)
    except Exception as exc:  # pyarrow raises several types for unreadable files
        raise DataError(f"{path}: cannot read Parquet file ({exc}); is it complete and really Parquet?") from exc
    i = 0
    for batch in pf.iter_batches(batch_size=1024):
        for rec in batch.to_pylist():
            yield RawRecord(i, "record", rec)
            i += 1


def _iter_hf(path: Path, split: str | None) -> Iterator[RawRecord]:
    import datasets

    try:
        ds = datasets.load_from_disk(str(path))
    except Exception as exc:  # datasets raises FileNotFoundError / ValueError variants
        raise DataError(f"{path}: cannot load with datasets.load_from_disk ({exc})") from exc
    if isinstance(ds, datasets.DatasetDict):
        names = list(ds)
        if split is None and len(names) == 1:
            split = names[0]
        if split not in ds:
            raise DataError(f"{path} holds splits {', '.join(names)}; choose one with split= (or give "
                            f"the split's folder, e.g. {path / names[0]})")
        ds = ds[split]
    for i, rec in enumerate(ds):
        yield RawRecord(i, "record", rec)


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


class RecordChecker:
    """Turns raw records into samples with their problems: importer, schema checks, duplicate ids and
    (optionally) media checks. Shared by :func:`load_samples` and ``mmrl data validate``."""

    def __init__(self, path: Path, *, record_format: str = "auto", columns: Mapping[str, str] | None = None,
                 base_dir: Path | None = None, media: str | None = None, progress: bool = False,
                 max_question_chars: int | None = DEFAULT_MAX_QUESTION_CHARS,
                 cap_hint: str = MAX_QUESTION_HINT) -> None:
        self.path = path
        self.max_question_chars = max_question_chars  # None: no cap
        self.cap_hint = cap_hint
        self.progress = progress  # a progress bar while media files are checked
        self.record_format = record_format
        self.columns = columns
        self.base_dir = base_dir
        self.media = media  # None, "exists" or "decode"
        self.seen_ids: dict[str, str] = {}
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

        file = str(self.path)
        good = [c for c in checked if c.sample is not None]
        reasons = check_samples_media([c.sample for c in good], self.base_dir, decode=(self.media == "decode"),
                                      cache=self.media_cache, progress=self.progress)
        for c, found in zip(good, reasons):
            c.problems.extend(Problem(file, c.line, c.sample.id, "media", r, c.unit) for r in found)

    def check(self, raw: RawRecord) -> CheckedRecord:
        file = str(self.path)
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
        if sample is not None:
            if sample.id in self.seen_ids:
                problems.append(Problem(file, raw.line, sample.id, "duplicate",
                                        f"duplicate id (first used at {self.seen_ids[sample.id]}); "
                                        "ids must be unique", raw.unit))
            else:
                self.seen_ids[sample.id] = where
        return CheckedRecord(raw.line, raw.unit, where, sample, problems)


def locate_dataset(path: str | Path, fmt: str = "auto", media_root: str | Path | None = None
                   ) -> tuple[Path, str, str, Path]:
    """``(path, file format, record format, media base folder)`` of a dataset; DataError if it is missing."""
    path = Path(path)
    if not path.exists():
        raise DataError(f"dataset not found: {path}")
    file_fmt, rec_fmt = parse_fmt(fmt)
    if file_fmt == "auto":
        file_fmt = detect_file_format(path)
    base_dir = Path(media_root) if media_root is not None else (path if path.is_dir() else path.parent)
    return path, file_fmt, rec_fmt, base_dir


def load_samples(
    path: str | Path,
    *,
    fmt: str = "auto",
    columns: Mapping[str, str] | None = None,
    media_root: str | Path | None = None,
    on_bad_sample: str = "raise",
    check_media: bool | str = False,
    split: str | None = None,
    resolve_paths: bool = True,
    progress: bool = False,
    skip_hint: str = "pass on_bad_sample='skip'",
    max_question_chars: int | None = DEFAULT_MAX_QUESTION_CHARS,
) -> LoadResult:
    """Read every record of ``path`` into :class:`Sample` objects.

    ``columns`` maps source column names to record fields (``{"query": "question", "level":
    "meta.difficulty"}``). Relative media paths resolve against ``media_root`` if given, else the dataset
    file's folder (the folder itself for a ``datasets`` folder); with ``resolve_paths`` the loaded samples
    carry the resolved paths. ``check_media``: ``False``; ``True``/``"exists"`` (each file exists and is
    not empty); ``"decode"`` (each file is opened and decoded, as ``mmrl data validate`` does).
    ``split`` picks a split of a ``DatasetDict`` folder. Media files are checked all at once, in parallel,
    and the verdicts cached (:func:`~data_pipelines.media_check.check_files`); ``progress`` shows a bar.
    The error of ``on_bad_sample="raise"`` lists every problem; ``skip_hint`` is how its last line tells
    the caller to skip them instead (``mmrl train`` says ``data.on_bad_sample=skip``). A record whose question
    and options are longer than ``max_question_chars`` characters (None: no cap) is a bad record. A file with
    no records at all raises :class:`DataError` ("FILE has no records"), whatever ``on_bad_sample`` says.
    """
    if on_bad_sample not in ("raise", "skip"):
        raise ValueError(f"on_bad_sample must be 'raise' or 'skip', got {on_bad_sample!r}")
    path, file_fmt, rec_fmt, base_dir = locate_dataset(path, fmt, media_root)
    result = LoadResult(path=path, file_format=file_fmt, record_format=rec_fmt, base_dir=base_dir)
    mode = "exists" if check_media is True else (check_media or None)
    checker = RecordChecker(path, record_format=rec_fmt, columns=columns, base_dir=base_dir, media=mode,
                            progress=progress, max_question_chars=max_question_chars)
    for checked in checker.run(iter_raw_records(path, file_fmt, split=split)):
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
    if result.total == 0:
        raise DataError(no_records_message(path))
    if file_fmt == "jsonl":  # numbered as _iter_jsonl numbers them (FILE:N), blank lines included
        with open(path, "rb") as fh:
            result.lines = sum(1 for _ in fh)
    if result.problems and on_bad_sample == "raise":
        shown = "\n".join(f"  {p}" for p in result.problems)
        raise DataError(f"{result.skipped} bad record(s) of {result.total} in {path}:\n{shown}\n"
                        f"{numbering_note(result.problems)}"
                        f"fix them, or {skip_hint} to load the good records and skip these")
    return result


NO_RECORDS = ("has no records (an empty file, only blank lines, an empty list or table); give a file with at "
              "least one record")
"""What a data file with no records is told, after its path."""


def no_records_message(path: Path) -> str:
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
