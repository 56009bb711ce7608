"""Evaluation protocols: frames, prompt and generation length per benchmark.

``official`` (the default) follows each benchmark's own evaluation code, as its
:class:`~data_pipelines.benchmarks.Benchmark` spec writes it down (``official``, ``prompt``; each benchmark's
module says where its settings come from); ``qwen`` is the setting the Qwen2.5-VL report gives for all its video
numbers (Qwen2.5-VL Technical Report, arXiv 2502.13923: at most 768 frames and 24,576 video tokens; qwen-vl-utils
sampling at 2 fps) with a direct-answer prompt; ``lmms-eval`` is what lmms-eval (0.7, HEAD 75571cf) runs for its
``qwen2_5_vl`` model with the task's own prompt and token cap (the spec's ``lmms_eval``, ``lmms_prompt``) — the
setting most Qwen2.5-VL RL papers used.

Answer extraction is the same everywhere: :func:`rewards.answers.extract_answer` then
:func:`~rewards.answers.extract_choice` / :func:`~rewards.answers.extract_yes_no` (the rewards' normaliser);
what differs per benchmark is the text it reads (MVBench: ``"(" +`` the first generated line after the
``Best option:(`` pre-fill) and which accuracy is the official one (Video-MME drops unparsed answers).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

from data_pipelines.benchmarks import benchmarks, get_benchmark
from data_pipelines.benchmarks._common import DIRECT_MC, option_lines, plain_options
from data_pipelines.benchmarks.mvbench import PREFILL as MVBENCH_PREFILL
from mmrl.config.prompt_templates import format_fields, instruction
from mmrl_common.errors import ConfigError
from mmrl_common.registry import did_you_mean

__all__ = ["MVBENCH_PREFILL", "PROTOCOLS", "TEMPLATES", "Protocol", "build_prompt", "check_template",
           "interleave_subtitles", "make_protocol", "plain_options", "shuffled_options", "subtitle_lines"]

TEMPLATES = ("official", "direct", "reasoning")
"""The built-in ``--prompt-template`` names; any other value must be a format string with ``{question}``."""


def check_template(template: str) -> str:
    """``template`` when it is a built-in name or a format string with ``{question}``; otherwise (a typo of
    a name) a :class:`ConfigError` naming the nearest name, so the typo never becomes the prompt."""
    if template in TEMPLATES:
        return template
    fields = format_fields(template) if isinstance(template, str) else None
    if fields is not None and "question" in fields:
        return template
    raise ConfigError(f"--prompt-template: unknown template {template!r}; {did_you_mean(str(template), TEMPLATES)}"
                      f"valid: {', '.join(TEMPLATES)}, or a format string with a {{question}} field (and "
                      "optionally {options}, {instruction})")

DIRECT_SHORT = "Answer the question using a single word or phrase."


@dataclass
class Protocol:
    """Everything that decides what the model sees and how long it may answer."""

    benchmark: str
    name: str = "official"
    video_policy: str = "qwen"  # segments | uniform | longvideobench | qwen
    nframes: int | None = None
    fps: float = 2.0
    max_frames: int = 768
    video_min_pixels: int = 16 * 28 * 28
    video_max_pixels: int = 768 * 28 * 28
    total_pixels: int | None = None
    image_max_pixels: int = 1280 * 28 * 28
    template: str = "official"
    max_new_tokens: int = 64
    temperature: float = 0.0  # 0: greedy; above 0 sampled (lmms-eval's MMVU task asks for 0.7)
    source: str = ""

    def settings(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    def describe(self) -> str:
        if self.video_policy == "qwen":
            frames = (f"qwen-vl-utils, {self.nframes} frames" if self.nframes
                      else f"qwen-vl-utils at {self.fps:g} fps (max {self.max_frames})")
        else:
            frames = f"{self.video_policy}, {self.nframes} frames"
        if self.video_policy == "lmms-eval":
            frames = f"lmms-eval's Qwen2.5-VL frames (2 fps decoded, {self.nframes} kept)"
        total = f", total ≤{self.total_pixels} px" if self.total_pixels else ""
        decoding = f", sampled at temperature {self.temperature:g}" if self.temperature > 0 else ", greedy"
        return (f"protocol {self.name}: frames {frames}, ≤{self.video_max_pixels} px/frame{total}, "
                f"images ≤{self.image_max_pixels} px, prompt {self.template!r}, "
                f"max_new_tokens {self.max_new_tokens}{decoding}")


PROTOCOLS = ("official", "qwen", "lmms-eval")


def make_protocol(benchmark: str, name: str = "official", *, family: str = "qwen2_5_vl", frames: int | None = None,
                  max_pixels: int | None = None, template: str | None = None,
                  max_new_tokens: int | None = None) -> Protocol:
    """The protocol for ``benchmark`` (its spec's ``official`` or ``lmms_eval`` settings, or the Qwen report's),
    with the user's overrides applied."""
    if name not in PROTOCOLS:
        raise ConfigError(f"--protocol must be one of {', '.join(PROTOCOLS)}, got {name!r}")
    spec = get_benchmark(benchmark)
    factor = 2 * (16 if family.startswith("qwen3") else 14)
    if name == "lmms-eval":
        if spec.lmms_eval is None:
            written = ", ".join(b.name for b in benchmarks() if b.lmms_eval is not None)
            raise ConfigError(f"--protocol lmms-eval is written down for {written}, not {benchmark}; "
                              "use --protocol official (or the lmms-eval bridge, --lmms-eval)")
        # lmms-eval's qwen2_5_vl model (lmms_eval/models/simple/qwen2_5_vl.py): min_pixels 256*28*28, max_pixels
        # 1,605,632 per image or frame, 32 frames kept of those qwen-vl-utils decodes at 2 fps, system prompt "You
        # are a helpful assistant."; each task's yaml sets the prompt and the token cap (tasks/<name>/*.yaml).
        f2 = factor * factor
        p = Protocol(benchmark=benchmark, name=name, video_policy="lmms-eval", nframes=32, fps=2.0, max_frames=768,
                     video_min_pixels=256 * f2, video_max_pixels=1605632, image_max_pixels=1605632,
                     template="lmms-eval", **spec.lmms_eval)
    elif name == "official" or spec.fixed_protocol:
        p = Protocol(benchmark=benchmark, name=name, **spec.official)
    else:
        # Qwen2.5-VL report: fps 2, <=768 frames, <=24,576 video tokens; qwen-vl-utils pixel defaults
        # (128..768 tokens per frame); images at the processor's default cap (16,384 tokens).
        p = Protocol(benchmark=benchmark, name="qwen", video_policy="qwen", fps=2.0, max_frames=768,
                     video_min_pixels=128 * factor * factor, video_max_pixels=768 * factor * factor,
                     total_pixels=24576 * factor * factor, image_max_pixels=16384 * factor * factor,
                     template="direct", max_new_tokens=128, source="Qwen2.5-VL report (arXiv 2502.13923)")
    if frames is not None:
        if frames < 1:
            raise ConfigError(f"--frames must be >= 1, got {frames}")
        p.nframes = frames
    if max_pixels is not None:
        if max_pixels < factor * factor:
            raise ConfigError(f"--max-pixels must be at least {factor * factor} ({factor}x{factor}), got {max_pixels}")
        p.video_max_pixels = p.image_max_pixels = max_pixels
    p.video_min_pixels = min(p.video_min_pixels, p.video_max_pixels)
    if template is not None:
        p.template = check_template(template)
        if template == "reasoning" and max_new_tokens is None:
            p.max_new_tokens = max(p.max_new_tokens, 1024)
    if max_new_tokens is not None:
        p.max_new_tokens = max_new_tokens
    return p


