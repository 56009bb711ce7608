"""Importers: records in other frameworks' formats -> native sample dicts (see :mod:`data_pipelines.schema`).

Built in:

* ``native``: our own schema (``id, problem_type, question, options, answer, media, meta``).
* ``video-r1``: Video-R1 JSON (``problem``, ``options`` like ``"A. foo"``, ``solution`` holding
  ``<answer>..</answer>``, ``problem_type`` in ``multiple choice | numerical | regression | OCR |
  free-form``, ``data_type`` image/video, ``path``).
* ``easyr1``: EasyR1 / verl style (``prompt`` or ``problem`` with ``<image>``/``<video>`` placeholders,
  ``answer``, ``images``, ``videos``). Multiple choice: the options are lines of the problem text (``A. red``,
  ``B. blue``..) and the answer names one (``B``, ``(B)``, ``B. blue`` or ``blue``): they become ``options``
  and the answer letter; a problem without such lines, or whose answer names none of them, stays ``open``.
  Embedded image bytes or PIL images are written once to ``mmrl_common.paths.cache_dir()/media/`` (named by
  content hash) so every sample has a file path.
* ``sharegpt`` (alias ``llava``): LLaVA / ShareGPT chat records: ``conversations`` (turns ``{"from": "human" |
  "gpt", "value": ..}``, or ``{"role": "user" | "assistant", "content": ..}``) with the media in top-level
  ``image`` / ``images`` / ``video`` / ``videos`` keys. The human turn is the question (its ``<image>`` /
  ``<video>`` placeholders removed), the reply the answer (``<answer>..</answer>`` read out); options and the
  problem type as for EasyR1. A chat of several questions, or a placeholder with no file for it, is refused by
  name.

A native record may also carry its media LLaVA's way, in a top-level ``video`` / ``image`` (or ``videos`` /
``images``) key beside an empty ``media``: the files join ``media``; and ``<image>`` / ``<video>`` placeholders in
a question are removed (mmrl places the media itself).

Each importer is ``convert(record, index) -> dict`` returning a native dict; it raises
:class:`~mmrl_common.errors.DataError` when the record cannot be converted (the loader reports that at the
record's file and line). :func:`detect_record_format` picks an importer from one record's keys. Add more
with :func:`register_importer`.
"""

from __future__ import annotations

import hashlib
import io
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from mmrl_common.errors import DataError
from mmrl_common.registry import Registry

from .schema import guess_media_type, maybe_json, parse_number, split_option

Convert = Callable[[Mapping[str, Any], int], dict[str, Any]]
Detect = Callable[[Mapping[str, Any]], bool]


@dataclass
class Importer:
    name: str
    detect: Detect
    convert: Convert


def _spelling(name: str) -> str:
    return name.strip().lower().replace("_", "-")


IMPORTERS: Registry[Importer] = Registry("record format", "data.format", error=DataError, duplicates="error",
                                         normalize=_spelling)
"""Every record format by name, in registration (= detection) order; case and ``_`` vs ``-`` do not matter."""


def register_importer(name: str, detect: Detect, convert: Convert, *, overwrite: bool = False,
                      aliases: tuple[str, ...] = ()) -> None:
    """Add a record format. Detection tries importers in registration order; ``native`` comes first."""
    IMPORTERS.add(name, Importer(name, detect, convert), overwrite=overwrite, aliases=aliases)


def record_formats() -> list[str]:
    """Record format names in detection order."""
    return list(IMPORTERS)


def get_importer(name: str) -> Importer:
    """The importer of record format ``name`` (any spelling or alias); :class:`DataError` otherwise."""
    return IMPORTERS.get(name)


def detect_record_format(record: Any) -> str | None:
    """Name of the first importer whose ``detect`` accepts ``record``; None when none does."""
    if not isinstance(record, Mapping):
        return None
    for imp in IMPORTERS.values():
        if imp.detect(record):
            return imp.name
    return None


# -------------------------------------------------------------------------------------------- native
def _detect_native(r: Mapping[str, Any]) -> bool:
    return "problem_type" in r and "question" in r and ("answer" in r or "media" in r)


LLAVA_MEDIA_KEYS = {"image": "image", "images": "image", "video": "video", "videos": "video"}
"""Top-level keys that hold a record's media files in LLaVA / ShareGPT records, with the kind of each."""


