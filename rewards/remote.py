"""Rewards computed by a service over HTTP: the user's own reward server (``http``), and the client that the
judge reward (:mod:`rewards.judge`) shares with it.

``http`` posts the samples of a step to ``url`` in batches, one JSON request per batch::

    POST url  {"items": [{"id", "question", "options", "completion", "answer", "problem_type", "media"}, ...]}
    -> [0.5, 1.0, null, ...]                (or {"scores": [...]}: one number, or null, per item, in order)

``media``: the sample's images and videos, ``[{"type": "image" | "video", "path": "/abs/clip.mp4"}, ...]`` (the
files as the data names them; a server on the same machine reads them).

``null`` is "not applicable" (the registry's convention: the sample's total gets nothing from this reward and
the component's mean leaves it out). In a config::

    rewards:
      - {name: http, kwargs: {url: "http://127.0.0.1:8000/score", timeout_s: 30, retries: 3,
                              batch_size: 16, concurrency: 4, cache: true}}

What every service reward shares (:class:`ServiceClient`, one place for it):

* **batches and concurrency**: the items a call has not cached go out ``batch_size`` at a time, up to
  ``concurrency`` requests at once (threads).
* **retries**: a connection error, a timeout, an HTTP 5xx or 429 is retried ``retries`` times, waiting
  ``backoff_s`` seconds, doubling each time, each wait drawn between half and one and a half of that (so the
  ranks of a run do not retry in lock-step), or what the service's ``Retry-After`` header asks (seconds, up to
  :data:`MAX_RETRY_AFTER_S`). Other HTTP errors are not retried.
* **failures are named and counted, never scored 0**: after its retries a failed item is scored None (not
  applicable), one line on stderr names its sample ids, the url and the error, and the reward logs
  ``reward_metric/<reward>/failed`` (with ``asked``: requests sent, ``cached``: items answered from the cache).
* **cache**: each answer is kept per sample and text (the sample's id, its media, question, options,
  reference answer and the completion: two samples with the same question over different videos are two items)
  in the run folder,
  ``reward_cache/<reward>-<digest of the service settings>.rank<R>.jsonl`` (one JSON line an answer, written as
  it comes), so a resumed run (``--resume``, same folder) asks again nothing it was answered. ``cache: false``
  turns it off and merges nothing: every item is sent, even one equal to another of the same call. Outside a run
  (no run folder) answers are cached in memory only.
* **pre-flight**: before the model loads, ``mmrl train`` calls :func:`preflight_rewards`: the settings are
  checked (a ConfigError naming ``rewards[i].kwargs.<key>``) and the service reached; a service that cannot be
  reached stops the run with one line (the url, the error, what to do).
"""

from __future__ import annotations

import hashlib
import json
import os
import random
import sys
import threading
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from mmrl_common.errors import ConfigError, MmrlError
from rewards.registry import normalize_completions, register_reward

__all__ = ["Failed", "ServiceClient", "ServiceSettings", "http_reward", "post_json", "preflight_rewards",
           "reward_items", "set_run_dir"]

CACHE_DIR = "reward_cache"
MAX_RETRY_AFTER_S = 300.0
"""The longest wait a service's ``Retry-After`` header may ask for before a retry."""
_RUN_DIR: list[Path | None] = [None]  # the run folder of the run in this process (set by preflight_rewards)
_LOCK = threading.Lock()


def set_run_dir(run_dir: Path | None) -> None:
    """The run folder whose ``reward_cache/`` service rewards read and write (None: memory only); the answers
    held in memory are dropped, so a run (a resumed one too) reads its folder's cache from disk."""
    with _LOCK:
        _RUN_DIR[0] = None if run_dir is None else Path(run_dir)
        _CACHES.clear()


