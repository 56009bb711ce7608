"""The ``judge`` reward (rewards/judge.py): a judge model asked through an OpenAI-compatible chat-completions
endpoint, here a standard-library ``http.server`` on 127.0.0.1 that speaks its JSON. The score rule, the
template per problem type, a 500 retried, a reply without a score named and counted (not 0), the check before
the run (a stopped judge, a model the endpoint does not serve), and two training steps through ``mmrl train``
whose resume asks the judge nothing it was asked."""

from __future__ import annotations

import json
import socket
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest
import tiny_runs
from tiny_runs import TINY_RUN, module_cache, rl_rows, run_cli  # noqa: F401 (module_cache is a fixture)

MODEL = "judge-model"


class JudgeServer:
    """``GET /v1/models`` lists :data:`MODEL`; ``POST /v1/chat/completions`` answers ``Score: 1`` when the
    completion (after 'Response: ') has an even length, else ``Score: 0``; ``reply`` replaces the answer;
    ``fail`` lists the numbers (1-based) of the chat requests answered with a 500."""

    def __init__(self, fail: tuple[int, ...] = (), reply: str | None = None):
        self.requests: list[dict] = []
        self.headers: list[dict] = []
        self.fail, self.reply = set(fail), reply
        self.lock = threading.Lock()
        owner = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args) -> None:
                pass

            def send(self, code: int, obj) -> None:
                data = json.dumps(obj).encode()
                self.send_response(code)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def do_GET(self) -> None:
                if self.path == "/v1/models":
                    self.send(200, {"object": "list", "data": [{"id": MODEL, "object": "model"}]})
                else:
                    self.send(404, {"error": "not found"})

            def do_POST(self) -> None:
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                with owner.lock:
                    owner.requests.append(body)
                    owner.headers.append(dict(self.headers))
                    n = len(owner.requests)
                if self.path != "/v1/chat/completions":
                    self.send(404, {"error": "not found"})
                    return
                if n in owner.fail:
                    self.send(500, {"error": "planted failure"})
                    return
                prompt = body["messages"][-1]["content"]
                if isinstance(prompt, list):  # a multimodal message: the pictures, then the text
                    prompt = next(part["text"] for part in prompt if part["type"] == "text")
                completion = prompt.split("Response: ", 1)[1].split("\n\n", 1)[0]
                text = owner.reply if owner.reply is not None else \
                    f"Looks fine.\nScore: {1 - len(completion) % 2}"
                self.send(200, {"id": "x", "object": "chat.completion", "model": body["model"],
                                "choices": [{"index": 0, "finish_reason": "stop",
                                             "message": {"role": "assistant", "content": text}}]})

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.base_url = f"http://127.0.0.1:{self.server.server_address[1]}/v1"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    def __enter__(self) -> JudgeServer:  # noqa: PYI034
        self.thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture(autouse=True)
def _no_run_dir():
    from rewards.remote import set_run_dir

    set_run_dir(None)
    yield
    set_run_dir(None)


def judge(completions: list[str], problem_types: list[str], **kwargs) -> tuple[list, dict]:
    from rewards import get_reward

    metrics: dict = {}
    n = len(completions)
    cols = {"id": [f"s{i}" for i in range(n)], "question": ["What is shown?"] * n, "answer": ["a red ball"] * n,
            "problem_type": problem_types, "options": [[]] * n, "media": kwargs.pop("media_of", [[]] * n),
            "log_metric": metrics.__setitem__}
    return get_reward("judge")(completions, **cols, **kwargs), metrics


@pytest.mark.parametrize(("reply", "score"), [
    ("Score: 1", 1.0), ("score: 0", 0.0), ("First Score: 0, on reflection\nScore: 1", 1.0),
    ("**Score:** 1", 1.0), ("Score = 0", 0.0),
])
def test_the_last_score_in_the_reply_is_the_reward(reply, score):
    from rewards.judge import parse_score

    assert parse_score(reply) == score


def test_a_score_out_of_range_or_missing_is_no_score_and_max_score_scales():
    from rewards.judge import parse_score
    from rewards.remote import Failed

    assert parse_score("Score: 7", max_score=10) == 0.7
    for reply in ("Score: 2", "It is correct.", "", "Score: -1"):
        with pytest.raises(Failed):
            parse_score(reply)


def test_each_problem_type_gets_its_template_and_the_user_can_replace_one():
    with JudgeServer() as srv:
        got, metrics = judge(["ab", "abc", "abcd"], ["open", "free_form", "multiple_choice"], base_url=srv.base_url,
                             model=MODEL, templates={"free_form": "MINE {question} | {answer} | Response: {completion}"},
                             cache=False)
    assert got == [1.0, 0.0, 1.0] and metrics["judge/failed"] == 0
    prompts = {r["messages"][-1]["content"].split("Response: ")[1].split("\n")[0]: r for r in srv.requests}
    assert "open-ended question" in prompts["ab"]["messages"][-1]["content"]
    assert prompts["abc"]["messages"][-1]["content"] == "MINE What is shown? | a red ball | Response: abc"
    assert "Reference answer: a red ball" in prompts["abcd"]["messages"][-1]["content"]
    assert all(r["model"] == MODEL and r["temperature"] == 0 and r["max_tokens"] == 256 for r in srv.requests)


