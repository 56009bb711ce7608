"""The ``http`` reward: scores from the user's own HTTP service (rewards/remote.py), served here by the standard
library's ``http.server`` on 127.0.0.1 in a thread. Batches and concurrency, a 500 retried, a failure named and
counted (never scored 0), the answers cached in the run folder so a resumed run re-asks nothing, and a stopped
server stopping ``mmrl train`` before the model loads with one line."""

from __future__ import annotations

import json
import socket
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest
import tiny_runs
from tiny_runs import TINY_RUN, module_cache, rl_rows, run_cli  # noqa: F401 (module_cache is a fixture)


class RewardServer:
    """A reward server: one score per item (the completion's length mod 3, halved; null for problem type
    ``skip``); ``fail`` lists the numbers (1-based) of the POSTs answered with a 500."""

    def __init__(self, fail: tuple[int, ...] = (), by_id: dict[str, float] | None = None):
        self.posts: list[list[dict]] = []
        self.fail = set(fail)
        self.by_id = by_id  # scores by the item's id (as a server that looks the sample up), not its text
        self.status, self.retry_after = 500, None  # what a failed POST answers
        self.lock = threading.Lock()
        owner = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args) -> None:
                pass

            def do_POST(self) -> None:
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                with owner.lock:
                    owner.posts.append(body["items"])
                    n = len(owner.posts)
                if n in owner.fail:
                    self.send_response(owner.status)
                    if owner.retry_after is not None:
                        self.send_header("Retry-After", owner.retry_after)
                    self.end_headers()
                    self.wfile.write(b"planted failure")
                    return
                scores = [owner.by_id[it["id"]] if owner.by_id is not None
                          else None if it["problem_type"] == "skip" else (len(it["completion"]) % 3) / 2
                          for it in body["items"]]
                data = json.dumps(scores).encode()
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/score"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    @property
    def items(self) -> int:
        return sum(len(p) for p in self.posts)

    def __enter__(self) -> RewardServer:  # noqa: PYI034
        self.thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self.server.shutdown()
        self.server.server_close()


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def score(completions: list[str], **kwargs) -> tuple[list, dict]:
    from rewards import get_reward

    metrics: dict = {}
    n = len(completions)
    cols = {"id": kwargs.pop("ids", [f"s{i}" for i in range(n)]), "question": ["q"] * n, "answer": ["a"] * n,
            "problem_type": kwargs.pop("problem_type", ["free_form"] * n), "options": [[]] * n,
            "media": kwargs.pop("media", [[]] * n), "log_metric": metrics.__setitem__}
    return get_reward("http")(completions, **cols, **kwargs), metrics


@pytest.fixture(autouse=True)
def _no_run_dir():
    from rewards.remote import set_run_dir

    set_run_dir(None)
    yield
    set_run_dir(None)


def test_items_go_out_in_batches_and_come_back_in_order():
    texts = [f"answer {'x' * i}" for i in range(7)]
    with RewardServer() as srv:
        got, metrics = score(texts, url=srv.url, batch_size=3, concurrency=2, cache=False)
    assert got == [(len(t) % 3) / 2 for t in texts]
    assert sorted(len(p) for p in srv.posts) == [1, 3, 3]
    assert {it["id"] for p in srv.posts for it in p} == {f"s{i}" for i in range(7)}
    assert metrics["http/failed"] == 0 and metrics["http/asked"] == 3


def test_null_is_not_applicable_and_the_total_leaves_it_out():
    from rewards import CombinedReward

    with RewardServer() as srv:
        combo = CombinedReward([{"name": "http", "kwargs": {"url": srv.url}}])
        out = combo.compute(["bb", "aa"], {"id": ["a", "b"], "question": ["q", "q"], "answer": ["x", "x"],
                                           "problem_type": ["skip", "free_form"]})
    assert out.applicable["http"] == [False, True] and out.total == [0.0, 1.0]


def test_a_500_is_retried():
    with RewardServer(fail=(1,)) as srv:
        got, metrics = score(["abc", "ab"], url=srv.url, backoff_s=0.01, cache=False)
    assert got == [0.0, 1.0] and len(srv.posts) == 2
    assert metrics["http/failed"] == 0 and metrics["http/asked"] == 2


def test_after_the_retries_an_item_is_named_counted_and_not_applicable(capsys):
    with RewardServer(fail=(1, 2, 3)) as srv:
        got, metrics = score(["abc", "ab"], url=srv.url, backoff_s=0.01, retries=2, batch_size=1, concurrency=1,
                             cache=False)
    assert len(srv.posts) == 4  # the first item's three tries, the second's one
    assert got == [None, 1.0]  # not 0: the registry leaves it out of the component's mean
    assert metrics["http/failed"] == 1
    err = capsys.readouterr().err
    assert "'s0'" in err and "'s1'" not in err and srv.url in err and "HTTP 500" in err and "3 tries" in err


