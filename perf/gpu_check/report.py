"""The Markdown rendering of ``make gpu-check``'s results (standard library only)."""

from __future__ import annotations

from typing import Any


def _f(v: Any, fmt: str = ".2f") -> str:
    if v is None:
        return "–"
    if isinstance(v, (int, float)) and not isinstance(v, bool):
        return format(v, fmt)
    return str(v)


def _pct(v: Any) -> str:
    return "–" if v is None else f"{100 * v:.1f}%"


def _flops(v: Any) -> str:
    return "–" if not v else f"{v / 1e12:.1f} TFLOP"


def render(data: dict[str, Any]) -> str:
    stages = data.get("stages", {})
    env = stages.get("environment", {}).get("result", {})
    device = env.get("gpu") or "CPU"
    lines = [f"# mmrl GPU check: {device}", ""]
    status = data.get("exit_status")
    lines += [f"Started {data.get('started')}, finished {data.get('finished') or '(running or stopped)'}; mode "
              f"`{data.get('mode')}`; exit status {'–' if status is None else status}"
              + (" (PASS)" if status == 0 else " (FAIL)" if status else "") + ".", ""]
    if data.get("mode") == "cpu":
        lines += [("**No CUDA device: this is the CPU mode on a tiny model. No GPU figure (memory, utilisation, "
                  "GPU speed) was measured.**"), ""]
    if env:
        pk = env.get("packages", {})
        have = ", ".join(f"{k} {v['version']}" for k, v in pk.items() if v.get("version"))
        lines += [f"Python {env.get('python')} ({env.get('executable')}), torch {env.get('torch')} (CUDA "
                  f"{env.get('torch_cuda')}), driver {env.get('driver') or '–'}; {device}"
                  + (f", {env.get('gpu_memory_gb')} GB, capability {env.get('capability')}, bf16 8192³ matrix "
                     f"product {env.get('matmul_bf16_tflops')} TFLOP/s" if env.get("gpu") else "")
                  + f"; {env.get('cpus')} CPUs, {env.get('host_memory_gb')} GB host memory, {env.get('disk_free_gb')} "
                  f"GB free disk, {env.get('shm_free_gb')} GB free /dev/shm.", "", f"Packages: {have}.", ""]
    lines += ["| stage | status | seconds | notes |", "| --- | --- | --- | --- |"]
    for name, rec in stages.items():
        note = rec.get("error") or rec.get("skipped") or ""
        failed = [c[0] for c in rec.get("checks", []) if not c[1]]
        if failed and not note:
            note = "failed: " + "; ".join(failed)
        if rec.get("from_earlier_call"):
            note = "(an earlier call's) " + note
        lines.append(f"| {name} | {rec.get('status', '').upper()} | {_f(rec.get('seconds'), '.0f')} | "
                     f"{note.replace('|', '/')[:300]} |")
    lines.append("")
    if data.get("budgets") or data.get("aims"):
        lines += ["| budget | measured | result |", "| --- | --- | --- |"]
        for kind, rows in (("", data.get("budgets", [])), ("aim: ", data.get("aims", []))):
            for b in rows:
                res = {True: "within" if not kind else "met", False: "EXCEEDED" if not kind else "below the aim",
                       None: "not checked"}[b.get("ok")]
                if b.get("detail"):
                    res += f" ({b['detail']})"
                lines.append(f"| {kind}`{b['bound']}` | {_f(b.get('value'))} | {res} |")
        lines.append("")
    lines += _train(stages.get("train"))
    lines += _profile(stages.get("profile"))
    lines += _deepspeed(stages.get("deepspeed"))
    lines += _tests(stages.get("gpu-tests"))
    lines += ["## Checks", ""]
    for name, rec in stages.items():
        for check, ok, detail in rec.get("checks", []):
            lines.append(f"- {name}: {'PASS' if ok else 'FAIL'}: {check}" + (f" ({detail})" if detail else ""))
    lines.append("")
    for name, rec in stages.items():
        if rec.get("log_tail"):
            lines += [f"### {name}: the last lines of its output", "", "```", *rec["log_tail"], "```", ""]
    return "\n".join(lines) + "\n"


