"""Evaluation protocols: frames, prompt and generation length per benchmark.

``official`` (the default) follows each benchmark's own evaluation code; ``qwen`` is the setting the
Qwen2.5-VL report gives for all its video numbers (qwen-vl-utils sampling at 2 fps, at most 768 frames, at
most 24,576 video tokens in total) with a direct-answer prompt; ``lmms-eval`` is what lmms-eval (0.7, HEAD
75571cf) runs for its ``qwen2_5_vl`` model with the task's own prompt and token cap — the setting most
Qwen2.5-VL RL papers used (:data:`LMMS_EVAL`). Sources: research/eval.md (§1.3–1.5 MVBench,
§2.2–2.4 Video-MME, §2.5 Qwen, §3.1 LongVideoBench, §3.2 MMVU) and research/medical.md §5 (LLaVA-Med).

Answer extraction is the same everywhere: :func:`rewards.answers.extract_answer` then
:func:`~rewards.answers.extract_choice` / :func:`~rewards.answers.extract_yes_no` (the rewards' normaliser);
what differs per benchmark is the text it reads (MVBench: ``"(" +`` the first generated line after the
``Best option:(`` pre-fill) and which accuracy is the official one (Video-MME drops unparsed answers).
"""

from __future__ import annotations

import dataclasses
import re
from dataclasses import dataclass
from typing import Any

from mmrl.prompts import format_fields, instruction
from mmrl_common.errors import ConfigError
from mmrl_common.registry import did_you_mean

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

MVBENCH_SYSTEM = (
    "Carefully watch the video and pay attention to the cause and sequence of events, the detail and movement "
    "of objects, and the action and pose of persons. Based on your observations, select the best option that "
    "accurately addresses the question.\n"
)
MVBENCH_PREFILL = "Best option:("
VIDEOMME_INSTRUCTION = (
    "Select the best answer to the following multiple-choice question based on the video. Respond with only "
    "the letter (A, B, C, or D) of the correct option."
)
DIRECT_MC = "Answer with the option's letter from the given choices directly."
DIRECT_SHORT = "Answer the question using a single word or phrase."
MMVU_DIRECT = ("Do not generate any intermediate reasoning process. Answer directly with the option letter "
               "from the given choices.")
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


_OFFICIAL: dict[str, dict[str, Any]] = {
    # research/eval.md §1.3-1.5: 16 middle-of-segment frames inside the bound, 224-px frames, system prompt,
    # "Best option:(" pre-fill, greedy, 100 new tokens, first line kept.
    "mvbench": {"video_policy": "segments", "nframes": 16, "video_max_pixels": 224 * 224, "max_new_tokens": 100,
                "source": "MVBench notebook (eval.md §1.3-1.5)"},
    # §2.2 official prompt; frames are model-defined there, so lmms-eval's Qwen wrapper default: 32 frames
    # spread evenly over the video (§4.2); 16 new tokens (lmms-eval yaml, §2.4).
    "videomme": {"video_policy": "uniform", "nframes": 32, "max_new_tokens": 16,
                 "source": "Video-MME README prompt, lmms-eval frames (eval.md §2.2-2.4)"},
    # §3.1: min(max_frames, int(duration)) frames at a fixed stride; 16 frames as lmms-eval's _val_i task.
    "longvideobench": {"video_policy": "longvideobench", "nframes": 16, "max_new_tokens": 16,
                       "source": "longvideobench_dataset.py (eval.md §3.1)"},
    # §3.2: direct-output prompt, 10 frames (main.py default), official MAX_TOKENS 1024.
    "mmvu": {"video_policy": "uniform", "nframes": 10, "max_new_tokens": 1024,
             "source": "MMVU main.py direct-output prompt (eval.md §3.2)"},
    # research/medical.md §5: LLaVA-Med asks the question as it is and scores closed/open answers.
    "vqa-rad": {"max_new_tokens": 128, "source": "LLaVA-Med scoring (medical.md §5)"},
    "pathvqa": {"max_new_tokens": 128, "source": "LLaVA-Med scoring (medical.md §5)"},
    "slake": {"max_new_tokens": 128, "source": "LLaVA-Med scoring (medical.md §5)"},
    # multiple-choice medical sets: the question with its lettered options, a short answer
    "pmc-vqa": {"max_new_tokens": 128, "source": "multiple choice, letter or option text (medical.md §5)"},
    "omnimedvqa": {"max_new_tokens": 128, "source": "multiple choice, letter or option text (medical.md §5)"},
    "medxpertqa-mm": {"max_new_tokens": 128, "source": "multiple choice, letter or option text (medical.md §5)"},
    "mmmu-med": {"max_new_tokens": 128, "source": "multiple choice, letter or option text (medical.md §5)"},
    # the toy world: the training recipe's media settings and prompt (mmrl.config defaults)
    "toy": {"video_policy": "qwen", "max_frames": 16, "video_max_pixels": 64 * 28 * 28,
            "image_max_pixels": 256 * 28 * 28, "template": "reasoning", "max_new_tokens": 64, "source": "mmrl video-qa recipe defaults"},
}


