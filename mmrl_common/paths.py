"""Where mmrl keeps things it builds once and reuses (tiny models, the toy world)."""

import os
from pathlib import Path


def cache_dir() -> Path:
    """``$MMRL_CACHE`` if set, else ``~/.cache/mmrl``. Created on first use."""
    root = Path(os.environ.get("MMRL_CACHE") or Path.home() / ".cache" / "mmrl")
    root.mkdir(parents=True, exist_ok=True)
    return root
