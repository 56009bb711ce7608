"""Data-parallel training under ``torchrun --nproc_per_node 2`` (gloo, CPU) with DeepSpeed ZeRO-2 and ZeRO-3.

The same global batch on two ranks must give the single-process run's loss at every step and its final
weights (fp32 round-off apart); a run killed on both ranks after a checkpoint resumes and ends where the
unkilled run ends; rank 0 alone writes the run folder. Data shaped as users' data is (images, videos of
different lengths, a video asked twice, text-only questions, a corrupt video met mid-run, an uneven share of
prompts, dynamic sampling, mini-batches) must not split the ranks' collectives under ZeRO-3.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest
import torch
from mixed_data import make_mixed, mixed_run
from model_names import assert_published_names
from safetensors.torch import load_file
from synthetic_media import model_weights

pytestmark = pytest.mark.xdist_group("torchrun")  # one torchrun pair at a time

MMRL = str(Path(sys.executable).with_name("mmrl"))
TORCHRUN = str(Path(sys.executable).with_name("torchrun"))
REWARD = '''
from rewards import register_reward


@register_reward("text_length")
def text_length(completions, **_):
    """Longer completions score higher: random models' rollouts differ, so advantages are not zero."""
    return [len(c if isinstance(c, str) else c[-1]["content"]) / 10 for c in completions]
