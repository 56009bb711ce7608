"""Run on two "nodes" of two ranks by ``test_multinode.py`` (two ``torchrun --nnodes 2 --nproc-per-node 2``
launches, each node with its own ``MMRL_CACHE``): each node's cache prepared by its local rank 0, and the media
check shared out among all ranks.

``python media_spread_probe.py FILES_JSON OUT_DIR``. Inside :meth:`World.node_first` each rank notes who had
prepared its node's cache when it came in (the local rank 0 prepares it: it creates ``prepared-by``, naming
itself). Then every rank checks the same files (a list of ``[path, kind]``) inside
:meth:`World.spread_media_checks`, twice (the second time every verdict is in each node's cache), then once
more with rank 1 seeing another last file (missing there), which must fail on every rank with the same error.
Each rank writes ``OUT_DIR/rank<R>.json``: what it found, its verdicts and what each call checked."""

from __future__ import annotations

import json
import sys
from pathlib import Path

from probe_exit import leave

from data_pipelines.media_check import LAST_CHECK, check_files
from mmrl.engine import distributed
from mmrl_common.errors import DataError
from mmrl_common.paths import cache_dir


def main(files_json: str, out_dir: str) -> None:
    w = distributed.init("cpu", timeout_minutes=3)
    files = [tuple(f) for f in json.loads(Path(files_json).read_text())]
    marker = cache_dir() / "prepared-by"
    with w.node_first():
        found = marker.read_text() if marker.exists() else None
        if w.is_node_main:
            with open(marker, "x") as fh:  # fails if anyone prepared this node's cache before
                fh.write(str(w.rank))
    with w.spread_media_checks():
        verdicts = check_files(files, decode=True)
    first = dict(LAST_CHECK)
    with w.spread_media_checks():
        again = check_files(files, decode=True)
    second = dict(LAST_CHECK)
    seen = files if w.rank == 0 else [*files[:-1], (files[-1][0] + ".not-here", files[-1][1])]
    error = None
    try:
        with w.spread_media_checks():
            check_files(seen, decode=True)
    except DataError as exc:
        error = str(exc)
    report = {"rank": w.rank, "local_rank": w.local_rank, "node": w.node, "found": found, "first": first, "second": second,
              "verdicts": [[p, k, verdicts[(p, k)]] for p, k in files],
              "same_again": [again[(p, k)] for p, k in files] == [verdicts[(p, k)] for p, k in files],
              "error": error}
    Path(out_dir, f"rank{w.rank}.json").write_text(json.dumps(report))
    leave()


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
