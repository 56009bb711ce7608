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

    def __init__(self, fail: tuple[int, ...] = ()):
        self.posts: list[list[dict]] = []
        self.fail = set(fail)
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
                    self.send_response(500)
                    self.end_headers()
                    self.wfile.write(b"planted failure")
                    return
                scores = [None if it["problem_type"] == "skip" else (len(it["completion"]) % 3) / 2
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
    cols = {"id": [f"s{i}" for i in range(n)], "question": ["q"] * n, "answer": ["a"] * n,
            "problem_type": kwargs.pop("problem_type", ["free_form"] * n), "options": [[]] * n,
            "log_metric": metrics.__setitem__}
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


def test_answers_are_cached_per_question_and_completion(tmp_path):
    from rewards.remote import set_run_dir

    set_run_dir(tmp_path)
    with RewardServer() as srv:
        first, _ = score(["aa", "bbb", "aa"], url=srv.url)
        assert srv.items == 2  # the repeated completion asked once
        again, metrics = score(["aa", "bbb"], url=srv.url)
        assert again == first[:2] and srv.items == 2 and metrics["http/cached"] == 2
    assert list((tmp_path / "reward_cache").glob("http-*.rank0.jsonl"))


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
