"""End-of-run report: ``report.md`` with PNG plots of the training curves, and ``summary.json``."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from mmrl.engine.run_log import read_metrics

CURVES = [
    ("reward", "mean total reward", "reward.png"),
    ("reward/accuracy", "training accuracy (reward component)", "accuracy.png"),
    ("reward/format", "format reward (share of well-formed completions)", "format.png"),
    ("response_length", "mean response length (tokens)", "length.png"),
    ("kl", "KL to the reference (mean per token)", "kl.png"),
]


def register_curve(key: str, title: str, filename: str) -> None:
    """Add a plot to every run's ``report.md`` (methods call this when they are imported). ``key`` is a
    metric logged in ``metrics.jsonl``; a key ending in ``*`` (``"ares/entropy/*"``) draws every metric with
    that prefix as its own line in one figure. Registering the same file again replaces the entry."""
    CURVES[:] = [c for c in CURVES if c[2] != filename]
    CURVES.append((key, title, filename))


def _smooth(values: list[float], k: int) -> list[float]:
    out, acc = [], []
    for v in values:
        acc.append(v)
        if len(acc) > k:
            acc.pop(0)
        out.append(sum(acc) / len(acc))
    return out


def save_figure(fig: Any, ax: Any, title: str, path: Path) -> None:
    """Title ``ax`` with ``title``, lay the figure out and write it to ``path``. A title wider than the figure
    is wrapped onto more lines until it fits (``tight_layout`` makes room for the lines, the axis labels and the
    tick labels, but never narrows a title, which matplotlib centres over the axes and cuts at the edges)."""
    import textwrap

    def wrap(width: int) -> list[str]:
        return textwrap.wrap(title, width, break_on_hyphens=False) or [title]

    text = ax.set_title(title)
    fig.tight_layout()
    renderer = fig.canvas.get_renderer()
    width, margin = len(title), 4  # characters per line; pixels kept clear of the figure's edges
    for _ in range(len(title)):
        box = text.get_window_extent(renderer)
        if (box.x0 >= margin and box.x1 <= fig.bbox.width - margin) or width <= 8:
            break
        room = 2 * min(box.x0 + box.width / 2, fig.bbox.width - box.x0 - box.width / 2) - 2 * margin
        width = max(8, min(width - 1, int(width * room / max(box.width, 1.0))))
        n = len(wrap(width))  # as few lines as fit, then as even as those lines allow (no one-word last line)
        longest = max((len(word) for word in title.split()), default=0)  # split inside a word only if it must
        even = next(w for w in range(max(-(-len(title) // n), min(longest, width)), width + 1) if len(wrap(w)) <= n)
        text.set_text("\n".join(wrap(even)))
        fig.tight_layout()  # room for the added lines
    fig.savefig(path)


def plot_curves(run_dir: Path, held_out: list[tuple[int, float]] | None = None,
                eval_label: str = "held-out eval") -> list[tuple[str, str]]:
    """Write one PNG per curve found in metrics.jsonl; returns ``(title, file)`` pairs. The accuracy curve
    carries the held-out evaluations: those during RL (``eval/accuracy``) and ``held_out`` (step, accuracy)
    points such as the evaluations before and after RL, labelled ``eval_label`` (the report's "eval on the training
    data" when the data evaluated is the training data)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = [r for r in read_metrics(run_dir) if r.get("stage") == "rl"]
    made = []
    for key, title, fname in CURVES:
        if key.endswith("*"):
            if _plot_family(plt, rows, key[:-1], title, run_dir / fname):
                made.append((title, fname))
            continue
        pts = [(r["step"], r[key]) for r in rows if isinstance(r.get(key), (int, float))]
        evals = sorted([(r["step"], r["eval/accuracy"]) for r in rows
                        if key == "reward/accuracy" and isinstance(r.get("eval/accuracy"), (int, float))]
                       + (list(held_out or []) if key == "reward/accuracy" else []))
        if not pts:
            continue
        steps, vals = zip(*pts)
        fig, ax = plt.subplots(figsize=(6, 3.4), dpi=100)
        ax.plot(steps, vals, color="#9ab", lw=1, label="per step")
        ax.plot(steps, _smooth(list(vals), max(1, len(vals) // 20)), color="#135", lw=2, label="smoothed")
        if evals:
            ax.plot(*zip(*evals), "o-", color="#c50", label=eval_label)
        ax.set_xlabel("step")
        ax.grid(alpha=0.3)
        ax.legend(loc="best", fontsize=8)
        save_figure(fig, ax, title, run_dir / fname)
        plt.close(fig)
        made.append((title, fname))
    return made


def _plot_family(plt: Any, rows: list[dict[str, Any]], prefix: str, title: str, path: Path) -> bool:
    """One line (smoothed) per metric whose name starts with ``prefix``; False when there is none."""
    keys = sorted({k for r in rows for k, v in r.items() if k.startswith(prefix) and isinstance(v, (int, float))})
    if not keys:
        return False
    fig, ax = plt.subplots(figsize=(6, 3.4), dpi=100)
    for k in keys:
        pts = [(r["step"], r[k]) for r in rows if isinstance(r.get(k), (int, float))]
        steps, vals = zip(*pts)
        ax.plot(steps, _smooth(list(vals), max(1, len(vals) // 20)), lw=1.6, label=k[len(prefix):] or k)
    ax.set_xlabel("step")
    ax.grid(alpha=0.3)
    ax.legend(loc="best", fontsize=8)
    save_figure(fig, ax, title, path)
    plt.close(fig)
    return True


def data_line(role: str, d: dict[str, Any]) -> str:
    """One split's counts as the file has them: lines read (JSONL: blank ones too), records, loaded, skipped and
    why, and the samples used (good records a setting leaves out, named). ``d`` is ``mmrl.run.load_split``'s
    info; ``role`` is ``train`` or ``eval``."""
    from data_pipelines.loaders import SKIP_KINDS

    split = d.get("split")
    head = f"- **{role} data**" + (f" ({split} split)" if split and split != role else "")
    if not d.get("path"):
        return f"{head}: none (no data.{split or role} file given)"
    where = f"{head} `{d['path']}`: "
    if d.get("records") is None:  # a summary written before these counts were kept
        return f"{where}{d['used']} samples used of {d['loaded']} loaded ({d['skipped']} bad records skipped)"
    lines, blank = d.get("lines"), d.get("blank_lines") or 0
    read = (f"{lines} lines read{f' ({blank} blank)' if blank else ''}, " if lines is not None else "") + \
        f"{d['records']} records: {d['loaded']} loaded, {d['skipped']} skipped"
    why = d.get("skipped_by") or {}
    if why:
        read += " (" + ", ".join(f"{n} {SKIP_KINDS.get(k, k)}" for k, n in why.items()) + ")"
    left_out = d.get("left_out") or {}
    used = f"; {d['used']} used" + (" (" + ", ".join(f"{n} left out by {k}" for k, n in left_out.items()) + ")"
                                    if left_out else "")
    return where + read + used


def _fmt(v: Any) -> str:
    return f"{v:.3f}" if isinstance(v, float) else ("–" if v is None else str(v))


def run_warnings(run_dir: Path) -> list[dict[str, Any]]:
    """The run-health warnings logged during RL (``warning/<kind>`` entries of metrics.jsonl)."""
    return [{"step": r["step"], "kind": k.split("/", 1)[1], "text": v} for r in read_metrics(run_dir)
            if r.get("stage") == "rl" for k, v in r.items() if k.startswith("warning/") and v]


def skipped_updates(run_dir: Path) -> dict[str, Any] | None:
    """The optimizer steps RL skipped because the loss or the gradient was not finite, as a warning entry
    (``step``: the last RL step; ``kind``: ``skipped_updates``), from metrics.jsonl; None when none was."""
    rows = [r for r in read_metrics(run_dir) if r.get("stage") == "rl"]
    skipped = max((int(r["skipped_updates"]) for r in rows if isinstance(r.get("skipped_updates"), (int, float))),
                  default=0)
    if not skipped:
        return None
    applied = sum(int(r.get("optimizer_steps") or 0) for r in rows)
    return {"step": rows[-1]["step"], "kind": "skipped_updates",
            "text": f"{skipped} of {skipped + applied} optimizer steps were skipped because the loss or the gradient "
                    "was not finite (the weights were left as they were in those steps); many skips mean a "
                    "diverging run: a learning rate too high (train.lr), or a reward or loss term giving NaN"}


def _held_out_points(summary: dict[str, Any]) -> list[tuple[int, float]]:
    rl = (summary.get("stages") or {}).get("rl") or {}
    points = []
    for key, step in (("eval_before_rl", 0), ("eval_after_rl", rl.get("steps"))):
        acc = (summary.get(key) or {}).get("accuracy")
        if isinstance(acc, (int, float)) and isinstance(step, int):
            points.append((step, float(acc)))
    return points


def _counted(summary: dict[str, Any]) -> str:
    k = summary.get("eval_min_options") or 0
    return (f"the accuracy counts multiple-choice questions with at least {k} options (eval.min_options)." if k > 0
            else "the accuracy counts every question.")


def write_report(run_dir: Path, summary: dict[str, Any]) -> Path:
    skips = skipped_updates(run_dir)
    summary = {**summary, "warnings": run_warnings(run_dir) + ([skips] if skips else [])}
    (run_dir / "summary.json").write_text(json.dumps(summary, indent=2, default=str) + "\n")
    plots = plot_curves(run_dir, _held_out_points(summary), eval_label="eval on the training data" if
                        summary.get("eval_on_training_data") else "held-out eval")
    lines = [f"# mmrl run report: {summary.get('task', '')}", ""]
    stopped = ((summary.get("stages") or {}).get("rl") or {}).get("stopped")
    if stopped:  # the run stopped itself (mmrl.engine.trainer.Diverged): what happened and what to do, first
        lines += ["## Stopped early", "", str(stopped), ""]
    before, after = summary.get("eval_before_rl"), summary.get("eval_after_rl")
    on_training = summary.get("eval_on_training_data")  # --eval-data FILE is --data FILE: not held out
    if before or after:
        lines += ["## Evaluation on the training data (not held out)" if on_training else "## Held-out evaluation",
                  ""] + ([f"**{on_training}.**", ""] if on_training else []) + [
                  f"Split `{summary.get('eval_split')}`, greedy decoding; {_counted(summary)}", "",
                  "| | before RL | after RL |", "| --- | --- | --- |"]
        b, a = before or {}, after or {}
        lines.append(f"| accuracy | {_fmt(b.get('accuracy'))} | {_fmt(a.get('accuracy'))} |")
        lines.append(f"| questions | {_fmt(b.get('n'))} | {_fmt(a.get('n'))} |")
        left_out = (a or b).get("excluded") or []
        for group in ("by_task", "by_problem_type"):
            keys = sorted(set(b.get(group, {})) | set(a.get(group, {})))
            for k in keys:
                lines.append(f"| {group[3:]}: {k} | {_fmt(b.get(group, {}).get(k))} | {_fmt(a.get(group, {}).get(k))} |")
        lines.append("")
        if left_out:
            lines += [f"Not in the accuracy ({len(left_out)}):", ""]
            lines += [f"- `{e['id']}`: {e['reason']}" for e in left_out]
            lines.append("")
    changed = summary.get("settings_changes") or []
    if changed:  # --resume --force-settings: what the run continued with from which step (config.yaml: the last)
        lines += ["## Changed on resume", "", ("The run did not train on one set of data and settings throughout; "
                                               "`config.yaml` holds the last session's:"), ""]
        for c in changed:
            lines += [f"- from step {c.get('from_step')}: {change}" for change in c.get("changes") or []]
        lines.append("")
    if summary["warnings"]:
        lines += ["## Warnings", ""]
        lines += [f"- step {w['step']}: {w['text']}" for w in summary["warnings"]]
        lines.append("")
    lines += ["## Stages", ""]
    for name, info in summary.get("stages", {}).items():
        if name == "data":
            for split, d in info.items():
                if d:
                    lines.append(data_line(split, d))
                    for rec in d.get("skipped_records") or []:
                        who = f" sample `{rec['id']}`:" if rec.get("id") else ""
                        lines.append(f"  - skipped `{rec['where']}`:{who} {'; '.join(rec['reasons'])}")
            continue
        lines.append(f"- **{name}**: " + ", ".join(f"{k} {_fmt(v)}" for k, v in (info or {}).items()
                                                   if k != "stopped"))  # said first, under "Stopped early"
    wall = summary.get("wall_seconds")
    if isinstance(wall, (int, float)):
        lines += [(f"- **time**: {wall:.0f} s in all (every session of the run, resumes included); the RL "
                   "seconds above are the RL steps' own time"), ""]
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
