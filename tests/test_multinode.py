"""Two nodes on this machine: two ``torchrun --nnodes 2 --nproc-per-node 1`` launches on the loopback (static
rendezvous), each node with its own ``HOME`` and ``MMRL_CACHE``, sharing only the data, the model and the run
folder, as nodes of a cluster share a network file system.

A run on the two nodes, killed on both after its first checkpoint and resumed with ``--resume``, ends as the
one-process run ends (the loss, reward and grad norm of every step; the final weights), without DeepSpeed and
with ZeRO-3; each node's local rank 0 wrote the media check's verdicts into its own node's cache. The media
check itself is shared out among the ranks of both nodes, and a rank that sees other files than rank 0 stops
every rank with the same error. A tensor-parallel block that would span two nodes is refused.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest
import torch
from model_names import assert_published_names
from synthetic_media import model_weights
from tiny_runs import TINY_RUN

from mmrl.engine.distributed import World
from mmrl_common.errors import ConfigError

pytestmark = [pytest.mark.xdist_group("torchrun"), pytest.mark.slow]  # one torchrun group at a time

TORCHRUN = str(Path(sys.executable).with_name("torchrun"))
MMRL = str(Path(sys.executable).with_name("mmrl"))
PROBE = Path(__file__).with_name("media_spread_probe.py")
REWARD = '''
from rewards import register_reward


@register_reward("text_length")
def text_length(completions, **_):
    """Longer completions score higher: random models' rollouts differ, so advantages are not zero."""
    return [len(c if isinstance(c, str) else c[-1]["content"]) / 10 for c in completions]
