"""The sample record: one question with its media, whatever the source format.

A :class:`Sample` is what every loader, importer, sampler and reward sees::

    Sample(id="toy-color-train-0001", problem_type="multiple_choice",
           question="What colour is the moving object?", options=["red", "green", "blue", "yellow"],
           answer="B", media=[MediaItem("video", "media/train/color/0001.mp4", {"nframes": 8})],
           meta={"task": "color", "difficulty": "easy", "source": "toy"})

Validation never raises: :func:`validate_sample` returns a list of reasons (plain strings that say what is
wrong and how to fix it), and :func:`check_record` turns a raw dict into a ``Sample`` plus a list of
:class:`Problem` records that carry the file and line. Problem types live in a registry
(:func:`register_problem_type`) so methods can add their own answer checks.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from mmrl_common.errors import DataError
from mmrl_common.registry import Registry

MEDIA_TYPES = ("image", "video")
IMAGE_EXTS = {".png", ".jpg", ".jpeg", ".bmp", ".gif", ".webp", ".tif", ".tiff", ".dcm"}
VIDEO_EXTS = {".mp4", ".avi", ".mov", ".mkv", ".webm", ".m4v", ".mpeg", ".mpg", ".flv"}
# Keys allowed in MediaItem.sampling: the ones of the design plus the ones qwen-vl-utils understands.
SAMPLING_KEYS = {
    "fps", "nframes", "start", "end", "max_pixels", "min_pixels", "total_pixels",
    "min_frames", "max_frames", "resized_height", "resized_width",
}
RECORD_FIELDS = ("id", "problem_type", "question", "options", "answer", "media", "meta")


# --------------------------------------------------------------------------------------------- records
@dataclass
class MediaItem:
    """One image or video of a sample. ``path`` is relative to the dataset file's folder (or the
    ``media_root`` the user gives) unless absolute or a URL; ``sampling`` holds optional frame-sampling
    hints (``fps``, ``nframes``, ``start``, ``end`` in seconds, ``max_pixels``)."""

    type: str
    path: str
    sampling: dict[str, Any] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {"type": self.type, "path": self.path}
        if self.sampling:
            out["sampling"] = dict(self.sampling)
        return out

    @classmethod
    def from_dict(cls, data: Mapping[str, Any] | str) -> MediaItem:
        """Build from ``{"type", "path", "sampling"?}``, or from a bare path string (type from the
        extension), or from the qwen-vl-utils shape ``{"video": path, "fps": 2}``."""
        if isinstance(data, str):
            return cls(type=guess_media_type(data) or "", path=data)
        if isinstance(data, (list, tuple)) and data and all(isinstance(f, str) for f in data):
            raise DataError(frames_refusal(data))
        if not isinstance(data, Mapping):
            raise DataError(f"media item must be an object with 'type' and 'path', got {type(data).__name__}")
        data = dict(data)
        for key in ("path", *MEDIA_TYPES):
            if isinstance(data.get(key), (list, tuple)) and data[key] and all(isinstance(f, str) for f in data[key]):
                raise DataError(frames_refusal(data[key]))
        if "path" not in data:
            for kind in MEDIA_TYPES:
                if isinstance(data.get(kind), str):
                    path = data.pop(kind)
                    data.pop("type", None)
                    sampling = {k: data.pop(k) for k in list(data) if k in SAMPLING_KEYS}
                    sampling.update(sampling_dict(data.pop("sampling", None)))
                    return cls(type=kind, path=path, sampling={k: v for k, v in sampling.items() if v is not None})
        path = data.get("path")
        kind = data.get("type") or (guess_media_type(path) if isinstance(path, str) else None) or ""
        return cls(type=str(kind), path="" if path is None else str(path), sampling=sampling_dict(data.get("sampling")))

    def is_remote(self) -> bool:
        return "://" in self.path

    def resolve(self, base_dir: str | Path | None) -> Path:
        """The file this item points to: absolute paths as they are, relative ones under ``base_dir``."""
        p = Path(self.path).expanduser()
        if p.is_absolute() or base_dir is None or self.is_remote():
            return p
        return Path(base_dir) / p


def frames_refusal(files: list[str] | tuple[str, ...]) -> str:
    """What a media item given as a list of files (a video as its frames, qwen-vl-utils' shape) is told: mmrl
    reads each video from one file."""
    shown = ", ".join(repr(f) for f in list(files)[:2]) + (", ..." if len(files) > 2 else "")
    return (f"a list of {len(files)} files ({shown}) as one item: a video given as its frame files is not read; "
            "join the frames into one video file (ffmpeg -framerate 2 -i frame_%03d.png clip.mp4) and give its "
            "path, or give each frame as an image item")


def sampling_dict(value: Any) -> dict[str, Any]:
    """A media item's ``sampling`` as a dict: null, an empty text and null values (a Parquet or ``datasets``
    column gives every row every key, null where a row has none) mean "not given"; a JSON text is decoded;
    anything else that is not an object raises :class:`DataError`."""
    shape = "an object such as {\"fps\": 2} or {\"start\": 3, \"end\": 9}"
    if value is None:
        return {}
    if isinstance(value, str):
        try:
            value = json.loads(value) if value.strip() else {}
        except ValueError:
            raise DataError(f"'sampling' is text that is not JSON ({_short(value)}); give {shape}") from None
    if not isinstance(value, Mapping):
        raise DataError(f"'sampling' must be {shape}, got {type(value).__name__} {_short(value)}")
    out = {str(k): v for k, v in value.items() if v is not None}
    for key in _WHOLE_KEYS:  # 8.0 (a float column) is 8: a frame count must be an int for the samplers
        if isinstance(out.get(key), float) and out[key].is_integer():
            out[key] = int(out[key])
    return out


@dataclass
class Sample:
    """One question with its answer and media. See the module docstring and DESIGN.md section 4."""

    id: str
    problem_type: str
    question: str
    answer: Any
    options: list[str] | None = None
    media: list[MediaItem] = field(default_factory=list)
    meta: dict[str, Any] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        """A JSON-ready dict with the fields in a fixed order (so written files are byte-stable)."""
        return {
            "id": self.id,
            "problem_type": self.problem_type,
            "question": self.question,
            "options": None if self.options is None else list(self.options),
            "answer": list(self.answer) if isinstance(self.answer, tuple) else self.answer,
            "media": [m.to_dict() for m in self.media],
            "meta": dict(self.meta),
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Sample:
        """Build a sample from a dict; raises :class:`DataError` listing every problem found."""
        sample, reasons = parse_record(data)
        if sample is None or reasons:
            sid = data.get("id") if isinstance(data, Mapping) else None
            head = f"sample {sid!r}: " if sid is not None else ""
            raise DataError(head + "; ".join(reasons))
        return sample

    def validate(self) -> list[str]:
        """Reasons this sample is invalid (empty when it is fine)."""
        return validate_sample(self)

    @property
    def videos(self) -> list[MediaItem]:
        return [m for m in self.media if m.type == "video"]

    @property
    def images(self) -> list[MediaItem]:
        return [m for m in self.media if m.type == "image"]

    def option_letters(self) -> list[str]:
        return option_letters(len(self.options or []))

    def answer_text(self) -> str:
        """For multiple choice, the text of the correct option; of a list of acceptable answers, the first;
        otherwise the answer as a string."""
        if self.problem_type == "multiple_choice" and self.options and isinstance(self.answer, str):
            idx = letter_index(self.answer)
            if idx is not None and idx < len(self.options):
                return self.options[idx]
        if isinstance(self.answer, (list, tuple)) and self.answer and self.problem_type in TEXT_ANSWER_TYPES:
            return str(self.answer[0])
        return str(self.answer)


@dataclass
class Problem:
    """One thing wrong with one record. ``str(problem)`` is ``FILE:LINE: reason``.

    ``unit`` says what ``line`` counts: ``"line"`` (1-based line of a JSONL file) or ``"record"``
    (0-based index of the record in a JSON list, Parquet table or ``datasets`` folder), formatted as
    ``FILE:record N: reason``.
    """

    file: str
    line: int | None
    sample_id: str | None
    kind: str
    reason: str
    unit: str = "line"

    def location(self) -> str:
        if self.line is None:
            return self.file
        if self.unit == "record":
            return f"{self.file}:record {self.line}"
        return f"{self.file}:{self.line}"

    def __str__(self) -> str:
        who = f"sample {self.sample_id!r}: " if self.sample_id not in (None, "") else ""
        return f"{self.location()}: {who}{self.reason}"


# --------------------------------------------------------------------------------------- problem types
AnswerCheck = Callable[[Sample], list[str]]


@dataclass
class ProblemType:
    name: str
    check: AnswerCheck
    description: str = ""


def _alias_key(name: str) -> str:
    return "".join(ch for ch in str(name).lower() if ch.isalnum())


PROBLEM_TYPES: Registry[ProblemType] = Registry("problem type", "problem_type", duplicates="error",
                                                normalize=_alias_key)
"""Every problem type by name; aliases (other spellings) resolve to the name, ignoring case and punctuation."""


def register_problem_type(
    name: str,
    check: AnswerCheck | None = None,
    *,
    description: str = "",
    aliases: tuple[str, ...] = (),
    overwrite: bool = False,
) -> None:
    """Add a problem type. ``check(sample)`` returns reasons the answer/options are invalid (may be
    ``None``: any answer is accepted). ``aliases`` are other spellings that normalise to ``name``."""
    if not name or not isinstance(name, str):
        raise ValueError("problem type name must be a non-empty string")
    PROBLEM_TYPES.add(name, ProblemType(name, check or (lambda s: []), description), aliases=aliases,
                      overwrite=overwrite)


def problem_types() -> list[str]:
    """The registered problem type names."""
    return PROBLEM_TYPES.names()


def normalize_problem_type(name: str) -> str:
    """Canonical name for a spelling such as ``"multiple choice"`` or ``"Multiple-Choice"``; unknown
    names come back unchanged (validation then reports them)."""
    return PROBLEM_TYPES.canonical(name) or name


def option_letter(i: int) -> str:
    """0 -> ``"A"``, 1 -> ``"B"``: the letter of the option at index ``i``."""
    if not 0 <= i < 26:
        raise ValueError(f"option index {i} has no letter (A-Z: at most 26 options)")
    return chr(ord("A") + i)


def option_letters(n: int) -> list[str]:
    return [option_letter(i) for i in range(n)]


def letter_index(letter: str) -> int | None:
    """``"B"`` -> 1; None when ``letter`` is not a single capital letter."""
    s = str(letter).strip()
    if len(s) == 1 and "A" <= s <= "Z":
        return ord(s) - ord("A")
    return None


_OPTION_LABEL = re.compile(r"^\s*\(?([A-Z])[.):]\s*(.*)$", re.DOTALL)
MAX_OPTIONS = 26
"""Options are lettered A to Z."""


def split_option(text: str) -> tuple[str | None, str]:
    """``"A. red"`` -> (``"A"``, ``"red"``); ``"red"`` -> (None, ``"red"``)."""
    m = _OPTION_LABEL.match(text)
    return (m.group(1), m.group(2).strip()) if m else (None, text.strip())


def strip_option_labels(options: list[str]) -> list[str]:
    """``["A. red", "B) green", "(C) blue"]`` -> ``["red", "green", "blue"]``: the prompt letters the options
    itself, so a label that repeats an option's own letter would show twice ("A. A. red"). Labels go only when
    every option carries its own letter (``"A. Lincoln"`` beside an unlabelled option is text) and has text
    after it; otherwise the options come back as they are."""
    if len(options) > MAX_OPTIONS:
        return list(options)
    bodies = []
    for i, text in enumerate(options):
        letter, body = split_option(text)
        if letter != option_letter(i) or not body:
            return list(options)
        bodies.append(body)
    return bodies


def _check_options(options: list[str]) -> list[str]:
    """Reasons a record's options cannot be shown as lettered choices: more than 26, an empty one, repeats."""
    if len(options) > MAX_OPTIONS:
        return [(f"{len(options)} options, but options are lettered A to Z: at most {MAX_OPTIONS}; remove some "
                 "(or make the question 'open')")]
    reasons = [f"option {option_letter(i)} is empty; give its text or remove it"
               for i, text in enumerate(options) if not text.strip()]
    groups: dict[str, list[int]] = {}
    for i, text in enumerate(options):
        if text.strip():
            groups.setdefault(" ".join(text.split()).casefold(), []).append(i)
    for same in (g for g in groups.values() if len(g) > 1):
        letters = [option_letter(i) for i in same]
        said = ", ".join(letters[:-1]) + " and " + letters[-1]
        reasons.append(f"options {said} are the same text ({options[same[0]].strip()!r}); every option must differ: "
                       "reword or remove the repeat")
    return reasons


