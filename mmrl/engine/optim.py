"""The optimizer side of training: backward, gradient reduction, clipping, the AdamW step, their state.

Two updaters with one interface (:class:`Updater`), chosen by ``train.deepspeed``:

* :class:`LocalUpdater` (default): torch AdamW (the fused kernel where torch has one for the device). Under
  ``model.dtype=bf16`` the model holds bf16 weights for the forward and backward passes while the optimizer
  steps **fp32 master weights** (and fp32 moments): the bf16 gradients are cast into the masters'
  :data:`MASTER_CHUNK_ELEMENTS` at a time (each bf16 gradient freed once cast), those masters stepped and
  copied back, rounded, into the model, so the update's peak is about 16 bytes a parameter, not 20. A 1e-6
  update is far below bf16's resolution near 1 (2^-8): without the masters most weights would never move.
  With several ranks (``torchrun``, no DeepSpeed) the gradients are summed over ranks in buckets before
  clipping: plain data parallelism.
* :class:`DeepSpeedUpdater`: DeepSpeed ZeRO stage 2 or 3 (``configs/deepspeed/zero2.json``, ``zero3.json``,
  or the user's own file) over the same torch AdamW (DeepSpeed's CPU Adam with ``train.offload``); bf16 with
  DeepSpeed's own fp32 master weights when ``model.dtype=bf16``. ZeRO-3 shards the parameters, and the KL
  reference with them; :meth:`Updater.gather_params` reads them whole one module at a time (checkpoints, the
  vLLM weight push) and :meth:`Updater.gathered_for_generation` once for a whole rollout session (HF
  generation), and :func:`zero3_sharded_loading` makes ``from_pretrained`` build a model already partitioned.

The trainer's loss for a micro-batch is already its share of the step's loss summed over every rank
(token and sequence counts are global), so gradients are **summed** over ranks: the local updater
all-reduces with a sum, DeepSpeed (which averages) gets the loss times the world size.
"""

from __future__ import annotations

import contextlib
import json
import math
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import torch

from mmrl.engine.distributed import World
from mmrl.model.recurrent import direct_reads
from mmrl_common.errors import ConfigError, MmrlError

CONFIG_DIR = Path(__file__).resolve().parents[2] / "configs" / "deepspeed"


LR_SCHEDULES = ("cosine", "constant", "linear")
"""``train.lr_schedule`` / ``sft.lr_schedule``: after the linear warm-up, the learning rate decays to
``min_lr_ratio`` of the peak along a half cosine or a straight line, or stays at the peak (constant)."""


class LrSchedule:
    """The learning rate of optimizer step ``n`` (0-based: the scheduler's position) as a multiplier of the
    peak: linear warm-up over ``warmup`` steps (``(k + 1) / warmup`` at the k-th), then ``kind`` over the
    rest of the schedule's ``total`` steps (cosine or linear decay to ``min_ratio``, or constant 1).

    :meth:`restart` begins it again at a later step (a curriculum stage that resets the optimizer): warm-up
    and decay from there, over the given number of steps (None: to the run's last step, ``total``)."""

    def __init__(self, kind: str, warmup: int, total: int, min_ratio: float = 0.0):
        if kind not in LR_SCHEDULES:
            raise ConfigError(f"lr_schedule: expected one of {', '.join(LR_SCHEDULES)}, got {kind!r}")
        self.kind, self.warmup, self.total, self.min_ratio = kind, int(warmup), int(total), float(min_ratio)
        self.start, self.steps = 0, None  # the schedule runs from step `start` for `steps` steps (None: to total)

    def restart(self, start: int, steps: int | None = None) -> None:
        self.start, self.steps = int(start), None if steps is None else int(steps)

    def __call__(self, step: int) -> float:
        n = step - self.start
        if self.warmup > 0 and n < self.warmup:
            return (n + 1) / self.warmup
        if self.kind == "constant":
            return 1.0
        span = self.steps if self.steps is not None else self.total - self.start
        progress = min(1.0, (n - self.warmup) / max(1, span - self.warmup))
        shape = 0.5 * (1 + math.cos(math.pi * progress)) if self.kind == "cosine" else 1.0 - progress
        return self.min_ratio + (1 - self.min_ratio) * shape


def lr_lambda(warmup: int, total: int, min_ratio: float, kind: str = "cosine") -> LrSchedule:
    """The schedule of a run: :class:`LrSchedule` from step 0 over ``total`` steps."""
    return LrSchedule(kind, warmup, total, min_ratio)