def _top_level_media(r: Mapping[str, Any]) -> list[dict[str, Any]]:
    """The media a record names in top-level ``image`` / ``images`` / ``video`` / ``videos`` keys."""
    media: list[dict[str, Any]] = []
    for key, kind in LLAVA_MEDIA_KEYS.items():
        value = r.get(key)
        if value is None or (isinstance(value, (str, list, tuple)) and not value):
            continue
        if key == "video" and isinstance(value, (list, tuple)) and value \
                and all(isinstance(v, str) and guess_media_type(v) == "image" for v in value):
            value = [value]  # one video as a list of frame files (qwen-vl-utils' shape): refused by the schema
        media.extend(_media_list(value, kind, key=key))
    return media


def _flat(value: Any) -> list[str]:
    items = value if isinstance(value, (list, tuple)) else [value]
    return [v for v in items if isinstance(v, str)]


def _names_files(value: Any) -> bool:
    """Whether a top-level ``image`` / ``video`` value is media: file paths (a text, or a list of texts) or
    embedded images (``{"bytes": ..}`` as a ``datasets`` Image column gives them, ``{"path": ..}``)."""
    def one(v: Any) -> bool:
        if isinstance(v, str):
            return bool(v.strip())
        if isinstance(v, Mapping):
            return bool(v.get("bytes")) or isinstance(v.get("path"), str) and bool(v["path"])
        return isinstance(v, (list, tuple)) and bool(v) and all(isinstance(f, str) for f in v)

    if isinstance(value, (list, tuple)):
        return bool(value) and all(one(v) for v in value)
    return one(value)


def _strip_placeholders(text: str) -> str:
    return _PLACEHOLDER_RE.sub("", text).strip()


def _convert_native(r: Mapping[str, Any], index: int) -> dict[str, Any]:
    out = dict(r)
    if isinstance(out.get("question"), str) and _PLACEHOLDER_RE.search(out["question"]):
        out["question"] = _strip_placeholders(out["question"])  # mmrl places the media itself
    named = [k for k in LLAVA_MEDIA_KEYS if _names_files(out.get(k))]
    if not named:
        return out
    given = maybe_json(out.get("media"))
    if given in (None, "", [], "[]"):  # LLaVA's habit: the files beside the question, not in 'media'
        out["media"] = _top_level_media({k: out.pop(k) for k in named})
        return out
    listed = {m.get("path") if isinstance(m, Mapping) else m for m in
              (given if isinstance(given, (list, tuple)) else [given])}
    for key in named:  # beside a 'media' list, only a key that names a media file by its extension counts
        files = [v for v in _flat(out[key]) if guess_media_type(v)]
        extra = [f for f in files if f not in listed]
        if extra:
            kind = LLAVA_MEDIA_KEYS[key]
            raise DataError(f"the record has a 'media' list and also a top-level {key!r} key naming {extra[0]!r}, "
                            f"which 'media' does not list; put every file in 'media' (as {{\"type\": \"{kind}\", "
                            f"\"path\": \"{extra[0]}\"}}) and remove the {key!r} key")
        if files and len(files) == len(_flat(out[key])):
            out.pop(key)  # the same files as 'media': not kept twice in meta
    return out


# ------------------------------------------------------------------------------------------- Video-R1
_ANSWER_RE = re.compile(r"<answer>(.*?)</answer>", re.DOTALL | re.IGNORECASE)
VIDEO_R1_TYPES = {
    "multiple choice": "multiple_choice",
    "numerical": "numeric",
    "regression": "regression",
    "ocr": "ocr",
    "free-form": "free_form",
    "yes/no": "yes_no",
}


def extract_answer_tag(text: Any) -> str:
    """``"<think>..</think><answer> B </answer>"`` -> ``"B"``; text without the tag comes back stripped."""
    s = "" if text is None else str(text)
    m = _ANSWER_RE.search(s)
    return (m.group(1) if m else s).strip()


def _detect_video_r1(r: Mapping[str, Any]) -> bool:
    return "problem" in r and "solution" in r


