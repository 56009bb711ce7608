"""Build DeepSpeed's C++ ops that mmrl's CPU runs load (CPU Adam for ``train.offload``, the shared-memory
communication op of DeepSpeed's CPU accelerator) once, at ``make setup``, into torch's extension cache
(``TORCH_EXTENSIONS_DIR``, else ``~/.cache/torch_extensions``), so that no test or run builds them on first use
(minutes of compiling inside a worker). Already built: loaded from the cache in seconds. A machine without a
C++ compiler gets a warning, not a failed setup: the demo does not need these ops."""

from __future__ import annotations

import os
import sys
import time


def main() -> int:
    os.environ.setdefault("DS_ACCELERATOR", "cpu")
    t0 = time.perf_counter()
    try:
        from deepspeed.accelerator import get_accelerator

        accelerator = get_accelerator()
        for name in ("CPUAdamBuilder", "ShareMemCommBuilder"):
            builder = accelerator.create_op_builder(name)
            if builder is not None and builder.is_compatible(verbose=False):
                builder.load(verbose=False)
    except Exception as exc:  # noqa: BLE001 (any build failure: said, setup goes on)
        print(f"warning: DeepSpeed's CPU ops did not build ({type(exc).__name__}: {exc}); a run or test that needs "
              "them (train.offload, DeepSpeed on CPU ranks) builds them on first use", file=sys.stderr)
        return 0
    print(f"DeepSpeed CPU ops ready ({time.perf_counter() - t0:.0f} s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
