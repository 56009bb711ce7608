"""A judge model's verdict as the reward (``judge``), asked through an OpenAI-compatible chat-completions
endpoint: what ``vllm serve`` and hosted providers expose.

::

    rewards:
      - {name: judge, kwargs: {base_url: "http://127.0.0.1:8000/v1", model: Qwen/Qwen2.5-7B-Instruct,
                               api_key_env: JUDGE_API_KEY, max_tokens: 256, concurrency: 8}}

Each completion is one request, ``POST {base_url}/chat/completions`` with ``{"model", "messages": [{"role":
"user", "content": prompt}], "temperature": 0, "max_tokens"}`` (``Authorization: Bearer $<api_key_env>`` when
``api_key_env`` names an environment variable; ``system`` adds a system message; ``extra_body`` adds fields,
e.g. vLLM's ``{structured_outputs: {regex: "Score: [01]"}}``). The prompt is the template of
the sample's problem type (:data:`TEMPLATES`: ``open``, ``free_form``, and ``default`` for every other type),
with ``{question}``, ``{options}``, ``{answer}`` (the reference) and ``{completion}`` (the policy's whole
answer) filled in; ``templates: {open: "...", default: "..."}`` replaces any of them.

**What the judge sees of the sample** (``send_media``): ``none`` (default: a text-only judge, the prompt alone)
or ``images``: each image of the sample and ``media_frames`` frames of each video (default 4, evenly spaced over
the whole video), each at most ``media_max_side`` pixels on its longer side (default 448), sent before the prompt as the
OpenAI-style ``image_url`` parts (JPEG data URLs) that ``vllm serve`` takes for a vision-language model
(``--limit-mm-per-prompt '{"image": N}'``). A file that cannot be read fails that item (named, counted, None).

**The score rule**: the *last* ``Score: N`` in the judge's reply (case-insensitive; ``**Score:** N`` and
``Score = N`` read too), N a number from 0 to ``max_score`` (default 1), divided by ``max_score``. A reply
without one, or with N out of range, gets no score: the item is named and counted as a failure
(``reward_metric/judge/failed``) and scored None (not applicable), never 0. The default templates ask for
``Score: 1`` (correct) or ``Score: 0`` (incorrect) on the last line.

Batches (``batch_size`` items a worker asks in turn, default 1), ``concurrency`` (default 8), ``timeout_s``,
``retries``, ``backoff_s``, the cache of replies per sample and text (id, media, question, reference,
completion) in the run folder and the check before the run (the endpoint reached; the model listed by ``GET {base_url}/models`` when the endpoint
lists models) are :mod:`rewards.remote`'s, shared with the ``http`` reward.
"""

from __future__ import annotations

import base64
import io
import os
import re
from collections.abc import Mapping
from typing import Any

from mmrl_common.errors import ConfigError, MmrlError
from rewards.registry import register_reward
from rewards.remote import Failed, ServiceClient, ServiceSettings, get_json, post_json, reward_items

__all__ = ["SCORE_RULE", "TEMPLATES", "JudgeSettings", "judge_reward", "judge_settings", "parse_score"]

_INSTRUCTIONS = ("Judge whether the response answers the question correctly, taking the reference answer as "
                 "correct. Give a short reason, then on the last line write exactly 'Score: 1' if the response is "
                 "correct or 'Score: 0' if it is not.")
TEMPLATES: dict[str, str] = {
    "open": ("You are grading an answer to an open-ended question.\n\nQuestion: {question}\n\nReference answer: "
             "{answer}\n\nResponse: {completion}\n\nThe response is correct when it states the same meaning as "
             "the reference answer; wording may differ. " + _INSTRUCTIONS),
    "free_form": ("You are grading a short free-form answer.\n\nQuestion: {question}\n\nReference answer: "
                  "{answer}\n\nResponse: {completion}\n\nThe response is correct when its final answer matches "
                  "the reference answer (the same value, entity or phrase). " + _INSTRUCTIONS),
    "default": ("You are grading an answer.\n\nQuestion: {question}\n{options}\nReference answer: {answer}\n\n"
                "Response: {completion}\n\n" + _INSTRUCTIONS),
}
SCORE_RULE = ("the last 'Score: N' in the judge's reply (case-insensitive), N from 0 to max_score, divided by "
              "max_score; a reply without one is a failure (None, counted), never 0")