def _convert_video_r1(r: Mapping[str, Any], index: int) -> dict[str, Any]:
    missing = [k for k in ("problem", "solution") if r.get(k) is None]
    if missing:
        other = detect_record_format(r)
        looks = f"; it looks like a {other} record (--format {other}, or auto)" if other and other != "video-r1" else ""
        raise DataError(f"missing field(s) {', '.join(repr(k) for k in missing)}: a Video-R1 record has problem, "
                        f"solution (<answer>..</answer>), problem_type, options and path{looks}")
    raw_type = str(r.get("problem_type", "")).strip()
    ptype = VIDEO_R1_TYPES.get(raw_type.lower(), raw_type.lower().replace(" ", "_") or "open")
    answer: Any = extract_answer_tag(r.get("solution"))
    options = None
    if r.get("options"):
        opts = r["options"]
        if not isinstance(opts, (list, tuple)):
            raise DataError(f"Video-R1 'options' must be a list like ['A. foo', 'B. bar'], got {opts!r}")
        options = []
        for i, text in enumerate(opts):
            letter, body = split_option(str(text))
            expected = chr(ord("A") + i)
            if letter is not None and letter != expected:
                raise DataError(f"Video-R1 option {i} is labelled {letter!r} but should be {expected!r} "
                                f"(options must be in A, B, C.. order): {text!r}")
            options.append(body)
    if ptype == "multiple_choice":
        letter, _ = split_option(answer) if len(answer) > 1 else (answer, "")
        answer = (letter or answer).strip()
    media = []
    if r.get("path"):
        kind = str(r.get("data_type") or guess_media_type(str(r["path"])) or "")
        media.append({"type": kind, "path": str(r["path"])})
    source = r.get("data_source")
    pid = r.get("id", r.get("problem_id"))
    if pid is None:
        sid = f"video-r1-{index}"
    else:
        sid = f"{source}-{pid}" if source and "id" not in r else str(pid)
    # the raw solution stays a column of its own (meta keys are passed to rewards by name), as TRL's reward
    # functions (accuracy_reward, ...) read it: solution="<answer>B</answer>"
    meta: dict[str, Any] = {"source": "video-r1", "original_problem_type": raw_type, "solution": str(r["solution"])}
    for key in ("data_source", "process", "problem_id"):
        if r.get(key) not in (None, ""):
            meta[key] = r[key]
    return {"id": sid, "problem_type": ptype, "question": str(r["problem"]), "options": options,
            "answer": answer, "media": media, "meta": meta}


# -------------------------------------------------------------------------------------------- EasyR1
_PLACEHOLDER_RE = re.compile(r"<(image|video)>\s*")


def _detect_easyr1(r: Mapping[str, Any]) -> bool:
    return ("prompt" in r or "problem" in r) and "answer" in r


_OPTIONS_HEADER_RE = re.compile(r"^\s*(options|choices|answer choices|candidates)\s*:?\s*$", re.IGNORECASE)


def options_in_text(text: str) -> tuple[str, list[str]] | None:
    """``"Colour?\nA. red\nB. blue"`` -> (``"Colour?"``, ``["red", "blue"]``): a run of two or more lines
    labelled A, B, C.. in order (``A.``, ``A)``, ``(A)``, ``A:``) is the options; an ``Options:`` line just
    above them goes too, and any text after them stays in the question. None when the text has no such run."""
    lines = text.split("\n")
    for start, line in enumerate(lines):
        letter, body = split_option(line)
        if letter != "A" or not body:
            continue
        options, end = [body], start + 1
        while end < len(lines):
            letter, body = split_option(lines[end])
            if letter != chr(ord("A") + len(options)) or not body:
                break
            options.append(body)
            end += 1
        if len(options) < 2:
            continue
        head = lines[:start]
        if head and _OPTIONS_HEADER_RE.match(head[-1]):
            head = head[:-1]
        question = "\n".join(head + lines[end:]).strip()
        return question, options
    return None


def option_letter(answer: Any, options: list[str]) -> str | None:
    """The letter an answer names among ``options``: ``"B"``, ``"(B)"``, ``"B."``, ``"B. blue"`` (the text
    must then be option B's), or an option's exact text (case aside); None otherwise."""
    if not isinstance(answer, str) or not answer.strip():
        return None
    text = answer.strip()
    letters = [chr(ord("A") + i) for i in range(len(options))]
    bare = text.strip("().: ")
    if len(bare) == 1 and bare.isalpha() and bare.isupper():
        return bare
    letter, body = split_option(text)
    if letter in letters and body.lower().rstrip(".") == options[letters.index(letter)].lower().rstrip("."):
        return letter
    matches = [letters[i] for i, o in enumerate(options) if o.strip().lower() == text.lower()]
    return matches[0] if len(matches) == 1 else None


