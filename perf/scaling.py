"""``python -m perf --only scaling``: weak scaling of the update on gloo ranks (CPU).

The same work per rank on 1 and on N ranks: one process trains ``P`` prompts x G answers a step in
mini-batches of ``M`` rows; N ranks train ``N x P`` prompts in mini-batches of ``N x M`` rows, so each rank
rolls out and trains ``P`` prompts and each optimizer step holds ``M`` rows per rank. Perfect data
parallelism keeps the update's seconds per step (``time/update_s``, the median over the steps after the
first) the same: the ratio N ranks / 1 process is 1.0. A rule that gives each optimizer step to one rank
while the others wait makes it about the number of mini-batches a rank's rows fall in (the others' steps are
dummy passes). The runs are measured in one invocation, one thread per rank; ``balance/tokens_max_over_mean``
(the busiest rank's tokens over the mean, per optimizer step) is printed beside it. On a machine with as many
cores as ranks, the ranks also share the memory bus and caches, so a second figure divides by N independent
single processes run at once (the same work with no collective): what the framework adds to what the
machine takes.
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
from pathlib import Path
from typing import Any

MMRL = str(Path(sys.executable).with_name("mmrl"))
TORCHRUN = str(Path(sys.executable).with_name("torchrun"))
REWARD = '''
from rewards import register_reward


@register_reward("perf_text_length")
def perf_text_length(completions, **_):
    """Longer completions score higher: a random model's answers differ, so the advantages are not zero."""
    return [len(c if isinstance(c, str) else c[-1]["content"]) / 10 for c in completions]
'''


def _launch(root: Path, name: str, ranks: int, *, prompts: int, mini: int, steps: int, group: int, tokens: int,
            micro: int) -> tuple[subprocess.Popen, Path]:
    out = root / name
    args = ["train", "--quiet", "--out", str(out), "model.tiny_family=qwen2_5_vl", "model.init=random",
            "data.toy_size={train: 32, val: 2, test: 2}", "data.toy_tasks=[color]",
            "data.media.video_min_pixels=3136", "data.media.video_max_pixels=3136",
            f"rollout.group_size={group}", f"rollout.max_new_tokens={tokens}", "rollout.seed_per_prompt=true",
            f"train.prompts_per_step={prompts * ranks}", f"grpo.ppo_mini_batch_size={mini * ranks}",
            f"train.micro_batch_size={micro}", f"train.steps={steps}", "train.save_every=0", "train.log_every=0",
            "train.cpu_threads=1", "sft.steps=0", "eval.before_rl=false", "eval.after_rl=false",
            f"imports=[{root / 'perf_reward.py'}]", "rewards=[{name: perf_text_length}]"]
    cmd = [MMRL, *args] if ranks == 1 else [TORCHRUN, "--standalone", "--nproc_per_node", str(ranks), "-m", "mmrl",
                                            *args]
    env = {**os.environ, "MMRL_CACHE": str(root / "cache"), "OMP_NUM_THREADS": "1", "TQDM_DISABLE": "1"}
    return subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True), out


def _result(proc: subprocess.Popen, out: Path, ranks: int) -> dict[str, Any]:
    try:
        log, _ = proc.communicate(timeout=1800)
    except subprocess.TimeoutExpired:
        proc.kill()
        raise RuntimeError(f"the {ranks}-rank run in {out} did not finish in 30 minutes") from None
    if proc.returncode != 0:
        raise RuntimeError(f"the {ranks}-rank run in {out} failed:\n{log[-3000:]}")
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    rows = [r for r in rows if r.get("stage") == "rl"][1:]  # the first step warms up
    return {"ranks": ranks, "update_s": statistics.median(r["time/update_s"] for r in rows),
            "step_s": statistics.median(r["time/step_s"] for r in rows),
            "optimizer_steps": rows[-1]["optimizer_steps"],
            "balance": statistics.mean(r.get("balance/tokens_max_over_mean", float("nan")) for r in rows),
            "idle": sum(r.get("balance/idle_rank_steps", 0) for r in rows), "steps": len(rows)}


def bench_scaling(root: Path, *, ranks: int = 2, prompts: int = 4, mini: int = 16, steps: int = 8, group: int = 8,
                  tokens: int = 32, micro: int = 4) -> dict[str, Any]:
    """The 1-process and the ``ranks``-rank runs at equal work per rank, and the update's ratio; also
    ``ranks`` independent 1-process runs at once (no collective between them: what this machine's cores give
    when they are all busy, the best the ranks can do here)."""
    (root / "perf_reward.py").write_text(REWARD)
    kw = {"prompts": prompts, "mini": mini, "steps": steps, "group": group, "tokens": tokens, "micro": micro}
    _result(*_launch(root, "warm-up", 1, **{**kw, "steps": 2}), 1)  # builds the tiny model and the toy world
    one = _result(*_launch(root, "one", 1, **kw), 1)
    many = _result(*_launch(root, "ranks", ranks, **kw), ranks)
    alone = [_launch(root, f"alone{i}", 1, **kw) for i in range(ranks)]
    apart = [_result(proc, out, 1) for proc, out in alone]
    busy = statistics.median(r["update_s"] for r in apart)
    return {"settings": {"ranks": ranks, **kw}, "runs": [one, many], "ratio": many["update_s"] / one["update_s"],
            "busy_update_s": busy, "ratio_busy": many["update_s"] / busy}


def print_scaling(result: dict[str, Any]) -> None:
    s = result["settings"]
    print(f"weak scaling of the update (gloo, 1 thread per rank): {s['prompts']} prompts x G={s['group']} x "
          f"{s['tokens']} new tokens per rank, mini-batches of {s['mini']} rows per rank, micro-batches of "
          f"{s['micro']}; median over {result['runs'][0]['steps']} steps after the first")
    head = f"{'ranks':>5} {'update s/step':>14} {'step s':>8} {'optimizer steps':>16} {'tokens max/mean':>16} " \
           f"{'idle rank-steps':>16}"
    print(head)
    print("-" * len(head))
    for r in result["runs"]:
        print(f"{r['ranks']:>5} {r['update_s']:>14.3f} {r['step_s']:>8.3f} {r['optimizer_steps']:>16} "
              f"{r['balance']:>16.3f} {r['idle']:>16}")
    print(f"update seconds, {s['ranks']} ranks / 1 process at equal work per rank: {result['ratio']:.2f} "
          "(perfect: 1.00)")
    print(f"{s['ranks']} independent single processes at once (every core busy, no collective): "
          f"{result['busy_update_s']:.3f} s/step; {s['ranks']} ranks / that: {result['ratio_busy']:.2f}\n")
