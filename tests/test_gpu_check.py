"""``make gpu-check``'s stage runner and its asserts in the CPU mode (``python -m perf.gpu_check --mode cpu``): the
same runner and stages as on a GPU, on the tiny model, in seconds, so that they cannot rot.

Two runs: a clean one (environment, the README command's run, the profiled micro-batch), whose results files
are read back after every stage; and one in which a stage fails (the GPU tests without CUDA), one times out,
a later stage still runs and a budget is exceeded, each said by its own bit of the exit status."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from perf.gpu_check.runner import BUDGET_EXCEEDED, FAILED, run

REPO = Path(__file__).resolve().parent.parent
pytestmark = pytest.mark.xdist_group("gpu_check")  # one worker: the tiny model and toy world are built once


@pytest.fixture(scope="module")
def work(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """One scratch folder (tiny model, toy world) for both runs."""
    assert not torch.cuda.is_available()  # the CPU mode is what this module covers
    return tmp_path_factory.mktemp("gpu-check-work")


@pytest.mark.slow
def test_a_clean_run_writes_each_stage_when_it_ends_and_exits_0(work: Path, tmp_path: Path,
                                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("MMRL_CACHE", str(work / "cache"))
    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    seen: list[tuple[str, dict]] = []

    def on_write(stage: str, paths: list[Path]) -> None:  # read the files back as the run goes
        assert sorted((p.parent.name, p.suffix) for p in paths) == [("copy", ".json"), ("copy", ".md"),
                                                                    ("results", ".json"), ("results", ".md")]
        js = next(p for p in paths if p.suffix == ".json" and p.parent.name == "results")
        seen.append((stage, json.loads(js.read_text())))

    status = run(["--mode", "cpu", "--stages", "environment,train,profile", "--work", str(work), "--out",
                  str(tmp_path / "results"), "--copy-to", str(tmp_path / "copy")], on_write=on_write)
    assert status == 0
    assert [s for s, _ in seen] == ["environment", "train", "profile", "end"]
    for i, (stage, data) in enumerate(seen[:-1]):
        # written when the stage ended: it is there with its outcome, and no later stage has run yet
        assert data["stages"][stage]["status"] == "ok", data["stages"][stage]
        assert list(data["stages"]) == ["environment", "train", "profile"][:i + 1]
        assert data["exit_status"] is None and data["mode"] == "cpu"
    final = seen[-1][1]
    assert final["exit_status"] == 0 and final["finished"]
    (js,) = (tmp_path / "results").glob("gpu_check-cpu-*.json")
    assert json.loads(js.read_text()) == final
    assert (tmp_path / "copy" / js.name).read_text() == js.read_text()
    md = js.with_suffix(".md").read_text()
    assert "No CUDA device" in md and "No GPU figure" in md and "| train | OK |" in md

    env = final["stages"]["environment"]["result"]
    assert env["cuda"] is False and env["packages"]["transformers"]["version"]
    train = final["stages"]["train"]["result"]
    assert train["steps"] == 2 and train["size"] == "tiny" and train["command"].startswith("mmrl train --task video-qa")
    for key in ("rollout_s", "reference_s", "update_s", "step_s", "save_s", "trained_tok_s", "generated_tok_s",
                "peak_gb", "memory/peak_gb"):
        assert isinstance(train[key], (int, float)) and train[key] > 0, key
    assert train["update_mfu_6nt"] is None  # no utilisation without a GPU's peak
    prof = final["stages"]["profile"]["result"]
    assert prof["flops_forward"] > 0 and prof["flops_backward"] > prof["flops_forward"]  # backward ~2x forward
    assert 0 < prof["flops_vision_forward"] < prof["flops_forward"]  # the vision tower is in the count
    assert 0 < prof["flops_attention_forward"] < prof["flops_forward"]  # and attention
    assert prof["micro_batch"]["vision_tokens"] > 0 and prof["mfu"] is None and prof["top_kernels"]
    budgets = {b["bound"]: b for b in final["budgets"]}
    assert budgets["train.peak_gb<=16"]["ok"] is True and budgets["profile.peak_gb<=16"]["ok"] is True


@pytest.mark.slow
def test_a_failed_stage_a_timeout_and_a_budget_each_make_the_exit_status_non_zero(work: Path,
                                                                                   tmp_path: Path) -> None:
    env = {**os.environ, "MMRL_CACHE": str(work / "cache"), "OMP_NUM_THREADS": "1"}
    # the GPU tests fail without CUDA; the deepspeed stage gets 1 second; profile runs after both, over a budget
    done = subprocess.run(
        [sys.executable, "-m", "perf.gpu_check", "--mode", "cpu", "--stages", "gpu-tests,deepspeed,profile",
         "--timeout", "deepspeed=1", "--budget", "profile.peak_gb<=0.001", "--work", str(work), "--out",
         str(tmp_path), "--name", "check"], check=False, cwd=REPO, env=env, capture_output=True, text=True, timeout=900)
    out = done.stdout + done.stderr
    assert done.returncode == FAILED | BUDGET_EXCEEDED, out[-3000:]
    data = json.loads((tmp_path / "check.json").read_text())
    stages = data["stages"]
    assert list(stages) == ["environment", "gpu-tests", "deepspeed", "profile"]
    assert stages["environment"]["status"] == "ok"
    tests = stages["gpu-tests"]
    assert tests["status"] == "failed" and tests["returncode"] != 0
    assert tests["result"]["failed"] and "test_a_cuda_device_is_there" in tests["result"]["failed"][0]
    assert tests["log_tail"]  # the end of its output is kept
    assert stages["deepspeed"]["status"] == "timeout" and "1 s" in stages["deepspeed"]["error"]
    assert stages["profile"]["status"] == "ok"  # the stages after a failure and a timeout still ran
    budgets = {b["bound"]: b for b in data["budgets"]}
    budget = budgets["profile.peak_gb<=0.001"]  # it replaced the default profile.peak_gb<=16
    assert budget["ok"] is False and budget["value"] > 0.001 and "profile.peak_gb<=16" not in budgets
    assert budgets["train.peak_gb<=16"]["ok"] is None  # the train stage did not run: not checked
    assert data["exit_status"] == FAILED | BUDGET_EXCEEDED
    md = (tmp_path / "check.md").read_text()
    assert "| gpu-tests | FAILED |" in md and "| deepspeed | TIMEOUT |" in md and "EXCEEDED" in md
    assert "budget exceeded: profile.peak_gb<=0.001" in out


@pytest.mark.slow
def test_a_budget_alone_exceeded_sets_only_its_bit(work: Path, tmp_path: Path) -> None:
    """The environment stage alone, with a budget on its CPU count that it cannot meet: every stage passed, the
    exit status is the budget's bit only."""
    env = {**os.environ, "MMRL_CACHE": str(work / "cache"), "OMP_NUM_THREADS": "1"}
    done = subprocess.run(
        [sys.executable, "-m", "perf.gpu_check", "--mode", "cpu", "--stages", "environment", "--no-default-budgets",
         "--budget", "environment.cpus>=100000", "--work", str(work), "--out", str(tmp_path), "--name", "b"],
        check=False, cwd=REPO, env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == BUDGET_EXCEEDED, (done.stdout + done.stderr)[-3000:]
    data = json.loads((tmp_path / "b.json").read_text())
    assert data["stages"]["environment"]["status"] == "ok"
    assert data["budgets"] == [{"bound": "environment.cpus>=100000", "value": os.cpu_count(), "ok": False}]


def test_malformed_budgets_and_unknown_stages_are_refused_before_anything_runs(tmp_path: Path) -> None:
    assert run(["--budget", "peak<80", "--work", str(tmp_path)]) == 2
    assert run(["--stages", "environment,warp", "--work", str(tmp_path)]) == 2
    assert run(["--timeout", "train", "--work", str(tmp_path)]) == 2
    assert not list(tmp_path.glob("stages/*"))  # no stage started


def test_the_profile_check_catches_a_processor_that_shrinks_the_sampled_frames(tmp_path: Path) -> None:
    """The acceptance model's processor must keep the frames at the size the settings sampled them: the tiny
    models' budget (16 tokens a frame) shrank the README command's 448 x 448 frames to 112 x 112 in the first
    GPU run of this check; the published budgets (``perf.gpu_check.PROCESSOR``) keep them."""
    from types import SimpleNamespace

    from transformers import AutoProcessor

    from mmrl.model import MediaInput
    from mmrl.tiny_models import build_processor, make_tiny, resolve_size
    from perf.gpu_check import FAMILY, PROCESSOR
    from perf.gpu_check.stages import sampled_vision_tokens

    small = AutoProcessor.from_pretrained(make_tiny(FAMILY, tmp_path / "tiny"))
    published = build_processor(FAMILY, resolve_size(FAMILY, **PROCESSOR), small.tokenizer)
    frames = torch.zeros(4, 3, 448, 448, dtype=torch.uint8)
    media = [MediaInput(key="v", kind="video", data=SimpleNamespace(frames=frames))]

    def tokens(processor) -> int:
        grid = processor.video_processor(videos=[frames], return_tensors="pt")["video_grid_thw"]
        return int(grid.prod()) // processor.video_processor.merge_size ** 2

    assert sampled_vision_tokens(media, published) == 2 * 16 * 16 == tokens(published)
    assert tokens(small) < sampled_vision_tokens(media, small)
