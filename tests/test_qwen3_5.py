"""Qwen3.5 (``qwen3_5`` and ``qwen3_5_moe``, issue 59): a decoder whose Gated DeltaNet layers (a recurrent state and a
short causal convolution) sit between full-attention layers, with Qwen3-VL's processor and positions.

What is measured here: the log-prob shortcuts mmrl refuses for it (padding-free packing, the shared prefix) give
wrong log-probs when forced on, while its padded pass equals each sequence alone; LoRA adapts both layer kinds;
mmrl's ``varlen`` attention runs its full-attention layers; ``mmrl train`` runs on mixed image and video data
with HF rollouts; two ZeRO-3 ranks equal one process; a killed run resumes bit for bit; ``mmrl eval`` runs it on
the MVBench fixture. Prefill-once generation, the vision-feature cache and the positions are covered with every
family (tests/test_prefill_once.py, test_policy.py, test_rope.py).
"""

from __future__ import annotations

import dataclasses
import json
import os
import signal
import subprocess
import time
import types
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file
from synthetic_media import model_weights
from test_distributed import RUN, command, env, rl_rows, train  # noqa: F401 (env: a fixture)
from test_packing import folders, mixed_batch, policy_of  # noqa: F401 (fixtures)

from mmrl.model import Policy, lora, recurrent
from mmrl.model.logprobs import forward_logprobs

QWEN3_5 = ("qwen3_5", "qwen3_5_moe")


def logprobs(policy: Policy, seqs, **options) -> torch.Tensor:
    """The policy's log-probs of ``seqs`` with ``options`` set as given, even those mmrl refuses for the model:
    the passes read the policy's parts through a view whose options are replaced (the policy is untouched)."""
    view = types.SimpleNamespace(**{**vars(policy), "options": dataclasses.replace(policy.options, **options)},
                                 device=policy.device)
    with torch.no_grad():
        logp, _, mask = forward_logprobs(view, seqs)
    return logp * mask


@pytest.mark.parametrize("family", QWEN3_5)
def test_the_shortcuts_are_refused_and_would_be_wrong(policy_of, family: str) -> None:  # noqa: F811
    policy = policy_of(family)
    policy.configure(padding_free=True, shared_prefix=True)
    assert (policy.options.padding_free, policy.options.shared_prefix) == (False, False)
    assert set(recurrent.REASONS) == {"padding_free", "shared_prefix"}
    seqs = mixed_batch(policy, family, "video")
    padded = logprobs(policy, seqs, padding_free=False, shared_prefix=False)
    # padding is exact: each row as it is alone (a padded token adds nothing to a recurrent state)
    for i in (0, 4, len(seqs) - 1):
        alone = logprobs(policy, [seqs[i]], padding_free=False, shared_prefix=False)[0]
        torch.testing.assert_close(padded[i, :len(seqs[i])], alone, rtol=0, atol=1e-5)
    scale = float(padded.abs().max())
    packed = logprobs(policy, seqs, padding_free=True, shared_prefix=False, pack_one_row=True)
    # forced on, packing is off by far more than round-off (the samples after the first in a row start from
    # another's state), and the shared prefix cannot run: its caches record keys and values only, and the
    # Gated DeltaNet layers ask them for their convolution state (transformers' DynamicCache.get_conv_state)
    assert float((packed - padded).abs().max()) > 1e-4 * scale  # ten times the tolerance the control meets
    with pytest.raises((IndexError, ValueError)):
        logprobs(policy, seqs, padding_free=False, shared_prefix=True)
    # the same forcing on Qwen3-VL (attention only) is exact: the measurement itself is sound
    control = policy_of("qwen3_vl")
    cseqs = mixed_batch(control, "qwen3_vl", "video")
    base = logprobs(control, cseqs, padding_free=False, shared_prefix=False)
    for forced in ({"padding_free": True, "shared_prefix": False, "pack_one_row": True},
                   {"padding_free": False, "shared_prefix": True}):
        torch.testing.assert_close(logprobs(control, cseqs, **forced), base, rtol=0,
                                   atol=1e-5 * float(base.abs().max()))


@pytest.mark.parametrize("family", QWEN3_5)
def test_lora_adapts_both_layer_kinds(policy_of, family: str) -> None:  # noqa: F811
    from mmrl.config import LoraSettings
    from mmrl.model import load_policy

    policy = load_policy(policy_of(family).load_args["path"], device="cpu")
    info = lora.apply_lora(policy, LoraSettings(r=4))
    adapted = {n.rsplit(".lora_", 1)[0] for n, _ in policy.model.named_parameters() if ".lora_" in n}
    kinds = policy.model.config.text_config.layer_types
    linear, full = kinds.count("linear_attention"), kinds.count("full_attention")
    assert linear and full
    for proj in lora.LINEAR_ATTENTION_TARGETS:
        assert sum(n.endswith(f"linear_attn.{proj}") for n in adapted) == linear, proj
    for proj in ("q_proj", "k_proj", "v_proj", "o_proj"):
        assert sum(n.endswith(f"self_attn.{proj}") for n in adapted) == full, proj
    assert not any(".visual." in n for n in adapted) and info["vision_modules"] == 0
    # an explicit list is taken as given
    policy = load_policy(policy_of(family).load_args["path"], device="cpu")
    lora.apply_lora(policy, LoraSettings(r=4, target_modules=["q_proj"]))
    assert {n.rsplit(".", 1)[-1] for n, _ in policy.model.named_modules() if n.endswith("q_proj")} == {"q_proj"}
    assert not any("linear_attn" in n and ".lora_" in n for n, _ in policy.model.named_parameters())


