"""``mmrl data validate``: check every record and open every media file of a dataset.

Each problem prints as ``FILE:LINE: reason`` (``FILE:record N:`` for JSON/Parquet/``datasets``), then a
summary. Images are fully decoded; videos are opened and their first, middle and last frames decoded, and each
record's sampling window and frame counts are checked against its video (:mod:`data_pipelines.media_check`): a
record that passes is one a run with the default frame rule (qwen) can draw.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import TextIO

from .loaders import (
    DEFAULT_MAX_QUESTION_CHARS,
    NO_RECORDS,
    RecordChecker,
    iter_raw_records,
    locate_dataset,
    numbering_note,
)
from .schema import Problem

CAP_HINT = "raise the cap with --max-question-chars N (data.max_question_chars=N in the run)"


@dataclass
class ValidationReport:
    path: Path
    file_format: str
    record_format: str
    total: int = 0
    bad: int = 0
    problems: list[Problem] = field(default_factory=list)
    media_checked: int = 0
    media_bad: int = 0

    @property
    def ok(self) -> bool:
        return self.bad == 0 and not self.problems

    @property
    def good(self) -> int:
        return self.total - self.bad

    def summary(self) -> str:
        verdict = "OK" if self.ok else "FAILED"
        return (f"{verdict}: {self.path}: {self.total} records ({self.record_format} records, {self.file_format} "
                f"file), {self.good} good, {self.bad} bad, {len(self.problems)} problems; "
                f"{self.media_checked} media files checked, {self.media_bad} bad")


def validate_dataset(
    path: str | Path,
    *,
    media_root: str | Path | None = None,
    fmt: str = "auto",
    columns: dict[str, str] | None = None,
    check_media: bool = True,
    split: str | None = None,
    progress: bool = False,
    max_question_chars: int | None = DEFAULT_MAX_QUESTION_CHARS,
) -> ValidationReport:
    """Check every record of ``path`` (and, with ``check_media``, decode every media file); a record longer
    than ``max_question_chars`` (question and options) is bad, and a file with no records fails."""
    path, file_fmt, rec_fmt, base_dir = locate_dataset(path, fmt, media_root)
    checker = RecordChecker(path, record_format=rec_fmt, columns=columns, base_dir=base_dir,
                            media="decode" if check_media else None, progress=progress,
                            max_question_chars=max_question_chars, cap_hint=CAP_HINT)
    report = ValidationReport(path=path, file_format=file_fmt, record_format=rec_fmt)
    records = iter_raw_records(path, file_fmt, split=split)
    if progress:
        from tqdm import tqdm

        records = tqdm(records, desc=f"validate {path.name}", unit="rec", leave=False, file=sys.stderr)
    for checked in checker.run(records):
        report.total += 1
        if checked.problems or checked.sample is None:
            report.bad += 1
            report.problems.extend(checked.problems)
    report.record_format = checker.record_format
    if report.total == 0:
        report.problems.append(Problem(str(path), None, None, "structure", NO_RECORDS))
    report.media_checked = len(checker.media_cache)
    report.media_bad = sum(1 for r in checker.media_cache.values() if r)
    return report


def run_validate(
    path: str | Path,
    *,
    media_root: str | Path | None = None,
    fmt: str = "auto",
    columns: dict[str, str] | None = None,
    out: TextIO | None = None,
    progress: bool = False,
    max_question_chars: int | None = DEFAULT_MAX_QUESTION_CHARS,
) -> int:
    """Validate and print; returns the exit status (0 all good, 1 any bad record)."""
    out = out or sys.stdout
    report = validate_dataset(path, media_root=media_root, fmt=fmt, columns=columns, progress=progress,
                              max_question_chars=max_question_chars)
    for problem in report.problems:
        print(problem, file=out)
    print(numbering_note(report.problems) + report.summary(), file=out)
    return 0 if report.ok else 1