def _infer_problem_type(answer: Any, options: Any) -> str:
    if options:
        return "multiple_choice"
    if isinstance(answer, str) and answer.strip().lower() in ("yes", "no"):
        return "yes_no"
    if parse_number(answer) is not None:
        return "numeric"
    return "open"


def store_embedded_image(value: Any) -> str:
    """Write embedded image bytes (``{"bytes": ..}``, raw bytes, or a PIL image) to the media cache once
    and return the file path."""
    from mmrl_common.paths import cache_dir

    if hasattr(value, "save") and hasattr(value, "tobytes"):  # PIL image
        buf = io.BytesIO()
        value.save(buf, format="PNG")
        data, ext = buf.getvalue(), ".png"
    else:
        data = value["bytes"] if isinstance(value, Mapping) else value
        if not isinstance(data, (bytes, bytearray)):
            raise DataError(f"cannot read embedded image of type {type(data).__name__}")
        ext = ".png" if data[:4] == b"\x89PNG" else ".jpg" if data[:2] == b"\xff\xd8" else ".img"
    out = cache_dir() / "media" / (hashlib.sha1(data).hexdigest()[:20] + ext)
    if not out.exists():
        out.parent.mkdir(parents=True, exist_ok=True)
        tmp = out.with_suffix(out.suffix + f".tmp{id(data)}")
        tmp.write_bytes(data)
        tmp.replace(out)
    return str(out)


def _media_list(values: Any, kind: str, key: str = "") -> list[dict[str, Any]]:
    if values is None:
        return []
    if isinstance(values, (str, Mapping)) or hasattr(values, "save"):
        values = [values]
    out = []
    for v in values:
        if isinstance(v, str):
            out.append({"type": kind, "path": v})
        elif isinstance(v, Mapping) and v.get("bytes"):
            out.append({"type": kind, "path": store_embedded_image(v)})
        elif isinstance(v, Mapping) and v.get("path"):
            out.append({"type": kind, "path": str(v["path"])})
        elif kind == "image" and (hasattr(v, "save") or isinstance(v, (bytes, bytearray))):
            out.append({"type": kind, "path": store_embedded_image(v)})
        elif kind == "video" and isinstance(v, (list, tuple)):
            out.append({"type": kind, "path": list(v)})  # frame files: the schema refuses them in one line
        else:
            where = f"'{key}' " if key else ""
            raise DataError(f"cannot read {kind} entry {where}{v!r}; give a file path")
    return out


def _question_fields(question: str, answer: Any, r: Mapping[str, Any]) -> tuple[str, Any, Any, str]:
    """(question, options, answer, problem type) of an imported question: ``<answer>`` tags read out; the
    options a record lists, or EasyR1's options as lines of the question text with a letter answer; the type
    given, or inferred from the answer."""
    if isinstance(answer, str):
        answer = extract_answer_tag(answer)
    options = r.get("options") or None
    if options:
        options = [split_option(str(o))[1] for o in options]
    elif r.get("problem_type") in (None, "", "multiple_choice", "multiple choice"):
        # EasyR1's multiple choice: the options are lines of the problem text and the answer is a letter
        found = options_in_text(question)
        letter = option_letter(answer, found[1]) if found else None
        if found and (letter or r.get("problem_type")):
            question, options = found
            answer = letter or answer
    ptype = r.get("problem_type") or _infer_problem_type(answer, options)
    return question, options, answer, ptype


def _convert_easyr1(r: Mapping[str, Any], index: int) -> dict[str, Any]:
    text = r.get("prompt", r.get("problem"))
    if isinstance(text, list):  # chat-format prompt: take the user turns' text
        text = "\n".join(str(m.get("content", "")) for m in text if isinstance(m, Mapping))
    question = _strip_placeholders(str(text or ""))
    question, options, answer, ptype = _question_fields(question, r.get("answer"), r)
    media = _media_list(r.get("images"), "image") + _media_list(r.get("videos"), "video")
    meta: dict[str, Any] = {"source": "easyr1"}
    known = {"prompt", "problem", "answer", "images", "videos", "options", "problem_type", "id"}
    meta.update({k: v for k, v in r.items() if k not in known and isinstance(v, (str, int, float, bool))})
    return {"id": str(r.get("id", f"easyr1-{index}")), "problem_type": ptype, "question": question,
            "options": options, "answer": answer, "media": media, "meta": meta}