@pytest.mark.parametrize("family", QWEN3_5)
def test_varlen_attention_runs_the_full_attention_layers(policy_of, family: str) -> None:  # noqa: F811
    sdpa, varlen = policy_of(family, "sdpa"), policy_of(family, "varlen")
    seqs = mixed_batch(sdpa, family, "image")
    ref = logprobs(sdpa, seqs, padding_free=False, shared_prefix=False)
    got = logprobs(varlen, mixed_batch(varlen, family, "image"), padding_free=False, shared_prefix=False)
    torch.testing.assert_close(got, ref, rtol=0, atol=1e-5 * float(ref.abs().max()))


def test_a_moe_folder_in_the_published_per_expert_layout_loads_and_mmrl_writes_fused_experts(tmp_path: Path) -> None:
    """The published Qwen3.5 MoE checkpoints hold one tensor per expert (transformers' original format for it);
    mmrl loads such a folder to the same weights, and the folders it writes keep the fused tensors
    (:data:`mmrl.model.weights.FUSED_IN_FOLDERS`), which transformers loads back unchanged."""
    from transformers import AutoConfig, AutoModelForImageTextToText, AutoProcessor

    from mmrl.model import load_policy
    from mmrl.model.weights import save_pretrained
    from mmrl.toy.tiny_models import make_tiny

    ours = make_tiny("qwen3_5_moe", tmp_path / "ours", seed=0)
    assert any(k.endswith(".mlp.experts.gate_up_proj") for k in load_file(ours / "model.safetensors"))
    # a model built from the config (no loading recorded) saves in transformers' original format: split experts
    model = AutoModelForImageTextToText.from_config(AutoConfig.from_pretrained(ours))
    model.load_state_dict(AutoModelForImageTextToText.from_pretrained(ours).state_dict())
    published = tmp_path / "published"
    model.save_pretrained(published)
    AutoProcessor.from_pretrained(ours).save_pretrained(published)
    names = set(load_file(published / "model.safetensors"))
    assert any(".mlp.experts.0.gate_proj.weight" in k for k in names) and not any(k.endswith("gate_up_proj") for k in names)
    a, b = load_policy(ours, device="cpu").model.state_dict(), load_policy(published, device="cpu").model.state_dict()
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    save_pretrained(tmp_path / "again", load_policy(published, device="cpu").model)
    again = load_file(tmp_path / "again" / "model.safetensors")
    assert any(k.endswith(".mlp.experts.gate_up_proj") for k in again)
    assert all(torch.equal(again[k], a[k]) for k in again if k in a)


# ------------------------------------------------------------------------------------------------ runs
def run_settings(family: str, environ: dict[str, str], *extra: str) -> list[str]:
    """test_distributed's run (its reward differs between rollouts; its ``env`` fixture writes it) on ``family``,
    images and videos (both toy tasks), at the video budget Qwen3-VL's 32-px merged patches need."""
    return [*RUN, f"model.tiny_family={family}", "data.toy_tasks=[color, color_image]",
            "data.media.video_min_pixels=4096", "data.media.video_max_pixels=4096",
            f"imports=[{environ['MMRL_TEST_REWARD']}]", *extra]