'''
RUN = [
    "model.tiny_family=qwen2_5_vl", "model.init=random",
    "data.toy_size={train: 4, val: 2, test: 2}", "data.toy_tasks=[color]",
    "data.media.video_min_pixels=3136", "data.media.video_max_pixels=3136",
    "rollout.group_size=4", "rollout.max_new_tokens=4", "rollout.seed_per_prompt=true",
    # 2 prompts x 4 rollouts: each rank rolls out one prompt and trains it in two micro-batches (3 + 1)
    "train.prompts_per_step=2", "train.micro_batch_size=3", "train.steps=4", "train.save_every=2",
    "train.keep_checkpoints=2", "train.log_every=0", "train.cpu_threads=1", "train.lr=1e-3",
    "sft.steps=0", "eval.before_rl=false", "eval.after_rl=false",
    "rewards=[{name: text_length}]", "grpo.kl_coef=0.01", "grpo.entropy_coef=0.01",
]


@pytest.fixture(scope="module")
def env(tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    root = tmp_path_factory.mktemp("dist")
    (root / "text_length.py").write_text(REWARD)
    return {**os.environ, "MMRL_CACHE": str(root / "cache"), "DS_ACCELERATOR": "cpu", "OMP_NUM_THREADS": "1",
            "TQDM_DISABLE": "1", "MMRL_TEST_REWARD": str(root / "text_length.py")}


def command(out: Path, env: dict[str, str], ranks: int, *extra: str, run: list[str] | None = None) -> list[str]:
    """``mmrl train`` on ``ranks`` processes with :data:`RUN` (or ``run``) and ``extra``."""
    base = [*RUN, f"imports=[{env['MMRL_TEST_REWARD']}]"] if run is None else run
    args = ["train", "--quiet", "--out", str(out), *base, *extra]
    if ranks == 1:
        return [MMRL, *args]
    return [TORCHRUN, "--standalone", "--nproc_per_node", str(ranks), "-m", "mmrl", *args]


def train(out: Path, env: dict[str, str], ranks: int, *extra: str, run: list[str] | None = None) -> None:
    """A run that must finish: a hang fails the test at the timeout, a crash shows the ranks' tracebacks."""
    done = subprocess.run(command(out, env, ranks, *extra, run=run), check=False, env=env, capture_output=True,
                          text=True, timeout=600)
    if done.returncode != 0:  # the ranks' own tracebacks, not only torchrun's summary
        lines = (done.stdout + done.stderr).splitlines()
        pytest.fail("\n".join([ln for ln in lines if ln.startswith("[rank0]")][-40:] + lines[-10:]))


def rl_rows(run: Path) -> list[dict]:
    rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    return [r for r in rows if r["stage"] == "rl"]


@pytest.fixture(scope="module")
def single(env: dict[str, str], tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("single") / "run"
    train(out, env, 1)
    return out


@pytest.mark.parametrize("stage", ["zero2", "zero3"])
@pytest.mark.slow
def test_two_ranks_equal_one_process_and_resume_after_kill(stage: str, single: Path, env: dict[str, str],
                                                          tmp_path: Path) -> None:
    straight = tmp_path / "straight"
    train(straight, env, 2, f"train.deepspeed={stage}")

    # the loss at every step and the final weights equal the single-process run's
    one, two = rl_rows(single), rl_rows(straight)
    assert [r["step"] for r in two] == [1, 2, 3, 4]  # each step logged once: rank 0 alone writes
    for a, b in zip(one, two):
        assert a["reward"] == pytest.approx(b["reward"], abs=1e-6)  # the same rollouts
        assert a["loss"] == pytest.approx(b["loss"], rel=1e-4, abs=1e-7), a["step"]
        assert a["grad_norm"] == pytest.approx(b["grad_norm"], rel=1e-4), a["step"]
    assert any(abs(r["loss"]) > 1e-4 for r in one) and all(r["reward_std"] > 0 for r in one)
    # every model folder under the published checkpoint's names, the model loaded whole or already partitioned
    assert_published_names(single / "final", single / "checkpoint-4", straight / "final", straight / "checkpoint-4")
    w1, w2 = model_weights(single / "final"), model_weights(straight / "final")
    assert set(w1) == set(w2)
    # Per tensor, the two runs' total updates agree to 1% of the update's size. (Not a plain allclose: Adam
    # divides by the gradient's magnitude, so a gradient that is round-off noise, like the key-projection
    # bias's, which softmax makes exactly zero in exact arithmetic, moves its weight by learning-rate-sized
    # noise that is different in every run with a different summation order.)
    w0 = model_weights(single / "checkpoint-2")
    assert any(not torch.equal(w1[k], w0[k]) for k in w1)  # the last steps moved the weights
    far = {}
    for k in w1:
        moved = float((w1[k] - w0[k]).abs().max())
        gap = float((w1[k] - w2[k]).abs().max())
        if gap > 1e-2 * moved + 1e-7:
            far[k] = (gap, moved)
    assert not far, f"weights differ beyond fp32 round-off (gap, update): {list(far.items())[:3]}"

    # only rank 0 wrote: the folder holds one run's files; per-rank files only inside checkpoints
    ckpt = straight / "checkpoint-4"
    assert {p.name for p in ckpt.glob("rng_state_rank*.pt")} == {"rng_state_rank0.pt", "rng_state_rank1.pt"}
    assert (ckpt / "deepspeed").is_dir()
    assert not list(straight.glob(".tmp-*"))

    # killed on both ranks after checkpoint-2, then resumed: the same end as the uninterrupted run
    killed = tmp_path / "killed"
    proc = subprocess.Popen(command(killed, env, 2, f"train.deepspeed={stage}"), env=env,
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, start_new_session=True)
    while not (killed / "checkpoint-2" / "trainer_state.pt").is_file():
        assert proc.poll() is None, proc.stderr.read().decode()[-4000:]
        time.sleep(0.05)
    for p in [*psutil.Process(proc.pid).children(recursive=True), psutil.Process(proc.pid)]:
        p.send_signal(signal.SIGKILL)  # both ranks and torchrun (the ranks are not in its process group)
    proc.wait()
    psutil.wait_procs(psutil.Process().children(recursive=True), timeout=0)
    proc.stderr.close()
    assert not (killed / "final").exists() and not (killed / "checkpoint-4").exists()  # killed mid-run
    train(killed, env, 2, f"train.deepspeed={stage}", "--resume")
    w3 = model_weights(killed / "final")
    assert_published_names(killed / "final")
    differ = [k for k in w2 if not torch.equal(w2[k], w3[k])]
    assert not differ, f"{len(differ)} tensors differ after the resume, e.g. {differ[:3]}"
    assert [r["step"] for r in rl_rows(killed)] == [1, 2, 3, 4]
    for a, b in zip(two, rl_rows(killed)):
        assert a["loss"] == b["loss"], a["step"]


BALANCED = ["train.prompts_per_step=4", "grpo.ppo_mini_batch_size=8", "train.steps=2", "train.save_every=0"]


@pytest.fixture(scope="module")
def single_minibatched(env: dict[str, str], tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("single_mb") / "run"
    train(out, env, 1, *BALANCED)
    return out


@pytest.mark.parametrize("deepspeed", ["null", "zero3"])
@pytest.mark.slow
def test_every_rank_trains_in_every_optimizer_step(deepspeed: str, single_minibatched: Path, env: dict[str, str],
                                                  tmp_path: Path) -> None:
    """4 prompts x 4 answers in mini-batches of 8 rows (two optimizer steps a batch): each rank rolls out 2
    prompts, and each optimizer step trains one group of each rank's, not both groups of one rank while the
    other runs dummy passes. The run equals the single-process one (metrics and weights)."""
    two = tmp_path / "two"
    train(two, env, 2, *BALANCED, f"train.deepspeed={deepspeed}")
    one_rows, two_rows = rl_rows(single_minibatched), rl_rows(two)
    assert [r["step"] for r in two_rows] == [1, 2]
    for a, b in zip(one_rows, two_rows):
        assert b["optimizer_steps"] == 2
        assert b["balance/idle_rank_steps"] == 0, b  # every rank trained real rows in every optimizer step
        assert b["balance/tokens_max_over_mean"] < 1.5, b  # (2.0: one rank did each step's work)
        assert a["reward"] == pytest.approx(b["reward"], abs=1e-6)
        assert a["loss"] == pytest.approx(b["loss"], rel=1e-4, abs=1e-7), a["step"]
        assert a["grad_norm"] == pytest.approx(b["grad_norm"], rel=1e-4), a["step"]
    w1, w2 = model_weights(single_minibatched / "final"), model_weights(two / "final")
    assert set(w1) == set(w2)
    gaps = {k: float((w1[k] - w2[k]).abs().max()) for k in w1}
    assert max(gaps.values()) < 1e-4, sorted(gaps.items(), key=lambda kv: -kv[1])[:3]


@pytest.mark.slow
def test_lora_under_zero3_equals_one_process(env: dict[str, str], tmp_path: Path) -> None:
    """LoRA adapters (no dropout: its masks would come from each rank's own random stream) trained on two
    ZeRO-3 ranks, with the KL reference as the adapters-off model, end as the single-process run's."""
    lora = ["model.lora={r: 4, dropout: 0.0}", "train.steps=2", "train.save_every=0"]
    train(tmp_path / "one", env, 1, *lora)
    train(tmp_path / "two", env, 2, "train.deepspeed=zero3", *lora)
    for a, b in zip(rl_rows(tmp_path / "one"), rl_rows(tmp_path / "two")):
        assert a["loss"] == pytest.approx(b["loss"], rel=1e-4, abs=1e-7)
        assert a["kl"] == pytest.approx(b["kl"], rel=1e-3, abs=1e-9)
    a1 = load_file(tmp_path / "one" / "final" / "adapter" / "adapter_model.safetensors")
    a2 = load_file(tmp_path / "two" / "final" / "adapter" / "adapter_model.safetensors")
    assert_published_names(tmp_path / "one" / "final", tmp_path / "two" / "final")  # merged
    assert set(a1) == set(a2) and any(k for k in a1 if "lora_B" in k)
    assert any(float(a1[k].abs().max()) > 1e-4 for k in a1 if "lora_B" in k)  # lora_B starts at 0: it moved
    # Every adapter weight agrees to 1% of one Adam step (lr 1e-3). Not an element-wise rtol: Adam divides by
    # the gradient's magnitude, so an element whose gradient is near zero moves by a learning-rate-sized step
    # whose last digits depend on the summation order (seen: one of 1536 elements 1.6e-6 apart, 0.3% of its
    # value). A missing or doubled gradient reduction moves weights by whole steps (~1e-3) and fails here.
    far = {k: float((a1[k] - a2[k]).abs().max()) for k in a1}
    assert all(gap <= 1e-2 * 1e-3 for gap in far.values()), sorted(far.items(), key=lambda kv: -kv[1])[:3]


@pytest.mark.slow
def test_zero3_on_mixed_data_equals_one_process(env: dict[str, str], tmp_path: Path) -> None:
    """Two ZeRO-3 ranks whose passes differ in every way users' data makes them differ (media counts and
    kinds per rank, frame counts, a text-only share, 2 prompts on one rank and 1 on the other, top-up rounds
    of dynamic sampling that may leave a rank no group, a corrupt video skipped on one rank) finish, and match
    the single-process run (no DeepSpeed) step by step: rewards, the grad norm, and the loss, which is not
    zero on-policy here (a KL term and one optimizer step per group). Shared-prefix and chunked log-probs
    stay on. Then every checkpoint holds the real weights: those of the single-process run."""
    data, reward = make_mixed(tmp_path / "data")
    run = mixed_run(data, reward)
    train(tmp_path / "one", env, 1, run=run)
    train(tmp_path / "two", env, 2, "train.deepspeed=zero3", run=run)
    one, two = rl_rows(tmp_path / "one"), rl_rows(tmp_path / "two")
    assert [r["step"] for r in two] == [1, 2, 3, 4]
    assert sum(r["generation_rounds"] for r in one) > len(one)  # dynamic sampling topped up
    assert one[-1]["skipped_samples"] >= 1  # the corrupt video was met (and skipped) mid-run
    assert all(r["optimizer_steps"] > 1 for r in one)  # mini-batches: the loss is off-policy after the first
    for a, b in zip(one, two):
        assert a["reward"] == pytest.approx(b["reward"], abs=1e-6), a["step"]  # the same rollouts
        assert a["skipped_samples"] == b["skipped_samples"]
        assert abs(a["loss"]) > 1e-4
        assert a["loss"] == pytest.approx(b["loss"], rel=1e-4, abs=1e-7), a["step"]
        assert a["grad_norm"] == pytest.approx(b["grad_norm"], rel=1e-4), a["step"]
    for sub in ("checkpoint-4", "final"):  # gathered one module at a time to rank 0: not empty shards
        w1, w2 = model_weights(tmp_path / "one" / sub), model_weights(tmp_path / "two" / sub)
        assert set(w1) == set(w2)
        gaps = {k: float((w1[k] - w2[k]).abs().max()) for k in w1 if w1[k].shape == w2[k].shape}
        assert len(gaps) == len(w1) and max(gaps.values()) < 1e-4, sorted(gaps.items(), key=lambda kv: -kv[1])[:3]


PROBE = Path(__file__).with_name("zero3_generation_probe.py")


@pytest.mark.slow
def test_zero3_generation_gathers_the_weights_once_per_call(env: dict[str, str], tmp_path: Path) -> None:
    """HF generation under ZeRO-3 gathers the whole model once per generate call (one all-gather per
    parameter, counted by DeepSpeed's own comms logger), not per module per token; ranks that generate
    different numbers of tokens do not wait on each other; training works afterwards."""
    from mmrl.toy.tiny_models import make_tiny

    model = make_tiny("qwen2_5_vl", tmp_path / "model", seed=0)
    out = tmp_path / "probe.json"
    done = subprocess.run([TORCHRUN, "--standalone", "--nproc_per_node", "2", str(PROBE), str(model), str(out)],
                          env=env, check=False, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, (done.stdout + done.stderr)[-4000:]
    report = json.loads(out.read_text())
    assert [r["rank"] for r in report] == [0, 1]
    for r in report:
        assert r["gathers"] == r["n_params"], r  # one gather of every parameter, whatever the length
        assert r["session_gathers"] == r["n_params"], r  # several calls in one session: still one
        assert torch.isfinite(torch.tensor([r["loss"], r["grad_norm"]])).all(), r
    assert max(report[0]["lengths"]) > max(report[1]["lengths"])  # the ranks ran different numbers of passes


def _one_and_two_ranks(args: list[str], env: dict[str, str], tmp_path: Path) -> tuple[list[dict], list[dict]]:
    """``mmrl ARGS`` in one process (into tmp_path/one) and on 2 torchrun ranks (tmp_path/two): both
    runs' predictions."""
    for ranks, name in ((1, "one"), (2, "two")):
        launch = [MMRL] if ranks == 1 else [TORCHRUN, "--standalone", "--nproc_per_node", "2", "-m", "mmrl"]
        done = subprocess.run([*launch, *args, "--out", str(tmp_path / name)], env=env, check=False,
                              capture_output=True, text=True, timeout=300)
        assert done.returncode == 0, (done.stdout + done.stderr)[-4000:]
    one, two = ([json.loads(line) for line in (tmp_path / name / "predictions.jsonl").read_text().splitlines()]
                for name in ("one", "two"))
    return one, two


@pytest.mark.slow
def test_eval_on_two_ranks_scores_every_question_once(env: dict[str, str], tmp_path: Path) -> None:
    """``mmrl eval`` under torchrun: each rank answers its share (5 questions: 3 and 2), the predictions are
    gathered in order, and the score equals the single-process one."""
    from mmrl.toy.tiny_models import make_tiny

    model = make_tiny("qwen2_5_vl", tmp_path / "model", seed=0)
    args = ["eval", "--quiet", "--model", str(model), "data.toy_size={train: 1, val: 1, test: 5}",
            "data.toy_tasks=[color]", "data.media.video_min_pixels=3136", "data.media.video_max_pixels=3136",
            "data.media.min_frames=4", "data.media.max_frames=4", "eval.batch_size=1", "eval.max_new_tokens=6",
            "train.cpu_threads=1"]
    one, two = _one_and_two_ranks(args, env, tmp_path)
    assert len(one) == 5 and [p["id"] for p in two] == [p["id"] for p in one]  # each question once, in order
    assert [p["completion"] for p in two] == [p["completion"] for p in one]
    m1, m2 = (json.loads((tmp_path / name / "metrics.json").read_text()) for name in ("one", "two"))
    assert m2["accuracy"] == m1["accuracy"] and m2["n"] == m1["n"] == 5


@pytest.mark.slow
def test_benchmark_eval_on_two_ranks_equals_one_process(env: dict[str, str], tmp_path: Path) -> None:
    """``mmrl eval --benchmark`` under torchrun: the ranks split the questions, rank 0 merges the predictions
    in question order and scores them as one process does; the fixture's question without its video is
    counted wrong and listed on both."""
    from data_pipelines.benchmarks.fixtures import write_fixture
    from mmrl.toy.tiny_models import make_tiny

    model = make_tiny("qwen2_5_vl", tmp_path / "model", seed=0)
    root = write_fixture("videomme", tmp_path / "videomme", n=4)
    args = ["eval", "--quiet", "--benchmark", "videomme", "--data-root", str(root), "--model", str(model),
            "--frames", "4", "--max-pixels", "3136", "--batch-size", "2", "--workers", "0", "--consistency",
            "eval.max_new_tokens=6", "train.cpu_threads=1"]
    one, two = _one_and_two_ranks(args, env, tmp_path)
    assert [p["id"] for p in two] == [p["id"] for p in one] and len(one) >= 4
    assert [p["completion"] for p in two] == [p["completion"] for p in one]
    # ACRE's check ran on each rank's share: the same permutations, cases and section as one process
    fields = ("permutation", "case", "shuffled_letter")
    assert [[p.get(k) for k in fields] for p in two] == [[p.get(k) for k in fields] for p in one]
    assert sum("case" in p for p in one) == len(one) - 1  # every question but the one without its video
    assert not list((tmp_path / "two").glob("predictions.rank*.jsonl"))  # merged, then removed
    m1, m2 = (json.loads((tmp_path / name / "metrics.json").read_text()) for name in ("one", "two"))
    assert m2["scores"] == m1["scores"] and m2["timing"]["ranks"] == 2
    assert m2["consistency"] == m1["consistency"] and m1["consistency"]["n"] == len(one) - 1
    assert m1["media_failures"] and m2["media_failures"] == m1["media_failures"]


@pytest.mark.slow
def test_agent_eval_on_two_ranks_equals_one_process(env: dict[str, str], tmp_path: Path) -> None:
    """``mmrl eval --agent earl --benchmark`` under torchrun: each rank plays its share of the questions through
    the agent loop (and the plain answer beside it), the episodes are gathered in question order and scored as
    one process scores them. (The held-out agent evaluation shares and gathers the same way: the plug-in test
    below runs it on 2 ranks.)"""
    from data_pipelines.benchmarks.fixtures import write_fixture
    from mmrl.toy.tiny_models import make_tiny

    model = make_tiny("qwen2_5_vl", tmp_path / "model", seed=0)
    root = write_fixture("toy", tmp_path / "toy", n=2)
    bench = ["eval", "--benchmark", "toy", "--data-root", str(root), "--frames", "4", "--limit", "3", "--quiet",
             "--model", str(model), "--agent", "earl", "eval.max_new_tokens=6", "train.cpu_threads=1"]
    one, two = _one_and_two_ranks(bench, env, tmp_path)
    assert [(p["mode"], p["id"], p["completion"]) for p in two] == [(p["mode"], p["id"], p["completion"]) for p in one]
    assert [p["mode"] for p in one] == ["agent_loop"] * 3 + ["baseline"] * 3
    m1, m2 = (json.loads((tmp_path / n / "metrics.json").read_text()) for n in ("one", "two"))
    assert all(m2[k] == m1[k] for k in ("n", "agent_loop", "baseline")) and m1["n"] == 3


@pytest.mark.slow
def test_the_agent_eval_plugin_under_zero3_on_two_ranks(env: dict[str, str], tmp_path: Path) -> None:
    """EARL's ``agent_eval`` plug-in in a ZeRO-3 run on 2 ranks: each rank plays its share of the held-out
    questions (3: 2 and 1, so the ranks make different numbers of generate calls inside one weight gather),
    every rank logs the same numbers, rank 0 alone writes ``agent_eval.json``; the run ends, it does not hang."""
    out = tmp_path / "run"
    run = [*RUN, f"imports=[{env['MMRL_TEST_REWARD']}, mmrl.methods.earl]", "train.steps=2", "train.save_every=0",
           "data.toy_size={train: 4, val: 3, test: 2}", "eval.batch_size=1", "eval.max_new_tokens=4",
           "plugins={agent_eval: {environment: none, before: true}}"]
    train(out, env, 2, "train.deepspeed=zero3", run=run)
    saved = json.loads((out / "agent_eval.json").read_text())
    assert set(saved) == {"agent_eval_before@0", "agent_eval@2"}
    rows = rl_rows(out)
    assert [r["step"] for r in rows] == [1, 2]
    assert rows[0]["agent_eval_before/accuracy"] == saved["agent_eval_before@0"]["agent_eval_before/accuracy"]
    assert rows[1]["agent_eval/frames"] == saved["agent_eval@2"]["agent_eval/frames"] > 0


LEAVE_GROUP = '''
import os, socket, sys
import torch.distributed as dist
from mmrl.cli import main