_SCORE = re.compile(r"score\**\s*[:=]\s*\**\s*([-+]?\d+(?:\.\d+)?)", re.IGNORECASE)
_KEYS = ("base_url", "model", "api_key_env", "temperature", "max_tokens", "max_score", "templates", "system",
         "extra_body", "send_media", "media_frames", "media_max_side")
MEDIA_MODES = ("none", "images")
DEFAULTS = {"batch_size": 1, "concurrency": 8, "timeout_s": 60.0}


def parse_score(reply: str, max_score: float = 1.0) -> float:
    """The reward in a judge's reply by :data:`SCORE_RULE`; :class:`Failed` when it has none."""
    found = _SCORE.findall(reply or "")
    if not found:
        short = " ".join((reply or "").split())
        raise Failed(f"the judge's reply has no 'Score: N' ({short[:80]!r}{'...' if len(short) > 80 else ''})",
                     retry=False)
    value = float(found[-1])
    if not 0 <= value <= max_score:
        raise Failed(f"the judge's score {found[-1]} is outside 0..{max_score:g}", retry=False)
    return value / max_score


class JudgeSettings:
    """A judge reward's kwargs, checked."""

    def __init__(self, kwargs: Mapping[str, Any], where: str = "reward 'judge'"):
        unknown = sorted(set(kwargs) - {*_KEYS, *ServiceSettings.KEYS})
        if unknown:
            raise ConfigError(f"{where}.kwargs: unknown key(s) {unknown} of reward 'judge'; its keys: "
                              f"{', '.join((*_KEYS, *ServiceSettings.KEYS))}")
        self.service = ServiceSettings.from_kwargs(kwargs, url_key="base_url", where=where, defaults=DEFAULTS)
        self.base_url = self.service.url.rstrip("/")
        self.model = kwargs.get("model")
        if not isinstance(self.model, str) or not self.model.strip():
            raise ConfigError(f"{where}.kwargs.model: the judge model's name at {self.base_url} is required "
                              "(what its /models lists, e.g. the path or name given to `vllm serve`)")
        self.api_key_env = kwargs.get("api_key_env")
        if self.api_key_env is not None and (not isinstance(self.api_key_env, str) or not self.api_key_env):
            raise ConfigError(f"{where}.kwargs.api_key_env: the name of an environment variable, got "
                              f"{self.api_key_env!r}")
        self.temperature = self._number(kwargs, "temperature", 0.0, where)
        self.max_tokens = kwargs.get("max_tokens", 256)
        if isinstance(self.max_tokens, bool) or not isinstance(self.max_tokens, int) or self.max_tokens < 1:
            raise ConfigError(f"{where}.kwargs.max_tokens: {self.max_tokens!r} must be an integer >= 1")
        self.max_score = self._number(kwargs, "max_score", 1.0, where)
        if self.max_score <= 0:
            raise ConfigError(f"{where}.kwargs.max_score: {self.max_score!r} must be > 0")
        templates = kwargs.get("templates") or {}
        if not isinstance(templates, Mapping) or not all(isinstance(v, str) and "{completion}" in v
                                                         for v in templates.values()):
            raise ConfigError(f"{where}.kwargs.templates: a mapping of problem type (open, free_form, default, or "
                              "any other type) to a prompt with {completion} (and {question}, {answer}, {options})")
        self.templates = {**TEMPLATES, **{str(k): v for k, v in templates.items()}}
        self.system = kwargs.get("system")
        if self.system is not None and not isinstance(self.system, str):
            raise ConfigError(f"{where}.kwargs.system: a string, got {self.system!r}")
        self.media = kwargs.get("send_media", "none")
        if self.media not in MEDIA_MODES:
            raise ConfigError(f"{where}.kwargs.send_media: {self.media!r} must be one of {', '.join(MEDIA_MODES)} "
                              "(images: the sample's images and frames of its videos go to a vision-language judge)")
        self.frames, self.max_side = kwargs.get("media_frames", 4), kwargs.get("media_max_side", 448)
        for key, value, low in (("media_frames", self.frames, 1), ("media_max_side", self.max_side, 28)):
            if isinstance(value, bool) or not isinstance(value, int) or value < low:
                raise ConfigError(f"{where}.kwargs.{key}: {value!r} must be an integer >= {low}")
        extra = kwargs.get("extra_body") or {}
        self.extra_body = dict(extra) if isinstance(extra, Mapping) else {}
        if not isinstance(extra, Mapping) or set(self.extra_body) & {"model", "messages"}:
            raise ConfigError(f"{where}.kwargs.extra_body: a mapping of further request fields (not model or "
                              "messages), e.g. {structured_outputs: {regex: 'Score: [01]'}} for vLLM")

    @staticmethod
    def _number(kwargs: Mapping[str, Any], key: str, default: float, where: str) -> float:
        v = kwargs.get(key, default)
        if isinstance(v, bool) or not isinstance(v, (int, float)) or v < 0:
            raise ConfigError(f"{where}.kwargs.{key}: {v!r} must be a number >= 0")
        return float(v)

    def headers(self, where: str = "reward 'judge'") -> dict[str, str]:
        if self.api_key_env is None:
            return {}
        key = os.environ.get(self.api_key_env)
        if not key:
            raise ConfigError(f"{where}.kwargs.api_key_env: the environment variable {self.api_key_env} is not "
                              "set; export it with the judge's API key")
        return {"Authorization": f"Bearer {key}"}

    def template(self, problem_type: Any) -> str:
        return self.templates.get(str(problem_type), self.templates["default"])

    def prompt(self, item: Mapping[str, Any]) -> str:
        options = item.get("options") or []
        answer = item.get("answer")
        filled = {"question": str(item.get("question") or ""),
                  "options": "".join(f"{o}\n" for o in options) if isinstance(options, (list, tuple)) else str(options),
                  "answer": ", ".join(map(str, answer)) if isinstance(answer, (list, tuple)) else str(answer),
                  "completion": str(item.get("completion") or "")}
        text = self.template(item.get("problem_type"))
        for key, value in filled.items():  # not str.format: templates and answers may hold braces (LaTeX)
            text = text.replace("{" + key + "}", value)
        return text

    def messages(self, item: Mapping[str, Any]) -> list[dict[str, Any]]:
        out = [{"role": "system", "content": self.system}] if self.system else []
        pictures = media_images(item.get("media") or [], frames=self.frames, max_side=self.max_side) \
            if self.media == "images" else []
        if not pictures:
            return [*out, {"role": "user", "content": self.prompt(item)}]
        parts = [{"type": "image_url", "image_url": {"url": url}} for url in pictures]
        return [*out, {"role": "user", "content": [*parts, {"type": "text", "text": self.prompt(item)}]}]

    def identity(self) -> dict[str, Any]:
        """What the replies depend on (the cache's name)."""
        return {"base_url": self.base_url, "model": self.model, "temperature": self.temperature,
                "max_tokens": self.max_tokens, "templates": self.templates, "system": self.system,
                "extra_body": self.extra_body, "media": [self.media, self.frames, self.max_side]}

    def describe(self) -> dict[str, Any]:
        """The judge as a report names it: endpoint, model, sampling, templates and the score rule."""
        return {"base_url": self.base_url, "model": self.model, "temperature": self.temperature,
                "max_tokens": self.max_tokens, "system": self.system, "extra_body": self.extra_body,
                "media": self.media if self.media == "none" else f"images: {self.frames} frames a video, "
                                                                 f"longer side <= {self.max_side}",
                "templates": dict(self.templates),
                "score_rule": SCORE_RULE.replace("max_score", f"max_score={self.max_score:g}")}

    def ask_one(self, item: Mapping[str, Any], headers: Mapping[str, str]) -> str:
        body = {**self.extra_body, "model": self.model, "messages": self.messages(item),
                "temperature": self.temperature, "max_tokens": self.max_tokens}
        answer = post_json(f"{self.base_url}/chat/completions", body, timeout=self.service.timeout_s,
                           headers=headers)
        try:
            content = answer["choices"][0]["message"]["content"]
        except (KeyError, IndexError, TypeError):
            raise Failed(f"not a chat-completions answer: {str(answer)[:120]!r}", retry=False) from None
        return content if isinstance(content, str) else ""

    def client(self) -> ServiceClient:
        headers = self.headers()
        return ServiceClient("judge", self.service, self.identity(),
                             lambda batch: [self.ask_one(it, headers) for it in batch],
                             lambda reply: parse_score(reply, self.max_score))