def test_answers_are_cached_per_sample_and_completion(tmp_path):
    from rewards.remote import set_run_dir

    set_run_dir(tmp_path)
    with RewardServer() as srv:
        first, _ = score(["aa", "bbb", "aa"], url=srv.url, ids=["s0", "s1", "s0"])
        assert srv.items == 2  # the same sample's repeated completion asked once
        again, metrics = score(["aa", "bbb"], url=srv.url)
        assert again == first[:2] and srv.items == 2 and metrics["http/cached"] == 2
    assert list((tmp_path / "reward_cache").glob("http-*.rank0.jsonl"))


VIDEOS = [[{"type": "video", "path": "/data/a.mp4"}], [{"type": "video", "path": "/data/b.mp4"}]]


def test_one_question_over_two_videos_gets_each_samples_score_fresh_and_from_the_cache(tmp_path):
    """The same question text, reference and completion over two videos are two items: a server that scores by
    ``id`` gives each its own score, and the run folder's cache keeps them apart for a resumed run."""
    from rewards.remote import set_run_dir

    set_run_dir(tmp_path)
    by_id = {"a": 1.0, "b": 0.0}
    with RewardServer(by_id=by_id) as srv:
        got, _ = score(["red", "red"], url=srv.url, ids=["a", "b"], media=VIDEOS)
        assert got == [1.0, 0.0] and srv.items == 2
        assert [it["media"] for it in srv.posts[0]] == VIDEOS  # the server sees each sample's video
        set_run_dir(tmp_path)  # a resumed run: the answers read back from the folder's cache
        again, metrics = score(["red", "red"], url=srv.url, ids=["a", "b"], media=VIDEOS)
        assert again == [1.0, 0.0] and srv.items == 2 and metrics["http/cached"] == 2


def test_without_a_cache_nothing_is_merged(tmp_path):
    from rewards.remote import set_run_dir

    set_run_dir(tmp_path)
    with RewardServer() as srv:
        got, metrics = score(["aa", "aa", "aa"], url=srv.url, ids=["s0", "s0", "s1"], cache=False)
    assert got == [1.0, 1.0, 1.0] and srv.items == 3 and metrics["http/asked"] == 1
    assert not (tmp_path / "reward_cache").exists()


def test_retries_wait_what_the_service_asks_else_a_jittered_backoff():
    import random

    from rewards.remote import Failed, ServiceSettings, retry_after_s, with_retries

    settings = ServiceSettings(url="http://127.0.0.1:1/", retries=3, backoff_s=1.0)
    answers = iter([Failed("HTTP 429", retry=True, retry_after=7.0), Failed("HTTP 503", retry=True),
                    Failed("timed out", retry=True), "ok"])

    def call():
        a = next(answers)
        if isinstance(a, Failed):
            raise a
        return a

    waits: list[float] = []
    assert with_retries(call, settings, sleep=waits.append) == ("ok", 4)
    assert waits[0] == 7.0  # Retry-After, not the backoff
    assert 1.0 <= waits[1] <= 3.0 and 2.0 <= waits[2] <= 6.0  # 2 s and 4 s, each within half to one and a half
    from rewards.remote import retry_wait

    draws = {retry_wait(Failed("x", retry=True), 1.0, random.Random(seed)) for seed in range(8)}
    assert len(draws) == 8 and all(0.5 <= d <= 1.5 for d in draws)  # ranks do not retry in lock-step
    assert retry_after_s("12") == 12.0 and retry_after_s(None) is None and retry_after_s("soon") is None
    assert retry_wait(Failed("x", retry=True, retry_after=1e6), 1.0, random.Random(0)) == 300.0


def test_a_429_from_the_server_carries_its_retry_after_and_is_retried():
    from rewards.remote import Failed, post_json

    with RewardServer(fail=(1,)) as srv:
        srv.status, srv.retry_after = 429, "0"
        with pytest.raises(Failed) as failed:
            post_json(srv.url, {"items": []}, timeout=5)
        assert failed.value.retry and failed.value.retry_after == 0.0  # read from the real response's header
        got, _ = score(["abc"], url=srv.url, backoff_s=30.0, cache=False)  # waits the 0 s asked, not 30
    assert got == [0.0] and len(srv.posts) == 2


def test_bad_settings_name_the_key():
    from mmrl_common.errors import ConfigError
    from rewards.remote import preflight_rewards

    with pytest.raises(ConfigError, match=r"rewards\[0\]\.kwargs\.url"):
        preflight_rewards([{"name": "http", "kwargs": {"url": "localhost:80"}}], None)
    with pytest.raises(ConfigError, match=r"rewards\[1\]\.kwargs\.batch_size"):
        preflight_rewards(["format", {"name": "http", "kwargs": {"url": "http://127.0.0.1:1/", "batch_size": 0}}],
                          None)