# --------------------------------------------------------------------------------------------------------
# Settings
# --------------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class ServiceSettings:
    """How a service reward talks to its service (the keys of its ``kwargs``)."""

    url: str
    timeout_s: float = 30.0
    retries: int = 3
    backoff_s: float = 0.5
    batch_size: int = 16
    concurrency: int = 4
    cache: bool = True

    KEYS = ("timeout_s", "retries", "backoff_s", "batch_size", "concurrency", "cache")

    @classmethod
    def from_kwargs(cls, kwargs: Mapping[str, Any], *, url_key: str, where: str,
                    defaults: Mapping[str, Any] | None = None) -> ServiceSettings:
        """The settings from a reward's kwargs, each checked (a ConfigError names ``where.kwargs.<key>``)."""
        given = {**(defaults or {}), **{k: kwargs[k] for k in cls.KEYS if k in kwargs}}
        url = kwargs.get(url_key)
        if not isinstance(url, str) or not url.strip():
            raise ConfigError(f"{where}.kwargs.{url_key}: the service's address is required, e.g. "
                              f"{url_key}: http://127.0.0.1:8000{'/v1' if url_key == 'base_url' else '/score'}")
        parsed = urllib.parse.urlparse(url.strip())
        if parsed.scheme not in ("http", "https") or not parsed.hostname:
            raise ConfigError(f"{where}.kwargs.{url_key}: {url!r} is not an http(s) address "
                              f"(e.g. http://127.0.0.1:8000/score)")

        def number(key: str, kind: type, low: float) -> Any:
            v = given.get(key, getattr(cls, key))
            if isinstance(v, bool) or not isinstance(v, (int, float)) or (kind is int and int(v) != v) or v < low:
                raise ConfigError(f"{where}.kwargs.{key}: {v!r} must be {'an integer' if kind is int else 'a number'}"
                                  f" >= {low}")
            return kind(v)

        cache = given.get("cache", True)
        if not isinstance(cache, bool):
            raise ConfigError(f"{where}.kwargs.cache: {cache!r} must be true or false")
        timeout = number("timeout_s", float, 0.001)
        return cls(url=url.strip(), timeout_s=timeout, retries=number("retries", int, 0),
                   backoff_s=number("backoff_s", float, 0.0), batch_size=number("batch_size", int, 1),
                   concurrency=number("concurrency", int, 1), cache=cache)


# --------------------------------------------------------------------------------------------------------
# HTTP
# --------------------------------------------------------------------------------------------------------


class Failed(Exception):
    """A request that failed; ``retry``: worth asking again (connection error, timeout, 5xx, 429);
    ``retry_after``: the seconds the service asked to wait (its ``Retry-After`` header), None when it did not."""

    def __init__(self, message: str, *, retry: bool, retry_after: float | None = None):
        super().__init__(message)
        self.retry = retry
        self.retry_after = retry_after


def retry_after_s(value: str | None) -> float | None:
    """A ``Retry-After`` header's wait in seconds (delay-seconds or an HTTP date), None when absent or unreadable."""
    if not value:
        return None
    value = value.strip()
    if value.isdigit():
        return float(value)
    from email.utils import parsedate_to_datetime

    try:
        when = parsedate_to_datetime(value)
    except (TypeError, ValueError):
        return None
    return max(0.0, when.timestamp() - time.time())


def _request(url: str, *, data: Any = None, headers: Mapping[str, str] | None = None, timeout: float) -> Any:
    """The JSON a GET (``data`` None) or a JSON POST returns; :class:`Failed` on any error."""
    body = None if data is None else json.dumps(data).encode()
    req = urllib.request.Request(url, data=body, method="GET" if data is None else "POST",
                                 headers={"Content-Type": "application/json", "Accept": "application/json",
                                          **(headers or {})})
    try:
        with urllib.request.urlopen(req, timeout=timeout) as resp:  # http(s): checked in the settings
            raw = resp.read()
    except urllib.error.HTTPError as exc:
        detail = exc.read()[:200].decode(errors="replace").strip()
        raise Failed(f"HTTP {exc.code} {exc.reason}" + (f": {detail}" if detail else ""),
                     retry=exc.code >= 500 or exc.code == 429,
                     retry_after=retry_after_s(exc.headers.get("Retry-After") if exc.headers else None)) from None
    except (urllib.error.URLError, TimeoutError, ConnectionError, OSError) as exc:
        reason = getattr(exc, "reason", exc)
        raise Failed(f"{type(reason).__name__}: {reason}" if not isinstance(reason, str) else reason,
                     retry=True) from None
    try:
        return json.loads(raw)
    except ValueError:
        raise Failed(f"the answer is not JSON: {raw[:120]!r}", retry=False) from None