def lr_scheduler(optimizer: torch.optim.Optimizer, schedule: LrSchedule) -> torch.optim.lr_scheduler.LambdaLR:
    """torch's LambdaLR driven by ``schedule``. The schedule's settings are not part of the scheduler's saved
    state (torch would save a callable object's attributes): they come from the run's settings and, for a
    restart, from the curriculum stage, so a resume rebuilds them."""
    return torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: schedule(step))


def refresh_lr(scheduler: torch.optim.lr_scheduler.LambdaLR) -> None:
    """Set each param group's learning rate for the scheduler's current position (after its schedule changed,
    e.g. restarted): its peak times the schedule's multiplier there."""
    for group, base, factor in zip(scheduler.optimizer.param_groups, scheduler.base_lrs, scheduler.lr_lambdas):
        group["lr"] = float(base) * factor(scheduler.last_epoch)
    scheduler._last_lr = [g["lr"] for g in scheduler.optimizer.param_groups]


def set_peak_lr(scheduler: torch.optim.lr_scheduler.LambdaLR, lr: float) -> None:
    """Make ``lr`` the schedule's peak from now on: the schedule goes on at its position (its multiplier of
    this step unchanged), each param group's learning rate is now ``lr`` times that multiplier. Kept in the
    scheduler's state (``base_lrs``) and the optimizer's (its groups' ``lr``), so a resumed run has it."""
    scheduler.base_lrs = [float(lr)] * len(scheduler.optimizer.param_groups)
    for group, factor in zip(scheduler.optimizer.param_groups, scheduler.lr_lambdas):
        group["initial_lr"] = float(lr)
        group["lr"] = float(lr) * factor(scheduler.last_epoch)
    scheduler._last_lr = [g["lr"] for g in scheduler.optimizer.param_groups]


def adamw(params: list[torch.nn.Parameter], train: Any, device: torch.device) -> torch.optim.AdamW:
    """torch AdamW with the run's settings; the fused kernel where torch has one for ``device``."""
    kwargs: dict[str, Any] = {"lr": train.lr, "betas": tuple(train.adam_betas), "weight_decay": train.weight_decay}
    if train.fused_adamw and _fused_supported(device):
        kwargs["fused"] = True
    return torch.optim.AdamW(params, **kwargs)


def cpu_adamw(params: list[torch.nn.Parameter], train: Any) -> torch.optim.Optimizer:
    """DeepSpeed's CPU AdamW (its C++ kernel, built on first use: about 1.5 minutes, then cached), which ZeRO
    requires when the optimizer state lives in host memory (``train.offload``); it reads the learning rate
    from its param groups at every step, so the run's schedule drives it as it drives torch's."""
    from deepspeed.ops.adam import DeepSpeedCPUAdam

    return DeepSpeedCPUAdam(params, lr=train.lr, betas=tuple(train.adam_betas), weight_decay=train.weight_decay,
                            adamw_mode=True)


def _fused_supported(device: torch.device) -> bool:
    try:
        from torch.optim.optimizer import _get_fused_kernels_supported_devices

        return device.type in _get_fused_kernels_supported_devices()
    except ImportError:  # an older torch: CUDA only
        return device.type == "cuda"


class Updater:
    """What the trainer calls: ``backward(loss)`` per micro-batch, then ``step()`` -> the gradient norm
    before clipping, or None when the step was skipped (a non-finite gradient)."""

    optimizer: torch.optim.Optimizer  # the LR scheduler drives its param_groups
    world: World
    partitioned = False
    """The parameters are sharded over ranks (ZeRO-3): read them through :meth:`gather_params`."""

    def backward(self, loss: torch.Tensor) -> None:
        raise NotImplementedError

    def step(self) -> float | None:
        raise NotImplementedError

    def zero_grad(self) -> None:
        raise NotImplementedError

    def reset_state(self) -> None:
        """Forget the optimizer's state (AdamW's moments and step counts; rebuilt at the next step, as in a
        new run from the current weights). The parameters, fp32 masters included, are left as they are."""
        self.optimizer.state.clear()

    # state for an exact resume
    def state_dict(self) -> dict[str, Any]:
        """Optimizer state kept in ``trainer_state.pt`` (empty when the updater saves its own files)."""
        return {}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        pass

    def save_files(self, folder: Path) -> None:
        """Write per-rank optimizer files into a checkpoint folder (every rank calls it)."""

    def load_files(self, folder: Path) -> None:
        pass

    @contextlib.contextmanager
    def full_weights(self, modify: bool = False) -> Iterator[None]:
        """The model's whole weights readable inside (ZeRO-3 gathers them; every rank must enter). With
        ``modify``, rank 0's changes to them are kept (and sent to every rank) on leaving."""
        yield

    def gather_params(self, params: list[torch.nn.Parameter]) -> contextlib.AbstractContextManager:
        """``params`` whole inside (ZeRO-3 gathers them: every rank must enter alike)."""
        return contextlib.nullcontext()

    def gathered_for_generation(self) -> contextlib.AbstractContextManager:
        """The model whole, and its forward free of collectives, for generation (ZeRO-3)."""
        return contextlib.nullcontext()

    def wrap_reference(self, model: torch.nn.Module) -> torch.nn.Module:
        """The KL reference model as this updater keeps it (ZeRO-3: sharded like the policy)."""
        return model

    def state_in_host_memory(self) -> contextlib.AbstractContextManager:
        """Inside, the optimizer's own state is out of device memory (``rollout.vllm.offload_optimizer``):
        :meth:`LocalUpdater.state_in_host_memory`. DeepSpeed keeps its state where ``train.offload`` says."""
        raise ConfigError(f"rollout.vllm.offload_optimizer: {type(self).__name__} holds no state of mmrl's own "
                          "AdamW to move; under train.deepspeed use train.offload=optimizer (DeepSpeed's CPU offload)")