def _check_multiple_choice(s: Sample) -> list[str]:
    if not s.options or len(s.options) < 2:
        return [("multiple_choice needs 'options': a list of at least 2 option texts; add them, or change "
                "problem_type (e.g. to 'open')")]
    if len(s.options) > MAX_OPTIONS:
        return []  # said by _check_options
    letters = option_letters(len(s.options))
    allowed = ", ".join(letters)
    if not isinstance(s.answer, str):
        return [f"multiple_choice answer must be an option letter ({allowed}), got {s.answer!r}"]
    idx = letter_index(s.answer)
    if idx is None:
        hint = ""
        if s.answer.strip() in s.options:
            hint = f" (it matches option {letters[s.options.index(s.answer.strip())]}; use that letter)"
        return [f"multiple_choice answer {s.answer!r} is not an option letter; use one of {allowed}{hint}"]
    if idx >= len(s.options):
        return [(f"answer letter {s.answer.strip()!r} is outside the options: there are {len(s.options)} "
                f"options, so the answer must be one of {allowed}; fix the answer or add the missing option")]
    return []


TEXT_ANSWER_TYPES = ("open", "free_form", "ocr")
"""The problem types whose answer may be a list of acceptable answers (the accuracy reward takes the best)."""


def _check_yes_no(s: Sample) -> list[str]:
    if not isinstance(s.answer, str) or s.answer.strip().lower() not in ("yes", "no"):
        return [f"yes_no answer must be 'yes' or 'no', got {s.answer!r}"]
    return []