def _train(rec: dict[str, Any] | None) -> list[str]:
    if not rec or not rec.get("result"):
        return []
    r = rec["result"]
    s = r.get("settings", {})
    lines = ["## The README's one-GPU command", "", f"`{r.get('command')}`", "",
             (f"{_f(r.get('params'), ',')} parameters; {s.get('prompts_per_step')} prompts x {s.get('group_size')} "
             f"answers x {s.get('max_new_tokens')} tokens, {s.get('frames')} frames of {s.get('video_pixels')} pixels, "
             + (f"micro-batches of {s.get('micro_batch_tokens')} tokens" if s.get("micro_batch_tokens")
              else f"micro-batch {s.get('micro_batch_size')}")
             + f", {s.get('attention', 'sdpa')} attention, {s.get('dtype')}, activation checkpointing "
             f"{s.get('gradient_checkpointing')}; memory held to {_f(r.get('memory_cap_gb'), '.1f')} GB; "
             f"{r.get('steps')} steps (timings: the mean of the {r.get('timed_steps')} after the first)."), "",
             ("| rollout s | reference s | update s | sync s | step s | first step s | checkpoint s | answer tokens | "
             "trained tok/s | generated tok/s | update MFU (6·N·tokens) |"),
             "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |",
             (f"| {_f(r.get('rollout_s'))} | {_f(r.get('reference_s'))} | {_f(r.get('update_s'))} | {_f(r.get('sync_s'))}"
             f" | {_f(r.get('step_s'))} | {_f(r.get('first_step_s'))} | {_f(r.get('save_s'))} | "
             f"{_f(r.get('response_length'), '.0f')} | {_f(r.get('trained_tok_s'), '.0f')} | "
             f"{_f(r.get('generated_tok_s'), '.0f')} | {_pct(r.get('update_mfu_6nt'))} |"), ""]
    mem = {k: v for k, v in r.items() if k.startswith("memory/")}
    lines += ["| memory (GB, 10^9 bytes) | peak |", "| --- | --- |",
              (f"| the whole run: the most allocated in any window (CUDA: tensors; CPU: resident set), in "
               f"`{r.get('peak_window', '–')}` | {_f(r.get('peak_gb'))} |"),
              (f"| the whole run: the most reserved by the allocator in any window (what the card must hold), in "
               f"`{r.get('peak_reserved_window', '–')}` | {_f(r.get('peak_reserved_gb'))} |")]
    lines += [f"| `{k}` (largest step or checkpoint) | {_f(v)} |" for k, v in sorted(mem.items())]
    lines.append("")
    hist = r.get("memory_history")
    if hist:
        lines += [(f"Allocator history (`--memory-history`, {hist.get('events'):,} events): the most allocated, "
                   f"{_f(hist.get('peak_allocated_gb'))} GB in {hist.get('blocks')} blocks, after event "
                   f"{hist.get('peak_after_event')}; live then, by where it was allocated (the innermost frame in "
                   "mmrl's code):"), "", "| allocated at | innermost frame | GB | blocks |", "| --- | --- | --- | --- |"]
        lines += [f"| `{row['where']}` | `{row['innermost']}` | {_f(row['gb'], '.3f')} | {row['blocks']} |"
                  for row in hist.get("top", [])]
        lines += [f"| the rest | | {_f(hist.get('rest_gb'), '.3f')} | |", ""]
    return lines


def _profile(rec: dict[str, Any] | None) -> list[str]:
    if not rec or not rec.get("result"):
        return []
    r = rec["result"]
    mb = r.get("micro_batch", {})
    lines = ["## One update micro-batch", "",
             (f"{mb.get('rows')} rows of {mb.get('prompt_tokens')} prompt tokens ({mb.get('vision_tokens')} vision) + "
             f"{mb.get('answer_tokens')} answer tokens; {mb.get('dtype')}, {mb.get('attention')} attention, shared "
             f"prefix {mb.get('shared_prefix')}, activation checkpointing {mb.get('gradient_checkpointing')}."), "",
             ("| forward | of which vision tower | of which attention | backward (recompute included) | seconds "
             "(median) | model TFLOP/s | MFU (3 x forward) | HFU (counted) | GPU busy | peak GB |"),
             "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |",
             (f"| {_flops(r.get('flops_forward'))} | {_flops(r.get('flops_vision_forward'))} | "
             f"{_flops(r.get('flops_attention_forward'))} | {_flops(r.get('flops_backward'))} | {_f(r.get('seconds'), '.3f')}"
             f" | {_f(r.get('achieved_tflops'), '.1f')} | {_pct(r.get('mfu'))} | {_pct(r.get('hfu'))} | "
             f"{_pct(r.get('gpu_busy'))} | {_f(r.get('peak_gb'))} |"), "",
             ("FLOPs counted by `torch.utils.flop_counter.FlopCounterMode` (matrix products and attention kernels; "
             "attention at its full, unmasked size); MFU: three times the forward's FLOPs per second over the "
             "card's dense bf16 peak; HFU: every counted FLOP (the checkpointed forward again in the backward); GPU "
             "busy: the share of the profiled pass in which the card ran a kernel or a copy (each counted once). "
             "The kernel table's share counts an aten op's row and its kernels' rows alike: it sums to about twice "
             "the kernel time."), ""]
    if r.get("top_kernels"):
        lines += ["| kernel | ms | calls | share |", "| --- | --- | --- | --- |"]
        lines += [f"| `{k['name'].replace('|', '/')}` | {k['ms']} | {k['calls']} | {_pct(k['share'])} |"
                  for k in r["top_kernels"]]
        lines.append("")
    return lines


def _deepspeed(rec: dict[str, Any] | None) -> list[str]:
    if not rec:
        return []
    if rec.get("skipped"):
        return ["## DeepSpeed in one process", "", f"Skipped: {rec['skipped']}", ""]
    r = rec.get("result", {})
    zeros = sorted({k.split("_")[0] for k in r if k.startswith("zero")})
    if not zeros:
        return []
    lines = ["## DeepSpeed in one process", "", (f"DeepSpeed {r.get('deepspeed')}, a {_f(r.get('params'), ',')}-parameter "
             "model, 4 steps with checkpoints at 2 and 4, then a copy resumed from checkpoint-2."), "",
             "| stage | tensors | differ after the resume | max abs diff | moved by steps 3-4 | seconds |",
             "| --- | --- | --- | --- | --- | --- |"]
    for z in zeros:
        lines.append(f"| {z} | {r.get(f'{z}_tensors')} | {r.get(f'{z}_tensors_differing_after_resume')} | "
                     f"{_f(r.get(f'{z}_max_abs_diff_after_resume'), '.1e')} | {r.get(f'{z}_tensors_moved_after_step_2')} | "
                     f"{_f(r.get(f'{z}_seconds'), '.0f')} |")
    return lines + [""]


def _tests(rec: dict[str, Any] | None) -> list[str]:
    if not rec or not rec.get("result"):
        return []
    r = rec["result"]
    lines = ["## GPU tests", "", (f"{r.get('tests')} collected, {r.get('passed')} passed, {len(r.get('failed', []))} "
             f"failed, {r.get('skipped')} skipped (`pytest -m gpu tests/test_gpu.py`)."), ""]
    lines += [f"- FAILED {f}" for f in r.get("failed", [])]
    return lines + ([""] if r.get("failed") else [])