class LocalUpdater(Updater):
    def __init__(self, model: torch.nn.Module, train: Any, world: World):
        self.model = model
        self.world = world
        self.max_grad_norm = train.max_grad_norm
        self.named = [(n, p) for n, p in model.named_parameters() if p.requires_grad]
        self.params = [p for _, p in self.named]
        dev = self.params[0].device
        self.master: list[torch.Tensor] | None = None
        if any(p.dtype != torch.float32 for p in self.params):
            # fp32 master weights: the optimizer's parameters; the model's copies only run forward/backward
            self.master = [p.detach().float().clone().requires_grad_(True) for p in self.params]
            self.optimizer = adamw(self.master, train, dev)
        else:
            self.optimizer = adamw(self.params, train, dev)
        self.host = HostCopies()  # the masters and moments while away (rollout.vllm.offload_optimizer)
        if world.active:  # every rank starts from rank 0's weights
            for p in self.params:
                if torch.distributed.get_backend() == "gloo" or p.is_cuda:
                    torch.distributed.broadcast(p.data, src=0)
            if self.master is not None:
                for m, p in zip(self.master, self.params):
                    m.data.copy_(p.data.float())

    def backward(self, loss: torch.Tensor) -> None:
        loss.backward()

    def step(self) -> float | None:
        self._here("an optimizer step")
        if self.world.active:
            _sum_over_ranks(self.params)
        if self.master is None:
            grads = [p.grad for p in self.params if p.grad is not None]
            norm = torch.nn.utils.clip_grad_norm_(self.params, self.max_grad_norm) if grads else torch.tensor(0.0)
            if not bool(torch.isfinite(norm)):
                return None
            self.optimizer.step()
            return float(norm)
        # fp32 masters: the bf16 gradients are cast into the masters' a few tensors at a time, each bf16
        # gradient freed once cast, and the optimizer steps those masters before the next are cast, so the
        # update never holds a second, fp32 copy of every gradient (peak: weights 2 + bf16 gradients 2 +
        # masters 4 + moments 8 bytes per parameter, plus one chunk)
        norm = _total_norm([p.grad for p in self.params if p.grad is not None])
        if not bool(torch.isfinite(norm)):
            return None
        # as torch.nn.utils.clip_grad_norm_: scale by max_norm / (norm + 1e-6), never up
        coef = torch.clamp(self.max_grad_norm / (norm + 1e-6), max=1.0)
        for chunk in _chunks_by_size(list(zip(self.master, self.params)), MASTER_CHUNK_ELEMENTS):
            stepped = []
            for m, p in chunk:
                if p.grad is None:
                    continue
                m.grad = p.grad.detach().float().mul_(coef.to(p.grad.device))
                p.grad = None
                stepped.append((m, p))
            if not stepped:
                continue
            self.optimizer.step()  # steps the masters that hold a gradient: this chunk's
            with torch.no_grad():
                for m, p in stepped:
                    m.grad = None
                    p.copy_(m)  # rounded to the model's dtype
        return float(norm)

    def zero_grad(self) -> None:
        self.optimizer.zero_grad(set_to_none=True)
        if self.master is not None:
            for p in self.params:
                p.grad = None

    def state_dict(self) -> dict[str, Any]:
        """The optimizer state and the fp32 master weights by parameter name, **the live tensors, not
        copies** (as torch's own ``optimizer.state_dict()`` gives the moments): ``torch.save`` streams them
        to host memory one tensor at a time as it writes (a GPU tensor is copied to the CPU, written and
        freed before the next), so a checkpoint adds no second copy of the masters on the GPU (a clone of
        every master there was 4 bytes a parameter, 15 GB for a 3B model, on top of the optimizer's peak
        memory) and, on the CPU, no copy at all. Write it out before the next optimizer step changes them."""
        self._here("a checkpoint")
        state: dict[str, Any] = {"optimizer": self.optimizer.state_dict()}
        if self.master is not None:  # fp32 master weights by parameter name
            state["master"] = {n: m.detach() for (n, _), m in zip(self.named, self.master)}
        return state

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self._here("loading a checkpoint")
        opt = state.get("optimizer", state)  # older checkpoints: the bare optimizer state
        self.optimizer.load_state_dict(opt)
        # tensors the optimizer kept as torch.load made them (no cast or move needed) sit in storage that cannot
        # be resized, which state_in_host_memory frees and refills: the optimizer gets copies of its own
        for per_param in self.optimizer.state.values():
            for key, value in per_param.items():
                if isinstance(value, torch.Tensor) and not value.untyped_storage().resizable():
                    per_param[key] = value.clone()
        if self.master is not None and "master" in state:
            with torch.no_grad():
                for (name, p), m in zip(self.named, self.master):
                    m.copy_(state["master"][name])
                    p.copy_(m)

    # ------------------------------------------------------------------ the state out of device memory
    def state_tensors(self) -> list[torch.Tensor]:
        """What :meth:`state_in_host_memory` moves: the fp32 master weights (under bf16) and every tensor of
        the optimizer's state (AdamW's moments and step counts, once the first step made them). Not the
        model's own weights: the rollout engine's weight push and the rewards read them."""
        tensors = list(self.master or [])
        for group in self.optimizer.param_groups:
            for p in group["params"]:
                tensors += [v for v in self.optimizer.state.get(p, {}).values() if isinstance(v, torch.Tensor)]
        return tensors

    @property
    def state_away(self) -> bool:
        """The state is in host memory now (inside :meth:`state_in_host_memory`)."""
        return self.host.away

    @contextlib.contextmanager
    def state_in_host_memory(self) -> Iterator[int]:
        """The fp32 masters and the optimizer's state in host memory for the block (pinned where CUDA is), their
        device storage freed, and back, bit for bit, on leaving: the rollout engine wakes into the room
        (``rollout.vllm.offload_optimizer``; EasyR1 keeps its actor's optimizer state off the GPU outside the
        update, ``offload_fsdp_optimizer`` / ``load_fsdp_optimizer`` in ``verl/utils/fsdp_utils.py`` around
        ``update_actor`` in ``verl/workers/fsdp_workers.py``). The tensors stay the same objects (their
        storages are emptied and refilled, see :class:`HostCopies`), so the optimizer and anything else holding
        them find them unchanged. Yields the bytes moved each way. Inside, the state is not readable: an
        optimizer step, a checkpoint or a load is refused (:class:`MmrlError`)."""
        moved = self.host.offload(self.state_tensors())
        try:
            yield moved
        finally:
            self.host.restore()

    def _here(self, what: str) -> None:
        if self.host.away:
            raise MmrlError(f"{what} while the optimizer state is in host memory (a rollout session with "
                            "rollout.vllm.offload_optimizer): it comes back when the session ends; do this "
                            "after the session")


