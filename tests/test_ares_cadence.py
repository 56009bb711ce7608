"""ARES's per-bucket KL controller keeps the released code's cadence whatever the memory settings (issue 48).
In shawn0728/ARES (verl/workers/actor/dp_actor.py, update_policy) each rank calls ``_update_beta_per_bucket`` once
per micro-batch of ``micro_batch_size_per_device_for_update`` rows of its share of a mini-batch
(experiments/AEPO/train.sh: 1 row, 8 GPUs), so the cadence is set by rows, not by a memory knob: mmrl calls the
controller once per ``plugins.ares.kl_call_rows`` rows of each mini-batch, and ``train.micro_batch_size`` /
``train.micro_batch_tokens`` (memory only) leave the controller's trajectory as it is."""

from __future__ import annotations

import pytest
import torch
from test_ares import make_batch, make_plugin
from tiny_runs import module_cache, run_rl  # noqa: F401  (module_cache is a fixture)

from mmrl.config import load_run_config
from mmrl_common.errors import ConfigError


def _fed(micro: int, tokens: int = 0, **settings) -> dict:
    plug = make_plugin(window=2, quantile=1.0, kl_update_every=2, **settings)
    plug.ctx.cfg.train.micro_batch_size = micro
    plug.ctx.cfg.train.micro_batch_tokens = tokens
    b = make_batch()
    plug.after_rewards(b)
    plug.after_advantages(b)
    b.rollout_logprobs = torch.zeros_like(b.loss_mask)
    b.ref_logprobs = -torch.arange(1, 7, dtype=torch.float32)[:, None] * b.loss_mask  # a different KL per row
    plug.after_update(b, {})
    return plug.controller.state_dict()


def test_the_controller_cadence_is_rows_not_micro_batches() -> None:
    ref = _fed(1, kl_call_rows=2)
    assert ref["calls"] == 3  # 6 rows, 2 a call
    for micro, tokens in ((2, 0), (6, 0), (4, 0), (1, 9)):
        assert _fed(micro, tokens, kl_call_rows=2) == ref, (micro, tokens)
    assert _fed(3, kl_call_rows=1)["calls"] == 6
    with pytest.raises(ConfigError, match="kl_call_rows"):
        make_plugin(kl_call_rows=0)


def test_the_recipe_calls_it_as_the_code() -> None:
    s = load_run_config("ares").plugins["ares"]
    # train.sh: micro_batch_size_per_device_for_update=1 on n_gpus_per_node=8: one call per row on each rank
    assert s["kl_call_rows"] == 8


@pytest.mark.slow
def test_two_runs_differing_in_micro_batch_size_move_the_controller_alike(tmp_path, module_cache):  # noqa: F811
    from mmrl.engine.checkpoint import latest_checkpoint, load_trainer_state

    states = []
    for micro in (1, 8):
        out = tmp_path / f"mb{micro}"
        run_rl(out, "rollout.max_new_tokens=6", "plugins.ares.branching=false", "plugins.ares.kl_update_every=1",
               "plugins.ares.kl_call_rows=2", "grpo.dynamic_sampling=false", "train.steps=1", "train.save_every=1",
               f"train.micro_batch_size={micro}", task="ares")
        states.append(load_trainer_state(latest_checkpoint(out / "run"))["plugins"]["ares"]["controller"])
    one, eight = states
    assert one["calls"] == eight["calls"] == 4  # 8 rows, 2 a call
    assert any(v is not None for v in one["kl_ema"].values())  # the controller saw the buckets' KL
    for key in ("beta", "kl_ema", "err_ema"):
        for b, v in one[key].items():
            assert (eight[key][b] is None) if v is None else eight[key][b] == pytest.approx(v, rel=1e-5, abs=1e-9), \
                (key, b)
