"""``make gpu-check``'s report in its CPU mode (``python -m perf.gpu_check`` without CUDA): the same code as on a
GPU, on a tiny model, in seconds, so that it cannot rot; it must say that no GPU figure was measured."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import torch


def test_cpu_mode_reports_every_stage_and_says_no_gpu_was_measured(tmp_path: Path) -> None:
    assert not torch.cuda.is_available()  # the CPU mode is what this test covers
    env = {**os.environ, "MMRL_CACHE": str(tmp_path / "cache"), "OMP_NUM_THREADS": "1", "TQDM_DISABLE": "1"}
    done = subprocess.run([sys.executable, "-m", "perf.gpu_check", "--backend", "hf", "--steps", "2", "--out",
                           str(tmp_path / "report")], env=env, check=False, capture_output=True, text=True,
                          timeout=600, cwd=Path(__file__).parent.parent)
    assert done.returncode == 0, (done.stdout + done.stderr)[-3000:]
    report = (tmp_path / "report" / "gpu_check.md").read_text()
    assert "No CUDA device" in report and "No GPU figure" in report
    data = json.loads((tmp_path / "report" / "gpu_check.json").read_text())
    assert data["checks"] and all(ok for _, ok, _ in data["checks"])
    (run,) = data["runs"]
    assert run["size"] == "tiny" and run["backend"] == "hf" and run["steps"] == 2
    for key in ("rollout_s", "reference_s", "update_s", "save_s", "trained_tok_s", "generated_tok_s"):
        assert run[key] is not None and run[key] > 0, key
    assert run["peak_gpu_gb"] is None and run["mfu"] is None  # not measured without a GPU
    assert "| tiny | hf |" in report
