"""``results.md``: the headline numbers and each breakdown as Markdown tables."""

from __future__ import annotations

from typing import Any


def pct(v: Any) -> str:
    return "–" if v is None else f"{100 * v:.1f}"


def _media_lines(metrics: dict[str, Any]) -> list[str]:
    """The questions whose video was missing or unreadable, after the table."""
    failed = metrics.get("media_failures") or []
    if not failed:
        return []
    how = "left out (data.on_bad_sample=skip)" if metrics.get("on_bad_sample") == "skip" else "counted wrong"
    out = ["", f"{len(failed)} question(s) without readable media, {how}:", ""]
    out += [f"- `{f['id']}`: {f['error']}" for f in failed[:50]]
    if len(failed) > 50:
        out.append(f"- ... and {len(failed) - 50} more (metrics.json lists them all)")
    return out


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
                  f"| open | {o['n']} | exact match | {pct(o['exact'])} |"]
        lines += _media_lines(metrics) + [""]
        for key, table in m.items():
            if key.startswith("by_"):
                lines += [f"## {key[3:].replace('_', ' ')}", "",
                          "| group | closed n | closed acc | open n | open recall |", "| --- | ---: | ---: | ---: | ---: |"]
                lines += [f"| {g} | {v['closed']['n']} | {pct(v['closed']['accuracy'])} | {v['open']['n']} | "
                          f"{pct(v['open']['recall'])} |" for g, v in table.items()]
                lines.append("")
        return "\n".join(lines)
    o, h = m["overall"], m["headline"]
    lines += [f"**{metrics['title']}: {pct(h['value'])}** — `{h['metric']}`: {h['convention']} ({h['why']}).", "",
              "| convention | value |", "| --- | ---: |",
              f"| **{h['metric']} (headline)**: {h['convention']} | **{pct(h['value'])}** |"]
    lines += [f"| {k}: {v['convention']} | {pct(v['value'])} |" for k, v in m.get("beside", {}).items()]
    lines += [f"| questions / answered / correct | {o['n']} / {o['answered']} / {o['correct']} |",
              f"| unparsed answers (no option letter read) | {o['unparsed']} |"]
    if o.get("errors"):
        lines.append(f"| media failures (counted wrong) | {o['errors']} |")
    lines += _media_lines(metrics)
    lines.append("")
    for key, table in m.items():
        if key.startswith("by_"):
            lines += [f"## {key[3:].replace('_', ' ')}", "",
                      "| group | n | accuracy | answered only | unparsed |", "| --- | ---: | ---: | ---: | ---: |"]
            lines += [f"| {g} | {v['n']} | {pct(v['accuracy'])} | {pct(v['accuracy_answered'])} | {v['unparsed']} |"
                      for g, v in table.items()]
            lines.append("")
    if m.get("judge"):
        lines += _judge_lines(m["open_ended"], m["judge"])
    return "\n".join(lines)


def _judge_lines(op: dict[str, Any], judge: dict[str, Any]) -> list[str]:
    """The open-ended questions' score and, beside it, the judge that gave it: model, endpoint, rule, prompt."""
    return ["## open-ended questions (judged)", "",
            (f"**{pct(op['accuracy'])}** over {op['judged']} judged of {op['n']} open-ended question(s) "
            f"({op['failed']} without a score, left out and listed in predictions.jsonl as judge_error)."), "",
            (f"Judge: `{judge['model']}` at {judge['base_url']}, temperature {judge['temperature']:g}, max_tokens "
            f"{judge['max_tokens']}. Score: {judge['score_rule']}."), "", "Prompt (the `open` template):", "",
            "```", judge["templates"]["open"], "```", ""]
