"""report.md plots: curves registered by methods, including a family of metrics drawn in one figure; a long title
is wrapped inside the figure (report.md and compare.md plots alike)."""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace

from mmrl.run import report


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


def _title_inside(fig, ax) -> bool:
    fig.canvas.draw()
    box, frame = ax.title.get_window_extent(), fig.bbox
    return frame.x0 <= box.x0 and box.x1 <= frame.x1 and frame.y0 <= box.y0 and box.y1 <= frame.y1


LONG = ("EARL: selection IoU with the gold frames (all episodes / those that select frames), measured on every "
        "evaluation of every stage")


def test_a_long_title_is_wrapped_inside_the_figure(tmp_path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6, 3.4), dpi=100)
    ax.plot([1, 2], [0, 1])
    ax.set_xlabel("step")
    ax.set_title(LONG)
    fig.tight_layout()
    assert not _title_inside(fig, ax)  # what tight_layout alone leaves: the title cut at both sides
    report.save_figure(fig, ax, LONG, tmp_path / "long.png")
    assert _title_inside(fig, ax)
    assert ax.title.get_text().replace("\n", " ") == LONG  # every word kept, only wrapped
    assert fig.bbox.contains(*ax.xaxis.label.get_window_extent().p0)
    assert fig.bbox.contains(*ax.xaxis.label.get_window_extent().p1)
    short = "mean total reward"
    report.save_figure(fig, ax, short, tmp_path / "short.png")
    assert ax.title.get_text() == short  # a title that fits stays on one line
    plt.close(fig)


def test_every_plot_of_a_run_and_of_a_compare_keeps_its_title_inside(tmp_path: Path, monkeypatch) -> None:
    """The figures plot_curves (report.md) and compare.plot_curves (compare.md) draw, caught before closing."""
    import matplotlib.pyplot as plt

    from mmrl.cli import compare

    figures = []
    monkeypatch.setattr(plt, "close", lambda fig=None: figures.append(fig))
    rows = [{"stage": "rl", "step": s, "reward": 0.1 * s, "vas/vps_drawn": s, "vas/vps_pool": 2 * s,
             "informative_groups": 0.5} for s in range(1, 6)]
    _write_metrics(tmp_path, rows)
    saved = list(report.CURVES)
    try:
        report.register_curve("informative_groups", LONG, "long.png")
        report.register_curve("vas/vps_*", "VAS: mean variance promotion score, drawn prompts vs the pool, "
                              "per step of the run", "family.png")
        made = report.plot_curves(tmp_path)
    finally:
        report.CURVES[:] = saved
    assert {f for _, f in made} >= {"reward.png", "long.png", "family.png"}
    key = "reward_metric/evidence/iou_selected_by_the_agent_over_all_episodes"
    run = compare.RunData(arm="baseline", seed=0, dir=tmp_path, status="finished",
                          rows=[{**r, key: 0.2 * r["step"]} for r in rows])
    spec = SimpleNamespace(curves=[key], arms=["baseline"], out=tmp_path)
    assert compare.plot_curves(spec, [run]) == {key: f"curve-{key.replace('/', '_')}.png"}
    drawn = [f for f in figures if f is not None]
    assert len(drawn) == len(made) + 1
    for fig in drawn:
        assert _title_inside(fig, fig.axes[0]), fig.axes[0].title.get_text()