class HostCopies:
    """Tensors' bytes moved out of their storage into host buffers and back (:meth:`offload`,
    :meth:`restore`): each storage is copied whole into a byte buffer (pinned when the storage is on a GPU,
    so the copies run at the bus's speed and may overlap), then shrunk to nothing with
    ``untyped_storage().resize_(0)`` (FSDP frees its unsharded parameters the same way): the device memory is
    really given back, and on a CPU (where "device" and host are the same memory) the originals are freed
    all the same, so the CPU tests measure what a GPU run does. :meth:`restore` grows each storage back to its
    size and copies the bytes in: the same tensor objects, bit-equal contents. While away a tensor must not be
    read (its storage holds nothing; the caller refuses its own uses). The pinned buffers are kept for the next
    offload (pinning host memory is slow: the next offload of the same sizes reuses them); a CPU's are dropped
    once restored."""

    def __init__(self) -> None:
        self._away: list[tuple[torch.UntypedStorage, torch.Tensor]] | None = None
        self._kept: list[torch.Tensor] = []  # pinned buffers of the last offload, reused by the next
        self.moves = 0  # offloads made
        self.bytes_moved = 0  # over every offload, one way (the same bytes come back)
        self.seconds = 0.0  # copying, both ways

    @property
    def away(self) -> bool:
        return self._away is not None

    @property
    def buffers(self) -> list[torch.Tensor]:
        """The host buffers holding the moved bytes now (empty when nothing is away)."""
        return [buf for _, buf in self._away or ()]

    def offload(self, tensors: list[torch.Tensor]) -> int:
        """Move ``tensors``' storages (each once) into host buffers and free them; the bytes moved."""
        if self._away is not None:
            raise MmrlError("the optimizer state is already in host memory")
        t0 = time.perf_counter()
        storages = _distinct_storages(tensors)
        fixed = [s for s in storages if not s.resizable()]
        if fixed:  # checked before anything is freed: a half-done move would leave tensors without contents
            raise MmrlError(f"{len(fixed)} of the optimizer's tensors sit in storage that cannot be resized (e.g. "
                            "made by torch.load): they cannot leave device memory in place")
        cuda = any(s.device.type == "cuda" for s in storages)
        away = []
        for i, s in enumerate(storages):
            n = s.nbytes()
            kept = self._kept[i] if i < len(self._kept) else None
            buf = kept if kept is not None and kept.numel() == n else torch.empty(
                n, dtype=torch.uint8, pin_memory=s.device.type == "cuda")
            buf.copy_(_bytes_of(s), non_blocking=s.device.type == "cuda")
            away.append((s, buf))
        if cuda:
            torch.cuda.synchronize()  # every copy landed before the device memory is let go
        for s, _ in away:
            s.resize_(0)
        if cuda:
            torch.cuda.empty_cache()  # to the driver: the engine allocates outside torch's cache
        self._away = away
        self._kept = [buf for _, buf in away] if cuda else []
        moved = sum(buf.numel() for _, buf in away)
        self.moves += 1
        self.bytes_moved += moved
        self.seconds += time.perf_counter() - t0
        return moved

    def restore(self) -> None:
        """Grow every storage back and copy its bytes in (a no-op when nothing is away)."""
        if self._away is None:
            return
        t0 = time.perf_counter()
        cuda = False
        for s, buf in self._away:
            s.resize_(buf.numel())
            cuda = cuda or s.device.type == "cuda"
            _bytes_of(s).copy_(buf, non_blocking=s.device.type == "cuda")
        if cuda:
            torch.cuda.synchronize()  # the buffers may be written again by the next offload
        self._away = None
        self.seconds += time.perf_counter() - t0


