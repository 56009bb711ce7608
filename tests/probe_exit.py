"""How a multi-process probe script under ``tests/`` ends: the one exit every such script takes
(``tests/test_probe_scripts.py`` checks that each does).

A probe's ranks leave the process group (:func:`mmrl.engine.distributed.finish`: a barrier, then
``destroy_process_group``) and then the process without the interpreter's C++ teardown: under load a rank
aborted in that teardown after all its work and its report were done ("terminate called without an active
exception": a joinable thread of gloo's or of DeepSpeed's CPU communication destroyed; seen in CI on
``media_spread_probe.py`` with the group destroyed, and on ``zero3_generation_probe.py``), which failed a test
that had measured everything it meant to. The trainer's own exit (``mmrl.engine.distributed.finish`` and a normal
interpreter exit) is exercised by every run test that starts ``mmrl`` under torchrun.
"""

from __future__ import annotations

import os
import sys


def leave() -> None:
    """End the probe: leave the process group (every rank waits for the others), flush, exit 0 at once."""
    from mmrl.engine import distributed

    distributed.finish()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)
