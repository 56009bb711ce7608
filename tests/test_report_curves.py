"""report.md plots: curves registered by methods, including a family of metrics drawn in one figure."""

from __future__ import annotations

import json
from pathlib import Path

from mmrl import report


def _write_metrics(run: Path, rows: list[dict]) -> None:
    run.mkdir(parents=True, exist_ok=True)
    with open(run / "metrics.jsonl", "w") as f:
        f.writelines(json.dumps(r) + "\n" for r in rows)


def test_registered_family_curve_is_drawn_and_absent_family_is_not(tmp_path: Path) -> None:
    rows = [{"stage": "rl", "step": s, "reward": 0.1 * s, "demo/part/a": s, "demo/part/b": 2 * s} for s in range(1, 6)]
    _write_metrics(tmp_path, rows)
    saved = list(report.CURVES)
    try:
        report.register_curve("demo/part/*", "demo parts", "demo_parts.png")
        report.register_curve("missing/*", "nothing logged", "missing.png")
        report.register_curve("demo/part/*", "demo parts again", "demo_parts.png")  # replaces, not duplicates
        made = report.plot_curves(tmp_path)
    finally:
        report.CURVES[:] = saved
    assert ("demo parts again", "demo_parts.png") in made
    assert all(f != "missing.png" for _, f in made)
    assert (tmp_path / "demo_parts.png").stat().st_size > 0
    assert not (tmp_path / "missing.png").exists()
    assert sum(1 for _, f in made if f == "demo_parts.png") == 1
