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
                "peak_gb", "memory/peak_gb", "memory/save_gb"):
        assert isinstance(train[key], (int, float)) and train[key] > 0, key
    # the whole run's peak is its largest window, the checkpoint's included
    windows = {k: v for k, v in train.items() if k.startswith("memory/") and k != "memory/peak_gb"}
    assert train["peak_gb"] == max(windows.values()) == train[train["peak_window"]]
    assert {"transformers", "av", "rapidfuzz"} <= set(train["distributions"])  # what the run imported
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
    from mmrl.toy.tiny_models import build_processor, make_tiny, resolve_size
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


# ---------------------------------------------------------------------------------------- a call on a lent machine
def _children(pid: int) -> list[tuple[int, str]]:
    """The processes whose parent is ``pid``: (pid, command line)."""
    out = []
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            stat = (proc / "stat").read_text()
            cmd = (proc / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        if int(stat.rsplit(")", 1)[1].split()[1]) == pid:
            out.append((int(proc.name), cmd))
    return out


def _alive(pid: int) -> bool:
    """Running (a zombie nobody reaped yet has ended)."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def _wait_for(cond, seconds: float) -> bool:
    import time

    end = time.monotonic() + seconds
    while time.monotonic() < end:
        if cond():
            return True
        time.sleep(0.2)
    return cond()


def _start_runner_mid_train(work: Path, out: Path) -> tuple[subprocess.Popen, int]:
    """The runner in the CPU mode (its own session, as a lent machine's command), once its train stage has
    started: the runner and the stage's process id."""
    env = {**os.environ, "MMRL_CACHE": str(work / "cache"), "OMP_NUM_THREADS": "1"}
    runner = subprocess.Popen([sys.executable, "-m", "perf.gpu_check", "--mode", "cpu", "--stages", "train", "--work",
                               str(work), "--out", str(out), "--name", "k"], cwd=REPO, env=env,
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    log = work / "stages" / "train" / "output.log"

    def stage() -> list[int]:
        return [p for p, cmd in _children(runner.pid) if "perf.gpu_check.stages train" in cmd]

    # the stage has begun its work: it said so in its log (after it asked to die with the runner)
    assert _wait_for(lambda: bool(stage()) and log.exists() and "stage train" in log.read_text(), 300), \
        "the train stage did not start"
    (pid,) = stage()
    return runner, pid


@pytest.mark.parametrize("how", ["SIGKILL", "SIGTERM"])
def test_a_killed_call_takes_its_stage_with_it(work: Path, tmp_path: Path, how: str) -> None:
    """A runner killed outright (SIGKILL: none of its own clean-up runs) or stopped (SIGTERM, as a command's
    time limit does) mid-stage leaves no stage process behind (it would hold the GPU's memory in the next
    call); a stopped runner also records the stage as stopped."""
    import signal

    runner, stage = _start_runner_mid_train(work, tmp_path)
    assert _alive(stage)
    os.kill(runner.pid, getattr(signal, how))
    rc = runner.wait(timeout=120)
    assert _wait_for(lambda: not _alive(stage), 60), f"stage {stage} outlived its runner ({how})"
    if how == "SIGTERM":
        assert rc == 128 + signal.SIGTERM
        data = json.loads((tmp_path / "k.json").read_text())
        assert data["stages"]["train"]["status"] == "stopped" and "SIGTERM" in data["stages"]["train"]["error"]
        assert data["exit_status"] == 128 + signal.SIGTERM
    else:
        assert rc == -signal.SIGKILL


def test_a_stage_dies_with_the_process_that_started_it_even_when_it_prints_nothing(tmp_path: Path) -> None:
    """``die_with_parent`` (every stage, and the ``mmrl`` runs a stage starts, call it first): a process whose
    parent is SIGKILLed ends although it is silent (a stage writing to its dead runner's pipe would fail anyway;
    one in a long GPU step writes nothing for minutes)."""
    import signal

    pid_file = tmp_path / "child.pid"
    child = ("import os, time; from perf.gpu_check.stages import die_with_parent; die_with_parent(); "
             f"open({str(pid_file)!r}, 'w').write(str(os.getpid())); time.sleep(600)")
    parent = ("import os, subprocess, sys, time; "
              f"subprocess.Popen([sys.executable, '-c', {child!r}], env={{**os.environ, "
              "'GPU_CHECK_PARENT_PID': str(os.getpid())}, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL); "
              "time.sleep(600)")
    proc = subprocess.Popen([sys.executable, "-c", parent], cwd=REPO, start_new_session=True)
    try:
        assert _wait_for(lambda: pid_file.exists() and pid_file.read_text().strip().isdigit(), 120)
        grandchild = int(pid_file.read_text())
        assert _alive(grandchild)
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait(timeout=60)
        assert _wait_for(lambda: not _alive(grandchild), 60), "the silent child outlived its parent"
    finally:
        proc.kill()
        if pid_file.exists() and _alive(int(pid_file.read_text())):
            os.kill(int(pid_file.read_text()), signal.SIGKILL)


def test_a_stage_gets_what_is_left_of_the_calls_budget() -> None:
    from perf.gpu_check.runner import MIN_STAGE_S, STOP_S, stage_timeout

    assert stage_timeout(1500, 0.0, None, 100.0) == 1500  # no budget: the stage's own
    assert stage_timeout(1500, 0.0, 540, 100.0) == 540 - 100 - STOP_S  # cut to the call's end, less the stop
    assert stage_timeout(60, 0.0, 540, 100.0) == 60  # its own when shorter
    assert stage_timeout(1500, 0.0, 540, 540 - STOP_S - MIN_STAGE_S + 1) is None  # too little left: not started


def test_a_spent_budget_starts_no_stage_and_says_so(tmp_path: Path) -> None:
    """A call whose budget is spent before a stage (here at once: GPU_CHECK_STARTED, set by `make gpu-check`
    before the wheels' install, is that long ago) starts none, records why and fails."""
    import time

    env = {**os.environ, "GPU_CHECK_STARTED": str(time.time() - 500)}
    done = subprocess.run([sys.executable, "-m", "perf.gpu_check", "--mode", "cpu", "--call-budget", "540",
                           "--stages", "environment,train", "--work", str(tmp_path / "w"), "--out", str(tmp_path),
                           "--name", "b"], cwd=REPO, env=env, capture_output=True, text=True, timeout=120, check=False)
    assert done.returncode == FAILED, done.stdout + done.stderr
    data = json.loads((tmp_path / "b.json").read_text())
    assert data["call_budget_s"] == 540
    assert data["stages"]["environment"]["status"] == "not run" and "budget" in data["stages"]["environment"]["error"]
    assert data["stages"]["train"]["status"] == "not run"
    assert not (tmp_path / "w" / "stages").exists()  # no stage process was started


def test_the_second_call_keeps_the_first_calls_stages_from_the_file_given(work: Path, tmp_path: Path) -> None:
    """Call 2 reads call 1's results from the path it is given (the JSON that came back from the machine, copied
    anywhere), writes under that file's name in --out, judges the budgets on both calls' stages."""
    first = tmp_path / "came-back" / "gpu_check-some-gpu-2026-12-01.json"
    first.parent.mkdir()
    first.write_text(json.dumps({"stages": {"train": {"status": "ok", "result": {"peak_gb": 70.0,
                                                                                 "peak_reserved_gb": 81.0}}}}))
    env = {**os.environ, "MMRL_CACHE": str(work / "cache"), "OMP_NUM_THREADS": "1"}
    done = subprocess.run([sys.executable, "-m", "perf.gpu_check", "--mode", "cpu", "--stages", "environment",
                           "--merge", str(first), "--no-default-budgets", "--budget", "train.peak_gb<=80",
                           "--budget", "train.peak_reserved_gb<=80", "--work", str(work), "--out",
                           str(tmp_path / "results")], cwd=REPO, env=env, capture_output=True, text=True,
                          timeout=600, check=False)
    assert done.returncode == BUDGET_EXCEEDED, (done.stdout + done.stderr)[-3000:]
    data = json.loads((tmp_path / "results" / first.name).read_text())
    assert data["merged_from"] == str(first)
    assert data["stages"]["environment"]["status"] == "ok" and not data["stages"]["environment"].get(
        "from_earlier_call")
    assert data["stages"]["train"]["from_earlier_call"] and data["stages"]["train"]["result"]["peak_gb"] == 70.0
    assert "| train | OK | – | (an earlier call's)" in (tmp_path / "results" / first.with_suffix(".md").name).read_text()
    budgets = {b["bound"]: b["ok"] for b in data["budgets"]}
    assert budgets == {"train.peak_gb<=80": True, "train.peak_reserved_gb<=80": False}
    assert run(["--merge", str(tmp_path / "nothing.json"), "--work", str(tmp_path)]) == 2  # refused before a stage


# ---------------------------------------------------------------------------------------------- the run's memory
def test_the_whole_runs_peak_is_the_largest_window_and_the_checkpoint_is_reported() -> None:
    """Every window resets the device's peak counter, so the whole run's peak is the windows' largest: the
    committed GPU run's logged windows (its update and optimizer step) give it, not the checkpoint's window
    that the device's counter held at the end; host memory is no GPU window."""
    from perf.gpu_check.stages import memory_peaks

    committed = json.loads((REPO / "perf" / "results" / "gpu_check-nvidia-h200-2026-11-27.json").read_text())
    logged = {k: v for k, v in committed["stages"]["train"]["result"].items() if k.startswith("memory/")}
    rows = [logged, {"memory/save_gb": committed["stages"]["train"]["result"]["peak_gb"],
                     "memory/save_host_gb": 1000.0}]
    peaks = memory_peaks(rows)
    allocated = {k: v for k, v in logged.items() if not k.endswith(("_reserved_gb", "_host_gb"))}
    reserved = {k: v for k, v in logged.items() if k.endswith("_reserved_gb")}
    assert peaks["peak_gb"] == max(allocated.values()) > peaks["memory/save_gb"]
    assert peaks["peak_window"] == max((k for k in allocated if k != "memory/peak_gb"), key=allocated.get)
    assert peaks["peak_reserved_gb"] == max(reserved.values())
    assert peaks["peak_reserved_window"] == max(reserved, key=reserved.get)
    # a step's largest window over several steps
    two = memory_peaks([{"memory/update_gb": 1.0}, {"memory/update_gb": 3.0}, {"memory/save_gb": 2.0}])
    assert (two["peak_gb"], two["peak_window"], two["memory/save_gb"]) == (3.0, "memory/update_gb", 2.0)


def test_the_allocation_history_summary_finds_the_most_allocated_moment_and_what_was_live() -> None:
    """``--memory-history``'s summary on a made-up allocator history: the moment the most was allocated, what
    was live then, credited to the innermost frame in mmrl's code; a block live since before the first
    recorded event is counted too, and said to be from before."""
    from perf.gpu_check.stages import GB, peak_allocations

    def frames(*where: str) -> list[dict]:
        return [{"filename": f"/x/{w.split(':')[0]}", "line": int(w.split(":")[1]), "name": "f"} for w in where]

    master = frames("torch/optim/adamw.py:10", "mmrl/engine/optim.py:50")
    grad = frames("torch/autograd/graph.py:5", "mmrl/engine/trainer.py:700")
    act = frames("torch/nn/functional.py:3", "mmrl/model/policy.py:90")
    events = [{"action": "alloc", "addr": 1, "size": 4 * GB, "frames": master},
              {"action": "alloc", "addr": 2, "size": 2 * GB, "frames": grad},
              {"action": "alloc", "addr": 3, "size": 1 * GB, "frames": act},  # the peak: 9 GB live
              {"action": "free_requested", "addr": 3, "size": 1 * GB, "frames": act},
              {"action": "free_completed", "addr": 3, "size": 1 * GB, "frames": act},
              {"action": "free_completed", "addr": 2, "size": 2 * GB, "frames": grad}]
    snapshot = {"segments": [{"device": 0, "blocks": [
        {"address": 1, "size": 4 * GB, "state": "active_allocated", "frames": master},
        {"address": 9, "size": 2 * GB, "state": "active_awaiting_free", "frames": []},  # from before the history
        {"address": 7, "size": 5 * GB, "state": "inactive", "frames": []}]}],  # cached, not allocated
        "device_traces": [events]}
    out = peak_allocations(snapshot)
    assert out["peak_allocated_gb"] == 9.0 and out["peak_after_event"] == 3 and out["blocks"] == 4
    top = {row["where"]: row["gb"] for row in out["top"]}
    assert top == {"mmrl/engine/optim.py:50 f": 4.0, "mmrl/engine/trainer.py:700 f": 2.0, "mmrl/model/policy.py:90 f": 1.0,
                   "(allocated before the recorded events)": 2.0}
    assert out["top"][0]["innermost"] == "torch/optim/adamw.py:10 f"


def test_the_gpu_busy_share_counts_each_device_interval_once() -> None:
    """The profile stage's ``gpu_busy``: overlapping kernels count once, gaps between them do not count, the span
    runs from the pass's first host event to its last event (an aten op's own row, which carries its kernels'
    time again, is a host event here and adds nothing)."""
    from types import SimpleNamespace

    from torch.autograd import DeviceType

    from perf.gpu_check.stages import device_busy

    def ev(kind: DeviceType, a: float, b: float) -> SimpleNamespace:
        return SimpleNamespace(device_type=kind, time_range=SimpleNamespace(start=a, end=b))

    cpu, gpu = DeviceType.CPU, DeviceType.CUDA
    prof = SimpleNamespace(events=lambda: [ev(cpu, 0, 100), ev(cpu, 10, 30), ev(gpu, 10, 20), ev(gpu, 15, 30),
                                           ev(gpu, 50, 60), ev(gpu, 90, 100)])
    assert device_busy(prof) == pytest.approx((20 + 10 + 10) / 100)
    assert device_busy(SimpleNamespace(events=lambda: [ev(cpu, 0, 10)])) is None
