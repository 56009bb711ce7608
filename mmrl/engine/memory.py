"""Peak memory: of a block of work (:func:`measure`, :func:`measure_in_subprocess`), and cheap readings for the
log: one window (:func:`reset_peak` + :func:`peak_gb`), or each stage of a training step (:class:`StagePeaks`:
``memory/rollout_gb``, ``memory/update_gb``, ... in ``metrics.jsonl``).

How memory is counted:

* **CUDA**: the bytes of live tensors, from torch's caching allocator (``torch.cuda.reset_peak_memory_stats``
  and ``max_memory_allocated``). Blocks the allocator caches but no tensor uses are not counted.
* **CPU**: torch keeps no allocator statistics, so the kernel's count of the process's resident pages is read
  instead: the resident-set high-water mark (``VmHWM`` in ``/proc/self/status``), reset at the start of the
  block by writing ``5`` to ``/proc/self/clear_refs`` (Linux 4.0 and later). That counts every page the
  process touches (torch tensors, Python objects, libraries loaded during the block). Two caveats:
  glibc keeps freed blocks below its mmap threshold (which it raises by itself up to 32 MB) for reuse, so
  the resident set follows the live tensors only loosely: a block can reuse memory an earlier one freed
  without raising the mark, or grow the heap by fragmentation. Blocks to be compared are therefore each run
  in a fresh process (:func:`measure_in_subprocess`) whose glibc returns every block of 1 MB or more to the
  system when it is freed (``MALLOC_MMAP_THRESHOLD_``); the resident set then tracks the live tensors
  closely, as the CUDA figure does. And where ``clear_refs`` cannot be
  written (not Linux, a locked-down ``/proc``), the process-lifetime maximum (``ru_maxrss``) stands in for
  the mark, which over-states a block run after a bigger one (:attr:`Peak.method` says which was used).
  The kernel's resident-set counters are updated lazily per thread: expect them off by up to a few
  hundred kB, nothing at the scale of a training micro-batch.
"""

from __future__ import annotations

import contextlib
import multiprocessing
import os
import queue as queue_mod
import resource
import sys
import traceback
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import torch

GB = 1e9  # bytes in the GB of ``memory/peak_gb`` (decimal)
_MMAP_ENV = "MALLOC_MMAP_THRESHOLD_"


@dataclass
class Peak:
    """The peak of one measured block, in bytes. ``start_bytes`` is what was in use when the block began
    (live CUDA tensors, or the resident set on CPU); ``peak_bytes`` the most in use during it."""

    start_bytes: int = 0
    peak_bytes: int = 0
    method: str = ""  # "cuda-allocated" | "cpu-rss-hwm" | "cpu-rss-lifetime-max"

    @property
    def extra_bytes(self) -> int:
        """The block's own peak: the most in use during it, above what was in use at its start."""
        return max(0, self.peak_bytes - self.start_bytes)

    @property
    def extra_gb(self) -> float:
        return self.extra_bytes / GB

    @property
    def peak_gb(self) -> float:
        return self.peak_bytes / GB


def _is_cuda(device: torch.device | str | None) -> bool:
    if device is None:
        return torch.cuda.is_available() and torch.cuda.is_initialized()
    return torch.device(device).type == "cuda"


def _status_kb(field: str) -> int | None:
    """A ``kB`` field of ``/proc/self/status`` (``VmRSS``, ``VmHWM``), or None where there is none."""
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith(field + ":"):
                    return int(line.split()[1])
    except OSError:
        return None
    return None


def _lifetime_max_rss() -> int:
    """The process's maximum resident set since it started, in bytes (``ru_maxrss``: kB on Linux, bytes on
    macOS)."""
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return rss if sys.platform == "darwin" else rss * 1024


def _reset_hwm() -> bool:
    """Reset this process's resident-set high-water mark to its current resident set; False if impossible."""
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
        return _status_kb("VmHWM") is not None
    except OSError:
        return False