def post_json(url: str, data: Any, *, timeout: float, headers: Mapping[str, str] | None = None) -> Any:
    """POST ``data`` as JSON to ``url``; the decoded answer (:class:`Failed` on error)."""
    return _request(url, data=data, headers=headers, timeout=timeout)


def get_json(url: str, *, timeout: float, headers: Mapping[str, str] | None = None) -> Any:
    return _request(url, headers=headers, timeout=timeout)


def retry_wait(failure: Failed, backoff: float, rng: random.Random) -> float:
    """The seconds to wait before the next try: what the service asked (``Retry-After``, at most
    :data:`MAX_RETRY_AFTER_S`), else ``backoff`` with jitter (between half and one and a half of it)."""
    if failure.retry_after is not None:
        return min(failure.retry_after, MAX_RETRY_AFTER_S)
    return backoff * rng.uniform(0.5, 1.5)


_JITTER = random.Random()  # seeded by the system: the ranks of a run draw different waits


def with_retries(call: Callable[[], Any], settings: ServiceSettings,
                 sleep: Callable[[float], Any] = time.sleep) -> tuple[Any, int]:
    """``call()`` retried on :class:`Failed` with ``retry`` set, waiting :func:`retry_wait` between tries;
    (its result, requests sent). Raises the last :class:`Failed` (its message says how many tries)."""
    backoff = settings.backoff_s
    for attempt in range(settings.retries + 1):
        try:
            return call(), attempt + 1
        except Failed as exc:
            if not exc.retry or attempt == settings.retries:
                exc.tries = attempt + 1  # type: ignore[attr-defined]
                raise
            sleep(retry_wait(exc, backoff, _JITTER))
        backoff *= 2
    raise AssertionError("unreachable")


def reach(url: str, settings: ServiceSettings, *, reward: str, setting: str) -> None:
    """Open a connection to ``url``'s host and port (retried like a request); MmrlError with one line when it
    cannot be reached."""
    import socket

    parsed = urllib.parse.urlparse(url)
    port = parsed.port or (443 if parsed.scheme == "https" else 80)

    def connect() -> None:
        try:
            socket.create_connection((parsed.hostname, port), timeout=settings.timeout_s).close()
        except OSError as exc:
            raise Failed(f"{type(exc).__name__}: {exc}", retry=True) from None

    try:
        with_retries(connect, settings)
    except Failed as exc:
        raise MmrlError(f"reward {reward!r}: cannot reach {url} ({exc}; {settings.retries + 1} tries): start the "
                        f"service, or set {setting} to the address it listens on") from None


# --------------------------------------------------------------------------------------------------------
# The shared client: cache, batches, concurrency, retries, failures
# --------------------------------------------------------------------------------------------------------


def reward_items(completions: Sequence[Any], columns: Mapping[str, Any]) -> list[dict[str, Any]]:
    """One JSON-ready item per completion: ``id``, ``question``, ``options``, ``completion``, ``answer``,
    ``problem_type`` and ``media`` (the sample's images and videos: ``[{"type", "path"}, ...]``)."""
    texts = normalize_completions(completions)
    n = len(texts)

    def col(key: str) -> list[Any]:
        v = columns.get(key)
        return list(v) if isinstance(v, (list, tuple)) and len(v) == n else [None] * n

    ids, questions, options, answers, types, media = (col(k) for k in ("id", "question", "options", "answer",
                                                                        "problem_type", "media"))
    return [{"id": ids[i], "question": questions[i], "options": options[i], "completion": texts[i],
             "answer": answers[i], "problem_type": types[i], "media": list(media[i] or [])} for i in range(n)]


ITEM_KEY_FIELDS = ("id", "media", "question", "options", "answer", "problem_type", "completion")
"""What an item's cache key is made of: the sample (its id and media), its text and the completion. A service
may score by any of them (a reward server by ``id``, a judge by the video), so items that differ in one are
never merged."""


def item_key(item: Mapping[str, Any]) -> str:
    """The cache key of an item (:data:`ITEM_KEY_FIELDS`)."""
    text = json.dumps([item.get(k) for k in ITEM_KEY_FIELDS], sort_keys=True, default=str, ensure_ascii=False)
    return hashlib.sha256(text.encode()).hexdigest()