def test_a_500_is_retried_and_a_reply_without_a_score_is_named_and_not_zero(capsys):
    with JudgeServer(fail=(1,)) as srv:
        got, metrics = judge(["ab"], ["open"], base_url=srv.base_url, model=MODEL, backoff_s=0.01, cache=False)
        assert got == [1.0] and len(srv.requests) == 2 and metrics["judge/failed"] == 0
    with JudgeServer(reply="I cannot tell.") as srv:
        got, metrics = judge(["ab", "abc"], ["open", "open"], base_url=srv.base_url, model=MODEL, cache=False)
    assert got == [None, None] and metrics["judge/failed"] == 2
    err = capsys.readouterr().err
    assert "'s0', 's1'" in err and "no 'Score: N'" in err and srv.base_url in err


def test_the_api_key_comes_from_the_named_variable_and_extra_body_joins_the_request(monkeypatch):
    monkeypatch.setenv("MMRL_TEST_JUDGE_KEY", "sk-test")
    with JudgeServer() as srv:
        got, _ = judge(["ab"], ["open"], base_url=srv.base_url, model=MODEL, api_key_env="MMRL_TEST_JUDGE_KEY",
                       extra_body={"top_p": 0.5, "structured_outputs": {"regex": "Score: [01]"}}, system="Be strict.",
                       cache=False)
    assert got == [1.0]
    assert srv.headers[0]["Authorization"] == "Bearer sk-test"
    body = srv.requests[0]
    assert body["top_p"] == 0.5 and body["structured_outputs"] == {"regex": "Score: [01]"}
    assert body["messages"][0] == {"role": "system", "content": "Be strict."}


def test_a_model_the_endpoint_does_not_serve_is_refused_before_the_run():
    from mmrl_common.errors import ConfigError
    from rewards.remote import preflight_rewards

    with JudgeServer() as srv, pytest.raises(ConfigError, match=r"rewards\[0\]\.kwargs\.model: 'other'.*judge-model"):
        preflight_rewards([{"name": "judge", "kwargs": {"base_url": srv.base_url, "model": "other"}}], None)
    with pytest.raises(ConfigError, match=r"rewards\[0\]\.kwargs\.api_key_env: .*MMRL_TEST_NO_SUCH_KEY"):
        preflight_rewards([{"name": "judge", "kwargs": {"base_url": "http://127.0.0.1:1/v1", "model": "m",
                                                        "api_key_env": "MMRL_TEST_NO_SUCH_KEY"}}], None)


def test_a_stopped_judge_stops_train_before_the_run_folder_is_written(tmp_path, capsys, module_cache):  # noqa: F811
    from mmrl.run.lock import run_contents

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        url = f"http://127.0.0.1:{s.getsockname()[1]}/v1"
    rc, _, err = run_cli(capsys, "train", "--quiet", "--out", str(tmp_path / "run"), *TINY_RUN,
                         f"rewards=[{{name: judge, kwargs: {{base_url: '{url}', model: m, retries: 1, "
                         "backoff_s: 0.01}}]")
    assert rc != 0 and "Traceback" not in err
    lines = [ln for ln in err.splitlines() if "cannot reach" in ln]
    assert len(lines) == 1 and url in lines[0] and "rewards[0].kwargs.base_url" in lines[0]
    assert run_contents(tmp_path / "run") == []


@pytest.mark.slow
def test_train_with_a_judge_retries_and_a_resume_asks_nothing_cached(tmp_path, capsys, module_cache):  # noqa: F811
    run = tmp_path / "run"
    with JudgeServer(fail=(3,)) as srv:
        rewards = (f"rewards=[{{name: format}}, {{name: judge, kwargs: {{base_url: '{srv.base_url}', model: {MODEL}, "
                   "backoff_s: 0.01, concurrency: 2}}]")
        rows = tiny_runs.stop_after(run, 2, rewards)  # step 2's replies asked, its row and checkpoint not written
        assert [r["step"] for r in rows] == [1]
        assert rows[0]["reward_metric/judge/failed"] == 0 and rows[0]["reward_metric/judge/asked"] >= 2
        asked = len(srv.requests)

        rc, _, err = run_cli(capsys, "train", "--quiet", "--out", str(run), "--resume")
        assert rc == 0, err
        assert len(srv.requests) == asked  # step 2, redone from checkpoint-1, found every reply in the cache
        again = rl_rows(run)
        assert [r["step"] for r in again] == [1, 2]
        assert again[-1]["reward_metric/judge/asked"] == 0 and again[-1]["reward_metric/judge/cached"] == 8
    assert list((run / "reward_cache").glob("judge-*.rank0.jsonl"))


