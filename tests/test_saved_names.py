"""Every model folder a run writes (``sft-model/``, ``checkpoint-*/``, ``final/``, with LoRA the merged ones)
names its tensors as the family's published checkpoints do, the names transformers' own ``save_pretrained``
writes for a plain model of that family; vLLM loads nothing else. (Runs on several ranks: the same check in
``test_distributed.py``; served by vLLM: ``test_vllm_serves_run_folders.py``.) A folder a ZeRO-3 run wrote
before, under ``model.model.*``, still loads."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from model_names import assert_published_names
from safetensors.torch import load_file, save_file
from tiny_runs import module_cache, run_rl  # noqa: F401  (module_cache is a fixture)

from mmrl.engine.checkpoint import load_weights
from mmrl.model import load_policy

SHORT = ["sft.steps=1", "sft.batch_size=2", "train.steps=1", "train.save_every=1"]


@pytest.mark.slow
def test_a_one_process_run_writes_the_published_names_and_reads_the_old_ones(tmp_path: Path,
                                                                             module_cache) -> None:  # noqa: F811
    run_rl(tmp_path, *SHORT)
    run = tmp_path / "run"
    assert_published_names(run / "sft-model", run / "checkpoint-1", run / "final")

    # a checkpoint as ZeRO-3 runs on several ranks wrote them before: the language model under model.model.*
    old = tmp_path / "old"
    old.mkdir()
    for f in (run / "checkpoint-1").iterdir():
        if f.name != "model.safetensors":
            (old / f.name).symlink_to(f)
    published = load_file(run / "checkpoint-1" / "model.safetensors")
    assert any(k.startswith("model.layers.") for k in published)
    save_file({("model." + k if k.startswith("model.") else k): v for k, v in published.items()},
              old / "model.safetensors")
    want = load_policy(run / "checkpoint-1", device="cpu").model.state_dict()
    for folder in (run / "checkpoint-1", old):  # into a model of zeros: every tensor must come from the folder
        model = load_policy(run / "sft-model", device="cpu").model
        with torch.no_grad():
            for t in model.state_dict().values():
                t.zero_()
        load_weights(model, folder)
        got = model.state_dict()
        assert got.keys() == want.keys() and all(torch.equal(got[k], want[k]) for k in want), folder


@pytest.mark.slow
def test_a_lora_run_writes_its_merged_models_under_the_published_names(tmp_path: Path,
                                                                       module_cache) -> None:  # noqa: F811
    run_rl(tmp_path, *SHORT, "model.lora={r: 4}")
    run = tmp_path / "run"
    assert not (run / "checkpoint-1" / "model.safetensors").exists()  # a LoRA checkpoint holds the adapters
    assert_published_names(run / "sft-model", run / "final")
