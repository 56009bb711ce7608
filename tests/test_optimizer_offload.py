"""``rollout.vllm.offload_optimizer``: the fp32 master weights and AdamW's state leave device memory while the
vLLM engine is awake and come back for the update (:meth:`mmrl.engine.optim.LocalUpdater.state_in_host_memory`).

On a CPU the move is the GPU's: each storage is copied into a host buffer and shrunk to nothing, then grown
and refilled. The unit tests check that the storages are really emptied while away and that the same tensors
come back bit for bit (and train on exactly as an updater that never moved them); the ``vllm`` test runs a tiny
full fine-tune on vLLM rollouts with the move on, stopped after a step and resumed, against an unbroken run."""

from __future__ import annotations

import copy
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
from synthetic_media import weights
from tiny_runs import module_cache, rl_rows, run_cli, run_rl, stop_after  # noqa: F401  (module_cache: a fixture)

from mmrl.config import load_run_config
from mmrl.engine.distributed import World
from mmrl.engine.optim import LocalUpdater, offload_in_rollouts
from mmrl_common.errors import ConfigError, MmrlError

TRAIN = SimpleNamespace(lr=1e-2, adam_betas=[0.9, 0.999], weight_decay=0.01, fused_adamw=True, max_grad_norm=1.0)


def model(dtype: torch.dtype) -> torch.nn.Module:
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.Tanh(), torch.nn.Linear(16, 4)).to(dtype)


def train_step(net: torch.nn.Module, updater: LocalUpdater, seed: int) -> None:
    gen = torch.Generator().manual_seed(seed)
    first = next(net.parameters())
    x = torch.randn(5, first.shape[1], generator=gen).to(first.device, first.dtype)
    updater.zero_grad()
    updater.backward(net(x).float().pow(2).mean())
    assert updater.step() is not None


def as_bytes(t: torch.Tensor) -> torch.Tensor:
    return t.detach().reshape(-1).view(torch.uint8).clone()


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_the_state_leaves_device_memory_and_returns_bit_for_bit(dtype: torch.dtype) -> None:
    """bf16 weights: the fp32 masters and AdamW's moments and step counts move; fp32 weights (no masters): the
    optimizer's state alone. The model's own weights stay."""
    net, twin = model(dtype), model(dtype)
    updater, plain = LocalUpdater(net, TRAIN, World()), LocalUpdater(twin, TRAIN, World())
    assert (updater.master is not None) == (dtype == torch.bfloat16)
    train_step(net, updater, 1)
    train_step(twin, plain, 1)
    state = updater.state_tensors()
    moments = [v for s in updater.optimizer.state.values() for v in s.values() if isinstance(v, torch.Tensor)]
    assert moments and all(any(v is t for t in state) for v in moments)  # every tensor of the optimizer's state
    assert all(any(m is t for t in state) for m in updater.master or [])  # and the masters
    before = [as_bytes(t) for t in state]
    ids = [id(t) for t in state]
    held = sum(t.untyped_storage().nbytes() for t in state)

    with updater.state_in_host_memory() as moved:
        assert updater.state_away
        assert moved == held
        assert all(t.untyped_storage().nbytes() == 0 for t in state)  # the device storage is given back
        assert all(p.untyped_storage().nbytes() > 0 for p in net.parameters())  # the weights the engine reads
        for what, call in (("an optimizer step", updater.step), ("a checkpoint", updater.state_dict),
                           ("loading a checkpoint", lambda: updater.load_state_dict({}))):
            with pytest.raises(MmrlError, match=what):
                call()
    assert not updater.state_away
    again = updater.state_tensors()
    assert [id(t) for t in again] == ids  # the same tensor objects: the optimizer's references hold
    assert all(torch.equal(as_bytes(t), b) for t, b in zip(again, before))

    # and training goes on exactly as if nothing had moved (a second trip in between too)
    train_step(net, updater, 2)
    train_step(twin, plain, 2)
    with updater.state_in_host_memory():
        pass
    train_step(net, updater, 3)
    train_step(twin, plain, 3)
    for p, q in zip(net.parameters(), twin.parameters()):
        assert torch.equal(as_bytes(p), as_bytes(q))
    for t, u in zip(updater.state_tensors(), plain.state_tensors()):
        assert torch.equal(as_bytes(t), as_bytes(u))
    assert updater.host.moves == 2


