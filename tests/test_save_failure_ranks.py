"""Issue 61: with several ranks, a save that fails on rank 0 (a real ``ulimit -f`` in rank 0's process only) stops
every rank where the save is, each with one line saying what failed where
(:meth:`mmrl.engine.distributed.World.all_or_none`): the ranks agree before going on, so none depends on noticing
that rank 0's process ended (gloo notices the closed connection, as before this change, but its line said only
that "another rank left"; NCCL may not notice until ``train.dist_timeout_minutes``)."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from tiny_runs import TINY_RUN, module_cache  # noqa: F401 (module_cache is a fixture)

ROOT = Path(__file__).resolve().parent.parent

RANK = textwrap.dedent("""
    import os, resource, sys
    from mmrl.cli import main
    if os.environ["RANK"] == "0":  # the checkpoint's weights (4 MB) pass the limit on rank 0 only
        resource.setrlimit(resource.RLIMIT_FSIZE, (2 << 20, resource.RLIM_INFINITY))
    sys.exit(main(sys.argv[1:]))
""")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _lines(err: str) -> list[str]:
    return [ln for ln in err.splitlines() if ln.startswith("error: ")]


@pytest.mark.slow
def test_a_save_failing_on_rank_0_stops_every_rank_at_once_each_with_one_line(
        tmp_path: Path, module_cache: None) -> None:  # noqa: F811
    from mmrl.config import load_run_config
    from mmrl.run.helpers import resolve_model, split_path

    cfg = load_run_config("video-qa", overrides=TINY_RUN)  # the tiny model and toy world built here, not by rank
    resolve_model(cfg)  # 0 under its file-size limit (the model's 4 MB would fail before any save)
    for split in ("train", "test"):
        split_path(cfg, split, show_progress=False)
    run, port, procs = tmp_path / "run", _free_port(), []
    for rank in (0, 1):
        env = {**os.environ, "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port), "WORLD_SIZE": "2",
               "RANK": str(rank), "LOCAL_RANK": str(rank), "LOCAL_WORLD_SIZE": "2", "OMP_NUM_THREADS": "1",
               "PYTHONPATH": str(ROOT)}
        # the timeout (3 minutes) is what the other rank would wait without the agreement
        procs.append(subprocess.Popen(
            [sys.executable, "-c", RANK, "train", "--quiet", "--out", str(run), *TINY_RUN, "train.steps=1",
             "train.save_every=1", "train.dist_timeout_minutes=3"],
            env=env, cwd=ROOT, text=True, stdout=subprocess.PIPE, stderr=subprocess.PIPE))
    (_, err0), (_, err1) = (p.communicate(timeout=600) for p in procs)
    assert procs[0].returncode == 2 and "Traceback" not in err0, err0
    assert len(_lines(err0)) == 1 and "model.safetensors: cannot be written: the file-size limit" in err0, err0
    assert procs[1].returncode == 2 and "Traceback" not in err1, err1
    line = _lines(err1)
    assert line == [("error: rank 0 failed while writing checkpoint-1 (its error is in its output); rank 1 stops "
                     "too")], err1
    assert not [p.name for p in run.iterdir() if p.name.startswith(".tmp")]
