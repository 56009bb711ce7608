"""Data parallelism: which process this is, and the few collectives the trainer needs.

``mmrl train`` started by ``torchrun --nproc_per_node N`` (or ``accelerate launch``, or torchrun with
rendezvous flags across nodes) sees ``WORLD_SIZE``, ``RANK`` and ``LOCAL_RANK`` in its environment and joins
the process group: NCCL when each rank has a GPU (``cuda:LOCAL_RANK``), gloo on CPUs. A plain ``mmrl train``
is a world of one and every helper here is a no-op.

How the work is split (see :class:`~mmrl.engine.trainer.GRPOTrainer`): every rank draws the same prompts (the
sampler is seeded alike), rolls out and scores its contiguous share of them (a group never leaves its rank),
and the scored shares are gathered in rank order, so every rank holds the step's whole batch, in the same
order as a single process would. Gradient-free log-prob passes split the rows and sum the results; the update
splits each mini-batch's rows, with token and sequence counts taken over the whole mini-batch, so the summed
loss is the single-process loss. Rank 0 alone writes the run folder.

Several nodes (``torchrun --nnodes N``): the data, the model and the run folder are on storage every node
shares; the mmrl cache (``MMRL_CACHE``: tiny models, the toy world, media-check verdicts) and ``HOME`` are
each node's own. Each node's local rank 0 prepares that node's caches before the node's other ranks read them
(:meth:`World.node_first`); the media check is shared out among all ranks and its verdicts gathered
(:meth:`World.spread_media_checks`); a tensor-parallel vLLM engine's block of ranks must sit inside one node
(:meth:`World.check_block`).
"""

from __future__ import annotations

import contextlib
import functools
import os
import sys
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

import torch

from mmrl.model.loading import warn_cpu_fallback
from mmrl.model.sequence_parallel import SequenceGroup
from mmrl_common.errors import ConfigError, MmrlError

T = TypeVar("T")

_TIMEOUT_WORDS = ("timed out", "timeout")
_PEER_GONE_WORDS = ("connection closed by peer", "connection reset by peer", "broken pipe")


def collective_failure(exc: BaseException, *, rank: int, size: int, timeout_minutes: float,
                       waiting_in: str = "a collective") -> str | None:
    """One line for a collective that failed because another rank did not answer (gloo's "Timed out waiting
    Nms", NCCL's watchdog timeout) or left (gloo's "Connection closed by peer"): which rank waited, where,
    the setting that bounds the wait and what likely hung; None for any other error."""
    if not isinstance(exc, RuntimeError):
        return None
    text = str(exc).lower()
    if any(w in text for w in _TIMEOUT_WORDS):
        return (f"rank {rank} of {size} waited train.dist_timeout_minutes={timeout_minutes:g} minutes in "
                f"{waiting_in} for the other ranks and stopped: a rank hung or is far behind (a media file "
                "whose decode does not return, a slow or full disk, a stuck data or reward server; each rank's "
                "last line says where it is) or died without a word (the OOM killer: dmesg); fix it and resume "
                "with --resume, or raise train.dist_timeout_minutes when one step, a checkpoint save or a first "
                "engine start legitimately takes longer")
    if any(w in text for w in _PEER_GONE_WORDS):
        return (f"rank {rank} of {size}: another rank left the run while this one waited in {waiting_in} (its "
                "own error, printed by that rank, says why; or it was killed: the OOM killer, dmesg)")
    return None


def _caller() -> str:
    """The first frame outside this module: ``mmrl/run/pipeline.py:183 (prepare_data)``."""
    frame = sys._getframe(1)
    while frame is not None and frame.f_code.co_filename == __file__:
        frame = frame.f_back
    if frame is None:
        return "?"
    parts = Path(frame.f_code.co_filename).parts
    where = "/".join(parts[parts.index("mmrl"):]) if "mmrl" in parts else Path(frame.f_code.co_filename).name
    return f"{where}:{frame.f_lineno} ({frame.f_code.co_name})"


