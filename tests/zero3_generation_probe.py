"""Run under ``torchrun --nproc_per_node 2`` by ``test_distributed.py``: HF generation under ZeRO-3.

``python zero3_generation_probe.py MODEL_DIR OUT_JSON``. Each rank generates from its own prompts (rank 0:
two image prompts, 8 new tokens; rank 1: one video prompt, 3 new tokens, so the ranks run different numbers of
forward passes), counting DeepSpeed's all-gathers with its own comms logger; then every rank makes a training
step on its rollouts (ZeRO-3's hooks must be back). Rank 0 writes what each rank saw."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).parent))

import deepspeed
import synthetic_media as sm
from probe_exit import leave

from mmrl.config import TrainConfig
from mmrl.engine import distributed
from mmrl.engine.optim import make_updater
from mmrl.engine.rollout import HFBackend, SamplingParams
from mmrl.model import RankBinding, load_policy


def main(model_dir: str, out: str) -> None:
    w = distributed.init("cpu")
    torch.manual_seed(0)
    policy = load_policy(model_dir, device="cpu")
    family = policy.family
    if w.rank == 0:
        prompts = [sm.prompt(policy, [sm.image(family, f"img{i}", seed=i)], "What is shown?") for i in range(2)]
        new_tokens = 8
    else:
        prompts = [sm.prompt(policy, [sm.video(family, "vid", frames=4)], "What happens?")]
        new_tokens = 3
    updater = make_updater(policy.model, TrainConfig(deepspeed="zero3", micro_batch_size=4, lr=1e-3), w,
                           bf16=False)
    policy.bind_ranks(RankBinding(invariant="calls", max_int=w.max_int, gather_params=updater.gather_params,
                                  gather_for_generation=updater.gathered_for_generation))
    n_params = len(list(policy.model.parameters()))

    deepspeed.comm.configure(enabled=True, prof_all=True)
    logger = deepspeed.comm.comms_logger
    logger.reset_data()
    params = SamplingParams(max_new_tokens=new_tokens, temperature=1.0)
    gens = HFBackend(policy).generate(prompts, n=2, params=params)  # one generate call (n=2 per prompt)
    gathers = sum(v[0] for v in logger.get_raw_data().get("all_gather_into_tensor", {}).values())
    logger.reset_data()
    with policy.generation_weights():  # a rollout session around several calls: still one gather in all
        for p in prompts:
            HFBackend(policy).generate([p], n=1, params=params)
    session_gathers = sum(v[0] for v in logger.get_raw_data().get("all_gather_into_tensor", {}).values())
    deepspeed.comm.configure(enabled=False)

    # a training step on the rollouts: forward with ZeRO-3's hooks, backward, optimizer step
    seqs = [p.extend(g.token_ids, trained=True) for p, group in zip(prompts, gens) for g in group]
    policy.model.train()
    logp, _, mask = policy.forward_logprobs(seqs)
    loss = -(logp * mask).sum() / mask.sum()
    updater.backward(loss)
    norm = updater.step()
    report = w.gather({"rank": w.rank, "gathers": gathers, "session_gathers": session_gathers,
                       "n_params": n_params, "lengths": [len(g.token_ids) for group in gens for g in group],
                       "loss": float(loss), "grad_norm": norm})
    if w.is_main:
        Path(out).write_text(json.dumps(report))
    leave()  # every rank has done its work: the process group left, the process ended without C++ teardown


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
