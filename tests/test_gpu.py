"""GPU tests (marker ``gpu``), run by ``make gpu-check`` on a machine with CUDA. Without one they fail: they are
never skipped, so a GPU check that ran nothing cannot pass."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest
import torch
from synthetic_media import image, prompt, video
from tiny_runs import module_cache, run_rl  # noqa: F401  (module_cache is a fixture)

from mmrl.model import load_policy
from mmrl.toy.tiny_models import make_tiny
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


# ------------------------------------------------------------------------------------------------ issue 37 on a GPU
def _errors(policy, seqs, ref, shared: bool, mode: str) -> tuple[float, float]:
    """(largest log-prob error relative to the padded batch's largest |log-prob|, largest gradient error
    relative to that gradient's norm) of one forward and backward in ``mode``."""
    from test_packing import run

    logp, _ent, mask, grads, _calls = run(policy, seqs, shared=shared, mode=mode)
    ref_logp, _ref_ent, ref_mask, ref_grads, _ = ref
    assert torch.equal(mask, ref_mask) and grads.keys() == ref_grads.keys()
    m = mask.bool()
    logp_err = float((logp[m] - ref_logp[m]).abs().max() / ref_logp[m].abs().max())
    grad_err = max(float((grads[n] - g).norm() / g.norm().clamp_min(1e-12)) for n, g in ref_grads.items())
    return logp_err, grad_err


def packed_vs_padded(device: str, dtype: str, root: Path) -> dict[str, tuple[float, float]]:
    """Each packed layout (the rows sdpa's cost model picks; one row with a block-diagonal mask) and the
    shared-prefix path (two passes, the first packed; one packed pass) against the padded batch: one forward and backward of a video
    group with ragged answers, two short groups and a group of one, every parameter trained."""
    from test_packing import mixed_batch, run

    policy = load_policy(make_tiny("qwen2_5_vl", root / "m", seed=0), dtype=dtype, attn_implementation="sdpa",
                         device=device)
    policy.set_trainable()
    policy.model.train()
    seqs = mixed_batch(policy, "qwen2_5_vl", "video")
    ref = run(policy, seqs, shared=False, mode="padded")
    errors = {}
    for shared, mode, one_pass in ((False, "packed", None), (False, "one_row", None), (True, "padded", None),
                                   (True, "one_row", False), (True, "one_row", True)):
        policy.configure(shared_prefix_one_pass=one_pass)  # the shared prefix in two passes, or in one packed pass
        name = f"{'shared prefix, ' if shared else ''}{mode}{', one pass' if one_pass else ''}"
        errors[name] = _errors(policy, seqs, ref, shared, mode)
    policy.configure(shared_prefix_one_pass=None)
    return errors


# the largest relative errors allowed (log-prob, gradient): fp32 is round-off; bf16 rounds every activation to 8
# bits of mantissa and the padded and packed batches add in different orders (on CPU in bf16 this batch gives
# log-prob errors up to 3e-4 and gradient errors up to 1.4e-2)
PACKED_TOLERANCE = {"fp32": (1e-4, 1e-3), "bf16": (5e-2, 0.1)}


@pytest.mark.parametrize("dtype", ["fp32", "bf16"])
def test_packed_micro_batches_equal_the_padded_batch_on_the_gpu(dtype: str, tmp_path: Path) -> None:
    """Padding-free micro-batches under sdpa on CUDA (a 4-D block-diagonal mask, so the memory-efficient or
    math kernel, not flash): the padded batch's log-probs and every parameter's gradient."""
    logp_tol, grad_tol = PACKED_TOLERANCE[dtype]
    for layout, (logp_err, grad_err) in packed_vs_padded("cuda", dtype, tmp_path).items():
        print(f"{dtype} {layout}: log-prob error {logp_err:.1e}, gradient error {grad_err:.1e}")
        assert logp_err <= logp_tol and grad_err <= grad_tol, (layout, logp_err, grad_err)


def prefill_once_vs_plain(device: str, dtype: str, root: Path) -> dict[str, float]:
    """Sampled generation (fixed seed, G=4, two video prompts of different lengths) with the prompt prefilled
    once and repeated G times: the share of samples with the same tokens, the largest log-prob difference on
    those, and the largest gap between each mode's reported log-probs and the training forward's."""
    from test_prefill_once import generate, prompts_of

    policy = load_policy(make_tiny("qwen2_5_vl", root / "m", seed=0), dtype=dtype, device=device)
    seqs = prompts_of(policy, "qwen2_5_vl", "video")
    kw = {"num_return_sequences": 4, "temperature": 0.9, "top_p": 0.95}
    plain, once = generate(policy, seqs, False, 7, **kw), generate(policy, seqs, True, 7, **kw)
    pairs = [(a, b) for ga, gb in zip(once, plain) for a, b in zip(ga, gb)]
    same = [(a, b) for a, b in pairs if a.token_ids == b.token_ids]
    logp_diff = max((float((torch.tensor(a.logprobs) - torch.tensor(b.logprobs)).abs().max()) for a, b in same),
                    default=float("nan"))
    gap = 0.0
    for gens in (once, plain):
        full = [p.extend(g.token_ids, trained=True) for p, gs in zip(seqs, gens) for g in gs]
        flat = [g for gs in gens for g in gs]
        with policy.inference():
            logp, _, mask = policy.forward_logprobs(full, temperature=0.9)
        for i, g in enumerate(flat):
            trained = logp[i][mask[i].bool()].float().cpu()
            gap = max(gap, float((trained - torch.tensor(g.logprobs)).abs().max()))
    return {"same_tokens": len(same) / len(pairs), "logprob_diff": logp_diff, "gap_to_training": gap}


@pytest.mark.parametrize("dtype", ["fp32", "bf16"])
def test_prefill_once_on_the_gpu(dtype: str, tmp_path: Path) -> None:
    """Prefill-once on CUDA. fp32: the plain call's samples and log-probs. bf16: the prompt's prefill runs on
    B rows instead of B x G, so kernels may round differently and a near-tie may flip a sampled token (as
    between any two GPU kernels); what must hold is that each mode's log-probs are the training forward's."""
    r = prefill_once_vs_plain("cuda", dtype, tmp_path)
    print(f"{dtype}: {r}")
    if dtype == "fp32":
        assert r["same_tokens"] == 1.0 and r["logprob_diff"] <= 1e-4, r
        assert r["gap_to_training"] <= 1e-3, r
    else:
        assert r["gap_to_training"] <= 0.1, r


def test_varlen_attention_uses_torchs_kernel_and_equals_sdpa_on_the_gpu(tmp_path: Path) -> None:
    """model.attn_implementation=varlen on a GPU: the segments go through torch's varlen_attn (not the padded
    fallback), and equal sdpa on each segment alone in bf16 (self-attention windows, causal rows, and
    continuations whose keys are a prefix plus their own, causal from the end of the keys: the alignment
    flash attention uses); a tiny model's log-probs and gradients equal the sdpa path's."""
    import torch.nn.functional as F

    from mmrl.model import varlen

    assert varlen._torch_varlen() is not None, f"torch {torch.__version__} has no torch.nn.attention.varlen"

    class Module(torch.nn.Module):
        is_causal, num_key_value_groups = True, 2

    torch.manual_seed(0)
    for causal, extra in ((False, 0), (True, 0), (True, 150)):
        lens_q = [129, 1, 300, 64, 200]
        lens_k = [n + extra for n in lens_q]
        q = torch.randn(1, 8, sum(lens_q), 64, device="cuda", dtype=torch.bfloat16)
        k = torch.randn(1, 4, sum(lens_k), 64, device="cuda", dtype=torch.bfloat16)
        v = torch.randn(1, 4, sum(lens_k), 64, device="cuda", dtype=torch.bfloat16)

        def cu(lens: list[int]) -> torch.Tensor:
            return torch.tensor([0, *torch.tensor(lens).cumsum(0).tolist()], device="cuda", dtype=torch.int32)

        assert varlen._use_torch_varlen(q)
        out, _ = varlen.attention(Module(), q, k, v, None, scaling=0.125, is_causal=causal, cu_seq_lens_q=cu(lens_q),
                                  cu_seq_lens_k=cu(lens_k), max_length_q=max(lens_q), max_length_k=max(lens_k))
        sq = sk = 0
        for lq, lk in zip(lens_q, lens_k):
            mask = (torch.arange(lk, device="cuda")[None] <= torch.arange(lq, device="cuda")[:, None] + lk - lq) \
                if causal else None
            ref = F.scaled_dot_product_attention(
                q[:, :, sq:sq + lq].float(), k[:, :, sk:sk + lk].repeat_interleave(2, 1).float(),
                v[:, :, sk:sk + lk].repeat_interleave(2, 1).float(), attn_mask=mask, scale=0.125).transpose(1, 2)
            torch.testing.assert_close(out[:, sq:sq + lq].float(), ref, rtol=2e-2, atol=2e-2)
            sq, sk = sq + lq, sk + lk
    folder = make_tiny("qwen2_5_vl", tmp_path / "m", seed=0)
    results = {}
    for attn in ("sdpa", "varlen"):
        policy = load_policy(folder, dtype="bf16", attn_implementation=attn, device="cuda")
        policy.set_trainable()
        fam = policy.family
        p = prompt(policy, [video(fam, "v", frames=4, side=16)], "What happens?")
        g = torch.Generator().manual_seed(0)
        seqs = [p.extend(torch.randint(100, 1000, (n,), generator=g).tolist(), trained=True) for n in (3, 9, 5)]
        logp, _, mask = policy.forward_logprobs(seqs, temperature=1.0)
        (logp * mask).sum().backward()
        results[attn] = (logp.float().detach(), policy.model.lm_head.weight.grad.float(),
                         policy.base.visual.blocks[0].attn.qkv.weight.grad.float())
    for a, b in zip(results["sdpa"], results["varlen"]):
        torch.testing.assert_close(b, a, rtol=5e-2, atol=5e-2 * float(a.abs().max()))


@pytest.mark.usefixtures("module_cache")
def test_qwen3_5_trains_on_the_gpu_and_its_log_probs_are_the_cpus(tmp_path: Path) -> None:
    """Qwen3.5 on CUDA (issue 59, unrun where it was written: no GPU). The kernels its Gated DeltaNet layers
    use are named (``make gpu-wheels`` carries fla-core; causal-conv1d needs an nvcc build): the warning names
    exactly the missing ones. Two bf16 RL steps on images and videos run; the log-probs of a prompt and answer in
    bf16 are the fp32 ones within bf16 rounding (both on the GPU: where fla imports, transformers routes these
    layers to its Triton kernels, which take no CPU tensors)."""
    from transformers import AutoConfig

    from mmrl.model.kernels import KERNELS, importable, linear_attention_kernels

    folder = make_tiny("qwen3_5", tmp_path / "m", seed=0)
    said = linear_attention_kernels(AutoConfig.from_pretrained(folder), torch.device("cuda")) or ""
    missing = [m for m in KERNELS if not importable(m)]
    print(f"linear-attention kernels: missing {missing or 'none'}")
    assert all(KERNELS[m][0] in said for m in missing) and (said == "") == (not missing)
    rows = run_rl(tmp_path, "model.tiny_family=qwen3_5", "model.dtype=bf16", "train.lr=1e-4",
                  "grpo.entropy_coef=0.01", "data.toy_tasks=[color, color_image]",
                  "data.media.video_min_pixels=4096", "data.media.video_max_pixels=4096")
    assert [r["step"] for r in rows] == [1, 2]
    assert all(torch.isfinite(torch.tensor(r["grad_norm"])) and r["grad_norm"] > 0 for r in rows)
    logps = {}
    for device, dtype in (("cuda", "fp32"), ("cuda", "bf16")):
        policy = load_policy(folder, device=device, dtype=dtype)
        policy.model.eval()
        seq = prompt(policy, [video("qwen3_5", "v", frames=4, side=4, seed=1)], "What happens?")
        seq = seq.extend(policy.tokenizer("<answer>A</answer>", add_special_tokens=False).input_ids, trained=True)
        with torch.no_grad():
            lp, _, mask = policy.forward_logprobs([seq])
        logps[dtype] = lp[mask.bool()].float().cpu()
    gap = float((logps["bf16"] - logps["fp32"]).abs().max())
    print(f"qwen3_5 log-probs on CUDA, bf16 vs fp32: max gap {gap:.4f} (CPU, torch's reference: 0.0043)")
    assert gap < 0.1, gap