def reset_peak(device: torch.device | str | None = None) -> None:
    """Start a new peak-memory window (call at the start of a micro-batch). ``device`` None: CUDA when torch
    has initialised it, else the CPU. Cheap: one allocator call on CUDA, one small ``/proc`` write on CPU."""
    if _is_cuda(device):
        torch.cuda.reset_peak_memory_stats(device)
    else:
        _reset_hwm()


def peak_gb(device: torch.device | str | None = None) -> float:
    """The most memory in use since the last :func:`reset_peak`, in GB (10^9 bytes), for ``memory/peak_gb``.

    CUDA: the peak of live tensor bytes on ``device`` (weights, optimizer state and activations included).
    CPU: the process's peak resident set since the last reset (``VmHWM``; everything the process holds, the
    Python interpreter and libraries included), or, where the mark cannot be reset, the process-lifetime
    maximum resident set (``ru_maxrss``), which never goes down. Cheap (no synchronisation with the GPU
    beyond the allocator's own bookkeeping, one small ``/proc`` read on CPU).
    """
    if _is_cuda(device):
        return torch.cuda.max_memory_allocated(device) / GB
    hwm = _status_kb("VmHWM")
    return (hwm * 1024 if hwm is not None else _lifetime_max_rss()) / GB


class StagePeaks:
    """The peak memory of each stage of a training step, for ``metrics.jsonl``.

    ``start(name)`` opens a window (:func:`reset_peak`) and ``stop(name)`` closes it; a stage measured several
    times in one step (the update's micro-batches, one optimizer step per mini-batch) keeps its largest peak.
    Windows do not nest: each start resets the device's peak. :meth:`metrics` gives, per stage,
    ``memory/<stage>_gb``: the most memory in use during the stage (CUDA: allocated tensors, everything live
    counted, not only the stage's own; CPU: the process's resident set), and on CUDA also
    ``memory/<stage>_reserved_gb`` (what torch's caching allocator held from the driver: what the card must
    have) and ``memory/<stage>_host_gb`` (the process's resident set in host memory); ``memory/peak_gb`` is
    the largest ``memory/<stage>_gb`` of the stages measured. Readings are cheap (allocator counters, one
    small ``/proc`` read and write on Linux; no GPU synchronisation).
    """

    def __init__(self, device: torch.device | str | None = None):
        self.device = device
        self.peaks: dict[str, dict[str, float]] = {}

    def start(self, name: str) -> None:
        reset_peak(self.device)
        if _is_cuda(self.device):
            _reset_hwm()  # the host's mark too (the CPU's own is the device's)

    def stop(self, name: str) -> None:
        reading = {"": peak_gb(self.device)}
        if _is_cuda(self.device):
            reading["_reserved"] = torch.cuda.max_memory_reserved(self.device) / GB
            hwm = _status_kb("VmHWM")
            reading["_host"] = (hwm * 1024 if hwm is not None else _lifetime_max_rss()) / GB
        seen = self.peaks.setdefault(name, {})
        for key, value in reading.items():
            seen[key] = max(seen.get(key, 0.0), value)

    @contextlib.contextmanager
    def stage(self, name: str) -> Iterator[None]:
        """``with peaks.stage("save"): ...``: :meth:`start` and :meth:`stop` around the block."""
        self.start(name)
        try:
            yield
        finally:
            self.stop(name)

    def call(self, name: str, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        """``fn(*args, **kwargs)`` measured as stage ``name``; its result."""
        with self.stage(name):
            return fn(*args, **kwargs)

    def metrics(self, *, overall: bool = True) -> dict[str, float]:
        """``memory/<stage><variant>_gb`` for every stage measured, plus (``overall``) ``memory/peak_gb``."""
        out = {f"memory/{name}{key}_gb": value for name, seen in self.peaks.items() for key, value in seen.items()}
        if overall and self.peaks:
            out["memory/peak_gb"] = max(seen[""] for seen in self.peaks.values())
        return out


@contextlib.contextmanager
def measure(device: torch.device | str | None = None) -> Iterator[Peak]:
    """``with measure(device) as peak: work()``; afterwards ``peak.extra_bytes`` is the block's own peak.

    See the module docstring for what is counted on CUDA and on CPU. On CPU compare blocks each run in a
    fresh process (:func:`measure_in_subprocess`): memory freed by an earlier block and kept by the C
    allocator can hide part of a later block's peak.
    """
    peak = Peak()
    if _is_cuda(device):
        torch.cuda.synchronize(device)
        torch.cuda.reset_peak_memory_stats(device)
        peak.start_bytes, peak.method = torch.cuda.memory_allocated(device), "cuda-allocated"
        yield peak
        torch.cuda.synchronize(device)
        peak.peak_bytes = torch.cuda.max_memory_allocated(device)
        return
    hwm = _reset_hwm()
    rss = _status_kb("VmRSS")
    peak.start_bytes = rss * 1024 if rss is not None else _lifetime_max_rss()
    peak.method = "cpu-rss-hwm" if hwm else "cpu-rss-lifetime-max"
    yield peak
    mark = _status_kb("VmHWM") if hwm else None
    peak.peak_bytes = mark * 1024 if mark is not None else _lifetime_max_rss()


def _child(setup: Callable[..., Callable[[], Any]], args: tuple, kwargs: dict, device: str | None,
           queue: Any) -> None:
    try:
        work = setup(*args, **kwargs)
        with measure(device) as peak:
            result = work()
        queue.put(("ok", peak, result))
    except BaseException:  # noqa: BLE001 - reported to the parent, which raises
        queue.put(("error", traceback.format_exc(), None))


def measure_in_subprocess(setup: Callable[..., Callable[[], Any]], *args: Any, device: str | None = None,
                          mmap_threshold: int | None = 1 << 20, **kwargs: Any) -> tuple[Peak, Any]:
    """Run ``work = setup(*args, **kwargs)`` and then ``work()`` in a fresh (spawned) Python process and
    measure the peak of ``work()`` alone (the setup, imports and model loading are not counted).

    ``setup`` must be importable by name (a module-level function) and its arguments picklable; ``work``'s
    return value (picklable) comes back with the :class:`Peak`. The child inherits the environment
    (``OMP_NUM_THREADS``, ``MMRL_CACHE``, ``CUDA_VISIBLE_DEVICES``), plus ``MALLOC_MMAP_THRESHOLD_`` =
    ``mmap_threshold`` bytes (None: glibc's own adaptive threshold) so that freed blocks of that size and
    more leave the resident set at once (see the module docstring). Errors in the child are raised here as
    a ``RuntimeError`` carrying its traceback.
    """
    ctx = multiprocessing.get_context("spawn")
    queue = ctx.Queue()
    proc = ctx.Process(target=_child, args=(setup, args, kwargs, device, queue))
    saved = os.environ.get(_MMAP_ENV)
    if mmap_threshold is not None:
        os.environ[_MMAP_ENV] = str(int(mmap_threshold))  # the spawned interpreter reads it at start
    try:
        proc.start()
    finally:
        if mmap_threshold is not None:
            if saved is None:
                os.environ.pop(_MMAP_ENV, None)
            else:
                os.environ[_MMAP_ENV] = saved
    try:
        while True:
            try:
                status, payload, result = queue.get(timeout=1.0)
                break
            except queue_mod.Empty:
                if not proc.is_alive():  # killed (out of memory) or crashed before reporting
                    raise RuntimeError(f"the measuring subprocess (pid {proc.pid}) died with exit code "
                                       f"{proc.exitcode} before reporting (out of memory?)") from None
    except BaseException:
        proc.kill()
        raise
    finally:
        proc.join()
    if status != "ok":
        raise RuntimeError(f"the measured work failed in its subprocess (pid {proc.pid}):\n{payload}")
    return payload, result


def available_bytes(device: torch.device | str | None = None) -> int | None:
    """Memory free for new work: free GPU memory on CUDA, ``MemAvailable`` on Linux CPUs; None if unknown."""
    if _is_cuda(device):
        free, _ = torch.cuda.mem_get_info(device)
        return int(free)
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        return None
    return None


__all__ = ["GB", "Peak", "StagePeaks", "available_bytes", "measure", "measure_in_subprocess", "peak_gb", "reset_peak"]
