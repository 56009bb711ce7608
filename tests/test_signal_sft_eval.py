"""SIGTERM to ``mmrl sft`` and ``mmrl eval`` (issue 61, item 12): each stops at its next boundary (SFT after the
optimizer step in flight, with a checkpoint; an evaluation after the batch in flight, its answers kept in a
partial predictions file), says how far it got and the exact command that continues it, releases the folder's
lock and exits with 143 (128 + SIGTERM); the continued run ends as a run never stopped: the same SFT losses and
final weights, the same predictions and metrics. ``mmrl eval --benchmark`` alike, from its own predictions file.

The subprocess tests wait for a marker, as tests/test_sigterm.py does for ``mmrl train``: SFT's first row in
``metrics.jsonl``; for the held-out evaluation, the first batch reported by an evaluation check this module
registers through ``imports:`` (:data:`MARKS_CHECK`, a public extension point: it notes each batch's question
ids in a file); for a benchmark, the first line of its ``predictions.jsonl``. The in-process tests drive the same
stop and resume through the engine's functions with a stop request instead of a signal."""

from __future__ import annotations

import json
import os
import re
import shlex
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

MMRL = str(Path(sys.executable).with_name("mmrl"))
TINY = ["model.tiny_family=qwen2_5_vl", "model.init=random", "data.toy_size={train: 4, val: 2, test: 12}",
        "data.toy_tasks=[color]", "data.media.video_min_pixels=3136", "data.media.video_max_pixels=3136",
        "rollout.max_new_tokens=8", "sft.steps=0", "train.cpu_threads=1"]
SFT = ["sft", "--quiet", "--steps", "8", *TINY, "sft.batch_size=3", "sft.lr=1e-3", "train.seed=3"]

MARKS_CHECK = '''
"""An evaluation check for tests/test_signal_sft_eval.py: after each batch of questions it appends their ids, one
line per batch, to the file named by MMRL_TEST_BATCH_MARKS."""
import os

from mmrl.engine.evaluate import register_check


@register_check("batch_marks", summarize=lambda predictions: {"questions": len(predictions)})
def batch_marks(service, samples, rows, *, max_new_tokens, **settings):
    with open(os.environ["MMRL_TEST_BATCH_MARKS"], "a") as f:
        f.write(" ".join(str(s.id) for s in samples) + "\\n")
'''