def _distinct_storages(tensors: list[torch.Tensor]) -> list[torch.UntypedStorage]:
    """The storages under ``tensors``, each once (views share one), empty ones left out."""
    seen: set[int] = set()
    out = []
    for t in tensors:
        s = t.untyped_storage()
        if s.nbytes() == 0 or s.data_ptr() in seen:
            continue
        seen.add(s.data_ptr())
        out.append(s)
    return out


def _bytes_of(storage: torch.UntypedStorage) -> torch.Tensor:
    """A uint8 tensor over the whole of ``storage``."""
    return torch.empty(0, dtype=torch.uint8, device=storage.device).set_(storage)


MASTER_CHUNK_ELEMENTS = 1 << 22  # gradient elements cast to fp32 and stepped at a time (16 MB in fp32)
REDUCE_BUCKET_ELEMENTS = 1 << 25  # gradient elements all-reduced in one flat buffer


def _chunks_by_size(items: list[Any], limit: int) -> Iterator[list[Any]]:
    """Consecutive runs of ``(master, param)`` pairs (or parameters) of at most ``limit`` elements each (a
    larger tensor is a run of its own)."""
    run: list[Any] = []
    size = 0
    for item in items:
        n = (item[1] if isinstance(item, tuple) else item).numel()
        if run and size + n > limit:
            yield run
            run, size = [], 0
        run.append(item)
        size += n
    if run:
        yield run


def _total_norm(grads: list[torch.Tensor]) -> torch.Tensor:
    """The global L2 norm of ``grads`` in fp32, one tensor at a time (no fp32 copy of a bf16 gradient)."""
    if not grads:
        return torch.tensor(0.0)
    dev = grads[0].device
    norms = [torch.linalg.vector_norm(g.detach(), 2, dtype=torch.float32).to(dev) for g in grads]
    return torch.linalg.vector_norm(torch.stack(norms), 2)


def _sum_over_ranks(params: list[torch.nn.Parameter]) -> None:
    """Sum the gradients over ranks in flat buckets of at most :data:`REDUCE_BUCKET_ELEMENTS` (a missing
    gradient counts as zeros)."""
    for p in params:
        if p.grad is None:
            p.grad = torch.zeros_like(p)
    by_dtype: dict[torch.dtype, list[torch.nn.Parameter]] = {}
    for p in params:
        by_dtype.setdefault(p.grad.dtype, []).append(p)
    for group in by_dtype.values():
        for bucket in _chunks_by_size(group, REDUCE_BUCKET_ELEMENTS):
            flat = torch.cat([p.grad.reshape(-1) for p in bucket])
            torch.distributed.all_reduce(flat)
            offset = 0
            for p in bucket:
                n = p.grad.numel()
                p.grad.copy_(flat[offset:offset + n].view_as(p.grad))
                offset += n
            del flat