def test_a_failure_inside_brings_the_state_back() -> None:
    net = model(torch.bfloat16)
    updater = LocalUpdater(net, TRAIN, World())
    before = [as_bytes(t) for t in updater.state_tensors()]  # masters only: no step taken yet
    with pytest.raises(RuntimeError, match="engine"), updater.state_in_host_memory():
        raise RuntimeError("the engine failed")
    assert not updater.state_away
    assert all(torch.equal(as_bytes(t), b) for t, b in zip(updater.state_tensors(), before))
    snapshot = copy.deepcopy(updater.state_dict())  # readable again
    assert set(snapshot) == {"optimizer", "master"}


def test_a_loaded_checkpoints_state_moves_too(tmp_path: Path) -> None:
    """A resumed run's optimizer state comes from ``torch.load``, whose storage cannot be resized: the updater
    owns copies of it, so it moves like a fresh run's and trains on exactly as the run that wrote it."""
    net, twin = model(torch.bfloat16), model(torch.bfloat16)
    updater = LocalUpdater(net, TRAIN, World())
    train_step(net, updater, 1)
    torch.save(updater.state_dict(), tmp_path / "state.pt")
    loaded = torch.load(tmp_path / "state.pt", weights_only=True, map_location="cpu")
    assert not any(v.untyped_storage().resizable() for s in loaded["optimizer"]["state"].values() for v in s.values())
    resumed = LocalUpdater(twin, TRAIN, World())
    resumed.load_state_dict(loaded)
    with resumed.state_in_host_memory():
        assert all(t.untyped_storage().nbytes() == 0 for t in resumed.state_tensors())
    train_step(net, updater, 2)
    train_step(twin, resumed, 2)
    for t, u in zip(updater.state_tensors(), resumed.state_tensors()):
        assert torch.equal(as_bytes(t), as_bytes(u))


def test_a_tensor_that_cannot_move_stops_the_move_before_anything_is_freed() -> None:
    net = model(torch.bfloat16)
    updater = LocalUpdater(net, TRAIN, World())
    train_step(net, updater, 1)
    state = next(iter(updater.optimizer.state.values()))
    state["exp_avg"] = torch.from_numpy(state["exp_avg"].numpy().copy())  # numpy's memory: not resizable
    with pytest.raises(MmrlError, match="cannot be resized"), updater.state_in_host_memory():
        pass
    assert not updater.state_away
    assert all(t.untyped_storage().nbytes() > 0 for t in updater.state_tensors())


@pytest.mark.gpu
def test_on_a_gpu_the_state_goes_to_pinned_host_memory_and_the_device_memory_is_given_back() -> None:
    """On CUDA (make gpu-check's machine; fails without one): the moved bytes leave torch's allocated and
    reserved memory (the engine allocates outside torch's cache), wait in pinned buffers, and come back bit for
    bit into the same tensors."""
    assert torch.cuda.is_available(), "this test needs a CUDA device"
    torch.manual_seed(0)
    # 16 MB fp32 tensors: torch's allocator gives each its own segment, which empty_cache can hand back whole
    net = torch.nn.Sequential(*[torch.nn.Linear(2048, 2048, bias=False) for _ in range(3)]).to("cuda", torch.bfloat16)
    updater = LocalUpdater(net, TRAIN, World())
    train_step(net, updater, 1)
    state = updater.state_tensors()
    on_gpu = {t.untyped_storage().data_ptr(): t.untyped_storage().nbytes() for t in state if t.is_cuda}
    large = sum(n for n in on_gpu.values() if n >= 1 << 24)
    assert large >= 12 * sum(p.numel() for p in net.parameters())  # masters 4 + moments 8 bytes a parameter
    before = [as_bytes(t).cpu() for t in state]
    torch.cuda.synchronize()
    allocated, reserved = torch.cuda.memory_allocated(), torch.cuda.memory_reserved()
    with updater.state_in_host_memory() as moved:
        assert moved >= sum(on_gpu.values())
        assert torch.cuda.memory_allocated() <= allocated - sum(on_gpu.values())
        assert torch.cuda.memory_reserved() <= reserved - large
        assert updater.host.buffers and all(b.is_pinned() for b in updater.host.buffers)
    assert torch.cuda.memory_allocated() == allocated
    assert all(torch.equal(as_bytes(t).cpu(), b) for t, b in zip(updater.state_tensors(), before))
    train_step(net, updater, 2)  # and the fused step runs on them