'''
WAIT_S = 600  # a launch that has not ended by then is stopped and the test fails (never a hang)


@pytest.fixture(scope="module")
def shared(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """What the nodes share: the tiny model, the toy colour videos as a user's data file, the reward module."""
    from data_pipelines.toy.build import make_toy
    from mmrl.toy.tiny_models import make_tiny

    root = tmp_path_factory.mktemp("shared")
    model = make_tiny("qwen2_5_vl", root / "model", seed=0)
    make_toy(root / "data", 0, size={"train": 4, "val": 2, "test": 2}, tasks=["color"], progress=False)
    (root / "text_length.py").write_text(REWARD)
    return {"root": root, "model": model, "data": root / "data" / "train.jsonl", "reward": root / "text_length.py"}


def run_args(shared: dict[str, Path], out: Path, *extra: str) -> list[str]:
    """``mmrl train`` of 4 steps on 2 prompts x 4 answers, a checkpoint every 2 steps, on the shared model and
    data (a mini-batch per step, so each rank rolls out one prompt)."""
    return ["train", "--quiet", "--out", str(out), "--model", str(shared["model"]), *TINY_RUN,
            f"data.train={shared['data']}", "data.check_media=decode", f"imports=[{shared['reward']}]",
            "rewards=[{name: text_length}]", "rollout.seed_per_prompt=true", "train.steps=4", "train.save_every=2",
            "train.keep_checkpoints=2", "train.lr=1e-3", "grpo.kl_coef=0.01", "grpo.entropy_coef=0.01", *extra]


def _default_ops_dir() -> str:
    """Where torch builds extensions without ``TORCH_EXTENSIONS_DIR`` (torch's own rule, not a copy of it: the
    cache root, then ``py<version>_<accelerator>``): the ranks of the other tests compile DeepSpeed's ops there,
    so the nodes here find them built (the bare root was another folder, and the shared-memory op was compiled
    twice per test session, a minute or more each)."""
    from torch.utils.cpp_extension import _get_build_directory

    return str(Path(_get_build_directory("", verbose=False)))  # the folder an extension named "" would go in


def node_env(root: Path, node: int | str) -> dict[str, str]:
    """A node's environment: its own home and mmrl cache (``root/node<N>/``). DeepSpeed's compiled ops stay
    where this machine keeps them (``TORCH_EXTENSIONS_DIR``, else the machine's own ``~/.cache``): a node
    compiles them once in its life, and compiling them again in every fresh home costs minutes here."""
    home, cache = root / f"node{node}" / "home", root / f"node{node}" / "cache"
    home.mkdir(parents=True, exist_ok=True)
    env = {k: v for k, v in os.environ.items() if k not in ("XDG_CACHE_HOME", "MMRL_CACHE")}
    ops = os.environ.get("TORCH_EXTENSIONS_DIR") or _default_ops_dir()
    return {**env, "HOME": str(home), "MMRL_CACHE": str(cache), "TORCH_EXTENSIONS_DIR": ops,
            "DS_ACCELERATOR": "cpu", "OMP_NUM_THREADS": "1", "TQDM_DISABLE": "1"}


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def launch(root: Path, argv: list[str], logs: Path, per_node: int = 1) -> list[subprocess.Popen]:
    """The two nodes' torchrun launches of ``per_node`` ranks each (node 0 hosts the rendezvous), their output in
    ``logs/node<N>.log``."""
    port = free_port()
    logs.mkdir(parents=True, exist_ok=True)
    procs = []
    for node in (0, 1):
        with open(logs / f"node{node}.log", "w") as log:
            procs.append(subprocess.Popen(
                [TORCHRUN, "--nnodes", "2", "--nproc-per-node", str(per_node), "--node-rank", str(node), "--master-addr",
                 "127.0.0.1", "--master-port", str(port), *argv],
                env=node_env(root, node), stdout=log, stderr=subprocess.STDOUT, start_new_session=True))
    return procs


def kill(procs: list[subprocess.Popen]) -> None:
    """SIGKILL both launches and their ranks (the ranks are not in torchrun's process group)."""
    for proc in procs:
        try:
            tree = [*psutil.Process(proc.pid).children(recursive=True), psutil.Process(proc.pid)]
        except psutil.NoSuchProcess:
            continue
        for p in tree:
            try:
                p.send_signal(signal.SIGKILL)
            except psutil.NoSuchProcess:
                pass
    for proc in procs:
        proc.wait()


def tails(logs: Path) -> str:
    return "\n".join(f"--- node {n} ---\n" + "\n".join((logs / f"node{n}.log").read_text().splitlines()[-30:])
                     for n in (0, 1))


def wait(procs: list[subprocess.Popen], logs: Path, until: Path | None = None) -> None:
    """Wait for both launches to end well (or, with ``until``, for that file to appear, then kill both). A
    launch that fails, or one still running after :data:`WAIT_S`, stops both and fails the test with the
    nodes' output."""
    deadline = time.monotonic() + WAIT_S
    while True:
        codes = [p.poll() for p in procs]
        if until is not None and until.is_file():
            kill(procs)
            return
        if any(c not in (None, 0) for c in codes) or time.monotonic() > deadline:
            kill(procs)
            pytest.fail(f"exit codes {codes} (None: still running after {WAIT_S} s)\n{tails(logs)}")
        if until is None and all(c == 0 for c in codes):
            return
        if until is not None and all(c is not None for c in codes):
            pytest.fail(f"both nodes ended before {until} was written\n{tails(logs)}")
        time.sleep(0.1)


def rl_rows(run: Path) -> list[dict]:
    rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    return [r for r in rows if r["stage"] == "rl"]


@pytest.fixture(scope="module")
def one(shared: dict[str, Path], tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The one-process run (no DeepSpeed) the two-node runs must equal."""
    root = tmp_path_factory.mktemp("one")
    out = root / "run"
    done = subprocess.run([MMRL, *run_args(shared, out)], env=node_env(root, "single"), capture_output=True,
                          text=True, timeout=WAIT_S, check=False)
    assert done.returncode == 0, (done.stdout + done.stderr)[-4000:]
    return out


@pytest.mark.parametrize("stage", ["none", "zero3"])
def test_two_nodes_killed_and_resumed_equal_one_process(stage: str, shared: dict[str, Path], one: Path,
                                                        tmp_path: Path) -> None:
    extra = [] if stage == "none" else [f"train.deepspeed={stage}"]
    out = shared["root"] / f"run-{stage}"  # the run folder on the shared storage
    # both nodes killed once the first checkpoint is written, then the same launches with --resume
    wait(launch(tmp_path, ["-m", "mmrl", *run_args(shared, out, *extra)], tmp_path / "logs"),
         tmp_path / "logs", until=out / "checkpoint-2" / "trainer_state.pt")
    assert not (out / "final").exists() and not (out / "checkpoint-4").exists()  # killed mid-run
    wait(launch(tmp_path, ["-m", "mmrl", *run_args(shared, out, *extra), "--resume"], tmp_path / "resume"),
         tmp_path / "resume")

    rows, base = rl_rows(out), rl_rows(one)
    assert [r["step"] for r in rows] == [1, 2, 3, 4]  # each step logged once, across the two sessions
    for a, b in zip(base, rows):
        assert a["reward"] == pytest.approx(b["reward"], abs=1e-6), a["step"]  # the same rollouts
        assert a["loss"] == pytest.approx(b["loss"], rel=1e-4, abs=1e-7), a["step"]
        assert a["grad_norm"] == pytest.approx(b["grad_norm"], rel=1e-4), a["step"]
    assert any(abs(r["loss"]) > 1e-4 for r in base) and all(r["reward_std"] > 0 for r in base)
    # Per tensor, the two runs' updates over the last two steps agree to 1% of the update's size (Adam moves a
    # weight whose gradient is round-off noise by a learning-rate-sized step that differs with the summation
    # order, so not an element-wise allclose; a missing or doubled gradient reduction fails here)
    w1, w2, w0 = model_weights(one / "final"), model_weights(out / "final"), model_weights(one / "checkpoint-2")
    assert set(w1) == set(w2) and any(not torch.equal(w1[k], w0[k]) for k in w1)
    far = {k: (float((w1[k] - w2[k]).abs().max()), float((w1[k] - w0[k]).abs().max())) for k in w1}
    far = {k: v for k, v in far.items() if v[0] > 1e-2 * v[1] + 1e-7}
    assert not far, f"weights differ beyond fp32 round-off (gap, update): {list(far.items())[:3]}"
    assert {p.name for p in (out / "checkpoint-4").glob("rng_state_rank*.pt")} == {"rng_state_rank0.pt",
                                                                                   "rng_state_rank1.pt"}
    assert_published_names(out / "final", out / "checkpoint-4")  # what vLLM and transformers load

    # each node's local rank 0 wrote the media check's verdicts into its own node's cache, nothing shared
    videos = {str((shared["data"].parent / m["path"]).resolve()) for line in shared["data"].read_text().splitlines()
              for m in json.loads(line)["media"]}
    for node in (0, 1):
        cache = json.loads((tmp_path / f"node{node}" / "cache" / "media-check.json").read_text())
        checked = {key.split(":", 2)[2] for key in cache}
        assert videos <= checked, (node, sorted(videos - checked))
        assert all(cache[key][2] is None for key in cache)  # every toy video decodes
    assert not list(shared["root"].rglob("media-check.json"))


def test_each_node_prepares_its_cache_and_all_ranks_share_the_media_check(shared: dict[str, Path],
                                                                         tmp_path: Path) -> None:
    """Two nodes of two ranks. Each node's local rank 0 prepares its node's cache while the other node's does
    the same, and the node's other rank comes in after it. The media check is shared out among the four
    ranks: each checks part of the files, every rank ends with every verdict (the bad files' reasons
    included), and each node's cache holds them all, so a second check decodes nothing. A rank that sees
    other files than rank 0 fails, and so does every other rank, with the same message: none waits for ever."""
    data = shared["data"].parent
    videos = sorted(str(p.resolve()) for p in data.rglob("*.mp4"))
    bad = tmp_path / "bad"
    bad.mkdir()
    (bad / "truncated.mp4").write_bytes(Path(videos[0]).read_bytes()[:3000])
    (bad / "fake.mp4").write_text("this is not a video\n")
    files = [[v, "video"] for v in videos] + [[str(bad / "truncated.mp4"), "video"], [str(bad / "fake.mp4"), "video"]]
    (tmp_path / "files.json").write_text(json.dumps(files))
    wait(launch(tmp_path, [str(PROBE), str(tmp_path / "files.json"), str(tmp_path)], tmp_path / "logs", per_node=2),
         tmp_path / "logs")
    ranks = [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in range(4)]
    assert [(r["node"], r["local_rank"]) for r in ranks] == [(0, 0), (0, 1), (1, 0), (1, 1)]
    # each node's leader found its fresh cache empty; the other rank found it prepared by its own node's leader
    assert [r["found"] for r in ranks] == [None, "0", None, "2"]
    n = len(files)
    for r in ranks:
        assert r["first"]["files"] == r["first"]["checked"] == n and r["first"]["processes"] == 4
        assert r["first"]["checked_here"] in (n // 4, -(-n // 4))  # its quarter
        assert r["second"]["checked"] == 0 and r["second"]["cached_here"] == n  # the node's own cache
        assert r["same_again"] and r["verdicts"] == ranks[0]["verdicts"]
    assert sum(r["first"]["checked_here"] for r in ranks) == n
    reasons = {Path(p).name: why for p, _, why in ranks[0]["verdicts"]}
    assert all(reasons[Path(v).name] is None for v in videos)
    assert "cannot decode video" in reasons["truncated.mp4"] and "cannot decode video" in reasons["fake.mp4"]
    for node in (0, 1):
        cache = json.loads((tmp_path / f"node{node}" / "cache" / "media-check.json").read_text())
        assert {key.split(":", 2)[2] for key in cache} == {p for p, _ in files}
    errors = {r["error"] for r in ranks}
    assert len(errors) == 1 and "process 1 sees other media files than process 0" in ranks[0]["error"]
    assert "fake.mp4.not-here: missing there" in ranks[0]["error"]


def test_a_tensor_parallel_block_must_sit_inside_a_node() -> None:
    """Blocks of ``rollout.vllm.tensor_parallel_size`` consecutive ranks: 2 nodes x 4 ranks take blocks of 1, 2
    or 4; a block of 8 or 3 would cross a node (or not tile the world) and is refused, naming the sizes that
    fit, on every rank."""
    def rank(r: int, per_node: int = 4, size: int = 8) -> World:
        return World(rank=r, size=size, local_rank=r % per_node, local_size=per_node, node=r // per_node)

    for tp in (1, 2, 4):
        assert [rank(r).block(tp)[0] for r in range(8)] == [r // tp for r in range(8)]
    for r in range(8):
        with pytest.raises(ConfigError, match=r"must sit inside one node.*\(1, 2, 4\)"):
            rank(r).block(8)
        with pytest.raises(ConfigError, match="does not divide the 8 ranks"):
            rank(r).check_block(3)
    # 2 nodes x 3 ranks, blocks of 2: node 1's ranks are 3-5, so the block of ranks 2 and 3 crosses nodes
    with pytest.raises(ConfigError, match=r"node 1 runs 3 ranks \(global ranks 3-5\)"):
        rank(3, per_node=3, size=6).check_block(2)
    assert World(rank=5, size=8, local_rank=5, local_size=8).block(8) == (0, 1, 5)  # one node of 8