# lmms-eval's qwen2_5_vl model (lmms_eval/models/simple/qwen2_5_vl.py): min_pixels 256*28*28, max_pixels
# 1,605,632 per image or frame, 32 frames kept of those qwen-vl-utils decodes at 2 fps, system prompt "You are a
# helpful assistant."; each task's yaml sets the prompt and the token cap (tasks/<name>/*.yaml, utils.py).
LMMS_EVAL: dict[str, dict[str, Any]] = {
    "mvbench": {"max_new_tokens": 16, "source": "lmms-eval tasks/mvbench (video branch, no bound applied)"},
    "videomme": {"max_new_tokens": 16, "source": "lmms-eval tasks/videomme (videomme / videomme_w_subtitle)"},
    "longvideobench": {"max_new_tokens": 32, "source": "lmms-eval tasks/longvideobench (longvideobench_val_v)"},
    "mmvu": {"max_new_tokens": 1024, "temperature": 0.7, "source": "lmms-eval tasks/mmvu (mmvu_val)"},
}
LMMS_SYSTEM = "You are a helpful assistant."
PROTOCOLS = ("official", "qwen", "lmms-eval")


def make_protocol(benchmark: str, name: str = "official", *, family: str = "qwen2_5_vl", frames: int | None = None,
                  max_pixels: int | None = None, template: str | None = None,
                  max_new_tokens: int | None = None) -> Protocol:
    """The protocol for ``benchmark``, with the user's overrides applied."""
    if name not in PROTOCOLS:
        raise ConfigError(f"--protocol must be one of {', '.join(PROTOCOLS)}, got {name!r}")
    factor = 2 * (16 if family.startswith("qwen3") else 14)
    if name == "lmms-eval":
        if benchmark not in LMMS_EVAL:
            raise ConfigError(f"--protocol lmms-eval is written down for {', '.join(LMMS_EVAL)}, not {benchmark}; "
                              "use --protocol official (or the lmms-eval bridge, --lmms-eval)")
        f2 = factor * factor
        p = Protocol(benchmark=benchmark, name=name, video_policy="lmms-eval", nframes=32, fps=2.0, max_frames=768,
                     video_min_pixels=256 * f2, video_max_pixels=1605632, image_max_pixels=1605632,
                     template="lmms-eval", **LMMS_EVAL[benchmark])
    elif name == "official" or benchmark == "toy":
        p = Protocol(benchmark=benchmark, name=name, **_OFFICIAL[benchmark])
    else:
        # Qwen2.5-VL report (eval.md §2.5): fps 2, <=768 frames, <=24,576 video tokens; qwen-vl-utils pixel
        # defaults (128..768 tokens per frame); images at the processor's default cap (16,384 tokens).
        p = Protocol(benchmark=benchmark, name="qwen", video_policy="qwen", fps=2.0, max_frames=768,
                     video_min_pixels=128 * factor * factor, video_max_pixels=768 * factor * factor,
                     total_pixels=24576 * factor * factor, image_max_pixels=16384 * factor * factor,
                     template="direct", max_new_tokens=128, source="Qwen2.5-VL report (eval.md §2.5)")
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
_LABEL = re.compile(r"^\s*[\(\[]?([A-Z])[\)\]\.:]\s*")


def plain_options(options: list[str] | None) -> list[str]:
    """Option texts without a leading ``A.``/``(A)`` label that matches their position."""
    out = []
    for i, o in enumerate(options or []):
        m = _LABEL.match(o)
        out.append(o[m.end():] if m and m.group(1) == "ABCDEFGHIJKLMNOPQRSTUVWXYZ"[i] else o)
    return out


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


def _lines(options: list[str], fmt: str) -> str:
    return "\n".join(fmt.format(letter="ABCDEFGHIJKLMNOPQRSTUVWXYZ"[i], text=o) for i, o in enumerate(options))