def parse_number(value: Any) -> float | None:
    """``3``, ``"3.5"``, ``" 1e3 "``, ``"1,000"`` -> float; None when it is not a finite number."""
    if isinstance(value, bool):
        return None
    if isinstance(value, (int, float)):
        x = float(value)
    elif isinstance(value, str):
        try:
            x = float(value.strip().replace(",", ""))
        except ValueError:
            return None
    else:
        return None
    return x if math.isfinite(x) else None


def _check_numeric(s: Sample) -> list[str]:
    from rewards.answers import latex_number  # \frac{1}{2}, \sqrt{2}: what the accuracy reward reads

    if parse_number(s.answer) is None and latex_number(s.answer) is None:
        return [f"{s.problem_type} answer must be a finite number (e.g. 3 or \"2.5\"), got {s.answer!r}"]
    return []


def _check_text(s: Sample) -> list[str]:
    if isinstance(s.answer, (list, tuple)):  # several acceptable answers: the reward scores the best match
        bad = [a for a in s.answer if not isinstance(a, (str, int, float)) or isinstance(a, bool)
               or (isinstance(a, str) and not a.strip())]
        if not s.answer or bad:
            return [(f"{s.problem_type} answer list must hold one or more non-empty texts (any of them is right), "
                    f"got {_short(s.answer)}")]
        return []
    if s.answer is None or (isinstance(s.answer, str) and not s.answer.strip()):
        return [f"{s.problem_type} answer must be a non-empty reference text"]
    if not isinstance(s.answer, (str, int, float)):
        return [(f"{s.problem_type} answer must be text (or a list of texts, any of them right), got "
                f"{type(s.answer).__name__}")]
    return []


