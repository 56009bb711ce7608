"""The sample record: validation per problem type, the registry, round trips, problem formatting."""

from __future__ import annotations

from pathlib import Path

import pytest

from data_pipelines.schema import (
    MediaItem,
    Problem,
    Sample,
    check_record,
    letter_index,
    normalize_problem_type,
    option_letter,
    option_letters,
    parse_record,
    problem_types,
    register_problem_type,
    validate_sample,
)
from mmrl_common.errors import DataError


def rec(**kw):
    base = {"id": "s1", "problem_type": "multiple_choice", "question": "Which colour?",
            "options": ["red", "green", "blue"], "answer": "B",
            "media": [{"type": "video", "path": "v.mp4", "sampling": {"nframes": 8}}], "meta": {"task": "t"}}
    base.update(kw)
    return base


def reasons(**kw) -> list[str]:
    return parse_record(rec(**kw))[1]


def test_known_types_registered():
    assert {"multiple_choice", "yes_no", "numeric", "open", "temporal_grounding", "free_form"} <= set(
        problem_types())


def test_valid_record_round_trip():
    sample = Sample.from_dict(rec())
    assert sample.answer_text() == "green"
    assert sample.media[0] == MediaItem("video", "v.mp4", {"nframes": 8})
    again = Sample.from_dict(sample.to_dict())
    assert again == sample
    assert list(sample.to_dict()) == ["id", "problem_type", "question", "options", "answer", "media", "meta"]


@pytest.mark.parametrize("answer", ["D", "Z"])
def test_multiple_choice_letter_outside_options(answer):
    (msg,) = reasons(answer=answer)
    assert "outside the options" in msg and "A, B, C" in msg


def test_multiple_choice_other_errors():
    assert "not an option letter" in reasons(answer="green")[0]
    assert "matches option B" in reasons(answer="green")[0]
    assert "at least 2" in reasons(options=None)[0]
    assert reasons(answer="C") == []


def test_yes_no_numeric_open_free_form():
    assert reasons(problem_type="yes_no", options=None, answer="Yes") == []
    assert "'yes' or 'no'" in reasons(problem_type="yes_no", options=None, answer="maybe")[0]
    assert reasons(problem_type="numeric", options=None, answer="3.5") == []
    assert reasons(problem_type="numeric", options=None, answer=4) == []
    assert "finite number" in reasons(problem_type="numeric", options=None, answer="three")[0]
    assert "finite number" in reasons(problem_type="numeric", options=None, answer="nan")[0]
    assert reasons(problem_type="open", options=None, answer="upper left") == []
    assert "non-empty" in reasons(problem_type="open", options=None, answer="  ")[0]
    assert "non-empty" in reasons(problem_type="free_form", options=None, answer="")[0]


def test_temporal_grounding():
    s, r = parse_record(rec(problem_type="temporal_grounding", options=None, answer="[1.5, 3]"))
    assert r == [] and s.answer == [1.5, 3.0]
    assert reasons(problem_type="temporal_grounding", options=None, answer=[0, 0]) == []
    assert "start is after end" in reasons(problem_type="temporal_grounding", options=None, answer=[3, 1])[0]
    assert ">= 0" in reasons(problem_type="temporal_grounding", options=None, answer=[-1, 1])[0]
    assert "two numbers" in reasons(problem_type="temporal_grounding", options=None, answer=[1, 2, 3])[0]


def test_unknown_problem_type_and_aliases():
    (msg,) = reasons(problem_type="riddle")
    assert "unknown problem_type 'riddle'" in msg and "register_problem_type" in msg
    assert normalize_problem_type("multiple choice") == "multiple_choice"
    assert normalize_problem_type("Numerical") == "numeric"
    assert normalize_problem_type("free-form") == "free_form"
    assert parse_record(rec(problem_type="Multiple Choice"))[0].problem_type == "multiple_choice"


def test_register_new_problem_type():
    def check(s: Sample) -> list[str]:
        return [] if str(s.answer).isupper() else ["answer must be upper case"]

    register_problem_type("shout_test", check, aliases=("SHOUT TEST",))
    try:
        assert reasons(problem_type="shout test", options=None, answer="HEY") == []
        assert reasons(problem_type="shout_test", options=None, answer="hey") == ["answer must be upper case"]
        with pytest.raises(ValueError, match="already registered"):
            register_problem_type("shout_test", check)
    finally:
        register_problem_type("shout_test", None, overwrite=True)


def test_structure_and_media_problems():
    _, r = parse_record({"id": "x", "question": "q"})
    assert "missing field(s) problem_type, answer" in r[0]
    r = reasons(media=[{"type": "audio", "path": ""}])
    assert any("type must be 'image' or 'video'" in m for m in r)
    assert any("'path' is empty" in m for m in r)
    r = reasons(media=[{"type": "video", "path": "v.mp4", "sampling": {"fsp": 2}}])
    assert "unknown sampling key 'fsp'" in r[0]
    r = reasons(media=[{"type": "video", "path": "v.mp4", "sampling": {"start": 5, "end": 2}}])
    assert "after end" in r[0]
    assert parse_record(["not", "a", "dict"])[0] is None
    with pytest.raises(DataError, match="sample 's1'.*outside the options"):
        Sample.from_dict(rec(answer="E"))


def test_media_item_shapes_and_resolution(tmp_path: Path):
    assert MediaItem.from_dict("clip.mp4").type == "video"
    assert MediaItem.from_dict("scan.png").type == "image"
    item = MediaItem.from_dict({"video": "a/b.mp4", "fps": 2.0})
    assert (item.type, item.path, item.sampling) == ("video", "a/b.mp4", {"fps": 2.0})
    assert item.resolve(tmp_path) == tmp_path / "a/b.mp4"
    assert MediaItem("image", str(tmp_path / "x.png")).resolve("/elsewhere") == tmp_path / "x.png"
    # JSON strings from parquet/datasets columns are decoded
    s, r = parse_record(rec(options='["a", "b"]', answer="A", meta='{"difficulty": "easy"}',
                            media='[{"type": "image", "path": "x.png"}]'))
    assert r == [] and s.options == ["a", "b"] and s.meta["difficulty"] == "easy" and s.images[0].path == "x.png"


def test_problem_format():
    _, problems = check_record(rec(answer="Q"), file="data/train.jsonl", line=7)
    (p,) = problems
    assert str(p).startswith("data/train.jsonl:7: sample 's1': ")
    assert p.kind == "answer" and p.sample_id == "s1"
    p = Problem("d.json", 3, None, "json", "broken", unit="record")
    assert str(p) == "d.json:record 3: broken"


def test_extra_fields_go_to_meta():
    s = Sample.from_dict({**rec(), "source_url": "http://x"})
    assert s.meta["source_url"] == "http://x"
    assert validate_sample(s) == []


def test_option_letters_and_their_index():
    assert option_letters(4) == ["A", "B", "C", "D"]
    assert [letter_index(option_letter(i)) for i in range(26)] == list(range(26))
    for bad in (-1, 26):
        with pytest.raises(ValueError, match="no letter"):
            option_letter(bad)
