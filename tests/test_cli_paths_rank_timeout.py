"""Issue 61, item 11: a rank that stops answering is named in one line within a bounded time
(``train.dist_timeout_minutes``), not by gloo's raw timeout traceback. Two gloo ranks on this machine: one sleeps
past a tiny timeout while the other waits in a :class:`~mmrl.engine.distributed.World` collective."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent

RANK = textwrap.dedent("""
    import sys, time
    from mmrl.engine import distributed
    from mmrl_common.errors import MmrlError

    w = distributed.init("cpu", timeout_minutes=0.04)  # 2.4 s
    if w.rank == 1:
        time.sleep(8)  # a rank that hangs (a decode that does not return)
    try:
        w.barrier()
    except MmrlError as exc:
        print(f"error: {exc}", file=sys.stderr)
        sys.exit(2)
    print("no timeout")
""")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_a_rank_that_hangs_is_one_line_naming_the_setting_not_a_gloo_traceback(tmp_path: Path) -> None:
    script = tmp_path / "rank.py"
    script.write_text(RANK)
    port = _free_port()
    procs = []
    start = time.monotonic()
    for rank in (0, 1):
        env = {**os.environ, "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port), "WORLD_SIZE": "2",
               "RANK": str(rank), "LOCAL_RANK": str(rank), "LOCAL_WORLD_SIZE": "2", "OMP_NUM_THREADS": "1",
               "PYTHONPATH": str(ROOT)}
        procs.append(subprocess.Popen([sys.executable, str(script)], env=env, cwd=ROOT, text=True,
                                      stdout=subprocess.PIPE, stderr=subprocess.PIPE))
    (_out0, err0), (_out1, err1) = (p.communicate(timeout=90) for p in procs)
    assert time.monotonic() - start < 60
    assert procs[0].returncode == 2, err0
    lines = err0.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in err0, err0
    assert lines[0].startswith("error: rank 0 of 2 waited train.dist_timeout_minutes=0.04 minutes in a barrier "
                               "(called from "), lines[0]
    assert "rank.py" in lines[0] and "a rank hung" in lines[0]
    # the rank that slept finds its peer gone: one line too
    assert procs[1].returncode == 2 and "Traceback" not in err1, err1
    assert "another rank left the run while this one waited in a barrier" in err1


@pytest.mark.parametrize("raw", [
    ("[../third_party/gloo/gloo/transport/tcp/unbound_buffer.cc:78] Timed out waiting 2000ms for recv operation "
    "to complete"),
    ("[Rank 1] Watchdog caught collective operation timeout: WorkNCCL(SeqNum=7, OpType=ALLREDUCE) ran for 1800000 "
    "milliseconds before timing out.")])
def test_a_raw_collective_timeout_outside_world_reads_as_the_same_line(raw: str) -> None:
    """The optimizer's own all-reduce and DeepSpeed's are not World's: the command line turns their timeout
    into the same line (mmrl.cli's last resort)."""
    from mmrl.engine.distributed import collective_failure

    line = collective_failure(RuntimeError(raw), rank=1, size=8, timeout_minutes=30)
    assert line and line.startswith("rank 1 of 8 waited train.dist_timeout_minutes=30 minutes in a collective")
    assert collective_failure(RuntimeError("CUDA out of memory"), rank=1, size=8, timeout_minutes=30) is None
