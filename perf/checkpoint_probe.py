"""Run by ``perf/update_memory.py`` under ``torchrun --nproc_per_node 2`` (gloo, CPU): one rank's peak while a
ZeRO-3 checkpoint's weights are gathered and rank 0 writes them.

``python checkpoint_probe.py MODEL_DIR MODE SAVE_DIR OUT_JSON``; MODE ``modules``: one module at a time, kept
on rank 0 (:func:`mmrl.model.weights.stream_weights`); ``whole``: every parameter gathered on every rank at once."""

from __future__ import annotations

import json
import sys
from pathlib import Path

from mmrl.config import TrainConfig
from mmrl.engine import distributed
from mmrl.engine.memory import measure
from mmrl.engine.optim import make_updater
from mmrl.model import load_policy
from mmrl.model.weights import collect_on_main, stream_weights


def main(model_dir: str, mode: str, save_dir: str, out: str) -> None:
    w = distributed.init("cpu")
    policy = load_policy(model_dir, device="cpu")
    params = sum(p.numel() for p in policy.model.parameters())
    model_bytes = sum(p.numel() * p.element_size() for p in policy.model.parameters())
    updater = make_updater(policy.model, TrainConfig(deepspeed="zero3", micro_batch_size=1), w, bf16=False)
    w.barrier()
    with measure(None) as peak:
        if mode == "modules":
            state = collect_on_main(stream_weights(policy.model, gather=updater.gather_params), is_main=w.is_main)
            if w.is_main:
                policy.model.save_pretrained(save_dir, state_dict=state)
            del state
        else:
            with updater.full_weights():
                if w.is_main:
                    policy.model.save_pretrained(save_dir)
        w.barrier()
    report = w.gather(peak.extra_bytes)
    if w.is_main:
        Path(out).write_text(json.dumps({"mode": mode, "params": params, "model_bytes": model_bytes,
                                         "peak_bytes": report}))


if __name__ == "__main__":
    main(*sys.argv[1:5])