@pytest.mark.slow
@pytest.mark.xdist_group("torchrun")
@pytest.mark.parametrize("family", QWEN3_5)
def test_trains_on_images_and_videos_and_two_zero3_ranks_equal_one_process(family: str, env: dict[str, str],  # noqa: F811
                                                                          tmp_path: Path) -> None:
    # MoE: the routers' load-balancing loss off, as in test_distributed's MoE test: on, its tiny gradients reach
    # every weight and Adam turns their round-off into learning-rate-sized steps that differ between the runs
    moe = ["model.router_aux_loss_coef=0"] if family == "qwen3_5_moe" else []
    settings = run_settings(family, env, "train.steps=2", "train.save_every=0", *moe)
    train(tmp_path / "one", env, 1, run=settings)
    train(tmp_path / "two", env, 2, "train.deepspeed=zero3", run=settings)
    one, two = rl_rows(tmp_path / "one"), rl_rows(tmp_path / "two")
    assert [r["step"] for r in one] == [r["step"] for r in two] == [1, 2]
    assert all(abs(r["loss"]) > 1e-4 and r["grad_norm"] > 0 for r in one)
    for a, b in zip(one, two):
        assert a["reward"] == pytest.approx(b["reward"], abs=1e-6)
        assert a["loss"] == pytest.approx(b["loss"], rel=1e-4, abs=1e-7), a["step"]
        assert a["grad_norm"] == pytest.approx(b["grad_norm"], rel=1e-4), a["step"]
    rollouts = [json.loads(x) for x in (tmp_path / "one" / "rollouts.jsonl").read_text().splitlines()]
    assert any("<|image_pad|>" in r["prompt"] for r in rollouts) and any("<|video_pad|>" in r["prompt"] for r in rollouts)
    start = model_weights(next((Path(env["MMRL_CACHE"]) / "models").glob(f"{family}-*")))
    w1, w2 = model_weights(tmp_path / "one" / "final"), model_weights(tmp_path / "two" / "final")
    assert set(w1) == set(w2) == set(start)
    moved = [k for k in w1 if not torch.equal(start[k], w1[k])]
    assert any(".linear_attn." in k for k in moved) and any(".self_attn." in k for k in moved)
    assert any(".linear_attn.conv1d." in k for k in moved)  # the weight ZeRO-3 gathers for its reader
    far = {k: float((w1[k] - w2[k]).abs().max()) for k in w1
           if float((w1[k] - w2[k]).abs().max()) > 1e-2 * float((w1[k] - start[k]).abs().max()) + 1e-7}
    assert not far, sorted(far.items(), key=lambda kv: -kv[1])[:3]


@pytest.mark.slow
def test_killed_run_resumes_bit_for_bit(env: dict[str, str], tmp_path: Path) -> None:  # noqa: F811
    settings = run_settings("qwen3_5", env, "train.steps=4", "train.save_every=2", "model.lora={r: 4}")
    train(tmp_path / "straight", env, 1, run=settings)
    broken = tmp_path / "broken"
    proc = subprocess.Popen(command(broken, env, 1, run=settings), env=env, stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 600
    while not (broken / "checkpoint-2").is_dir():  # killed once the first checkpoint is in place
        assert proc.poll() is None, "the run ended before its first checkpoint"
        assert time.monotonic() < deadline
        time.sleep(0.01)
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait(timeout=60)
    assert proc.returncode == -signal.SIGKILL, "the run had ended before the kill"
    train(broken, env, 1, "--resume", run=settings)
    a, b = rl_rows(tmp_path / "straight"), rl_rows(broken)
    assert [r["step"] for r in b] == [1, 2, 3, 4]
    assert [(r["loss"], r["grad_norm"]) for r in a] == [(r["loss"], r["grad_norm"]) for r in b]
    final_a, final_b = model_weights(tmp_path / "straight" / "final"), model_weights(broken / "final")
    assert final_a.keys() == final_b.keys() and all(torch.equal(final_a[k], final_b[k]) for k in final_a)
    # the LoRA run's final/ is the merged model, which transformers loads, and its adapters beside it
    assert (broken / "final" / "adapter").is_dir() or any(broken.glob("final/adapter*"))
    from transformers import AutoModelForImageTextToText

    merged = AutoModelForImageTextToText.from_pretrained(broken / "final")
    assert type(merged).__name__ == "Qwen3_5ForConditionalGeneration"
    saved = load_file(broken / "final" / "model.safetensors")
    assert not any(".lora_" in k for k in saved)


@pytest.mark.slow
def test_mmrl_eval_runs_a_qwen3_5_folder_on_the_mvbench_fixture(tmp_path: Path, capsys) -> None:
    from data_pipelines.benchmarks.fixtures import write_fixture
    from mmrl.cli import main
    from mmrl.toy.tiny_models import ensure_tiny

    root = write_fixture("mvbench", tmp_path / "mvbench", n=4)
    folder = ensure_tiny("qwen3_5")
    rc = main(["eval", "--benchmark", "mvbench", "--data-root", str(root), "--model", str(folder),
               "--out", str(tmp_path / "out"), "--frames", "4", "--max-pixels", "4096", "--batch-size", "2",
               "--workers", "0", "--quiet", "eval.max_new_tokens=6"])
    assert rc == 0, capsys.readouterr().err[-2000:]
    metrics = json.loads((tmp_path / "out" / "metrics.json").read_text())
    overall = metrics["scores"]["overall"]
    # every fixture question went through the model: the one whose video the fixture leaves out is an error
    # record, the others were generated for (a random model's answers are unparsed: no letter)
    assert metrics["n"] == overall["n"] == 5 and overall["errors"] == 1, overall
    preds = [json.loads(x) for x in (tmp_path / "out" / "predictions.jsonl").read_text().splitlines()]
    assert sum(1 for p in preds if not p.get("error") and p.get("completion")) == 4, preds[:2]