# ---------------------------------------------------------------------------------------------- DeepSpeed
def deepspeed_config(setting: str, *, micro_batch: int, world: World, max_grad_norm: float, bf16: bool,
                     offload: str = "none") -> dict[str, Any]:
    """The DeepSpeed config: ``zero2`` / ``zero3`` (shipped under ``configs/deepspeed/``) or a JSON file.
    Batch sizes, clipping and precision come from the run's settings; ``auto`` values in the file are
    filled from them. ``offload`` (``train.offload``): ``optimizer`` keeps the optimizer state (and its
    step) in host memory, ``all`` the parameters too (ZeRO-3)."""
    path = CONFIG_DIR / f"{setting}.json" if setting in ("zero2", "zero3") else Path(setting)
    if not path.is_file():
        raise ConfigError(f"train.deepspeed={setting!r}: not zero2, zero3 or a DeepSpeed JSON file")
    try:
        cfg = json.loads(path.read_text())
    except json.JSONDecodeError as exc:
        raise ConfigError(f"{path}: not valid JSON: {exc}") from exc
    stage = int(cfg.get("zero_optimization", {}).get("stage", 0))
    if stage not in (2, 3):
        raise ConfigError(f"{path}: zero_optimization.stage is {stage}; mmrl runs DeepSpeed ZeRO stage 2 or 3")
    if "optimizer" in cfg or "scheduler" in cfg:
        raise ConfigError(f"{path}: remove `optimizer` / `scheduler`: mmrl steps its own AdamW (train.lr, "
                          "train.adam_betas, train.weight_decay) and learning-rate schedule")
    for key, value in (("train_micro_batch_size_per_gpu", micro_batch), ("gradient_accumulation_steps", 1),
                       ("train_batch_size", micro_batch * world.size), ("gradient_clipping", max_grad_norm)):
        if cfg.get(key, "auto") == "auto":
            cfg[key] = value
    cfg["zero_allow_untested_optimizer"] = True
    # the trainer owns the accumulation boundary: a mini-batch's micro-batches accumulate, step() reduces
    cfg["managed_gradient_accumulation"] = False
    cfg.setdefault("steps_per_print", 10**9)
    cfg["bf16"] = {**cfg.get("bf16", {}), "enabled": bf16, "check_grad_overflow": True}
    cfg.pop("fp16", None)
    zero = cfg["zero_optimization"]
    if offload in ("optimizer", "all"):
        zero["offload_optimizer"] = {"device": "cpu", "pin_memory": torch.cuda.is_available(),
                                     **zero.get("offload_optimizer", {})}
    if offload == "all":
        if stage != 3:
            raise ConfigError("train.offload=all moves the parameters to host memory, which only ZeRO-3 shards: "
                              "use train.deepspeed=zero3, or train.offload=optimizer")
        zero["offload_param"] = {"device": "cpu", "pin_memory": torch.cuda.is_available(),
                                 **zero.get("offload_param", {})}
    return cfg


def offloads_optimizer(config: dict[str, Any]) -> bool:
    """The DeepSpeed config keeps the optimizer in host memory (DeepSpeed then needs its own CPU Adam)."""
    device = (config.get("zero_optimization", {}).get("offload_optimizer") or {}).get("device", "none")
    return device in ("cpu", "nvme")


@contextlib.contextmanager
def zero3_sharded_loading(train: Any, world: World, *, bf16: bool) -> Iterator[bool]:
    """Inside, under ZeRO-3 on several ranks, transformers' ``from_pretrained`` builds the model already
    partitioned (``deepspeed.zero.Init`` through ``HfDeepSpeedConfig``, as the HF Trainer does), so no rank ever
    holds a whole 7B: rank 0 reads the checkpoint and hands each module's weights to the ranks in turn. Yields
    whether it does (False without ZeRO-3 or on one rank: nothing changes). Only the block's loads are
    affected (a reward's own model loaded later is not)."""
    if not (train.deepspeed and world.active):
        yield False
        return
    config = deepspeed_config(train.deepspeed, micro_batch=train.micro_batch_size, world=world,
                              max_grad_norm=train.max_grad_norm, bf16=bf16, offload=train.offload)
    if int(config["zero_optimization"]["stage"]) != 3:
        yield False
        return
    import deepspeed
    from transformers.integrations import HfDeepSpeedConfig

    deepspeed.init_distributed(dist_backend=torch.distributed.get_backend())  # its world: torchrun's
    handle = HfDeepSpeedConfig(config)  # transformers keeps only a weak reference: alive for the block
    try:
        yield True
    finally:
        del handle


