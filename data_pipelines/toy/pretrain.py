"""The toy world's pre-training split: descriptions of what is seen, for the toy base model.

A real Qwen-VL arrives at RL already able to see; the toy base model must too. It is pre-trained (supervised)
on this split, which teaches perception by description -- the colour and shape of a moving object, the
number of discs, where a square travels, the colours of two flashes in order, a brief square's colour, a
picture's colour, a scan's finding -- and never the RL and test splits' questions, option lists or answer
letters:

* its media are drawn from generator streams of their own (``(seed, task, "pretrain")``), so no picture or
  video is shared with train/val/test;
* each record is an open request to name what is seen, in words of its own ("Name the colour of the moving
  object.", "Which colour does the moving object have?"; the RL question is "What colour is the moving
  object?" with lettered options), with no options, and its answer is the thing seen ("red", "3", "left"),
  never a letter. Half of the requests end with the words to choose from in a random order ("Pick one of:
  blue, red, yellow, green."), as a real base model has seen questions with candidates; without them the
  base answered every RL question with a colour (the RL prompts list options, which it had never seen).
* with ``letter_share`` > 0 (a base variant, ``model.toy_base: {letter_share: P}``), that share of the requests
  with a word-list answer is posed as a multiple-choice question instead: the words as lettered options in a
  random order (never the order the RL splits list them in), answered with the letter -- as a real base model
  has seen exam-style questions. The default base never sees a letter.

:func:`check_disjoint` verifies that against the other splits.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from mmrl_common.errors import DataError

from ..schema import option_letter
from .build import seeded_rng, write_media
from .draw import COLOR_NAMES, SHAPES
from .registry import ToyItem, get_task, world_config
from .video_tasks import COUNTS, DIRECTIONS

Describe = Callable[[ToyItem], str]

# task -> (request, what the answer is); several requests per picture where the drawing holds more facts
COLOUR = ("Name the colour of the {what}.", "Say which colour the {what} has.", "Tell the colour of the {what}.",
          "Which colour does the {what} have?")
SHAPE = ("Name the shape of the {what}.", "Say which shape the {what} has.", "Tell the shape of the {what}.",
         "Which shape does the {what} have?")


def _ask(templates: Sequence[str], what: str) -> list[str]:
    return [t.format(what=what) for t in templates]


# task -> [(requests, what the answer is)]: several facts per picture where the drawing holds more, and
# several wordings per fact (one is drawn per record), so the model learns the fact, not a sentence
DESCRIPTIONS: dict[str, list[tuple[list[str], Describe]]] = {
    "color": [(_ask(COLOUR, "moving object"), lambda it: it.answer),
              (_ask(SHAPE, "moving object"), lambda it: it.meta["shape"])],
    "shape": [(_ask(SHAPE, "moving object"), lambda it: it.answer),
              (_ask(COLOUR, "moving object"), lambda it: it.meta["color"])],
    "count": [(["Say how many coloured discs there are.", "Count the coloured discs.",
                "Tell the number of discs.", "How many discs can you see?"], lambda it: it.answer)],
    "motion": [(["Name the direction in which the square moves.", "Say which direction the square goes.",
                 "Tell the direction of the square's motion.", "Which way does the square travel?"],
                lambda it: it.answer)],
    "order": [(_ask(COLOUR, "first flash"), lambda it: it.meta["first"]),
              (_ask(COLOUR, "second flash"), lambda it: it.meta["second"])],
    "needle": [(_ask(COLOUR, "square that appears briefly"), lambda it: it.answer)],
    "color_image": [(_ask(COLOUR, "object"), lambda it: it.answer)],
    "scan": [(["Describe the finding in this scan.", "Report what the scan shows."],
              lambda it: (f"a {it.meta['finding']['polarity']} lesion in the {it.meta['finding']['location']}"
                          if it.meta["finding"]["present"] else "no lesion"))],
}


# the word sets an answer can come from (the candidates a request may list); free-text findings have none
VOCABULARIES: tuple[tuple[str, ...], ...] = (COLOR_NAMES, SHAPES, COUNTS, DIRECTIONS)
CANDIDATE_SHARE = 0.5


def candidates(answer: str) -> tuple[str, ...]:
    """The word set ``answer`` belongs to; () for a free-text answer."""
    return next((v for v in VOCABULARIES if answer in v), ())


def with_candidates(request: str, words: Sequence[str], rng: Any) -> str:
    """``request`` plus ``words`` to choose from, in a random order."""
    order = [words[int(k)] for k in rng.permutation(len(words))]
    return f"{request} Pick one of: {', '.join(order)}."


def lettered_options(words: Sequence[str], rng: Any) -> list[str]:
    """``words`` in a random order other than their own (the RL splits list a task's words in that order, so
    no pre-training option list is one of theirs)."""
    order = list(words)
    while order == list(words):
        order = [words[int(k)] for k in rng.permutation(len(words))]
    return order


POINTER_REQUESTS = ("Pick the option {word}.", "Choose the option that reads {word}.", "Which option says {word}?",
                    "Select {word} from the options.")


def pointer_drill(n: int, seed: int = 0) -> list[dict[str, Any]]:
    """``n`` text-only multiple-choice requests that name their answer ("Pick the option red." with 3-4 of a
    word set as lettered options in a random order, answered with the letter): the step from a word to its
    option's letter, which a tiny model learns only after thousands of steps (the toy base's pointer phase,
    ``BaseRecipe.pointer_steps``). No media and no fact about any picture; never an RL split's option order."""
    rng = seeded_rng(seed, "pointer", "pretrain")
    records = []
    for i in range(n):
        words = VOCABULARIES[int(rng.integers(len(VOCABULARIES)))]
        k = int(rng.integers(3, len(words) + 1))
        chosen = lettered_options(words, rng)[:k] if k == len(words) else \
            [words[int(j)] for j in rng.permutation(len(words))[:k]]
        answer = chosen[int(rng.integers(k))]
        request = POINTER_REQUESTS[int(rng.integers(len(POINTER_REQUESTS)))].format(word=answer)
        records.append({"id": f"toy-pointer-pretrain-{i:05d}", "problem_type": "multiple_choice", "question": request,
                        "options": chosen, "answer": option_letter(chosen.index(answer)), "media": [],
                        "meta": {"task": "pointer", "split": "pretrain", "seed": seed}})
    return records