def build_prompt(sample: Any, protocol: Protocol, *, subtitles: str | None = None) -> tuple[str | None, str, str]:
    """``(system, user_text, prefill)`` for one question under ``protocol``."""
    b, t = protocol.benchmark, protocol.template
    q = sample.question.strip()
    opts = plain_options(sample.options)
    mc = sample.problem_type == "multiple_choice"
    if t == "official":
        if b == "mvbench":
            text = f"Question: {q}\nOptions:\n{_lines(opts, '({letter}) {text}')}\nOnly give the best option."
            return MVBENCH_SYSTEM, text, MVBENCH_PREFILL
        if b == "videomme":
            head = ""
            if subtitles is not None:
                head = f"This video's subtitles are listed below:\n{subtitles}\n"
            body = "\n".join(sample.options)  # already "A. …"
            return None, f"{head}{VIDEOMME_INSTRUCTION}\n{q}\n{body}\nThe best answer is:", ""
        if b == "longvideobench":
            return None, f"Question: {q}\n{_lines(opts, '{letter}. {text}')}\n{DIRECT_MC}", ""
        if b == "mmvu":
            return None, (f"Question:{q}\n{_lines(opts, '{letter}: {text}')}\nVisual Information: processed video\n"
                          f"{MMVU_DIRECT}"), ""
        if b in ("vqa-rad", "pathvqa", "slake"):
            return None, q, ""
        t = "reasoning"  # toy: the training prompt
    if t == "lmms-eval":
        return _lmms_eval_prompt(b, q, sample, opts, subtitles)
    if t == "direct":
        if mc:
            return None, f"{q}\n{_lines(opts, '{letter}. {text}')}\n{DIRECT_MC}", ""
        return None, f"{q}\n{DIRECT_SHORT}", ""
    if t == "reasoning":
        body = f"{q}\nOptions:\n{_lines(opts, '{letter}. {text}')}\n" if mc else f"{q}\n"
        return None, body + instruction(sample.problem_type, "think_answer"), ""
    try:  # a format string
        text = t.format(question=q, options=_lines(opts, "{letter}. {text}") if mc else "",
                        instruction=instruction(sample.problem_type, "answer"))
    except (KeyError, IndexError) as exc:
        raise ConfigError(f"--prompt-template: unknown field {exc}; use official, direct, reasoning or a "
                          "format string with {question}, {options}, {instruction}") from exc
    return None, text, ""


LMMS_VIDEOMME = ("Select the best answer to the following multiple-choice question based on the video and the "
                 "subtitles. Respond with only the letter (A, B, C, or D) of the correct option.")


def _lmms_eval_prompt(b: str, q: str, sample: Any, opts: list[str], subtitles: str | None) -> tuple[str, str, str]:
    """lmms-eval's ``doc_to_text`` of each task with its default ``post_prompt`` (the wording differs from the
    official prompts on purpose: this is what lmms-eval numbers were made with)."""
    if b == "mvbench":  # mvbench/utils.py mvbench_doc_to_text + the yaml's post_prompt
        return LMMS_SYSTEM, f"Question:{q}\nOption:\n{_lines(opts, '({letter}) {text}')}\nOnly give the best option.\n", ""
    if b == "videomme":  # videomme/utils.py videomme_doc_to_text(_subtitle)
        body = f"{LMMS_VIDEOMME}\n{q}\n" + "\n".join(sample.options)
        if subtitles is not None:
            return LMMS_SYSTEM, f"This video's subtitles are listed below: \n{subtitles}\n{body}\nThe best answer is:", ""
        return LMMS_SYSTEM, f"{body}\n\nAnswer with the option's letter from the given choices directly.", ""
    if b == "longvideobench":  # longvideobench/utils.py longvideobench_doc_to_text (the _v task)
        return LMMS_SYSTEM, f"{q}\n{_lines(opts, '{letter}. {text}')}\n{DIRECT_MC}\n", ""
    # mmvu/utils.py multiple_choice_prompt: always the letters A to E (empty text for unused ones)
    five = list(opts) + [""] * max(0, 5 - len(opts))
    return LMMS_SYSTEM, (f"\nQuestion:{q}\n{_lines(five, '{letter}: {text}')}\nVisual Information: processed video\n"
                         "Do not generate any intermediate reasoning process. Answer directly with the option letter "
                         "from the\ngiven choices.\n"), ""


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
    """Video-MME's rule (eval.md §2.2): only the subtitle lines shown at the sampled frames' times."""
    keep = [text for start, end, text in cues if any(start <= t <= end for t in timestamps)]
    return "\n".join(dict.fromkeys(keep)) if keep else "No subtitles available"