# ------------------------------------------------------------------------------------------------ prompts
def shuffled_options(options: list[str], perm: list[int]) -> list[str]:
    """The options shown in another order (slot ``j`` shows ``options[perm[j]]``), as a benchmark stores them:
    an option that carries its position's label (Video-MME's ``"A. …"``) gets the label of its new slot, in the
    same style; plain texts stay plain."""
    letters = "ABCDEFGHIJKLMNOPQRSTUVWXYZ"
    plain = plain_options(options)
    out = []
    for j, i in enumerate(perm):
        label = options[i][: len(options[i]) - len(plain[i])]
        out.append(label.replace(letters[i], letters[j], 1) + plain[i] if label else plain[i])
    return out


def build_prompt(sample: Any, protocol: Protocol, *, subtitles: str | None = None) -> tuple[str | None, str, str]:
    """``(system, user_text, prefill)`` for one question under ``protocol``: the benchmark's own prompt (its
    spec's ``prompt`` or ``lmms_prompt``) or one of the shared templates."""
    t = protocol.template
    q = sample.question.strip()
    opts = plain_options(sample.options)
    mc = sample.problem_type == "multiple_choice"
    if t in ("official", "lmms-eval"):
        spec = get_benchmark(protocol.benchmark)
        own = spec.prompt if t == "official" else spec.lmms_prompt
        if own is not None:
            return own(sample, subtitles)
        if t == "lmms-eval":
            raise ConfigError(f"{spec.title} has no lmms-eval prompt written down; use --protocol official")
        t = "reasoning"  # no prompt of its own (the toy world, the multiple-choice medical sets): the training one
    if t == "direct":
        if mc:
            return None, f"{q}\n{option_lines(opts, '{letter}. {text}')}\n{DIRECT_MC}", ""
        return None, f"{q}\n{DIRECT_SHORT}", ""
    if t == "reasoning":
        body = f"{q}\nOptions:\n{option_lines(opts, '{letter}. {text}')}\n" if mc else f"{q}\n"
        return None, body + instruction(sample.problem_type, "think_answer"), ""
    try:  # a format string
        text = t.format(question=q, options=option_lines(opts, "{letter}. {text}") if mc else "",
                        instruction=instruction(sample.problem_type, "answer"))
    except (KeyError, IndexError) as exc:
        raise ConfigError(f"--prompt-template: unknown field {exc}; use official, direct, reasoning or a "
                          "format string with {question}, {options}, {instruction}") from exc
    return None, text, ""