def parse_span(value: Any) -> tuple[float, float] | None:
    """``[1.5, 3]`` or ``"[1.5, 3]"`` -> (1.5, 3.0); None when it is not a pair of numbers."""
    if isinstance(value, str):
        try:
            value = json.loads(value)
        except ValueError:
            return None
    if not isinstance(value, (list, tuple)) or len(value) != 2:
        return None
    a, b = parse_number(value[0]), parse_number(value[1])
    if a is None or b is None:
        return None
    return a, b


def _check_grounding(s: Sample) -> list[str]:
    span = parse_span(s.answer)
    if span is None:
        return [f"temporal_grounding answer must be [start, end] in seconds (two numbers), got {s.answer!r}"]
    start, end = span
    if start < 0:
        return [f"temporal_grounding answer {s.answer!r}: start must be >= 0 seconds"]
    if start > end:
        return [f"temporal_grounding answer {s.answer!r}: start is after end; write it as [start, end]"]
    return []


register_problem_type("multiple_choice", _check_multiple_choice,
                      description="answer is an option letter A.. within the options",
                      aliases=("multiple choice", "mc", "multiple-choice", "choice", "mcq"))
register_problem_type("yes_no", _check_yes_no, description="answer is yes or no",
                      aliases=("yes/no", "yesno", "boolean", "closed"))