def is_sharded(model: torch.nn.Module) -> bool:
    """The model's parameters are ZeRO-3 partitions (built under ``deepspeed.zero.Init``)."""
    return hasattr(next(model.parameters()), "ds_id")


class DeepSpeedUpdater(Updater):
    def __init__(self, model: torch.nn.Module, train: Any, world: World, *, bf16: bool):
        try:
            import deepspeed
        except ImportError as exc:
            raise MmrlError("train.deepspeed needs DeepSpeed: pip install 'mmrl[deepspeed]'") from exc
        self.world = world
        if not torch.distributed.is_initialized():  # one process without torchrun: a world of one
            _init_single_process(model)
        self.config = deepspeed_config(train.deepspeed, micro_batch=train.micro_batch_size, world=world,
                                       max_grad_norm=train.max_grad_norm, bf16=bf16, offload=train.offload)
        self.stage = int(self.config["zero_optimization"]["stage"])
        params = [p for p in model.parameters() if p.requires_grad]
        dev = params[0].device
        base = cpu_adamw(params, train) if offloads_optimizer(self.config) else adamw(params, train, dev)
        self.engine, self.optimizer_wrapper, _, _ = deepspeed.initialize(
            model=model, optimizer=base, config=self.config, dist_init_required=False)
        if self.stage == 3:
            gather_direct_reads(model)
        self.optimizer = base  # the schedule drives the base optimizer's param_groups (the flat partitions)
        self.model = model

    def backward(self, loss: torch.Tensor) -> None:
        if self.stage == 3:
            # The forward ran through the model's own modules, not engine.forward(): do the one thing of its
            # prologue that ZeRO-3's gradient accumulation needs (it counts micro-batches there: the first
            # copies its gradients into the partitions, the others add). ZeRO-2 accumulates without it
            # (measured: with it, a step's gradient norm is off by 3e-4 relative).
            self.engine.optimizer.clear_backward_seen_flag()
        # DeepSpeed averages gradients over ranks; the trainer's losses add up over ranks
        self.engine.backward(loss * self.world.size, scale_wrt_gas=False)

    def step(self) -> float | None:
        self.engine.step()
        if not self.engine.was_step_applied():
            return None
        norm = self.engine.get_global_grad_norm()
        return float(norm) if norm is not None else float("nan")

    def zero_grad(self) -> None:
        self.engine.zero_grad()

    def save_files(self, folder: Path) -> None:
        self.engine.save_checkpoint(str(folder), tag="deepspeed", client_state={}, save_latest=False)

    def load_files(self, folder: Path) -> None:
        path, _ = self.engine.load_checkpoint(str(folder), tag="deepspeed", load_optimizer_states=True,
                                              load_lr_scheduler_states=False, load_module_only=False)
        if path is None:
            raise MmrlError(f"{folder}: no DeepSpeed optimizer state (deepspeed/); was this checkpoint written by a "
                            "run without train.deepspeed?")

    @property
    def partitioned(self) -> bool:  # type: ignore[override]
        return self.stage == 3

    @contextlib.contextmanager
    def full_weights(self, modify: bool = False) -> Iterator[None]:
        if self.stage == 3:
            import deepspeed

            with deepspeed.zero.GatheredParameters(list(self.model.parameters()),
                                                   modifier_rank=0 if modify else None):
                yield
        else:
            yield

    def gather_params(self, params: list[torch.nn.Parameter]) -> contextlib.AbstractContextManager:
        if self.stage != 3:
            return contextlib.nullcontext()
        import deepspeed

        return deepspeed.zero.GatheredParameters(params, modifier_rank=None)

    @contextlib.contextmanager
    def gathered_for_generation(self) -> Iterator[None]:
        """ZeRO-3: every parameter gathered once (one collective pass over the model on entering), and
        ZeRO-3's module hooks, which would fetch and release each module's weights at each of its calls, off
        until leaving; generation then runs on local weights and each rank may make its own calls. As TRL's
        ``unwrap_model_for_generation`` (trl/models/utils.py: ``remove_hooks`` / ``add_hooks``). The whole
        model is on every device for the block (bf16 7B: 15 GB)."""
        if self.stage != 3:
            yield
            return
        import deepspeed

        offload = self.engine.optimizer.parameter_offload  # ZeRO-3's hook owner (DeepSpeedZeRoOffload)
        with deepspeed.zero.GatheredParameters(list(self.model.parameters()), modifier_rank=None):
            for p in self.model.parameters():
                p.ds_active_sub_modules.clear()
            for hook in [*offload.forward_hooks, *offload.backward_hooks]:
                hook.remove()
            offload.forward_hooks, offload.backward_hooks = [], []
            # TRL leaves the root's start-of-forward hook in place; while the coordinator re-traces it compares
            # the ranks' step counters with broadcasts, so ranks generating different numbers of tokens would
            # wait on each other forever: it goes too, and comes back first on leaving
            offload.fwd_pre_hook.remove()
            try:
                yield
            finally:
                coordinator = offload.get_param_coordinator()
                if not coordinator.is_invalid_trace():  # the module order it traced no longer holds
                    coordinator._invalidate_trace()
                offload.fwd_pre_hook = offload.module.register_forward_pre_hook(
                    lambda module, *args: offload.get_param_coordinator().reset_step())
                offload._register_deepspeed_module(offload.module)

    def wrap_reference(self, model: torch.nn.Module) -> torch.nn.Module:
        if self.stage != 3:
            return model  # ZeRO-2 keeps whole parameters on every rank: the reference is replicated too
        import deepspeed

        cfg = {k: v for k, v in self.config.items() if k not in ("gradient_clipping",)}
        cfg["zero_optimization"] = {"stage": 3, **{k: v for k, v in self.config["zero_optimization"].items()
                                                   if k.startswith("stage3_") or k == "offload_param"}}
        engine, *_ = deepspeed.initialize(model=model, config=cfg, dist_init_required=False)
        gather_direct_reads(model)
        return engine.module