@pytest.mark.slow
def test_eval_mmvu_scores_the_open_questions_with_the_judge(tmp_path, capsys, module_cache):  # noqa: F811
    from data_pipelines.benchmarks.fixtures import write_fixture
    from mmrl.toy.tiny_models import ensure_tiny

    root = write_fixture("mmvu", tmp_path / "mmvu", n=4)  # 4 multiple-choice, 1 open-ended, 1 without its video
    out = tmp_path / "out"
    with JudgeServer() as srv:
        rc, stdout, err = run_cli(
            capsys, "eval", "--benchmark", "mmvu", "--data-root", str(root), "--model", str(ensure_tiny("qwen2_5_vl")),
            "--out", str(out), "--frames", "4", "--max-pixels", "3136", "--batch-size", "2", "--workers", "0",
            "--quiet", "eval.max_new_tokens=6", "--judge", f"{srv.base_url},{MODEL}")
        assert rc == 0, err
        assert len(srv.requests) == 1  # the open question, once
        prompt = srv.requests[0]["messages"][-1]["content"]
        assert "Describe the motion." in prompt and "Reference answer: it moves" in prompt
    m = json.loads((out / "metrics.json").read_text())
    opened = m["scores"]["open_ended"]
    assert opened["n"] == 1 and opened["judged"] == 1 and opened["failed"] == 0
    completion = next(json.loads(line) for line in (out / "predictions.jsonl").read_text().splitlines()
                      if json.loads(line)["id"] == "validation_open")["completion"]
    assert opened["accuracy"] == 1 - len(completion) % 2  # the planted judge's verdict
    assert m["scores"]["overall"]["n"] == 5  # the multiple-choice headline as before: open questions apart
    judge = m["scores"]["judge"]
    assert judge["model"] == MODEL and judge["base_url"] == srv.base_url and "{completion}" in judge["templates"]["open"]
    assert MODEL in stdout and "open-ended" in stdout
    results = (out / "results.md").read_text()
    assert MODEL in results and "Score: 1" in results  # the judge's model and prompt beside the score


def _picture(url: str):
    import base64
    import io

    from PIL import Image

    head, data = url.split(",", 1)
    assert head == "data:image/jpeg;base64"
    return Image.open(io.BytesIO(base64.b64decode(data))).convert("RGB")


def test_a_vision_judge_sees_the_samples_image_and_frames_of_its_video(tmp_path, capsys):
    import numpy as np
    from PIL import Image

    from video.writer import write_mp4

    Image.new("RGB", (300, 200), (250, 10, 10)).save(tmp_path / "red.png")
    colours = [(10, 250, 10), (10, 10, 250), (250, 250, 10), (250, 250, 250)]  # 4 frames a colour
    write_mp4(tmp_path / "clip.mp4", np.stack([np.full((64, 96, 3), c, np.uint8) for c in colours for _ in range(4)]),
              fps=4.0, crf=0)
    media = [[{"type": "image", "path": str(tmp_path / "red.png")}, {"type": "video", "path": str(tmp_path / "clip.mp4")}],
             [{"type": "video", "path": str(tmp_path / "missing.mp4")}]]
    with JudgeServer() as srv:
        got, metrics = judge(["aa", "aa"], ["free_form"] * 2, base_url=srv.base_url, model=MODEL, send_media="images",
                             media_frames=3, media_max_side=64, media_of=media, cache=False, retries=0)
        plain, _ = judge(["aa"], ["free_form"], base_url=srv.base_url, model=MODEL, media_of=media[:1], cache=False)
    assert got == [1.0, None] and metrics["judge/failed"] == 1  # the unreadable video: named, never 0
    assert "missing.mp4" in capsys.readouterr().err
    content = srv.requests[0]["messages"][-1]["content"]
    assert [part["type"] for part in content] == ["image_url"] * 4 + ["text"]  # the image, 3 frames, the prompt
    pictures = [_picture(part["image_url"]["url"]) for part in content[:4]]
    assert pictures[0].size == (64, 43) and all(max(p.size) <= 64 for p in pictures)  # the longer side capped
    seen = [tuple(int(v) for v in np.asarray(p).reshape(-1, 3).mean(0)) for p in pictures]
    assert np.allclose(seen[0], (250, 10, 10), atol=12)  # the image
    assert np.allclose(seen[1], colours[0], atol=12) and np.allclose(seen[3], colours[-1], atol=12)  # first, last frame
    assert seen[2] not in (seen[1], seen[3])
    assert isinstance(srv.requests[-1]["messages"][-1]["content"], str) and plain == [1.0]  # media: none (default)