class DiskCache:
    """Answers by item key, read from every ``<stem>.rank*.jsonl`` in a folder and appended to this rank's."""

    def __init__(self, folder: Path | None, stem: str):
        self.path = None if folder is None else folder / f"{stem}.rank{int(os.environ.get('RANK', '0'))}.jsonl"
        self.values: dict[str, Any] = {}
        if folder is not None and folder.is_dir():
            for p in sorted(folder.glob(f"{stem}.rank*.jsonl")):
                for line in p.read_text().splitlines():
                    try:
                        row = json.loads(line)
                        self.values[row["key"]] = row["value"]
                    except (ValueError, KeyError, TypeError):
                        continue  # a line cut short by a crash: asked again

    def put(self, pairs: list[tuple[str, Any]]) -> None:
        with _LOCK:
            for k, v in pairs:
                self.values[k] = v
            if self.path is not None and pairs:
                self.path.parent.mkdir(parents=True, exist_ok=True)
                with self.path.open("a") as f:
                    f.write("".join(json.dumps({"key": k, "value": v}) + "\n" for k, v in pairs))


_CACHES: dict[tuple[Path | None, str], DiskCache] = {}


def cache_for(name: str, identity: Mapping[str, Any]) -> DiskCache:
    """The cache of reward ``name`` with these service settings in the current run folder."""
    digest = hashlib.sha256(json.dumps(identity, sort_keys=True, default=str).encode()).hexdigest()[:12]
    folder = None if _RUN_DIR[0] is None else _RUN_DIR[0] / CACHE_DIR
    key = (folder, f"{name}-{digest}")
    with _LOCK:
        if key not in _CACHES:
            _CACHES[key] = DiskCache(folder, key[1])
        return _CACHES[key]


class ServiceClient:
    """Scores items through ``ask(batch) -> list of answers`` (one request per batch), with the settings' batches,
    concurrency, retries and cache. ``score(answer) -> float | None`` turns a (cached) answer into the reward;
    it raises :class:`Failed` for an answer that cannot be read (the item fails, is named and counted)."""

    def __init__(self, name: str, settings: ServiceSettings, identity: Mapping[str, Any],
                 ask: Callable[[list[dict[str, Any]]], list[Any]],
                 score: Callable[[Any], float | None] = lambda v: v):
        self.name, self.settings, self.ask, self.to_score = name, settings, ask, score
        self.identity = dict(identity)

    def _ask_batch(self, batch: list[dict[str, Any]]) -> tuple[list[Any] | None, str | None, int]:
        def once() -> list[Any]:
            answers = self.ask(batch)
            if not isinstance(answers, list) or len(answers) != len(batch):
                got = f"{len(answers)} answers" if isinstance(answers, list) else type(answers).__name__
                raise Failed(f"the service answered {got} for {len(batch)} items (expected a list of "
                             f"{len(batch)})", retry=False)
            return answers

        try:
            answers, sent = with_retries(once, self.settings)
            return answers, None, sent
        except Failed as exc:
            tries = getattr(exc, "tries", 1)
            return None, f"{exc} ({tries} {'try' if tries == 1 else 'tries'})", tries

    def __call__(self, items: list[dict[str, Any]], log_metric: Callable[[str, float], Any] | None = None
                 ) -> list[float | None]:
        cache = cache_for(self.name, self.identity) if self.settings.cache else None
        # without a cache nothing is merged: each item its own key, asked on its own
        keys = [item_key(it) if cache is not None else f"{i}:{item_key(it)}" for i, it in enumerate(items)]
        todo: dict[str, dict[str, Any]] = {}
        for k, it in zip(keys, items):
            if (cache is None or k not in cache.values) and k not in todo:
                todo[k] = it
        pending = list(todo.items())
        batches = [pending[i:i + self.settings.batch_size] for i in range(0, len(pending), self.settings.batch_size)]
        answers: dict[str, Any] = {}
        errors: dict[str, str] = {}
        sent = 0
        if batches:
            with ThreadPoolExecutor(max_workers=min(self.settings.concurrency, len(batches))) as pool:
                results = list(pool.map(lambda b: self._ask_batch([it for _, it in b]), batches))
            for batch, (got, error, n) in zip(batches, results):
                sent += n
                if got is None:
                    for k, _ in batch:
                        errors[k] = error or "no answer"
                    continue
                pairs = list(zip([k for k, _ in batch], got))
                answers.update(pairs)
                if cache is not None:
                    cache.put(pairs)
        out: list[float | None] = []
        failed: dict[str, list[Any]] = {}
        for k, it in zip(keys, items):
            if k in errors:
                failed.setdefault(errors[k], []).append(it["id"])
                out.append(None)
                continue
            value = answers[k] if k in answers else cache.values[k]  # type: ignore[union-attr]
            try:
                out.append(self.to_score(value))
            except Failed as exc:
                failed.setdefault(str(exc), []).append(it["id"])
                out.append(None)
        for error, ids in failed.items():
            print(f"reward {self.name!r}: no score for sample id(s) {', '.join(map(repr, ids))} from "
                  f"{self.settings.url}: {error}; scored None (not applicable), counted in "
                  f"reward_metric/{self.name}/failed", file=sys.stderr, flush=True)
        if log_metric is not None:
            log_metric(f"{self.name}/failed", float(sum(len(v) for v in failed.values())))
            log_metric(f"{self.name}/asked", float(sent))
            log_metric(f"{self.name}/cached", float(sum(1 for k in keys if k not in todo)))
        return out


