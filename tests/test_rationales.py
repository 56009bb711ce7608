"""Reasoning traces for the reasoning cold start (``sft.target: reasoning``): every sentence of a toy trace is
true of its record, lengths vary between draws of the same record, a record's own ``meta.rationale`` wins, and a
record with neither gets an error that names it."""

from __future__ import annotations

import random

import pytest

from data_pipelines.schema import Sample
from data_pipelines.toy.rationales import LOOK, draw_trace, toy_facts, toy_rationale
from mmrl.engine.sft import answer_text, reasoning_target
from mmrl_common.errors import MmrlError


def toy_sample(task: str, answer: str = "B", options=("red", "green", "blue", "yellow"), **meta) -> Sample:
    return Sample(id=f"toy-{task}-train-0001", problem_type="multiple_choice", question="?", answer=answer,
                  options=list(options), meta={"source": "toy", "task": task, **meta})


def test_mc_answer_gives_the_letter_or_its_option() -> None:
    assert answer_text(toy_sample("color", "C")) == "C"
    assert answer_text(toy_sample("color", "C"), "option") == "blue"
    assert answer_text(Sample(id="x", problem_type="open", question="?", answer="a lesion"), "option") == "a lesion"


@pytest.mark.parametrize("n", [1, 2, 3, 4])
def test_count_facts_enumerate_exactly_the_count(n: int) -> None:
    facts = toy_facts("count", {"count": n}, str(n))
    enumeration = facts[0].split(":", 1)[1].strip(" .").split(", ")
    assert len(enumeration) == n
    assert f" {n} disc" in facts[1]


def test_order_facts_name_both_flashes_in_order() -> None:
    facts = toy_facts("order", {"first": "blue", "second": "red"}, "blue")
    assert facts == ["The first flash is blue.", "The second flash is red."]


def test_traces_hold_only_the_records_facts_and_lengths_vary() -> None:
    sample = toy_sample("shape", "A", options=("circle", "square", "triangle"), color="green")
    facts = toy_facts("shape", sample.meta, "circle")
    rng = random.Random(0)
    traces = [toy_rationale(sample, rng) for _ in range(200)]
    lengths = {len(t) for t in traces}
    assert len(lengths) >= 4, lengths
    for t in traces:
        kept = [f for f in facts if f in t]
        assert kept, t  # at least one fact
        assert [t.index(f) for f in kept] == sorted(t.index(f) for f in kept)  # in the given order
        rest = t
        for sentence in kept + list(LOOK):
            rest = rest.replace(sentence, "")
        assert rest.strip() == "", f"a sentence that is not a fact or a look step: {rest!r}"
    assert sum("The moving object is a circle." in t for t in traces) > 100  # the answer is often stated


def test_draw_trace_of_no_facts_is_only_look_steps() -> None:
    rng = random.Random(1)
    assert {draw_trace([], rng, max_looks=0) for _ in range(5)} == {""}


def test_a_records_own_rationale_wins_and_a_list_is_drawn_from() -> None:
    rng = random.Random(0)
    own = Sample(id="mine-1", problem_type="multiple_choice", question="?", answer="B", options=["x", "y"],
                 meta={"rationale": "The cup is on the left."})
    assert reasoning_target(own, rng) == "<think>The cup is on the left.</think><answer>B</answer>"
    listed = Sample(id="mine-2", problem_type="open", question="?", answer="a dog",
                    meta={"rationale": ["It has four legs.", "It barks."]})
    bodies = {reasoning_target(listed, rng) for _ in range(50)}
    assert bodies == {f"<think>{t}</think><answer>a dog</answer>"
                      for t in ("It has four legs.", "It barks.", "It has four legs. It barks.")}


def test_toy_traces_name_the_option_and_the_answer_follows_mc_answer() -> None:
    sample = toy_sample("color", "D", shape="circle")
    words = reasoning_target(sample, random.Random(0), "option")
    assert words.endswith("</think><answer>yellow</answer>") and words.startswith("<think>")
    traces = [reasoning_target(sample, random.Random(k)) for k in range(20)]
    assert all(t.endswith("</think><answer>D</answer>") for t in traces)
    assert any("yellow" in t for t in traces)  # the trace speaks of the option, not the letter


def test_a_record_without_a_rationale_is_named() -> None:
    plain = Sample(id="clip-042", problem_type="open", question="?", answer="x")
    with pytest.raises(MmrlError, match="clip-042.*meta.rationale"):
        reasoning_target(plain, random.Random(0))