def test_a_stopped_server_stops_train_before_the_model_loads(tmp_path, capsys, module_cache):  # noqa: F811
    from mmrl.run.lock import run_contents

    url = f"http://127.0.0.1:{free_port()}/score"
    rc, _, err = run_cli(capsys, "train", "--quiet", "--out", str(tmp_path / "run"), *TINY_RUN,
                           f"rewards=[{{name: format}}, {{name: http, kwargs: {{url: '{url}', retries: 1, backoff_s: 0.01}}}}]")
    assert rc != 0
    lines = [ln for ln in err.splitlines() if "cannot reach" in ln]
    assert len(lines) == 1 and url in lines[0] and "start the service" in lines[0] and "rewards[1].kwargs.url" in lines[0]
    assert "Traceback" not in err
    assert run_contents(tmp_path / "run") == []  # nothing written: the same command runs once the server is up


@pytest.mark.slow
def test_train_with_a_reward_server_retries_and_a_resume_asks_nothing_cached(tmp_path, capsys, module_cache):  # noqa: F811
    run = tmp_path / "run"
    with RewardServer(fail=(2,)) as srv:
        rewards = f"rewards=[{{name: format}}, {{name: http, kwargs: {{url: '{srv.url}', batch_size: 3, backoff_s: 0.01}}}}]"
        rows = tiny_runs.stop_after(run, 2, rewards)  # step 2's rewards asked, its row and checkpoint not written
        assert [r["step"] for r in rows] == [1]
        assert rows[0]["reward_metric/http/failed"] == 0  # the planted 500 (the second request) was retried
        assert rows[0]["reward_metric/http/asked"] >= 3 and "reward/http" in rows[0]
        asked = len(srv.posts)

        rc, _, err = run_cli(capsys, "train", "--quiet", "--out", str(run), "--resume")
        assert rc == 0, err
        assert len(srv.posts) == asked  # step 2, redone from checkpoint-1, found every answer in the cache
        again = rl_rows(run)
        assert [r["step"] for r in again] == [1, 2]
        assert again[-1]["reward_metric/http/asked"] == 0 and again[-1]["reward_metric/http/cached"] == 8
        assert again[-1]["reward_metric/http/failed"] == 0


@pytest.mark.slow
def test_a_run_scores_each_sample_by_its_id_though_question_and_answers_are_equal(tmp_path, capsys, module_cache):  # noqa: F811
    """Two samples with the same question and reference over two video files (one video's bytes, so that the
    greedy policy answers both alike): a server that scores by ``id`` gives every rollout of ``a`` 1 and of ``b``
    0, in a fresh run and in the step a ``--resume`` redoes from the cache."""
    import shutil

    from data_pipelines.toy import ensure_toy

    toy = ensure_toy(seed=0, size={"train": 4, "val": 2, "test": 2}, tasks=["color"], progress=False)
    first = json.loads((toy / "train.jsonl").read_text().splitlines()[0])
    video = toy / first["media"][0]["path"]
    records = []
    for sid in ("a", "b"):
        shutil.copy(video, tmp_path / f"{sid}.mp4")
        records.append({"id": sid, "problem_type": "free_form", "question": "What colour is the square?",
                        "answer": "red", "media": [{"type": "video", "path": f"{sid}.mp4"}]})
    data = tmp_path / "data.jsonl"
    data.write_text("".join(json.dumps(r) + "\n" for r in records))
    run = tmp_path / "run"
    with RewardServer(by_id={"a": 1.0, "b": 0.0}) as srv:
        rewards = f"rewards=[{{name: http, kwargs: {{url: '{srv.url}'}}}}]"
        overrides = [rewards, f"data.train={data}", f"data.test={data}", "rollout.top_k=1", "train.log_rollouts=8"]
        tiny_runs.stop_after(run, 2, *overrides)
        rc, _, err = run_cli(capsys, "train", "--quiet", "--out", str(run), "--resume")
        assert rc == 0, err
        asked = [it["id"] for post in srv.posts for it in post]
    rows = [json.loads(line) for line in (run / "rollouts.jsonl").read_text().splitlines()]
    assert {r["step"] for r in rows} == {1, 2} and {r["id"] for r in rows} == {"a", "b"}
    completions = {(r["id"], "\n".join(r["turns"])) for r in rows}
    assert {c for _, c in completions if _ == "a"} & {c for _, c in completions if _ == "b"}  # the same answers
    assert all(r["rewards"]["http"] == {"a": 1.0, "b": 0.0}[r["id"]] for r in rows)
    assert set(asked) == {"a", "b"}
