"""``results.md``: the headline numbers and each breakdown as Markdown tables."""

from __future__ import annotations

from typing import Any


def pct(v: Any) -> str:
    return "–" if v is None else f"{100 * v:.1f}"


def markdown(metrics: dict[str, Any]) -> str:
    m = metrics["scores"]
    lines = [f"# {metrics['title']} — {metrics['model']}", "",
             f"{metrics['protocol_text']}; split {metrics['split']}; {metrics['n']} questions"
             + (f" (limit {metrics['limit']})" if metrics.get("limit") else "") + ".", ""]
    if "closed" in m:
        c, o = m["closed"], m["open"]
        lines += ["| questions | n | metric | value |", "| --- | ---: | --- | ---: |",
                  f"| closed | {c['n']} | accuracy (yes/no read by the shared extractor) | {pct(c['accuracy'])} |",
                  f"| closed | {c['n']} | LLaVA-Med hit (reference ⊂ output) | {pct(c['hit'])} |",
                  f"| closed | {c['n']} | unparsed | {c['unparsed']} |",
                  f"| open | {o['n']} | LLaVA-Med recall | {pct(o['recall'])} |",
                  f"| open | {o['n']} | LLaVA-Med F1 | {pct(o['f1'])} |",
                  f"| open | {o['n']} | token F1 (SQuAD) | {pct(o['token_f1'])} |",
                  f"| open | {o['n']} | BLEU-1 | {pct(o['bleu1'])} |",
                  f"| open | {o['n']} | exact match | {pct(o['exact'])} |", ""]
        for key, table in m.items():
            if key.startswith("by_"):
                lines += [f"## {key[3:].replace('_', ' ')}", "",
                          "| group | closed n | closed acc | open n | open recall |", "| --- | ---: | ---: | ---: | ---: |"]
                lines += [f"| {g} | {v['closed']['n']} | {pct(v['closed']['accuracy'])} | {v['open']['n']} | "
                          f"{pct(v['open']['recall'])} |" for g, v in table.items()]
                lines.append("")
        return "\n".join(lines)
    o = m["overall"]
    lines += ["| metric | value |", "| --- | ---: |",
              f"| **official ({m['official_metric']})** | **{pct(m['official'])}** |",
              f"| accuracy, all questions (unparsed = wrong) | {pct(o['accuracy'])} ({o['correct']}/{o['n']}) |",
              f"| accuracy, answered only | {pct(o['accuracy_answered'])} ({o['correct']}/{o['answered']}) |",
              f"| unparsed answers | {o['unparsed']} |"]
    if o.get("errors"):
        lines.append(f"| media errors (counted wrong) | {o['errors']} |")
    if "task_mean" in m:
        lines.append(f"| mean of task accuracies | {pct(m['task_mean'])} |")
    lines.append("")
    for key, table in m.items():
        if key.startswith("by_"):
            lines += [f"## {key[3:].replace('_', ' ')}", "",
                      "| group | n | accuracy | answered only | unparsed |", "| --- | ---: | ---: | ---: | ---: |"]
            lines += [f"| {g} | {v['n']} | {pct(v['accuracy'])} | {pct(v['accuracy_answered'])} | {v['unparsed']} |"
                      for g, v in table.items()]
            lines.append("")
    return "\n".join(lines)
