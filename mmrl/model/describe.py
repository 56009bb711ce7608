"""A model folder in words, from its ``config.json`` alone (no weights, no torch): what an error or a run's
record says a model is (``qwen2_5_vl (hidden 64, 2 layers, vocab 151936)``)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any


def describe_model(folder: str | Path) -> str:
    """A model folder in words from its ``config.json``: ``qwen2_5_vl (hidden 64, 2 layers, vocab 151936)``."""
    try:
        cfg = json.loads((Path(folder) / "config.json").read_text())
    except (OSError, ValueError):
        return "no readable config.json"
    return describe_config(cfg)


def describe_config(cfg: dict[str, Any]) -> str:
    """A model's ``config.json`` (as a dict) in words (:func:`describe_model`)."""
    text = cfg.get("text_config") or cfg
    parts = [f"{k} {text[key]}" for k, key in (("hidden", "hidden_size"), ("layers", "num_hidden_layers"),
                                                ("vocab", "vocab_size")) if key in text]
    return f"{cfg.get('model_type', '?')} ({', '.join(parts)})"
