"""Qwen3-VL MoE as a fourth model family (issue 50): a tiny random ``Qwen3VLMoeForConditionalGeneration`` built
offline by ``mmrl models make-tiny``, with Qwen3-VL's tokenizer and processor; its M-RoPE positions are
Qwen3-VL's (checked against transformers' own ``get_rope_index`` of the MoE model for image and video prompts);
``mmrl train`` on image and video data with HF rollouts; LoRA on the attention projections.

The family list lives in one place (``mmrl.model.types.FAMILIES``): every other list reads it.
"""

from __future__ import annotations

import json
import typing
from pathlib import Path

import pytest
import torch
from synthetic_media import image, prompt, video
from tiny_runs import module_cache, rl_rows, run_cli, run_rl  # noqa: F401 - fixture

from mmrl.model import FAMILIES, Policy, inputs, load_policy
from mmrl.model.types import dense_family, is_moe
from mmrl.toy.tiny_models import SPECIAL_TOKENS, ensure_tiny, make_tiny
from mmrl_common.errors import ConfigError, MmrlError

MOE = "qwen3_vl_moe"


@pytest.fixture(scope="module")
def moe_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_tiny(MOE, tmp_path_factory.mktemp("moe") / "m", seed=0)


@pytest.fixture(scope="module")
def moe_policy(moe_dir: Path) -> Policy:
    policy = load_policy(moe_dir, device="cpu")
    policy.model.eval()
    return policy


# ------------------------------------------------------------------------------------------------ the family list
def test_every_family_list_reads_the_one_in_model_types() -> None:
    from mmrl import config
    from mmrl.benchmarks import lmms_bridge
    from mmrl.model import rope
    from mmrl.toy import tiny_models

    assert MOE in FAMILIES
    assert typing.get_args(typing.get_type_hints(config.ModelConfig)["tiny_family"]) == FAMILIES
    assert tiny_models.FAMILIES is FAMILIES
    assert set(FAMILIES) == set(SPECIAL_TOKENS)
    assert set(lmms_bridge.LMMS_MODELS) == {f for f in FAMILIES if not f.startswith("qwen3_5")}  # lmms-eval: none
    assert rope.FAMILIES is FAMILIES
    assert config.ModelConfig(tiny_family=MOE).tiny_family == MOE


