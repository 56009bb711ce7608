"""End-of-run report: ``report.md`` with PNG plots of the training curves, and ``summary.json``."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from mmrl.run_log import read_metrics

CURVES = [
    ("reward", "mean total reward", "reward.png"),
    ("reward/accuracy", "training accuracy (reward component)", "accuracy.png"),
    ("response_length", "mean response length (tokens)", "length.png"),
    ("kl", "KL to the reference (mean per token)", "kl.png"),
]


def _smooth(values: list[float], k: int) -> list[float]:
    out, acc = [], []
    for v in values:
        acc.append(v)
        if len(acc) > k:
            acc.pop(0)
        out.append(sum(acc) / len(acc))
    return out


def plot_curves(run_dir: Path) -> list[tuple[str, str]]:
    """Write one PNG per curve found in metrics.jsonl; returns ``(title, file)`` pairs."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = [r for r in read_metrics(run_dir) if r.get("stage") == "rl"]
    made = []
    for key, title, fname in CURVES:
        pts = [(r["step"], r[key]) for r in rows if isinstance(r.get(key), (int, float))]
        evals = [(r["step"], r["eval/accuracy"]) for r in rows
                 if key == "reward/accuracy" and isinstance(r.get("eval/accuracy"), (int, float))]
        if not pts:
            continue
        steps, vals = zip(*pts)
        fig, ax = plt.subplots(figsize=(6, 3.4), dpi=100)
        ax.plot(steps, vals, color="#9ab", lw=1, label="per step")
        ax.plot(steps, _smooth(list(vals), max(1, len(vals) // 20)), color="#135", lw=2, label="smoothed")
        if evals:
            ax.plot(*zip(*evals), "o-", color="#c50", label="held-out eval")
        ax.set_xlabel("step")
        ax.set_title(title)
        ax.grid(alpha=0.3)
        ax.legend(loc="best", fontsize=8)
        fig.tight_layout()
        fig.savefig(run_dir / fname)
        plt.close(fig)
        made.append((title, fname))
    return made


def _fmt(v: Any) -> str:
    return f"{v:.3f}" if isinstance(v, float) else ("–" if v is None else str(v))


def write_report(run_dir: Path, summary: dict[str, Any]) -> Path:
    (run_dir / "summary.json").write_text(json.dumps(summary, indent=2, default=str) + "\n")
    plots = plot_curves(run_dir)
    lines = [f"# mmrl run report: {summary.get('task', '')}", ""]
    before, after = summary.get("eval_before_rl"), summary.get("eval_after_rl")
    if before or after:
        lines += ["## Held-out evaluation", "",
                  (f"Split `{summary.get('eval_split')}`, greedy decoding; headline accuracy counts multiple-choice "
                  f"questions with at least {summary.get('eval_min_options', 0)} options."), "",
                  "| | before RL | after RL |", "| --- | --- | --- |"]
        b, a = before or {}, after or {}
        lines.append(f"| accuracy | {_fmt(b.get('accuracy'))} | {_fmt(a.get('accuracy'))} |")
        lines.append(f"| questions | {_fmt(b.get('n'))} | {_fmt(a.get('n'))} |")
        for group in ("by_task", "by_problem_type"):
            keys = sorted(set(b.get(group, {})) | set(a.get(group, {})))
            for k in keys:
                lines.append(f"| {group[3:]}: {k} | {_fmt(b.get(group, {}).get(k))} | {_fmt(a.get(group, {}).get(k))} |")
        lines.append("")
    lines += ["## Stages", ""]
    for name, info in summary.get("stages", {}).items():
        if name == "data":
            for split, d in info.items():
                if d:
                    lines.append(f"- **{split} data**: {d['used']} samples used of {d['loaded']} loaded "
                                 f"({d['skipped']} bad records skipped) from `{d['path']}`")
            continue
        lines.append(f"- **{name}**: " + ", ".join(f"{k} {_fmt(v)}" for k, v in (info or {}).items()))
    lines.append("")
    if plots:
        lines += ["## Training curves", ""]
        for title, fname in plots:
            lines += [f"### {title}", "", f"![{title}]({fname})", ""]
    lines += ["## Files", "", "- `config.yaml`: the resolved configuration",
              "- `metrics.jsonl`: one line per step and stage", ("- `rollouts.jsonl`: sample completions with "
              "every reward component"), "- `checkpoint-*/`: Hugging Face model folders plus trainer state",
              "- `final/`: the trained model (load with `AutoModelForImageTextToText.from_pretrained`)", ""]
    path = run_dir / "report.md"
    path.write_text("\n".join(lines))
    return path