def gather_direct_reads(model: torch.nn.Module) -> None:
    """Under ZeRO-3, make DeepSpeed gather the parameters a module's forward reads from a child it never calls
    (Qwen3.5's Gated DeltaNet convolves with ``self.conv1d.weight``: :func:`mmrl.model.recurrent.direct_reads`)
    whenever that module runs, in forward and backward: ``deepspeed.zero.register_external_parameter``, its API
    for a parameter used outside its own module. Without it the weight is an empty partition there (measured:
    "Dimension out of range" in the convolution). DeepSpeed's leaf modules (``set_z3_leaf_modules``) were tried
    first: the forward ran, the backward failed on a released partition."""
    pairs = direct_reads(model)
    if pairs:
        import deepspeed

        for module, params in pairs:
            for p in params:
                deepspeed.zero.register_external_parameter(module, p)


def _init_single_process(model: torch.nn.Module) -> None:
    import os
    import socket

    if "MASTER_PORT" not in os.environ:
        with socket.socket() as sock:  # a free port: several single-process runs may share the machine
            sock.bind(("127.0.0.1", 0))
            os.environ["MASTER_PORT"] = str(sock.getsockname()[1])
    for key, value in (("MASTER_ADDR", "127.0.0.1"), ("RANK", "0"), ("LOCAL_RANK", "0"), ("WORLD_SIZE", "1")):
        os.environ.setdefault(key, value)
    cuda = next(model.parameters()).is_cuda
    torch.distributed.init_process_group("nccl" if cuda else "gloo", rank=0, world_size=1)


def make_updater(model: torch.nn.Module, train: Any, world: World, *, bf16: bool) -> Updater:
    if train.deepspeed:
        return DeepSpeedUpdater(model, train, world, bf16=bf16)
    return LocalUpdater(model, train, world)


def offload_in_rollouts(setting: bool | str, *, backend: str, deepspeed: str | None, device: torch.device,
                        lora: bool, sleep_mode: bool) -> bool:
    """Whether the optimizer state leaves device memory during rollout sessions
    (``rollout.vllm.offload_optimizer``; :meth:`LocalUpdater.state_in_host_memory`). ``true``: with the vLLM
    backend, on any device (on a CPU the move is real too: the tests check it there); ``false``: never;
    ``auto``: a full fine-tune (LoRA's adapter state is small) with mmrl's own AdamW (not DeepSpeed, whose
    ``train.offload`` moves its own state) and ``rollout.backend=vllm`` with sleep mode on a GPU: the engine
    gives its memory back during the update and takes it again for the rollouts, where 12 bytes a parameter
    of masters and moments would leave it no room (a 3B: 45 GB). Without sleep mode the engine keeps its
    memory through the update, which must fit beside it anyway: moving the state out would cost copies and
    give the engine nothing. With the HF backend (generation on the training model) nothing moves."""
    if backend != "vllm" or setting is False:
        return False
    if setting is True:
        if deepspeed:
            from mmrl.config import offload_under_deepspeed

            raise ConfigError(offload_under_deepspeed(deepspeed))
        return True
    return not deepspeed and not lora and device.type == "cuda" and sleep_mode