# ------------------------------------------------------------------------------------------------ make-tiny
def test_make_tiny_cli_builds_a_mixture_of_experts_model(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    from transformers import AutoConfig, AutoModelForImageTextToText, AutoProcessor

    out = tmp_path / "moe"
    rc, printed, err = run_cli(capsys, "models", "make-tiny", "--family", MOE, "--out", str(out),
                               "--experts", "6", "--experts-per-token", "3")
    assert rc == 0 and err == "" and f"built {MOE} in {out}" in printed
    cfg = AutoConfig.from_pretrained(out)
    text = cfg.text_config
    assert cfg.model_type == MOE and type(cfg).__name__ == "Qwen3VLMoeConfig"
    assert (text.num_experts, text.num_experts_per_tok, text.decoder_sparse_step, text.mlp_only_layers) == (6, 3, 1, [])
    assert text.moe_intermediate_size > 0 and text.router_aux_loss_coef > 0 and text.output_router_logits is False
    assert text.norm_topk_prob is True  # as the released config.json (vLLM's Qwen3-VL MoE reads it)
    model = AutoModelForImageTextToText.from_pretrained(out)
    assert type(model).__name__ == "Qwen3VLMoeForConditionalGeneration"
    for layer in model.model.language_model.layers:  # every decoder layer is sparse: router + fused experts
        assert layer.mlp.gate.weight.shape == (6, text.hidden_size)
        assert layer.mlp.experts.gate_up_proj.shape == (6, 2 * text.moe_intermediate_size, text.hidden_size)
    # Qwen3-VL's processor, tokenizer and chat template (the real MoE checkpoints ship the same)
    processor = AutoProcessor.from_pretrained(out)
    dense = make_tiny("qwen3_vl", tmp_path / "dense")
    dense_proc = AutoProcessor.from_pretrained(dense)
    assert type(processor).__name__ == type(dense_proc).__name__ == "Qwen3VLProcessor"
    assert type(processor.video_processor) is type(dense_proc.video_processor)
    assert processor.tokenizer.get_vocab() == dense_proc.tokenizer.get_vocab()
    assert processor.chat_template == dense_proc.chat_template
    assert cfg.vision_config.patch_size == AutoConfig.from_pretrained(dense).vision_config.patch_size == 16
    info = json.loads((out / "mmrl_tiny.json").read_text())
    assert info["size"]["experts"] == 6 and info["size"]["experts_per_token"] == 3


def test_moe_sizes_are_refused_for_a_dense_family_and_checked(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="experts.*mixture-of-experts"):
        make_tiny("qwen3_vl", tmp_path / "a", experts=4)
    with pytest.raises(ConfigError, match="experts_per_token 5 is larger than experts 4"):
        make_tiny(MOE, tmp_path / "b", experts=4, experts_per_token=5)
    with pytest.raises(ConfigError, match="model.tiny_size: .*mixture-of-experts"):
        from mmrl.config import ModelConfig

        ModelConfig(tiny_family="qwen2_5_vl", tiny_size={"experts": 2})


def test_dense_cache_keys_are_unchanged_by_the_moe_sizes() -> None:
    """The MoE size fields stay out of a dense family's settings: its cached tiny models keep their folder."""
    from mmrl.toy.tiny_models import settings

    for family in FAMILIES:
        keys = set(settings(family)["size"])
        assert ("experts" in keys) == is_moe(family), family


# ------------------------------------------------------------------------------------------------ folder layout
def _experts(folder: Path) -> dict[str, torch.Tensor]:
    from safetensors.torch import load_file

    return {k: v for f in sorted(folder.glob("*.safetensors")) for k, v in load_file(f).items() if ".experts." in k}


def test_folders_hold_the_fused_experts_in_the_published_layout_and_load_back(moe_dir: Path, tmp_path: Path) -> None:
    """The fused expert weights are written as Qwen3-VL-30B-A3B's checkpoints hold them, the layout vLLM reads
    (gate_up_proj experts x hidden x 2·width, down_proj experts x width x hidden; transformers keeps the transposes
    in memory): by make-tiny and by mmrl's own writer (checkpoints, final/), and both transformers and mmrl's
    checkpoint loader read them back to the same weights. A folder in transformers' own layout (what mmrl wrote
    before) still loads."""
    from transformers import AutoModelForImageTextToText

    from mmrl.engine.checkpoint import load_weights
    from mmrl.model.weights import save_pretrained

    text = json.loads((moe_dir / "config.json").read_text())["text_config"]
    hidden, width, experts = text["hidden_size"], text["moe_intermediate_size"], text["num_local_experts"]
    assert hidden not in (width, 2 * width)  # no square tensor: the two layouts differ in shape
    saved = _experts(moe_dir)
    assert saved and {tuple(v.shape) for k, v in saved.items() if k.endswith("gate_up_proj")} == {(experts, hidden, 2 * width)}
    assert {tuple(v.shape) for k, v in saved.items() if k.endswith("down_proj")} == {(experts, width, hidden)}
    model = AutoModelForImageTextToText.from_pretrained(moe_dir)
    own = model.state_dict()
    for k, v in saved.items():
        assert torch.equal(own[k], v.transpose(1, 2))

    # mmrl's writer: the same tensors as the folder it was loaded from
    out = save_pretrained(tmp_path / "written", model)
    assert {k: v.shape for k, v in _experts(out).items()} == {k: v.shape for k, v in saved.items()}
    assert all(torch.equal(_experts(out)[k], v) for k, v in saved.items())

    # mmrl's checkpoint loader (a resume) into a model whose experts were changed; and a folder in the old layout
    legacy = tmp_path / "legacy"
    model.save_pretrained(legacy)  # transformers' save: the model's own layout (what mmrl wrote before)
    assert {tuple(v.shape) for k, v in _experts(legacy).items() if k.endswith("gate_up_proj")} == {(experts, 2 * width, hidden)}
    for folder in (out, legacy):
        with torch.no_grad():
            for name, p in model.named_parameters():
                if ".experts." in name:
                    p.zero_()
        load_weights(model, folder)
        assert all(torch.equal(model.state_dict()[k], v.transpose(1, 2)) for k, v in saved.items()), folder


# ------------------------------------------------------------------------------------------------ positions
def _hf_positions(policy: Policy, seqs: list) -> torch.Tensor:
    """Transformers' own (class) get_rope_index of the MoE model, not the rule mmrl installs on the instance."""
    batch = policy.pad(seqs, left=False)
    got, _ = type(policy.base).get_rope_index(
        policy.base, batch["input_ids"], mm_token_type_ids=batch["mm_token_type_ids"],
        attention_mask=batch["attention_mask"], **inputs.grid_kwargs(policy, seqs))
    return got


@pytest.mark.parametrize("kind", ["image", "video"])
def test_moe_positions_equal_the_models_own_rope_index(moe_policy: Policy, kind: str) -> None:
    policy = moe_policy
    policy.media.clear()
    assert dense_family(policy.family) == "qwen3_vl"
    tail = list(range(100, 104)) + [policy.tokenizer.convert_tokens_to_ids("<|im_end|>")]
    if kind == "image":
        media = [[image(MOE, "a", 3, 2)], [image(MOE, "a", 3, 2), image(MOE, "b", 2, 4, seed=1)]]
    else:  # 16 frames of 2 x 2 merged tokens: more temporal than spatial extent
        media = [[video(MOE, "v", frames=16, side=4)], [video(MOE, "w", frames=8, side=4, seed=1), image(MOE, "a")]]
    seqs = [prompt(policy, m, "What is it?").extend(tail, trained=True) for m in media]
    batch = policy.pad(seqs, left=False)
    got = policy.position_ids(batch, seqs)
    assert torch.equal(got, _hf_positions(policy, seqs))
    if kind == "video":  # one block per temporal patch: 8 blocks of 4 tokens, each advancing 2 positions
        assert policy.media["v"].grid_thw.tolist() == [8, 4, 4]
        n = len(seqs[0])
        assert got[:, 0, n - 1].tolist() == [n - 1 - 8 * 2] * 3


def test_moe_greedy_generation_matches_training_logprobs(moe_policy: Policy) -> None:
    policy = moe_policy
    policy.media.clear()
    prompts = [prompt(policy, [video(MOE, "v", frames=8, side=4)], "What happens?"),
               prompt(policy, [image(MOE, "i", 3, 2)], "What is it, briefly?")]
    gens = policy.generate(prompts, max_new_tokens=5, do_sample=False, with_logprobs=True)
    seqs = [p.extend(g[0].token_ids, trained=True) for p, g in zip(prompts, gens)]
    with torch.no_grad():
        logp, _, mask = policy.forward_logprobs(seqs)
    for row, g in enumerate(gens):
        assert len(g[0].token_ids) == len(g[0].logprobs) > 0
        torch.testing.assert_close(logp[row][mask[row].bool()], torch.tensor(g[0].logprobs), rtol=0, atol=1e-4)


# ------------------------------------------------------------------------------------------------ lmms-eval
def test_lmms_eval_bridge_needs_an_active_size_in_a_moe_path(moe_dir: Path, tmp_path: Path) -> None:
    from mmrl.benchmarks.lmms_bridge import build_command

    with pytest.raises(MmrlError, match=r"lmms-eval's qwen3_vl class loads as a mixture of experts"):
        build_command(moe_dir, "mvbench", out=tmp_path / "o")
    named = tmp_path / "tiny-A1B"
    named.symlink_to(moe_dir)
    cmd = build_command(named, "mvbench", out=tmp_path / "o")
    assert cmd[cmd.index("--model") + 1] == "qwen3_vl"


# ------------------------------------------------------------------------------------------------ training
MOE_RUN = [f"model.tiny_family={MOE}", "data.media.video_min_pixels=4096",
           "data.media.video_max_pixels=4096"]


@pytest.mark.slow
@pytest.mark.parametrize("task", ["image-qa", "video-qa"])
def test_mmrl_train_with_hf_rollouts_on_a_moe_model(module_cache, tmp_path: Path, task: str) -> None:  # noqa: F811
    from tiny_runs import TINY_RUN

    from mmrl.config import load_run_config
    from mmrl.run import train

    media = ["data.toy_tasks=[color_image]"] if task == "image-qa" else []  # TINY_RUN's toy task is videos
    cfg = load_run_config(task, overrides=[*TINY_RUN, *MOE_RUN, *media])
    start = load_policy(ensure_tiny(MOE), device="cpu")
    train(cfg, run_dir=tmp_path / "run", show_progress=False)
    rows = rl_rows(tmp_path / "run")
    assert [r["step"] for r in rows] == [1, 2]
    # the router's auxiliary loss is on by default, at the model config's own coefficient
    assert all(r["router_aux_loss"] > 0 for r in rows)
    final = load_policy(tmp_path / "run" / "final", device="cpu")
    assert final.family == MOE
    before, after = dict(start.model.named_parameters()), dict(final.model.named_parameters())
    moved = {n for n in before if not torch.equal(before[n], after[n])}
    assert any(".mlp.experts." in n for n in moved) and any(".mlp.gate." in n for n in moved), sorted(moved)[:8]
    rollouts = [json.loads(x) for x in (tmp_path / "run" / "rollouts.jsonl").read_text().splitlines()]
    pad = ("<|image_pad|>" if task == "image-qa" else "<|video_pad|>") + "×"
    assert rollouts and all(pad in r["prompt"] for r in rollouts)


@pytest.mark.slow
def test_lora_on_a_moe_model_adapts_the_attention_and_leaves_the_experts(module_cache, tmp_path: Path) -> None:  # noqa: F811
    rows = run_rl(tmp_path, *MOE_RUN, "model.lora={r: 4}")
    assert [r["step"] for r in rows] == [1, 2]
    from mmrl.model import lora

    policy = load_policy(ensure_tiny(MOE), device="cpu")
    from mmrl.config import LoraSettings

    info = lora.apply_lora(policy, LoraSettings(r=4))
    assert "mixture-of-experts layers (routers, fused expert weights) stay frozen" in lora.describe(info, LoraSettings(r=4))
    adapted = {n.rsplit(".lora_", 1)[0] for n, _ in policy.model.named_parameters() if ".lora_" in n}
    layers = len(policy.base.language_model.layers)
    for proj in ("q_proj", "k_proj", "v_proj", "o_proj"):
        assert sum(n.endswith(f"self_attn.{proj}") for n in adapted) == layers, proj
    assert not any(".mlp." in n or ".visual." in n for n in adapted)
    trainable = [n for n, p in policy.model.named_parameters() if p.requires_grad]
    assert trainable and all(".lora_" in n for n in trainable)


# ------------------------------------------------------------------------------------------------ router aux loss
def _router_grads(policy: Policy, seqs: list, coef: float) -> tuple[dict[str, torch.Tensor], float | None]:
    from mmrl.model.router_loss import RouterLogits

    policy.model.zero_grad(set_to_none=True)
    with RouterLogits(policy.model) as rec:
        logp, _, mask = policy.forward_logprobs(seqs)
    loss = -(logp * mask).sum() / mask.sum()
    aux = rec.loss() if coef > 0 else None
    if aux is not None:
        loss = loss + coef * aux
    loss.backward()
    grads = {n: p.grad.clone() for n, p in policy.model.named_parameters() if n.endswith("mlp.gate.weight")}
    policy.model.zero_grad(set_to_none=True)
    return grads, None if aux is None else float(aux.detach())


def test_router_aux_loss_is_transformers_own_and_moves_the_router_gradient(moe_policy: Policy) -> None:
    policy = moe_policy
    policy.media.clear()
    seq = prompt(policy, [image(MOE, "a", 3, 2)], "What is it?").extend(list(range(100, 106)), trained=True)
    off, _ = _router_grads(policy, [seq], 0.0)
    on, aux = _router_grads(policy, [seq], 0.5)
    assert off.keys() == on.keys() and len(on) == len(policy.base.language_model.layers)
    assert all(not torch.equal(off[n], on[n]) for n in on)
    # the value is what the model's own forward computes (output_router_logits) over the same tokens
    batch = policy.pad([seq], left=False)
    item = policy.media["a"]
    with torch.no_grad():
        out = policy.model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"],
                           mm_token_type_ids=batch["mm_token_type_ids"], pixel_values=item.pixel_values,
                           image_grid_thw=item.grid_thw.view(1, 3), output_router_logits=True, use_cache=False)
    assert aux == pytest.approx(float(out.aux_loss), rel=1e-5)