def _collective(name: str) -> Callable[[Callable[..., T]], Callable[..., T]]:
    """A :class:`World` collective whose wait for the other ranks ends (the process group's timeout, a rank
    gone) raises :class:`CollectiveTimeout`: one line naming this rank, the collective, its caller and
    ``train.dist_timeout_minutes``, instead of gloo's traceback."""
    def wrap(fn: Callable[..., T]) -> Callable[..., T]:
        @functools.wraps(fn)
        def inner(self: World, *args: Any, **kwargs: Any) -> T:
            try:
                return fn(self, *args, **kwargs)
            except RuntimeError as exc:
                line = collective_failure(exc, rank=self.rank, size=self.size, timeout_minutes=self.timeout_minutes,
                                          waiting_in=f"{name} (called from {_caller()})")
                if line is None:
                    raise
                raise CollectiveTimeout(line) from exc
        return inner
    return wrap


class CollectiveTimeout(MmrlError):
    """A collective of :class:`World` that another rank never joined, or left (:func:`collective_failure`)."""


@dataclass(frozen=True)
class World:
    """``local_rank`` / ``local_size``: this rank's place among the ranks of its node (torchrun's
    ``LOCAL_RANK`` / ``LOCAL_WORLD_SIZE``; ``local_size`` 0 when the launcher did not say: one node);
    ``node``: the node's index (``GROUP_RANK``). torchrun numbers the ranks node by node, so a node's ranks are
    consecutive."""

    rank: int = 0
    size: int = 1
    local_rank: int = 0
    local_size: int = 0
    node: int = 0
    timeout_minutes: float = 30  # train.dist_timeout_minutes: how long a collective waits for the other ranks

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    @property
    def is_node_main(self) -> bool:
        """The node's local rank 0: it prepares the node's caches (:meth:`node_first`)."""
        return self.local_rank == 0

    @property
    def active(self) -> bool:
        return self.size > 1

    # -------------------------------------------------------------------------------------- splitting
    def share(self, n: int, rank: int | None = None) -> range:
        """This rank's contiguous share of ``n`` items (the first ``n % size`` ranks get one more)."""
        r = self.rank if rank is None else rank
        base, extra = divmod(n, self.size)
        start = r * base + min(r, extra)
        return range(start, start + base + (1 if r < extra else 0))

    def block(self, size: int = 1) -> tuple[int, int, int]:
        """``(index, count, member)`` of this rank among blocks of ``size`` consecutive ranks (a vLLM engine
        spanning ``size`` GPUs): the ranks of a block roll out the same prompts, as one data-parallel rank.
        A block that the ranks cannot form is a :class:`ConfigError` (:meth:`check_block`)."""
        size = max(1, int(size))
        if size > 1:
            self.check_block(size)
        return self.rank // size, max(1, self.size // size), self.rank % size

    def check_block(self, size: int, setting: str = "rollout.vllm.tensor_parallel_size") -> None:
        """A :class:`ConfigError` unless blocks of ``size`` consecutive ranks tile the world and each sits inside
        one node (a tensor-parallel engine's ranks talk over the node's own links; vLLM cannot span nodes
        with its external launcher). Computed from this rank's own numbers: with the same ranks per node, as
        torchrun starts them, every rank comes to the same verdict, so all fail together, before any engine."""
        size = int(size)
        if size <= 1:
            return
        if self.size % size:
            raise ConfigError(f"{setting}={size} does not divide the {self.size} ranks: each engine takes {size} "
                              f"consecutive ranks; use a divisor of {self.size}, or start a multiple of {size} ranks")
        if self.local_size <= 0 or self.local_size == self.size:
            return  # one node
        first = self.rank - self.local_rank  # this node's first global rank
        if self.local_size % size or first % size:
            fits = [d for d in range(1, self.local_size + 1) if self.local_size % d == 0]
            raise ConfigError(
                f"{setting}={size}: a tensor-parallel engine must sit inside one node, but node {self.node} runs "
                f"{self.local_size} ranks (global ranks {first}-{first + self.local_size - 1}), so an engine's {size} "
                f"ranks would span two nodes; use a size that divides the ranks per node "
                f"({', '.join(map(str, fits))}), or start a multiple of {size} ranks on every node "
                "(torchrun --nproc-per-node)")

    def sequence_group(self, size: int) -> SequenceGroup | None:
        """This rank's sequence-parallel group (``train.sequence_parallel_size``): blocks of ``size`` consecutive
        ranks, each spreading its samples' tokens over its ranks (:mod:`mmrl.model.sequence_parallel`), data
        parallelism over the blocks. Every rank creates every block's process group (torch's rule for
        ``new_group``), so every rank calls this alike. None for a size of 1; a size that does not divide the
        ranks is a :class:`ConfigError`."""
        size = int(size)
        if size <= 1:
            return None
        if self.size % size:
            raise ConfigError(f"train.sequence_parallel_size={size} does not divide the {self.size} ranks: each "
                              f"group takes {size} consecutive ranks; use a divisor of {self.size}, or start a "
                              f"multiple of {size} ranks")
        mine = None
        for first in range(0, self.size, size):
            ranks = list(range(first, first + size))
            group = torch.distributed.new_group(ranks) if size < self.size else torch.distributed.group.WORLD
            if self.rank in ranks:
                mine = SequenceGroup(rank=self.rank - first, size=size, group=group)
        return mine

    def shard(self, items: Sequence[T], engine_ranks: int = 1) -> list[T]:
        """This rank's contiguous share of ``items`` for work that ends in :meth:`unshard`; with
        ``engine_ranks`` > 1 (a vLLM engine spanning that many ranks) the ranks of a block share one share."""
        index, count, _ = self.block(engine_ranks)
        mine = World(rank=index, size=count).share(len(items))
        return list(items)[mine.start:mine.stop]

    def unshard(self, part: Sequence[T], engine_ranks: int = 1) -> list[T]:
        """Every share's results (:meth:`shard`), concatenated in the order of the items, on every rank."""
        if not self.active:
            return list(part)
        return [x for share in self.gather(list(part))[::max(1, int(engine_ranks))] for x in share]

    # -------------------------------------------------------------------------------------- collectives
    @_collective("an all-gather")
    def gather(self, obj: T) -> list[T]:
        """Every rank's ``obj``, in rank order, on every rank (pickled; for small or CPU-side objects)."""
        if not self.active:
            return [obj]
        out: list[Any] = [None] * self.size
        torch.distributed.all_gather_object(out, obj)
        return out

    @_collective("a broadcast from rank 0")
    def broadcast(self, obj: T) -> T:
        """Rank 0's ``obj`` on every rank."""
        if not self.active:
            return obj
        box = [obj]
        torch.distributed.broadcast_object_list(box, src=0)
        return box[0]

    @_collective("a sum over ranks (all-reduce)")
    def sum_(self, tensor: torch.Tensor) -> torch.Tensor:
        """Sum ``tensor`` over ranks, in place (on the process group's device), and return it."""
        if self.active:
            dev = _comm_device()
            t = tensor.to(dev)
            torch.distributed.all_reduce(t)
            if t is not tensor:
                tensor.copy_(t)
        return tensor

    @_collective("a max over ranks (all-reduce)")
    def max_int(self, n: int) -> int:
        """The largest ``n`` over ranks."""
        if not self.active:
            return int(n)
        t = torch.tensor([int(n)], dtype=torch.int64, device=_comm_device())
        torch.distributed.all_reduce(t, op=torch.distributed.ReduceOp.MAX)
        return int(t.item())

    def all_true(self, flag: bool) -> bool:
        """True when ``flag`` holds on every rank."""
        if not self.active:
            return flag
        t = torch.tensor([1.0 if flag else 0.0])
        return bool(self.sum_(t).item() == self.size)

    def sum_stats(self, stats: dict[str, float]) -> dict[str, float]:
        """Sum a dict of floats over ranks (keys that only some ranks have count as 0 on the others)."""
        if not self.active:
            return stats
        keys = sorted({k for d in self.gather(sorted(stats)) for k in d})
        t = self.sum_(torch.tensor([float(stats.get(k, 0.0)) for k in keys], dtype=torch.float64))
        return dict(zip(keys, t.tolist()))

    @_collective("a barrier")
    def barrier(self) -> None:
        if self.active:
            torch.distributed.barrier()

    @contextlib.contextmanager
    def all_or_none(self, what: str) -> Iterator[None]:
        """Run a block that has no collective inside (rank 0 writing a checkpoint, each rank its own files) on
        every rank, then agree: when it raised on some rank, every rank raises, the failing ones their own error,
        the others one line naming the first failing rank and ``what`` it was doing, instead of waiting at the
        run's next collective until ``train.dist_timeout_minutes`` (a disk full on rank 0 while it saves)."""
        error: BaseException | None = None
        try:
            yield
        except BaseException as exc:  # noqa: BLE001 (re-raised below, after the other ranks are told)
            error = exc
        if self.active:
            failed = [r for r, bad in enumerate(self.gather(error is not None)) if bad]
        else:
            failed = [0] if error is not None else []
        if error is not None:
            raise error
        if failed:
            raise MmrlError(f"rank {failed[0]} failed while {what} (its error is in its output"
                            f"{'' if len(failed) == 1 else f'; ranks {failed} failed'}); rank {self.rank} stops too")

    def main_first(self) -> contextlib.AbstractContextManager:
        """Rank 0 runs the block first (building what lives in the shared run folder), the others after.
        For the mmrl cache, which is each node's own, use :meth:`node_first`."""
        return self._leader_first(self.is_main)

    def node_first(self) -> contextlib.AbstractContextManager:
        """Each node's local rank 0 runs the block first (building that node's caches under ``MMRL_CACHE``: the
        tiny model, the toy world), the node's other ranks after, reading what it built. All nodes' leaders
        work at once; one barrier over the world separates the two turns."""
        return self._leader_first(self.is_node_main)

    @contextlib.contextmanager
    def _leader_first(self, leader: bool) -> Iterator[None]:
        """The ranks with ``leader`` run the block first, the others after (one world barrier between)."""
        if not leader:
            self.barrier()
        try:
            yield
        finally:
            if leader:
                self.barrier()

    @contextlib.contextmanager
    def spread_media_checks(self) -> Iterator[None]:
        """Media checks inside the block (:func:`data_pipelines.media_check.check_files`, as the loaders call
        it) are shared out among all ranks, each checking its share of the files that any node's cache has
        no verdict for, and the verdicts gathered, so that every rank ends with all of them and each node's
        local rank 0 writes them into the node's cache. Every rank must run the same loads inside it."""
        if not self.active:
            yield
            return
        from data_pipelines.media_check import Spread, spread_checks

        with spread_checks(Spread(gather=self.gather, rank=self.rank, size=self.size,
                                  save=self.is_node_main, local_size=self.local_size or self.size)):
            yield

    def check_same_files(self, files: dict[str, Path | str | None], *, stamp: bool = False) -> None:
        """Every rank sees ``files`` (``{setting: path}``, None entries ignored) as rank 0 does: present or
        not, of the same size (and with ``stamp`` the same modification time: the very same file, as on
        storage every node shares). On a difference every rank raises the same :class:`MmrlError` naming the
        file and the ranks' hosts, instead of loading different data, or failing on one node while the
        others wait in a collective."""
        if not self.active:
            return
        import socket

        mine: dict[str, Any] = {}
        for name, path in files.items():
            if path is not None:
                mine[name] = _file_view(Path(path), stamp)
        views = self.gather((socket.gethostname(), mine))
        host0, first = views[0]
        for name in mine:
            for r, (host, seen) in enumerate(views):
                if seen.get(name) != first.get(name):
                    raise MmrlError(
                        f"{name} {files[name]}: rank {r} (host {host}) sees {_describe(seen.get(name))}, rank 0 "
                        f"(host {host0}) {_describe(first.get(name))}; on several nodes the data, the model and the "
                        "run folder must be on storage every node shares (the same path on each), while MMRL_CACHE "
                        "and HOME are each node's own")