def interleave_subtitles(cues: list[tuple[float, float, str]], timestamps: list[float]) -> list[int | str]:
    """LongVideoBench's interleaved prompt (its ``_i`` protocol; ``insert_subtitles_into_frames`` in lmms-eval's
    ``tasks/longvideobench/utils.py``, after the benchmark's own ``longvideobench_dataset.py``): frame indices
    and subtitle texts in order. Before each subtitle come the frames not yet placed whose time is at most the
    subtitle's midpoint; the subtitle follows only if some frame falls strictly inside it (a cue shorter than
    1 s is widened to 1 s around its midpoint). The frames left come last."""
    out: list[int | str] = []
    nxt = 0
    for start, end, text in cues:
        mid = (start + end) / 2
        while nxt < len(timestamps) and timestamps[nxt] <= mid:
            out.append(nxt)
            nxt += 1
        if end - start < 1:
            start, end = mid - 0.5, mid + 0.5
        if any(start < t < end for t in timestamps):
            out.append(text)
    out.extend(range(nxt, len(timestamps)))
    return out


def subtitle_lines(cues: list[tuple[float, float, str]], timestamps: list[float]) -> str:
    """Video-MME's rule (its README, "Evaluation Pipeline"): only the subtitle lines shown at the sampled frames'
    times."""
    keep = [text for start, end, text in cues if any(start <= t <= end for t in timestamps)]
    return "\n".join(dict.fromkeys(keep)) if keep else "No subtitles available"