register_problem_type("numeric", _check_numeric, description="answer is a number",
                      aliases=("numerical", "number", "count"))
register_problem_type("regression", _check_numeric,
                      description="answer is a number, scored by relative error (Video-R1's regression)")
register_problem_type("open", _check_text, description="short reference answer (synonyms in meta)",
                      aliases=("open-ended", "short answer", "vqa"))
register_problem_type("temporal_grounding", _check_grounding,
                      description="answer is [start, end] in seconds",
                      aliases=("grounding", "temporal grounding", "tg"))
register_problem_type("free_form", _check_text, description="long free text, compared by similarity",
                      aliases=("free-form", "freeform", "free form"))
register_problem_type("ocr", _check_text, description="text read from the media, compared word by word (1 - WER)",
                      aliases=("transcription",))


# ---------------------------------------------------------------------------------- parse and validate
def guess_media_type(path: str | None) -> str | None:
    if not path:
        return None
    ext = Path(path.split("?")[0]).suffix.lower()
    if ext in IMAGE_EXTS:
        return "image"
    if ext in VIDEO_EXTS:
        return "video"
    return None


def maybe_json(value: Any) -> Any:
    """Parquet/`datasets` columns sometimes hold lists or dicts as JSON strings; decode those."""
    if isinstance(value, str) and value.strip()[:1] in ("[", "{"):
        try:
            return json.loads(value)
        except ValueError:
            return value
    return value