_WORLD = World()


def world() -> World:
    """The current process's place (a world of one unless :func:`init` joined a process group)."""
    return _WORLD


def launched() -> bool:
    """Started by torchrun / accelerate launch with more than one process."""
    return int(os.environ.get("WORLD_SIZE", "1")) > 1


def init(device: str = "auto", timeout_minutes: float = 30) -> World:
    """Join the process group described by torchrun's environment (once); a world of one without it.
    ``timeout_minutes`` (``train.dist_timeout_minutes``): how long a collective waits for the other ranks
    before the run fails instead of hanging."""
    global _WORLD
    if not launched():
        return _WORLD
    if not torch.distributed.is_initialized():
        import datetime

        local = int(os.environ.get("LOCAL_RANK", "0"))
        use_cuda = device.startswith("cuda") or (device == "auto" and torch.cuda.is_available())
        if use_cuda:
            torch.cuda.set_device(local)
        torch.distributed.init_process_group(backend="nccl" if use_cuda else "gloo",
                                             timeout=datetime.timedelta(minutes=float(timeout_minutes)))
    _WORLD = World(rank=torch.distributed.get_rank(), size=torch.distributed.get_world_size(),
                   local_rank=int(os.environ.get("LOCAL_RANK", "0")),
                   local_size=int(os.environ.get("LOCAL_WORLD_SIZE", "0")),
                   node=int(os.environ.get("GROUP_RANK", "0")), timeout_minutes=float(timeout_minutes))
    return _WORLD