with socket.socket() as s:
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=0, world_size=1)
failed = main(["config", "show", "train.bogus=1"])
print("after a failed command:", failed, dist.is_initialized())
done = main(["config", "show"])
print("after a command that succeeded:", done, dist.is_initialized())
'''


def test_a_command_that_succeeds_leaves_the_process_group(tmp_path: Path) -> None:
    """The CLI destroys the process group when a command ends well (left to the interpreter's exit, gloo's
    threads can abort it, and NCCL warns); a failed command leaves it alone (its peers may be in a collective)."""
    done = subprocess.run([sys.executable, "-c", LEAVE_GROUP], capture_output=True, text=True, timeout=120,
                          env={**os.environ, "TQDM_DISABLE": "1"}, check=True)
    lines = [ln for ln in done.stdout.splitlines() if ln.startswith("after")]
    assert lines == ["after a failed command: 2 True", "after a command that succeeded: 0 False"]


@pytest.mark.parametrize("aux", ["null", "0"], ids=["router-aux-loss-on", "router-aux-loss-off"])
@pytest.mark.slow
def test_zero3_on_a_mixture_of_experts_model_equals_one_process(aux: str, env: dict[str, str], tmp_path: Path) -> None:
    """Qwen3-VL MoE (issue 50) on two ZeRO-3 ranks: each rank routes its own tokens to a different subset of
    experts, while ZeRO-3 gathers the fused expert weights and the router as whole modules at each call (and
    loads the folder's expert weights into their partitions untransposed). With the router's auxiliary loss on
    (the model config's coefficient) or off, every step's loss and gradient norm are the single-process run's; with it off the final weights are too (with it on, its tiny gradients reach every
    weight and Adam, dividing by their magnitude, turns round-off into lr-sized steps: see the LoRA test)."""
    moe = ["model.tiny_family=qwen3_vl_moe", "data.media.video_min_pixels=4096", "data.media.video_max_pixels=4096",
           "train.steps=2", "train.save_every=0", f"model.router_aux_loss_coef={aux}",
           # one micro-batch per prompt on either side: the load-balancing loss is a mean over the tokens of a
           # forward pass (as in transformers and Megatron), so it depends on how rows are grouped into passes
           "train.micro_batch_size=4"]
    train(tmp_path / "one", env, 1, *moe)
    train(tmp_path / "two", env, 2, "train.deepspeed=zero3", *moe)
    one, two = rl_rows(tmp_path / "one"), rl_rows(tmp_path / "two")
    assert [r["step"] for r in two] == [1, 2]
    for a, b in zip(one, two):
        assert a["reward"] == pytest.approx(b["reward"], abs=1e-6), a["step"]
        assert a["loss"] == pytest.approx(b["loss"], rel=1e-4, abs=1e-7), a["step"]
        assert a["grad_norm"] == pytest.approx(b["grad_norm"], rel=1e-4), a["step"]
        if aux == "null":
            # not equal to the digit: the ranks' passes are made alike (both shared-prefix passes, padded
            # suffixes), and the routers see the padding positions of a padded pass too
            assert a["router_aux_loss"] > 0 and b["router_aux_loss"] > 0
        else:
            assert "router_aux_loss" not in a and "router_aux_loss" not in b
    w1, w2 = model_weights(tmp_path / "one" / "final"), model_weights(tmp_path / "two" / "final")
    assert set(w1) == set(w2) and any(".mlp.experts." in k for k in w1)
    start = model_weights(next((Path(env["MMRL_CACHE"]) / "models").glob("qwen3_vl_moe-*")))
    moved = [k for k in w1 if not torch.equal(start[k], w1[k])]  # equal because trained, not because untouched
    assert any(".mlp.experts." in k for k in moved) and any(".mlp.gate." in k for k in moved)
    if aux == "0":
        gaps = {k: float((w1[k] - w2[k]).abs().max()) for k in w1 if w1[k].shape == w2[k].shape}
        assert len(gaps) == len(w1) and max(gaps.values()) < 1e-4, sorted(gaps.items(), key=lambda kv: -kv[1])[:3]