# ---------------------------------------------------------------------------------------- LLaVA / ShareGPT
_ASKS = {"human", "user"}
_REPLIES = {"gpt", "assistant", "model", "bot"}


def _detect_sharegpt(r: Mapping[str, Any]) -> bool:
    return isinstance(r.get("conversations"), (list, tuple)) and not _detect_native(r)


def _turn(t: Any, i: int) -> tuple[str, str]:
    if not isinstance(t, Mapping):
        raise DataError(f"conversations[{i}] must be an object like {{\"from\": \"human\", \"value\": \"..\"}}, "
                        f"got {type(t).__name__}")
    who = t.get("from", t.get("role"))
    text = t.get("value", t.get("content"))
    if not isinstance(who, str) or not isinstance(text, str):
        raise DataError(f"conversations[{i}] needs 'from' and 'value' texts (or 'role' and 'content'), got keys "
                        f"{sorted(map(str, t))}")
    return who.strip().lower(), text


def _convert_sharegpt(r: Mapping[str, Any], index: int) -> dict[str, Any]:
    turns = [_turn(t, i) for i, t in enumerate(r["conversations"])]
    asks = [i for i, (who, _) in enumerate(turns) if who in _ASKS]
    replies = [i for i, (who, _) in enumerate(turns) if who in _REPLIES]
    other = sorted({who for who, _ in turns if who not in _ASKS | _REPLIES | {"system"}})
    if other:
        raise DataError(f"conversations has turns from {other}; a ShareGPT turn is from 'human' (the question) "
                        "or 'gpt' (the answer)")
    if len(asks) != 1 or len(replies) != 1 or replies[0] < asks[0]:
        raise DataError(f"conversations holds {len(asks)} human and {len(replies)} gpt turns; mmrl trains on one "
                        "question and its answer: give one human turn followed by one gpt turn (split a "
                        "multi-turn chat into one record per question)")
    raw_question, answer_text = turns[asks[0]][1], turns[replies[0]][1]
    media = _top_level_media(r)
    for kind in ("image", "video"):
        wanted = len(re.findall(f"<{kind}>", raw_question))
        have = sum(1 for m in media if m["type"] == kind)
        if wanted and not have:
            raise DataError(f"the question has a <{kind}> placeholder but the record names no {kind} file; add "
                            f"\"{kind}\": \"FILE\" to the record (the path relative to the data file)")
    question, options, answer, ptype = _question_fields(_strip_placeholders(raw_question), answer_text, r)
    known = {"conversations", "options", "problem_type", "id", *LLAVA_MEDIA_KEYS}
    meta: dict[str, Any] = {"source": "sharegpt"}
    meta.update({k: v for k, v in r.items() if k not in known and isinstance(v, (str, int, float, bool))})
    return {"id": str(r.get("id", f"sharegpt-{index}")), "problem_type": ptype, "question": question,
            "options": options, "answer": answer, "media": media, "meta": meta}


register_importer("native", _detect_native, _convert_native, aliases=("mmrl",))
register_importer("video-r1", _detect_video_r1, _convert_video_r1, aliases=("videor1",))
register_importer("easyr1", _detect_easyr1, _convert_easyr1, aliases=("easy-r1", "verl"))
register_importer("sharegpt", _detect_sharegpt, _convert_sharegpt, aliases=("share-gpt", "llava"))


def import_record(record: Mapping[str, Any], index: int, fmt: str = "auto") -> tuple[str, dict[str, Any]]:
    """Convert one record; returns (format used, native dict). ``fmt="auto"`` detects it."""
    name = detect_record_format(record) if fmt == "auto" else get_importer(fmt).name
    imp = IMPORTERS.get(name or "native")
    return imp.name, imp.convert(record, index)


__all__ = [
    "Importer",
    "detect_record_format",
    "extract_answer_tag",
    "get_importer",
    "import_record",
    "record_formats",
    "register_importer",
    "store_embedded_image",
]