@pytest.fixture(scope="module")
def env(tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    root = tmp_path_factory.mktemp("signal")
    (root / "batch_marks.py").write_text(MARKS_CHECK)
    return {**os.environ, "MMRL_CACHE": str(root / "cache"), "OMP_NUM_THREADS": "1", "TQDM_DISABLE": "1",
            "MMRL_TEST_CHECK": str(root / "batch_marks.py")}


def weights(folder: Path) -> dict[str, torch.Tensor]:
    out: dict[str, torch.Tensor] = {}
    for f in sorted(folder.glob("*.safetensors")):
        out.update(load_file(f))
    assert out, f"no weights in {folder}"
    return out


def rows(run: Path, stage: str) -> list[dict]:
    return [r for r in map(json.loads, (run / "metrics.jsonl").read_text().splitlines()) if r["stage"] == stage]


def wait_for(proc: subprocess.Popen, ready) -> None:
    """Until ``ready()`` (the process ending first fails the test with its stderr)."""
    while not ready():
        assert proc.poll() is None, proc.communicate()[1][-3000:]
        time.sleep(0.02)


def run(argv: list[str], env: dict[str, str]) -> subprocess.CompletedProcess:
    return subprocess.run([MMRL, *argv], env=env, capture_output=True, text=True, timeout=600, check=False)


def stop_when(argv: list[str], env: dict[str, str], ready) -> tuple[int, str]:
    """Start ``mmrl ARGV``, SIGTERM it once ``ready()``; its exit status and stderr."""
    proc = subprocess.Popen([MMRL, *argv], env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        wait_for(proc, ready)
        os.kill(proc.pid, signal.SIGTERM)
        _, err = proc.communicate(timeout=300)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    return proc.returncode, err


def lock_holder(folder: Path) -> str:
    """What the folder's lock file says about its holder: empty once released."""
    return (folder / ".lock").read_text()


# ------------------------------------------------------------------------------------------------- mmrl sft
@pytest.mark.slow
def test_sigterm_stops_sft_with_a_checkpoint_and_resume_equals_an_unbroken_run(env: dict[str, str],
                                                                              tmp_path: Path) -> None:
    straight = tmp_path / "straight"
    done = run([*SFT, "--out", str(straight)], env)
    assert done.returncode == 0, done.stderr[-3000:]

    out = tmp_path / "stopped"
    rc, err = stop_when([*SFT, "--out", str(out)], env, lambda: (out / "metrics.jsonl").is_file()
                        and '"stage": "sft"' in (out / "metrics.jsonl").read_text())
    assert rc == 143, err[-3000:]  # 128 + SIGTERM, as a shell reports a process the signal ended
    said = re.search(r"stopped by SIGTERM at SFT step (\d+) of 8; checkpoint-\1 written\. Continue with: "
                     rf"mmrl sft --out {re.escape(str(out))} --resume", err)
    assert said, err[-3000:]
    step = int(said.group(1))
    assert 1 <= step < 8
    assert (out / f"checkpoint-{step}" / "trainer_state.pt").is_file()
    assert not (out / "final").exists() and not list(out.glob(".tmp-*"))  # final/ only once every step is done
    assert [r["step"] for r in rows(out, "sft")] == list(range(1, step + 1))
    assert lock_holder(out) == ""  # released on the way out

    again = run([*SFT, "--out", str(out)], env)  # not a silent restart over the stopped run
    assert again.returncode == 2 and "--resume to continue it" in again.stderr, again.stderr[-2000:]
    other = run(["sft", "--quiet", "--out", str(out), "--resume", "--steps", "9"], env)
    assert other.returncode == 2 and "sft.steps: 8 -> 9" in other.stderr, other.stderr[-2000:]

    resumed = run(["sft", "--quiet", "--out", str(out), "--resume"], env)  # the settings from its config.yaml
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert f"resumed from {out / f'checkpoint-{step}'} (SFT step {step} of 8)" in resumed.stdout + resumed.stderr
    a, b = weights(straight / "final"), weights(out / "final")
    assert set(a) == set(b)
    differ = [k for k in a if not torch.equal(a[k], b[k])]
    assert not differ, f"{len(differ)} tensors differ after the resume, e.g. {differ[:5]}"
    assert rows(out, "sft") == rows(straight, "sft")  # every step's loss and learning rate, to the last bit
    assert not list(out.glob("checkpoint-*"))  # the stop's checkpoint served the resume; final/ holds the model
    finished = run(["sft", "--quiet", "--out", str(out), "--resume"], env)
    assert finished.returncode == 2 and "finished" in finished.stderr


# ------------------------------------------------------------------------------------------------ mmrl eval
@pytest.mark.slow
def test_sigterm_stops_eval_keeping_its_answers_and_resume_gives_the_unbroken_result(env: dict[str, str],
                                                                                   tmp_path: Path) -> None:
    args = ["eval", "--quiet", "--batch-size", "2", "--check", "batch_marks", *TINY,
            f"imports=[{env['MMRL_TEST_CHECK']}]"]
    straight = tmp_path / "straight"
    done = run([*args, "--out", str(straight)], {**env, "MMRL_TEST_BATCH_MARKS": str(tmp_path / "marks0")})
    assert done.returncode == 0, done.stderr[-3000:]

    out, marks = tmp_path / "stopped", tmp_path / "marks1"
    rc, err = stop_when([*args, "--out", str(out)], {**env, "MMRL_TEST_BATCH_MARKS": str(marks)},
                        lambda: marks.is_file() and marks.read_text().count("\n") >= 1)
    assert rc == 143, err[-3000:]
    said = re.search(r"stopped by SIGTERM after (\d+) of 12 questions; their answers kept in (\S+)\. "
                     r"Continue with: (.+)", err)
    assert said, err[-3000:]
    n = int(said.group(1))
    assert 2 <= n < 12 and n % 2 == 0  # at a batch boundary, mid-way
    partial = out / "predictions.partial.jsonl"
    assert said.group(2) == str(partial)
    again = shlex.split(said.group(3))
    assert again[:3] == ["mmrl", "eval", "--quiet"] and again[-1] == "--resume"
    head, *kept = map(json.loads, partial.read_text().splitlines())
    assert head["partial"] is True and (head["done"], head["of"]) == (n, 12) and len(kept) == n
    straight_preds = [json.loads(line) for line in (straight / "predictions.jsonl").read_text().splitlines()]
    assert kept == straight_preds[:n]
    assert not (out / "metrics.json").exists() and not (out / "predictions.jsonl").exists()
    assert lock_holder(out) == ""

    refused = run([*args, "--out", str(out)], env)  # without --resume: nothing answered is thrown away
    assert refused.returncode == 2 and f"stopped after {n} of 12 questions" in refused.stderr
    other = run([*args, "--out", str(out), "--resume", "eval.max_new_tokens=5"], env)
    assert other.returncode == 2 and "eval.max_new_tokens: None -> 5" in other.stderr, other.stderr[-2000:]
    assert partial.read_text().count("\n") == n + 1  # untouched by the refusals

    marks2 = tmp_path / "marks2"
    resumed = subprocess.run([MMRL, *again[1:]], env={**env, "MMRL_TEST_BATCH_MARKS": str(marks2)}, capture_output=True, text=True,
                             timeout=600, check=False)  # the command it printed
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    answered = marks2.read_text().split()
    assert len(answered) == 12 - n and not set(answered) & {p["id"] for p in kept}  # only what was left
    assert (out / "predictions.jsonl").read_text() == (straight / "predictions.jsonl").read_text()
    assert json.loads((out / "metrics.json").read_text()) == json.loads((straight / "metrics.json").read_text())
    assert json.loads((out / "metrics.json").read_text())["batch_marks"] == {"questions": 12}
    assert not partial.exists()


@pytest.mark.slow
def test_sigterm_to_one_rank_stops_every_rank_of_an_eval_at_the_same_batch(env: dict[str, str],
                                                                           tmp_path: Path) -> None:
    """Under torchrun the ranks' shares differ in length (13 questions: 7 and 6, in batches of 2: 4 and 3), and a
    SIGTERM to one rank still stops both after the same batch (none waits in a collective), rank 0 keeping every
    rank's answers; the resume on 2 ranks ends as one process never stopped."""
    import psutil

    thirteen = "data.toy_size={train: 4, val: 2, test: 13}"
    args = ["eval", "--quiet", "--batch-size", "2", "--check", "batch_marks", *TINY, thirteen,
            f"imports=[{env['MMRL_TEST_CHECK']}]"]
    torchrun = [str(Path(sys.executable).with_name("torchrun")), "--standalone", "--nproc_per_node", "2", "-m", "mmrl"]
    straight = tmp_path / "straight"
    done = run([*args, "--out", str(straight)], {**env, "MMRL_TEST_BATCH_MARKS": str(tmp_path / "marks0")})
    assert done.returncode == 0, done.stderr[-3000:]

    out, marks = tmp_path / "two", tmp_path / "marks1"
    proc = subprocess.Popen([*torchrun, *args, "--out", str(out)], env={**env, "MMRL_TEST_BATCH_MARKS": str(marks)},
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True)
    try:
        wait_for(proc, lambda: marks.is_file() and marks.read_text().count("\n") >= 1)
        ranks = [p for p in psutil.Process(proc.pid).children(recursive=True)
                 if "mmrl" in " ".join(p.cmdline()) and "torchrun" not in " ".join(p.cmdline())]
        assert len(ranks) == 2
        ranks[-1].send_signal(signal.SIGTERM)  # one rank only: the other learns of it at the batch boundary
        _, err = proc.communicate(timeout=300)
    finally:
        if proc.poll() is None:
            for p in [*psutil.Process(proc.pid).children(recursive=True), psutil.Process(proc.pid)]:
                p.kill()
            proc.wait()
    assert proc.returncode != 0
    said = re.search(r"stopped by SIGTERM after (\d+) of 13 questions; their answers kept in", err)
    assert said, err[-4000:]  # rank 0's words, though the signal went to rank 1
    n = int(said.group(1))
    assert 4 <= n < 13 and n % 4 == 0  # the same number of batches of 2 on each rank
    head, *kept = map(json.loads, (out / "predictions.partial.jsonl").read_text().splitlines())
    by_id = {p["id"]: p for p in map(json.loads, (straight / "predictions.jsonl").read_text().splitlines())}
    assert head["done"] == n == len(kept) and all(by_id[p["id"]] == p for p in kept)

    resumed = subprocess.run([*torchrun, *args, "--out", str(out), "--resume"], capture_output=True, text=True,
                             env={**env, "MMRL_TEST_BATCH_MARKS": str(tmp_path / "marks2")}, timeout=600, check=False)
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert (out / "predictions.jsonl").read_text() == (straight / "predictions.jsonl").read_text()
    assert json.loads((out / "metrics.json").read_text()) == json.loads((straight / "metrics.json").read_text())


@pytest.mark.slow
def test_sigterm_stops_a_benchmark_eval_and_the_resume_completes_it(env: dict[str, str], tmp_path: Path) -> None:
    from data_pipelines.benchmarks.fixtures import write_fixture

    root = write_fixture("toy", tmp_path / "toy", n=5)
    args = ["eval", "--quiet", "--benchmark", "toy", "--data-root", str(root), "--frames", "4", "--batch-size", "1",
            "--workers", "0", "eval.max_new_tokens=8", *TINY]
    straight = tmp_path / "straight"
    done = run([*args, "--out", str(straight)], env)
    assert done.returncode == 0, done.stderr[-3000:]
    total = json.loads((straight / "metrics.json").read_text())["n"]

    out = tmp_path / "stopped"
    preds = out / "predictions.jsonl"
    rc, err = stop_when([*args, "--out", str(out)], env, lambda: preds.is_file() and preds.read_text().count("\n"))
    assert rc == 143, err[-3000:]
    said = re.search(rf"stopped by SIGTERM after (\d+) of {total} questions; their answers kept in "
                     rf"{re.escape(str(out))} \(predictions\*\.jsonl\)\. Continue with: .* --resume", err)
    assert said, err[-3000:]
    n = int(said.group(1))
    assert 1 <= n < total and preds.read_text().count("\n") == n
    assert not (out / "metrics.json").exists() and lock_holder(out) == ""

    resumed = run([*args, "--out", str(out), "--resume"], env)
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    m1, m2 = (json.loads((d / "metrics.json").read_text()) for d in (straight, out))
    assert m2["timing"]["resumed"] == n and m2["timing"]["generated_this_run"] == total - n
    assert m2["scores"] == m1["scores"]
    assert preds.read_text() == (straight / "predictions.jsonl").read_text()


# -------------------------------------------------------------------------------- the engine, in process
def _tiny_policy_and_samples(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, split: str, *extra: str):
    from mmrl.config import load_run_config
    from mmrl.model import load_policy
    from mmrl.run import load_split, resolve_model

    monkeypatch.setenv("MMRL_CACHE", str(tmp_path / "cache"))
    cfg = load_run_config(overrides=[*TINY, *extra])
    samples, _ = load_split(cfg, split, show_progress=False)
    model_dir = resolve_model(cfg)
    return cfg, model_dir, load_policy(model_dir), samples


def test_evaluate_stops_at_a_batch_boundary_and_continues_to_the_same_result(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from mmrl.engine.evaluate import EvalStopped, evaluate
    from mmrl.engine.service import RolloutService

    cfg, _, policy, samples = _tiny_policy_and_samples(tmp_path, monkeypatch, "test")
    service = RolloutService.from_config(policy, cfg)
    kw = {"max_new_tokens": 8, "batch_size": 3, "show_progress": False, "checks": {}}
    whole, whole_preds = evaluate(service, samples, **kw)
    polls: list[int] = []

    def after_two_batches() -> int:  # the third poll (before the third batch) asks to stop, as SIGTERM would
        polls.append(1)
        return signal.SIGTERM if len(polls) >= 3 else 0

    with pytest.raises(EvalStopped) as stopped:
        evaluate(service, samples, stop_requested=after_two_batches, **kw)
    assert stopped.value.signum == signal.SIGTERM
    assert stopped.value.progress.predictions == whole_preds[:6] and not stopped.value.progress.unreadable
    metrics, preds = evaluate(service, samples, earlier=stopped.value.progress, stop_requested=lambda: 0, **kw)
    assert preds == whole_preds and metrics == whole


def test_run_sft_stops_with_a_checkpoint_and_continues_as_if_never_stopped(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from mmrl.engine.checkpoint import seed_everything
    from mmrl.engine.run_log import RunLog
    from mmrl.engine.sft import SftCheckpoints, run_sft
    from mmrl.model import load_policy

    cfg, model_dir, _, samples = _tiny_policy_and_samples(tmp_path, monkeypatch, "train", "sft.target=gold",
                                                          "sft.steps=5", "sft.batch_size=3", "sft.lr=1e-3")

    def fresh(run_dir: Path, ck: SftCheckpoints | None) -> tuple[dict, dict[str, torch.Tensor]]:
        seed_everything(1)
        p = load_policy(model_dir)
        run_dir.mkdir(exist_ok=True)
        log = RunLog(run_dir)
        last = run_sft(cfg, p, samples, log=log, show_progress=False, checkpoints=ck)
        log.close()
        return last, {k: v.detach().clone() for k, v in p.model.state_dict().items()}

    last, straight = fresh(tmp_path / "straight", None)
    calls: list[int] = []
    stop = SftCheckpoints(tmp_path / "run", stop_requested=lambda: (calls.append(1), 15 if len(calls) > 2 else 0)[1])
    fresh(tmp_path / "run", stop)
    assert (stop.stopped_by, stop.step) == (15, 2) and stop.saved == tmp_path / "run" / "checkpoint-2"
    seed_everything(99)  # the resume restores every random state from the checkpoint
    again = SftCheckpoints(tmp_path / "run", resume=True)
    last2, resumed = fresh(tmp_path / "run", again)
    assert again.resumed_from == stop.saved and (again.stopped_by, again.step) == (0, 5)
    assert last2 == last
    assert all(torch.equal(straight[k], resumed[k]) for k in straight)
    assert rows(tmp_path / "run", "sft") == rows(tmp_path / "straight", "sft")