# --------------------------------------------------------------------------------------------------------
# The user's reward server
# --------------------------------------------------------------------------------------------------------


def _server_scores(answer: Any) -> Any:
    if isinstance(answer, Mapping) and "scores" in answer:
        return answer["scores"]
    return answer


def _number(value: Any) -> float | None:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise Failed(f"the service's score {value!r} is not a number or null", retry=False)
    return float(value)


def _http_settings(kwargs: Mapping[str, Any], where: str = "reward 'http'") -> ServiceSettings:
    unknown = sorted(set(kwargs) - {"url", *ServiceSettings.KEYS})
    if unknown:
        raise ConfigError(f"{where}.kwargs: unknown key(s) {unknown} of reward 'http'; its keys: url, "
                          f"{', '.join(ServiceSettings.KEYS)}")
    return ServiceSettings.from_kwargs(kwargs, url_key="url", where=where)


def _settings_kwargs(columns: Mapping[str, Any], keys: Sequence[str]) -> dict[str, Any]:
    return {k: columns[k] for k in keys if k in columns}


@register_reward("http", locate_errors=False)
def http_reward(completions: list[Any], **columns: Any) -> list[float | None]:
    """Scores from the user's HTTP reward server (see the module's docstring)."""
    settings = _http_settings(_settings_kwargs(columns, ("url", *ServiceSettings.KEYS)))

    def ask(batch: list[dict[str, Any]]) -> list[Any]:
        return _server_scores(post_json(settings.url, {"items": batch}, timeout=settings.timeout_s))

    client = ServiceClient("http", settings, {"url": settings.url}, ask, _number)
    return client(reward_items(completions, columns), columns.get("log_metric"))


def _http_preflight(kwargs: Mapping[str, Any], *, where: str) -> None:
    settings = _http_settings(kwargs, where)
    reach(settings.url, settings, reward="http", setting=f"{where}.kwargs.url")


http_reward.preflight = _http_preflight  # type: ignore[attr-defined]


# --------------------------------------------------------------------------------------------------------
# Pre-flight
# --------------------------------------------------------------------------------------------------------


def preflight_rewards(specs: Sequence[Any], run_dir: Path | None) -> None:
    """Before the model loads: the run folder whose cache service rewards use, and every configured reward
    that has a ``preflight(kwargs, where=...)`` (``http``, ``judge``) checked: settings, and the service
    reached. A failure stops the run with one line."""
    from rewards.registry import RewardSpec, resolve_reward

    set_run_dir(run_dir)
    for i, spec in enumerate(specs):
        spec = RewardSpec.parse(spec, f"rewards[{i}]")
        if not isinstance(spec.name, str):
            continue
        fn, _ = resolve_reward(spec.name, where=f"rewards[{i}]")
        check = getattr(fn, "preflight", None)
        if callable(check):
            check(dict(spec.kwargs), where=f"rewards[{i}]")