def test_router_aux_loss_setting_resolves_per_model(moe_policy: Policy, tmp_path: Path) -> None:
    from mmrl.config import ModelConfig
    from mmrl.model.router_loss import resolve_coef

    own = moe_policy.model.config.text_config.router_aux_loss_coef
    assert own > 0 and resolve_coef(None, moe_policy.model) == own
    assert resolve_coef(0, moe_policy.model) == 0.0 and resolve_coef(0.25, moe_policy.model) == 0.25
    dense = load_policy(ensure_tiny("qwen3_vl"), device="cpu")
    assert resolve_coef(None, dense.model) == 0.0 == resolve_coef(0, dense.model)
    with pytest.raises(ConfigError, match=r"model.router_aux_loss_coef=0.1: .*no router.*qwen3_vl_moe"):
        resolve_coef(0.1, dense.model)
    with pytest.raises(ConfigError, match=r"model.router_aux_loss_coef=-1"):
        ModelConfig(router_aux_loss_coef=-1)


@pytest.mark.slow
def test_train_logs_the_router_aux_loss_when_on_and_not_when_off(module_cache, tmp_path: Path,  # noqa: F811
                                                                   capsys: pytest.CaptureFixture) -> None:
    on = run_rl(tmp_path / "on", *MOE_RUN, "model.router_aux_loss_coef=0.5")
    off = run_rl(tmp_path / "off", *MOE_RUN, "model.router_aux_loss_coef=0")
    assert all(r["router_aux_loss"] > 0 for r in on)
    assert not any("router_aux_loss" in r for r in off)
    # a dense model refuses the setting with one line, before training
    from tiny_runs import TINY_RUN

    rc, _, err = run_cli(capsys, "train", "--quiet", "--task", "video-qa", "--out", str(tmp_path / "dense"),
                         *TINY_RUN, "model.tiny_family=qwen3_vl", "model.router_aux_loss_coef=0.5")
    assert rc != 0 and "Traceback" not in err
    assert "model.router_aux_loss_coef=0.5: the model (qwen3_vl) has no router" in err.strip().splitlines()[-1]