def test_when_the_state_moves() -> None:
    """auto: a full fine-tune on a GPU with the vLLM backend and its sleep mode, mmrl's own AdamW; true: with
    the vLLM backend anywhere; never with the HF backend."""
    gpu, cpu = torch.device("cuda"), torch.device("cpu")
    base = {"backend": "vllm", "deepspeed": None, "device": gpu, "lora": False, "sleep_mode": True}
    assert offload_in_rollouts("auto", **base)
    for change in ({"device": cpu}, {"lora": True}, {"deepspeed": "zero2"}, {"sleep_mode": False},
                   {"backend": "hf"}):
        assert not offload_in_rollouts("auto", **{**base, **change}), change
    assert offload_in_rollouts(True, **{**base, "device": cpu, "sleep_mode": False, "lora": True})
    assert not offload_in_rollouts(True, **{**base, "backend": "hf"})
    assert not offload_in_rollouts(False, **base)


def test_deepspeed_refuses_the_setting_when_the_configuration_loads() -> None:
    with pytest.raises(ConfigError, match="train.offload=optimizer"):
        load_run_config("video-qa", overrides=["train.deepspeed=zero2", "rollout.vllm.offload_optimizer=true"])
    cfg = load_run_config("video-qa", overrides=["train.deepspeed=zero2"])  # auto: off under DeepSpeed
    assert cfg.rollout.vllm.offload_optimizer == "auto"
    with pytest.raises(ConfigError, match="offload_optimizer"):
        load_run_config("video-qa", overrides=["rollout.vllm.offload_optimizer=sometimes"])


# every step moves the weights (a learning rate bf16 resolves, an entropy bonus), so a resume that replayed
# other rollouts or state would show; each request seeded by its step and place, so the engine a resumed run
# builds afresh samples what the unbroken run's did
VLLM_RUN = ["rollout.backend=vllm", "rollout.vllm.offload_optimizer=true", "model.dtype=bf16", "train.lr=1e-3",
            "grpo.entropy_coef=0.01", "rollout.seed_per_prompt=true", "train.steps=3", "train.save_every=1"]
VOLATILE = ("time/", "memory/")


def steady(row: dict) -> dict:
    return {k: v for k, v in row.items() if not k.startswith(VOLATILE)}


def state_bytes(checkpoint: Path) -> tuple[int, int]:
    """(bytes of the fp32 masters, bytes of the masters and every tensor of AdamW's state) in a checkpoint."""
    state = torch.load(checkpoint / "trainer_state.pt", weights_only=True)["optimizer"]
    masters = sum(t.numel() * t.element_size() for t in state["master"].values())
    opt = sum(v.numel() * v.element_size() for s in state["optimizer"]["state"].values() for v in s.values()
              if isinstance(v, torch.Tensor))
    return masters, masters + opt


@pytest.mark.vllm
@pytest.mark.slow
@pytest.mark.usefixtures("module_cache")
def test_a_vllm_run_with_the_state_offloaded_resumes_exactly(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    """A tiny full fine-tune (bf16 with fp32 masters) on vLLM rollouts with the optimizer state in host memory
    during every rollout session: stopped after step 2's work (checkpoint 1 kept) and resumed, it equals the
    unbroken run, metrics row for row and weights, masters and moments bit for bit. Each step moved the whole
    state: the masters at step 1 (AdamW makes its moments at the first step), masters and moments after."""
    straight = run_rl(tmp_path / "straight", *VLLM_RUN)
    run = tmp_path / "broken" / "run"
    assert [r["step"] for r in stop_after(run, 2, *VLLM_RUN)] == [1]
    rc, _, err = run_cli(capsys, "train", "--quiet", "--out", str(run), "--resume")
    assert rc == 0, err
    resumed = rl_rows(run)
    assert [r["step"] for r in resumed] == [1, 2, 3]
    assert [steady(r) for r in resumed] == [steady(r) for r in straight]
    first = tmp_path / "straight" / "run"
    for folder in ("final", "checkpoint-3"):
        a, b = weights(first / folder), weights(run / folder)
        assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a), folder
    ours = torch.load(run / "checkpoint-3" / "trainer_state.pt", weights_only=True)["optimizer"]
    theirs = torch.load(first / "checkpoint-3" / "trainer_state.pt", weights_only=True)["optimizer"]
    assert all(torch.equal(ours["master"][k], theirs["master"][k]) for k in theirs["master"])
    for p, s in theirs["optimizer"]["state"].items():
        assert all(torch.equal(ours["optimizer"]["state"][p][k], v) for k, v in s.items())
    a, b = weights(first / "checkpoint-2"), weights(first / "final")
    assert any(not torch.equal(a[k], b[k]) for k in a)  # step 3 moved the bf16 weights
    masters, whole = state_bytes(first / "checkpoint-3")
    assert masters < whole
    assert [round(r["offload/gb"] * 1e9) for r in straight] == [masters, whole, whole]
