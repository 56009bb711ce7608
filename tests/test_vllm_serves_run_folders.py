"""The model folders a run writes are served by vLLM as they are (``vllm serve runs/x/final``): whatever wrote
them (one process; ZeRO-2 on two ranks; ZeRO-3 on two ranks, whose model is loaded already partitioned; LoRA
under ZeRO-3, merged), ``final/`` and the checkpoints hold the published checkpoint's tensor names, and
vLLM's CPU build, loading the folder from disk, answers a text and an image prompt with the greedy tokens
transformers gives.

Marker ``vllm``: run by ``make test-vllm``; one torchrun pair at a time."""

from __future__ import annotations

import gc
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from model_names import assert_published_names
from synthetic_media import image
from tiny_runs import TINY_RUN

pytestmark = [pytest.mark.vllm, pytest.mark.xdist_group("torchrun")]

MMRL = str(Path(sys.executable).with_name("mmrl"))
TORCHRUN = str(Path(sys.executable).with_name("torchrun"))
SHORT = ["train.steps=1", "train.save_every=1", "train.lr=1e-2"]
# ranks, overrides, the folders served (a LoRA checkpoint holds adapters, not a model)
ARMS = {
    "one-process": (1, [], ["final"]),
    "zero2": (2, ["train.deepspeed=zero2"], ["checkpoint-1"]),
    # ZeRO-3 of Qwen2.5-VL: the lora-zero3 arm's merged export and tests/test_multinode.py's published names
    "zero3-qwen3_vl": (2, ["train.deepspeed=zero3", "model.tiny_family=qwen3_vl"], ["final", "checkpoint-1"]),
    "lora-zero3": (2, ["train.deepspeed=zero3", "model.lora={r: 4, dropout: 0.0}"], ["final"]),
}
NEW_TOKENS = 8


@pytest.fixture(scope="module")
def env(tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    root = tmp_path_factory.mktemp("served")
    return {**os.environ, "MMRL_CACHE": str(root / "cache"), "DS_ACCELERATOR": "cpu", "OMP_NUM_THREADS": "1",
            "TQDM_DISABLE": "1"}


def train(out: Path, env: dict[str, str], ranks: int, overrides: list[str]) -> None:
    launch = [MMRL] if ranks == 1 else [TORCHRUN, "--standalone", "--nproc_per_node", str(ranks), "-m", "mmrl"]
    done = subprocess.run([*launch, "train", "--quiet", "--out", str(out), *TINY_RUN, *SHORT, *overrides],
                          env=env, check=False, capture_output=True, text=True, timeout=600)
    if done.returncode != 0:
        lines = (done.stdout + done.stderr).splitlines()
        pytest.fail("\n".join([ln for ln in lines if ln.startswith("[rank")][-40:] + lines[-10:]))


def prompts(folder: Path) -> dict[str, tuple[str, object]]:
    """A text prompt and an image prompt, rendered by the folder's own chat template."""
    from transformers import AutoConfig, AutoProcessor

    processor = AutoProcessor.from_pretrained(folder)
    family = AutoConfig.from_pretrained(folder).model_type

    def render(content: list[dict]) -> str:
        return processor.apply_chat_template([{"role": "user", "content": content}], add_generation_prompt=True,
                                             tokenize=False)

    question = {"type": "text", "text": "Which colour fills most of the picture?"}
    return {"text": (render([question]), None),
            "image": (render([{"type": "image"}, question]), image(family, "picture", w=2, h=2).data)}


def hf_greedy(folder: Path, asks: dict[str, tuple[str, object]]) -> dict[str, list[int]]:
    from transformers import AutoModelForImageTextToText, AutoProcessor

    processor = AutoProcessor.from_pretrained(folder)
    model = AutoModelForImageTextToText.from_pretrained(folder, dtype=torch.float32).eval()
    out = {}
    for kind, (text, picture) in asks.items():
        inputs = processor(text=[text], images=[picture] if picture is not None else None, return_tensors="pt")
        with torch.no_grad():
            ids = model.generate(**inputs, do_sample=False, max_new_tokens=NEW_TOKENS)
        out[kind] = ids[0, inputs["input_ids"].shape[1]:].tolist()
    return out


def vllm_greedy(folder: Path, asks: dict[str, tuple[str, object]]) -> dict[str, list[int]]:
    """The folder loaded from disk by vLLM, as ``vllm serve`` loads it."""
    import vllm
    from vllm.distributed.parallel_state import destroy_model_parallel

    llm = vllm.LLM(model=str(folder), dtype="float32", enforce_eager=True, max_model_len=1024, seed=0,
                   limit_mm_per_prompt={"image": 1, "video": 0})
    try:
        params = vllm.SamplingParams(temperature=0.0, max_tokens=NEW_TOKENS)
        requests = [{"prompt": text, **({"multi_modal_data": {"image": picture}} if picture is not None else {})}
                    for text, picture in asks.values()]
        outs = llm.generate(requests, params, use_tqdm=False)
        return {kind: list(o.outputs[0].token_ids) for kind, o in zip(asks, outs)}
    finally:
        llm.llm_engine.engine_core.shutdown()
        destroy_model_parallel()
        del llm
        gc.collect()


@pytest.mark.parametrize("arm", list(ARMS))
def test_vllm_serves_the_runs_folders_as_transformers_does(arm: str, env: dict[str, str], tmp_path: Path) -> None:
    ranks, overrides, served = ARMS[arm]
    run = tmp_path / "run"
    train(run, env, ranks, overrides)
    assert_published_names(*(run / name for name in served))
    for name in served:
        folder = run / name
        asks = prompts(folder)
        want, got = hf_greedy(folder, asks), vllm_greedy(folder, asks)
        assert all(len(t) > 0 for t in want.values()), want
        assert got == want, (name, got, want)