def media_images(media: list[Mapping[str, Any]], *, frames: int, max_side: int) -> list[str]:
    """What a vision-language judge sees of a sample: each image, and ``frames`` frames evenly spaced over each
    video, as JPEG data URLs at most ``max_side`` pixels on their longer side. :class:`Failed` naming a file that
    cannot be read."""
    import numpy as np
    from PIL import Image

    from mmrl_common.errors import MediaError
    from video.decoders import DEFAULT_DECODE_TIMEOUT
    from video.reader import open_video
    from vision.io import open_image, to_rgb

    out = []
    for m in media:
        path = m.get("path")
        try:
            if m.get("type") == "image":
                pictures = [to_rgb(open_image(path))]
            else:
                with open_video(path, timeout=DEFAULT_DECODE_TIMEOUT) as reader:  # a hung decoder: a Failed
                    n = reader.num_frames
                    idx = np.unique(np.linspace(0, n - 1, num=min(frames, n)).round().astype(int))
                    pictures = [Image.fromarray(f) for f in reader.get_frames(idx)]
        except (MediaError, OSError, ValueError) as exc:
            raise Failed(f"the judge cannot be shown {path}: {exc}", retry=False) from None
        for picture in pictures:
            picture = picture.convert("RGB")
            picture.thumbnail((max_side, max_side))
            buf = io.BytesIO()
            picture.save(buf, format="JPEG", quality=90)
            out.append("data:image/jpeg;base64," + base64.b64encode(buf.getvalue()).decode())
    return out


