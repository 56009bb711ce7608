"""GPU tests (marker ``gpu``), run by ``make gpu-check`` on a machine with CUDA. Without one they fail: they are
never skipped, so a GPU check that ran nothing cannot pass."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest
import torch
from synthetic_media import image, prompt, video
from tiny_runs import module_cache, run_rl  # noqa: F401  (module_cache is a fixture)

from mmrl.policy import load_policy
from mmrl.tiny_models import make_tiny
from mmrl_common.errors import ConfigError

pytestmark = pytest.mark.gpu


def test_a_cuda_device_is_there() -> None:
    assert torch.cuda.is_available(), ("make gpu-check needs a CUDA device; torch "
                                       f"{torch.__version__} (CUDA {torch.version.cuda}) sees none")


def test_auto_places_the_model_on_the_gpu_and_keeps_the_current_device(tmp_path: Path) -> None:
    before = torch.cuda.current_device()
    policy = load_policy(make_tiny("qwen2_5_vl", tmp_path / "m", seed=0), device="auto")
    assert {p.device.type for p in policy.model.parameters()} == {"cuda"}
    assert torch.cuda.current_device() == before


@pytest.mark.usefixtures("module_cache")
def test_bf16_training_on_the_gpu(tmp_path: Path) -> None:
    """Two RL steps in bf16 on the GPU: the logged peak is CUDA memory, the weights move."""
    rows = run_rl(tmp_path, "model.dtype=bf16", "train.lr=1e-4", "grpo.entropy_coef=0.01")
    assert [r["step"] for r in rows] == [1, 2]
    assert all(0 < r["memory/peak_gb"] < torch.cuda.get_device_properties(0).total_memory / 1e9 for r in rows)
    assert all(torch.isfinite(torch.tensor(r["grad_norm"])) for r in rows)


@pytest.mark.parametrize("attn", ["sdpa", "flash_attention_2"])
def test_shared_prefix_equals_the_padded_batch_on_the_gpu(attn: str, tmp_path: Path) -> None:
    """The shared-prefix forward's log-probs equal the padded batch's under each attention kernel (bf16).
    flash_attention_2 without the flash-attn package must be refused clearly instead."""
    from mmrl.config import ModelConfig

    if attn == "flash_attention_2" and importlib.util.find_spec("flash_attn") is None:
        with pytest.raises(ConfigError, match="flash-attn"):
            ModelConfig(attn_implementation=attn)
        return
    policy = load_policy(make_tiny("qwen2_5_vl", tmp_path / "m", seed=0), dtype="bf16", attn_implementation=attn,
                         device="cuda")
    fam = policy.family
    prompts = [prompt(policy, [video(fam, "v", frames=4)], "What happens?"),
               prompt(policy, [image(fam, "i")], "What is shown?")]
    g = torch.Generator().manual_seed(0)
    seqs = [p.extend(torch.randint(100, 1000, (n,), generator=g).tolist(), trained=True)
            for p in prompts for n in (3, 7, 5)]
    with torch.no_grad():
        shared, _, mask = policy.forward_logprobs(seqs, shared_prefix=True)
        padded, _, _ = policy.forward_logprobs(seqs, shared_prefix=False)
    assert mask.sum() > 0
    torch.testing.assert_close(shared[mask.bool()], padded[mask.bool()], rtol=0, atol=5e-2)
