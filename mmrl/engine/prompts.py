"""Prompts: a sample becomes chat messages with its media and its question (by the run's ``prompt.template``,
:mod:`mmrl.config.prompt_templates`), and those become the policy's token sequence."""

from __future__ import annotations

import dataclasses
import string
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from mmrl.config.prompt_templates import resolve_template, template_instruction
from mmrl_common.errors import ConfigError

if TYPE_CHECKING:
    from mmrl.config import PromptConfig
    from mmrl.engine.media import MediaPreparer
    from mmrl.model import MediaInput, Policy, TokenSeq


def format_options(options: list[str] | None) -> str:
    if not options:
        return ""
    letters = string.ascii_uppercase
    return "Options:\n" + "".join(f"{letters[i]}. {text}\n" for i, text in enumerate(options))


def user_text(sample: Any, cfg: PromptConfig, options: list[str] | None = None) -> str:
    template = resolve_template(cfg.template)
    opts = sample.options if options is None else options
    try:
        return template.format(question=sample.question.strip(), options=format_options(opts),
                               instruction=template_instruction(cfg.template, sample.problem_type,
                                                                   cfg.answer_format))
    except (KeyError, IndexError) as exc:
        raise ConfigError(f"prompt.template: unknown field {exc} (use {{question}}, {{options}}, "
                          "{{instruction}})") from exc


def build_messages(sample: Any, cfg: PromptConfig, media_kinds: list[str] | list[dict[str, Any]],
                   options: list[str] | None = None) -> list[dict[str, Any]]:
    """Chat messages for one sample: media first, then the question (the Qwen-VL convention). ``media_kinds``:
    ``"image"``/``"video"`` per item, or content parts as :func:`media_parts` gives them."""
    content: list[dict[str, Any]] = [k if isinstance(k, dict) else {"type": k} for k in media_kinds]
    content.append({"type": "text", "text": user_text(sample, cfg, options)})
    messages: list[dict[str, Any]] = []
    if cfg.system:
        messages.append({"role": "system", "content": [{"type": "text", "text": cfg.system}]})
    messages.append({"role": "user", "content": content})
    return messages


def frame_label(number: int, seconds: float) -> str:
    """The label before frame ``number`` (1-based) in the ``frames`` layout."""
    return f"Frame {number} @ {seconds:.1f}s:"


def media_parts(media: Sequence[MediaInput]) -> tuple[list[dict[str, Any]], list[MediaInput]]:
    """Content parts and the items the processor gets, in order: a ``frames``-layout video becomes, per frame,
    its label and a one-frame video (key ``<video key>|frame<k>``); every other item stays one part."""
    parts: list[dict[str, Any]] = []
    items: list[MediaInput] = []
    for m in media:
        if m.kind != "video" or m.layout != "frames":
            parts.append({"type": m.kind})
            items.append(m)
            continue
        for k, t in enumerate(m.data.timestamps):
            parts += [{"type": "text", "text": frame_label(k + 1, float(t))}, {"type": "video"}]
            items.append(dataclasses.replace(m, key=f"{m.key}|frame{k}", data=m.data.frame(k), timestamps=[float(t)],
                                             layout="video"))
    return parts, items


def with_layout(media: Sequence[MediaInput], layout: str) -> list[MediaInput]:
    """``media`` with every video marked for ``layout`` (``prompt.video_layout``)."""
    return [dataclasses.replace(m, layout=layout) if m.kind == "video" and m.layout != layout else m for m in media]


def encode_prompt(policy: Policy, preparer: MediaPreparer, sample: Any, prompt: PromptConfig,
                  options: list[str] | None = None) -> tuple[TokenSeq, list[Any]]:
    """A sample's prompt tokens and its decoded media (the one place prompts are built). The media come back
    marked with ``prompt.video_layout`` (an environment shows new frames the same way)."""
    media = with_layout(preparer.prepare(sample), prompt.video_layout)
    parts, items = media_parts(media)
    messages = build_messages(sample, prompt, parts, options=options)
    return policy.encode(policy.render(messages), items), media