def pretrain_tasks() -> list[str]:
    return list(DESCRIPTIONS)


def make_pretrain(out: str | Path, seed: int = 0, *, tasks: Sequence[str] | None = None, per_task: int = 200,
                  resolution: int = 64, letter_share: float = 0.0, world: Mapping[str, Any] | None = None,
                  progress: bool = True) -> Path:
    """Write ``out/pretrain.jsonl`` and its media (``out/media/pretrain/<task>/``); returns the JSONL path.
    ``letter_share``: the share of requests with a word-list answer posed as a multiple-choice question
    instead (the list's words as options in a random order, never the RL splits' order; the answer is the
    letter). Those draws come from a stream of their own: the media and the facts are the same at any share."""
    out = Path(out)
    names = list(tasks) if tasks else pretrain_tasks()
    unknown = [n for n in names if n not in DESCRIPTIONS]
    if unknown:
        raise DataError(f"no pre-training descriptions for toy task(s) {', '.join(unknown)}; "
                        f"described: {', '.join(DESCRIPTIONS)}")
    cfg = world_config(resolution, world)  # the toy world's options, as the RL splits draw them
    records: list[dict[str, Any]] = []
    bar = None
    if progress:
        import sys

        from tqdm import tqdm

        bar = tqdm(total=len(names) * per_task, desc="pre-training split", unit="item", file=sys.stderr,
                   leave=False)
    for name in names:
        task = get_task(name)
        rng = seeded_rng(seed, name, "pretrain")
        # its own stream: the media do not depend on the share
        letters_rng = seeded_rng(seed, name, "pretrain-letters")
        for i in range(per_task):
            item = task.fn(rng, i, cfg)
            ext = "mp4" if item.frames is not None else "png"
            rel = f"media/pretrain/{name}/toy-{name}-pretrain-{i:05d}.{ext}"
            write_media(item, out / rel)
            media = {"type": "video" if item.frames is not None else "image", "path": rel}
            if item.sampling:
                media["sampling"] = dict(item.sampling)
            for k, (requests, describe) in enumerate(DESCRIPTIONS[name]):
                request = requests[int(rng.integers(len(requests)))]
                answer = str(describe(item))
                words = candidates(answer)
                kind, options, asked = "open", None, request
                if words and rng.random() < CANDIDATE_SHARE:
                    request = with_candidates(request, words, rng)
                if words and letter_share > 0 and letters_rng.random() < letter_share:
                    kind, options, request = "multiple_choice", lettered_options(words, letters_rng), asked
                    answer = option_letter(options.index(answer))
                records.append({"id": f"toy-{name}-pretrain-{i:05d}-{k}", "problem_type": kind,
                                "question": request, "options": options, "answer": answer,
                                "media": [media], "meta": {"task": name, "split": "pretrain", "seed": seed}})
            if bar is not None:
                bar.update(1)
    if bar is not None:
        bar.close()
    order = seeded_rng(seed, "order", "pretrain").permutation(len(records))
    path = out / "pretrain.jsonl"
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "w", encoding="utf-8", newline="\n") as fh:
        fh.writelines(json.dumps(records[int(k)], ensure_ascii=False) + "\n" for k in order)
    return path


def check_disjoint(pretrain: Sequence[dict[str, Any]], others: Sequence[dict[str, Any]]) -> list[str]:
    """What the pre-training records share with other splits' records: questions, option lists, answers,
    media files. Empty when nothing is shared. An option letter is a form, not a fact: a multiple-choice
    record's letter may be an answer elsewhere (its option list and its media may not)."""
    problems = []
    questions = {r["question"] for r in others}
    option_lists = {tuple(r["options"]) for r in others if r.get("options")}
    answers = {json.dumps(r["answer"]) for r in others}
    media = {m["path"] for r in others for m in r["media"]}
    for r in pretrain:
        if r["question"] in questions:
            problems.append(f"{r['id']}: question shared: {r['question']!r}")
        if r.get("options") and tuple(r["options"]) in option_lists:
            problems.append(f"{r['id']}: option list shared")
        lettered = r.get("problem_type") == "multiple_choice" and r.get("options")
        if json.dumps(r["answer"]) in answers and not lettered:
            problems.append(f"{r['id']}: answer shared: {r['answer']!r}")
        problems += [f"{r['id']}: media shared: {m['path']}" for m in r["media"] if m["path"] in media]
    return problems
