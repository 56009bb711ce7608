"""A JSON file that must hold a mapping, read with the reason it does not: what the run folder's and a model
folder's small records (``run_state.json``, ``inputs.json``, ``mmrl_eval.json``) share before each says, in its
own words, what the damage means and how to fix it."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any


def read_json_mapping(path: str | Path) -> tuple[dict[str, Any] | None, str | None]:
    """``(mapping, None)``, or ``(None, why)`` when the file cannot be read, is empty, is not valid JSON (cut short
    or garbled) or holds something other than a mapping; ``why`` reads after the file's name."""
    try:
        text = Path(path).read_text()
    except OSError as exc:
        return None, f"cannot be read ({exc.strerror or exc})"
    if not text.strip():
        return None, "is empty"
    try:
        data = json.loads(text)
    except ValueError as exc:
        return None, f"is not valid JSON (cut short or garbled: {str(exc).splitlines()[0][:80]})"
    return (data, None) if isinstance(data, dict) else (None, "does not hold a mapping")