def judge_settings(kwargs: Mapping[str, Any], where: str = "reward 'judge'") -> JudgeSettings:
    return JudgeSettings(kwargs, where)


@register_reward("judge", locate_errors=False)
def judge_reward(completions: list[Any], **columns: Any) -> list[float | None]:
    """The judge model's score of each completion (see the module's docstring)."""
    settings = JudgeSettings({k: columns[k] for k in (*_KEYS, *ServiceSettings.KEYS) if k in columns})
    return settings.client()(reward_items(completions, columns), columns.get("log_metric"))


def check_judge(settings: JudgeSettings, *, setting: str) -> None:
    """The endpoint reached and, where it lists its models, the judge model among them; one line otherwise."""
    headers = settings.headers(setting.rpartition(".kwargs")[0] or "reward 'judge'")
    url = f"{settings.base_url}/models"
    try:
        from rewards.remote import with_retries

        listed, _ = with_retries(lambda: get_json(url, timeout=settings.service.timeout_s, headers=headers),
                                 settings.service)
    except Failed as exc:
        if exc.retry:
            raise MmrlError(f"reward 'judge': cannot reach {settings.base_url} ({exc}; "
                            f"{settings.service.retries + 1} tries): start the judge's server (e.g. vllm serve "
                            f"{settings.model}), or set {setting} to the address it listens on") from None
        if str(exc).startswith(("HTTP 401", "HTTP 403")):
            raise MmrlError(f"reward 'judge': {url} refused the key ({exc}): check the variable named by "
                            "kwargs.api_key_env") from None
        return  # an endpoint without /models (some providers): reached, nothing more to check
    ids = [m.get("id") for m in listed.get("data", [])] if isinstance(listed, Mapping) else []
    if ids and settings.model not in ids:
        raise ConfigError(f"{setting.rpartition('.')[0]}.model: {settings.model!r} is not served at "
                          f"{settings.base_url}; it serves {', '.join(map(repr, ids))}")


def _judge_preflight(kwargs: Mapping[str, Any], *, where: str) -> None:
    check_judge(JudgeSettings(kwargs, where), setting=f"{where}.kwargs.base_url")


judge_reward.preflight = _judge_preflight  # type: ignore[attr-defined]