def _short(value: Any, limit: int = 60) -> str:
    text = repr(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."


def question_chars(question: str, options: list[str] | None) -> int:
    """The length of a record's prompt text: the question and the options' texts, in characters."""
    return len(question) + sum(len(o) for o in options or [])


def parse_record(data: Any) -> tuple[Sample | None, list[str]]:
    """Raw dict -> (Sample or None, reasons). Structural problems (missing or mistyped fields) and
    answer problems are both reported; the Sample is built whenever the fields have usable types."""
    if not isinstance(data, Mapping):
        return None, [(f"record must be a JSON object with fields {', '.join(RECORD_FIELDS)}; "
                      f"got {type(data).__name__}")]
    reasons: list[str] = []
    missing = [k for k in ("id", "problem_type", "question", "answer") if k not in data or data[k] is None]
    if missing:
        reasons.append(f"missing field(s) {', '.join(missing)}; every record needs id, problem_type, question "
                       "and answer (map differently named fields with data.columns={source: field} in a run, "
                       "--columns '{source: field}' in mmrl data validate / inspect)")
    sid = data.get("id")
    if sid is not None and not isinstance(sid, (str, int)):
        reasons.append(f"'id' must be a string, got {type(sid).__name__}")
    question = data.get("question")
    if question is not None and not isinstance(question, str):  # str() of a list would put its repr in the prompt
        reasons.append(f"'question' must be a string, got {type(question).__name__} ({_short(question)}); "
                       "join the parts into one text")
    options = maybe_json(data.get("options"))
    if options is not None and not (isinstance(options, (list, tuple)) and all(isinstance(o, str) for o in options)):
        reasons.append(f"'options' must be a list of strings or null, got {options!r}")
        options = None
    media_raw = maybe_json(data.get("media")) or []
    if isinstance(media_raw, (str, Mapping)):
        media_raw = [media_raw]
    media: list[MediaItem] = []
    if not isinstance(media_raw, (list, tuple)):
        reasons.append(f"'media' must be a list of {{type, path}} items, got {type(media_raw).__name__}")
    else:
        for i, raw in enumerate(media_raw):
            try:
                media.append(MediaItem.from_dict(raw))
            except (DataError, ValueError) as exc:
                reasons.append(f"media[{i}]: {exc}")
    meta = maybe_json(data.get("meta")) or {}
    if not isinstance(meta, Mapping):
        reasons.append(f"'meta' must be an object, got {type(meta).__name__}")
        meta = {}
    meta = dict(meta)
    for key, value in data.items():  # extra columns are kept in meta, never dropped silently
        if key not in RECORD_FIELDS and key not in meta:
            meta[key] = value
    if missing or not isinstance(question, str):
        return None, reasons
    ptype = normalize_problem_type(str(data["problem_type"]))
    answer = data["answer"]
    if ptype == "temporal_grounding":
        span = parse_span(answer)
        answer = list(span) if span is not None else answer
    sample = Sample(id=str(sid), problem_type=ptype, question=str(data["question"]),
                    answer=answer, options=strip_option_labels(list(options)) if options is not None else None,
                    media=media, meta=meta)
    reasons.extend(validate_sample(sample))
    return sample, reasons


def validate_sample(sample: Sample) -> list[str]:
    """Reasons ``sample`` is invalid: id, question, known problem type and its answer check, media items."""
    reasons: list[str] = []
    if not str(sample.id).strip():
        reasons.append("'id' is empty; give every record a unique id")
    if not isinstance(sample.question, str) or not sample.question.strip():
        reasons.append("'question' is empty; every record needs the question text")
    if sample.options is not None:
        reasons.extend(_check_options(sample.options))
    ptype = PROBLEM_TYPES.find(sample.problem_type)
    if ptype is None or ptype.name != sample.problem_type:
        reasons.append(f"unknown problem_type {sample.problem_type!r}; known types are "
                       f"{', '.join(problem_types())} (register new ones with "
                       "data_pipelines.schema.register_problem_type)")
    else:
        reasons.extend(ptype.check(sample))
    for i, item in enumerate(sample.media):
        reasons.extend(f"media[{i}]: {r}" for r in check_media_item(item))
    return reasons


_WHOLE_KEYS = ("nframes", "min_frames", "max_frames", "min_pixels", "max_pixels", "total_pixels",
               "resized_height", "resized_width")
"""Sampling keys whose value is a whole number >= 1 (``fps`` is any number > 0; ``start``/``end`` seconds >= 0)."""


def _sampling_value_problem(key: str, value: Any) -> str | None:
    """Why ``sampling.<key> = value`` cannot be used (None when it can): the frame sampler and the pixel budget
    take numbers only, ``fps`` above 0, counts and pixel budgets whole and at least 1, seconds at least 0."""
    if isinstance(value, str) and parse_number(value) is not None:
        return f"sampling {key}={value!r} is text; write the number without quotes ({key}: {value.strip()})"
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        return f"sampling {key}={_short(value)} must be a number"
    if key == "fps":
        return None if value > 0 else f"sampling fps={value!r} must be above 0 (frames sampled per second)"
    if key in ("start", "end"):
        return None if value >= 0 else f"sampling {key}={value!r} must be 0 or more seconds"
    if key in _WHOLE_KEYS and (value < 1 or value != int(value)):
        return f"sampling {key}={value!r} must be a whole number of at least 1"
    return None


def check_media_item(item: MediaItem) -> list[str]:
    """Reasons a media item is unusable as written: its type, path and sampling keys, values and their pairs
    (what needs the file itself, :mod:`data_pipelines.media_check` checks)."""
    reasons = []
    if not item.type:
        reasons.append(f"no type, and the path's extension does not tell ({_short(item.path)}); give type 'image' or "
                       "'video'")
    elif item.type not in MEDIA_TYPES:
        reasons.append(f"type must be 'image' or 'video', got {item.type!r}")
    if not item.path:
        reasons.append("'path' is empty; give the file path relative to the dataset file or media_root")
    elif item.is_remote():
        reasons.append(f"path {_short(item.path)} is a URL; mmrl reads local files only (it downloads nothing): "
                       "download the file and give its path")
    sampling = item.sampling
    usable: dict[str, float] = {}
    for key, value in sampling.items():
        if key not in SAMPLING_KEYS:
            reasons.append(f"unknown sampling key {key!r}; allowed: {', '.join(sorted(SAMPLING_KEYS))}")
        elif value is not None:
            why = _sampling_value_problem(key, value)
            if why:
                reasons.append(why)
            else:
                usable[key] = value
    start, end = usable.get("start"), usable.get("end")
    if start is not None and end is not None and start >= end:
        how = f"is after end={end:g} s" if start > end else "equals end"
        reasons.append(f"sampling start={start:g} s {how}: the window holds no video; give start < end")
    if "fps" in usable and "nframes" in usable:
        reasons.append(f"sampling gives both fps={usable['fps']:g} and nframes={usable['nframes']:g}; give one "
                       "(fps: frames per second, nframes: a fixed number of frames)")
    for lo, hi in (("min_frames", "max_frames"), ("min_pixels", "max_pixels")):
        if lo in usable and hi in usable and usable[lo] > usable[hi]:
            reasons.append(f"sampling {lo}={usable[lo]:g} is above {hi}={usable[hi]:g}; lower {lo} or raise {hi}")
    if ("resized_height" in sampling) != ("resized_width" in sampling):
        given, other = ("resized_height", "resized_width") if "resized_height" in sampling else \
            ("resized_width", "resized_height")
        reasons.append(f"sampling gives {given} without {other}; a fixed frame size needs both (or neither)")
    return reasons


def check_record(
    data: Any,
    *,
    file: str | Path = "<memory>",
    line: int | None = None,
    unit: str = "line",
) -> tuple[Sample | None, list[Problem]]:
    """Like :func:`parse_record`, with each reason wrapped in a :class:`Problem` at ``file:line``."""
    sample, reasons = parse_record(data)
    sid = sample.id if sample is not None else (
        str(data.get("id")) if isinstance(data, Mapping) and data.get("id") is not None else None)
    problems = [Problem(str(file), line, sid, _kind_of(r), r, unit) for r in reasons]
    return sample, problems


def _kind_of(reason: str) -> str:
    if reason.startswith("unknown problem_type"):
        return "problem_type"
    if reason.startswith("media["):
        return "media"
    if reason.startswith(("missing field", "record must be")):
        return "structure"
    return "answer" if "answer" in reason or "options" in reason else "field"
