"""Cross-check a checkpoint with lmms-eval (optional extra: ``pip install 'mmrl[eval]'``).

``mmrl eval --benchmark mvbench --model DIR --lmms-eval`` runs lmms-eval's own task on the same folder, via
its command line (EvolvingLMMs-Lab/lmms-eval, README; ``pretrained`` goes to ``from_pretrained``)::

    python -m lmms_eval --model qwen2_5_vl --model_args pretrained=DIR,max_num_frames=32 --tasks mvbench ...

lmms-eval downloads its datasets from the Hub at run time and uses its own frames, prompts (16 new tokens) and
scoring (no MVBench average, random options for unparsed LongVideoBench answers), so its numbers are a
cross-check, not the same protocol as ``mmrl eval --benchmark``. The task names are the benchmarks' own
(``Benchmark.lmms_task``, ``lmms_subtitle_task``: each benchmark's module names lmms-eval's task folder).
"""

from __future__ import annotations

import importlib.util
import json
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

from data_pipelines.benchmarks import benchmarks, find_benchmark
from mmrl.model.types import FAMILIES, dense_family, has_linear_attention, is_moe
from mmrl_common.errors import MmrlError

# lmms-eval's model class of each family: a mixture-of-experts family is run by its dense family's class,
# which (lmms_eval/models/simple/qwen3_vl.py) loads Qwen3VLMoeForConditionalGeneration only when the
# checkpoint path matches r"A\d+B" (as in Qwen3-VL-30B-A3B-Instruct), else the dense class
# Qwen3.5 has none: lmms-eval's qwen3_vl class builds Qwen3VLForConditionalGeneration or its MoE sibling by
# name, which cannot load a Qwen3.5 folder (mmrl's own `mmrl eval` runs it)
LMMS_MODELS = {family: dense_family(family) for family in FAMILIES if not has_linear_attention(family)}
_LMMS_MOE_PATH = re.compile(r"A\d+B")


def lmms_available() -> bool:
    return importlib.util.find_spec("lmms_eval") is not None


def build_command(model: str | Path, benchmark: str, *, out: str | Path, frames: int | None = None,
                  max_pixels: int | None = None, batch_size: int = 1, limit: int | None = None,
                  subtitles: bool = False) -> list[str]:
    """The lmms-eval command line for ``model`` (a Hugging Face folder) on ``benchmark``."""
    model = Path(model)
    spec = find_benchmark(benchmark)
    task = spec.lmms_task if spec is not None else None
    if task is None:
        bridged = sorted(b.name for b in benchmarks() if b.lmms_task)
        raise MmrlError(f"lmms-eval has no task for '{benchmark}'; bridged: {', '.join(bridged)}")
    if subtitles:
        if spec.lmms_subtitle_task is None:
            with_subs = " and ".join(b.name for b in benchmarks() if b.lmms_subtitle_task)
            raise MmrlError(f"--subtitles applies to {with_subs} only")
        task = spec.lmms_subtitle_task
    cfg_path = model / "config.json"
    if not cfg_path.is_file():
        raise MmrlError(f"{model}: no config.json; expected a Hugging Face model folder")
    family = json.loads(cfg_path.read_text()).get("model_type")
    if family not in LMMS_MODELS:
        why = ("lmms-eval has no class for it (its qwen3_vl class loads Qwen3-VL models only); run "
               f"`mmrl eval {model} --benchmark {benchmark}` instead" if family in FAMILIES else "")
        raise MmrlError(f"{model}: model type '{family}' has no lmms-eval model class here" + (f": {why}" if why else ""))
    if is_moe(family) and not _LMMS_MOE_PATH.search(str(model.absolute())):
        raise MmrlError(f"{model}: a {family} model, which lmms-eval's {LMMS_MODELS[family]} class loads as a "
                        "mixture of experts only when its path contains the active size (e.g. "
                        "Qwen3-VL-30B-A3B-Instruct); copy or link the folder to such a name (e.g. my-model-A3B)")
    args = [f"pretrained={model.absolute()}"]  # not resolved: a link keeps the name lmms-eval reads
    if frames:
        args.append(f"max_num_frames={frames}")
    if max_pixels:
        args.append(f"max_pixels={max_pixels}")
    cmd = [sys.executable, "-m", "lmms_eval", "--model", LMMS_MODELS[family], "--model_args", ",".join(args),
           "--tasks", task, "--batch_size", str(batch_size), "--output_path", str(out), "--log_samples"]
    if limit:
        cmd += ["--limit", str(limit)]
    return cmd


def run_lmms_eval(model: str | Path, benchmark: str, *, out: str | Path | None = None, **kwargs: Any) -> int:
    """Run lmms-eval on ``model``; its results land in ``out`` (default ``runs/lmms-eval/<benchmark>``)."""
    if not lmms_available():
        raise MmrlError("lmms-eval is not installed; install the extra with: pip install 'mmrl[eval]'")
    out = Path(out) if out else Path("runs") / "lmms-eval" / benchmark
    cmd = build_command(model, benchmark, out=out, **kwargs)
    print("running: " + " ".join(cmd), file=sys.stderr)
    return subprocess.call(cmd)