def finish() -> None:
    """Leave the process group at the end of a command that succeeded: every rank waits for the others, then
    the group is destroyed (NCCL warns, and gloo's threads may abort the interpreter at exit, when a group is
    left to the interpreter's teardown). A command that failed does not come here: its peers may be blocked in
    a collective, and torchrun stops them when this rank exits non-zero. Also ends the one-process group
    DeepSpeed needs without torchrun."""
    global _WORLD
    if not (torch.distributed.is_available() and torch.distributed.is_initialized()):
        return
    if torch.distributed.get_world_size() > 1:
        torch.distributed.barrier()
    torch.distributed.destroy_process_group()
    _WORLD = World()


def device_for(device: str) -> str:
    """``auto`` on a GPU rank is that rank's own GPU (``cuda:LOCAL_RANK``); ``auto`` on a machine whose GPUs
    CUDA cannot use says so (once) before running on the CPU."""
    w = world()
    if device == "auto" and torch.cuda.is_available():
        return f"cuda:{w.local_rank}"
    if device == "auto":
        warn_cpu_fallback()
    return device


def _file_view(path: Path, stamp: bool) -> tuple[str, int, int] | None:
    try:
        st = path.stat()
    except OSError:
        return None
    kind = "folder" if path.is_dir() else "file"
    return kind, (st.st_size if kind == "file" else 0), (st.st_mtime_ns if stamp else 0)


def _describe(view: tuple[str, int, int] | None) -> str:
    if view is None:
        return "nothing there"
    kind, size, mtime = view
    what = f"a file of {size} bytes" if kind == "file" else "a folder"
    return f"{what} modified at {mtime / 1e9:.3f}" if mtime else what


def _comm_device() -> torch.device:
    if torch.distributed.is_initialized() and torch.distributed.get_backend() == "nccl":
        return torch.device("cuda", torch.cuda.current_device())
    return torch.device("cpu")
