"""The multiple-choice medical readers (PMC-VQA, OmniMedVQA, MedXpertQA-MM, MMMU Health & Medicine) on small
copies written in each set's public layout from the toy scans: what each record becomes, a clear error for a
folder laid out otherwise, and the export to a training file that `mmrl train --data` reads and trains on."""

from __future__ import annotations

import csv
import json
import shutil
from pathlib import Path

import pytest
from tiny_runs import module_cache, run_rl  # noqa: F401 (module_cache is a fixture)

from data_pipelines.benchmarks import LayoutError, load_benchmark
from data_pipelines.benchmarks.fixtures import write_fixture
from data_pipelines.benchmarks.medical import export_training_file, main
from data_pipelines.loaders import load_samples
from mmrl_common.errors import DataError

pytestmark = pytest.mark.usefixtures("module_cache")

NEW = ("pmc-vqa", "omnimedvqa", "medxpertqa-mm", "mmmu-med")
# the toy scans' first four test questions as multiple choice: presence, location (4 options), location, polarity
GOLD = [("yes", ["yes", "no"]), (None, ["upper left", "upper right", "lower left", "lower right"])]


@pytest.fixture(scope="module")
def copies(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("medical")
    return {name: write_fixture(name, root / name, n=4) for name in NEW}


@pytest.mark.parametrize("name", NEW)
def test_reader_turns_each_question_into_a_multiple_choice_sample(copies, tmp_path: Path, name: str) -> None:
    data = load_benchmark(name, copies[name], media_cache=tmp_path / "cache")
    assert len(data.samples) == 4
    first, second = data.samples[0], data.samples[1]
    assert first.problem_type == "multiple_choice" and first.options == ["yes", "no"] and first.answer == "A"
    assert first.question.endswith("Is there a lesion in this scan?")
    assert second.options == GOLD[1][1] and second.answer in "ABCD"
    for s in data.samples:
        assert s.meta["answer_type"] == "closed" and s.meta["closed_rule"] == "multiple choice"
        assert len(s.media) == 1 and Path(s.media[0].path).is_file()
        assert not any(o[:2] in ("A:", "B:") for o in s.options)  # PMC-VQA's "A:" labels are stripped
    if name == "medxpertqa-mm":
        assert "Answer Choices" not in first.question and first.meta["question_type"] == "Reasoning"
    if name == "mmmu-med":
        assert first.question.startswith("(image 1) ") and data.info["open_skipped"] == 1
        with_open = load_benchmark(name, copies[name], media_cache=tmp_path / "cache", include_open=True)
        assert [s.problem_type for s in with_open.samples].count("open") == 1
    if name == "omnimedvqa":
        assert {s.meta["dataset"] for s in data.samples} == {"Toy CT", "Toy MRI"}


def test_pmc_vqa_answer_text_without_a_label_column(copies, tmp_path: Path) -> None:
    src = copies["pmc-vqa"] / "test_clean.csv"
    rows = list(csv.DictReader(src.open(encoding="utf-8")))
    folder = tmp_path / "pmc"
    shutil.copytree(copies["pmc-vqa"], folder)
    with open(folder / "test_clean.csv", "w", encoding="utf-8", newline="") as fh:
        w = csv.DictWriter(fh, [k for k in rows[0] if k != "Answer_label"])
        w.writeheader()
        w.writerows({k: v for k, v in r.items() if k != "Answer_label"} for r in rows)
    by_text = load_benchmark("pmc-vqa", folder)
    by_label = load_benchmark("pmc-vqa", copies["pmc-vqa"])
    assert [s.answer for s in by_text.samples] == [s.answer for s in by_label.samples]


def _break(name: str, folder: Path) -> str:
    """Lay ``folder`` out wrongly; the words the error must say."""
    if name == "pmc-vqa":
        (folder / "images").rename(folder / "pictures")
        return "image 'PMC1000_F1.jpg' not found"
    if name == "omnimedvqa":
        shutil.rmtree(folder / "QA_information")
        return "no QA_information/Open-access/\\*.json"
    if name == "medxpertqa-mm":
        (folder / "MM" / "test.jsonl").rename(folder / "test.jsonl")
        return "no question file for split 'test'"
    for sub in folder.iterdir():
        sub.rename(folder / sub.name.lower())
    return "no validation-\\*.parquet under any of Basic_Medical_Science"


@pytest.mark.parametrize("name", NEW)
def test_wrong_layout_says_what_was_expected_where(copies, tmp_path: Path, name: str) -> None:
    folder = tmp_path / name
    shutil.copytree(copies[name], folder)
    words = _break(name, folder)
    with pytest.raises(LayoutError, match=words) as err:
        load_benchmark(name, folder, media_cache=tmp_path / "cache")
    assert "expected layout under" in str(err.value)
    with pytest.raises(LayoutError, match="folder not found"):
        load_benchmark(name, tmp_path / "nowhere")


def test_bad_records_are_named(copies, tmp_path: Path) -> None:
    folder = tmp_path / "mx"
    shutil.copytree(copies["medxpertqa-mm"], folder)
    lines = (folder / "MM" / "test.jsonl").read_text().splitlines()
    item = json.loads(lines[1])
    item["label"] = "Z"
    lines[1] = json.dumps(item)
    (folder / "MM" / "test.jsonl").write_text("\n".join(lines))
    with pytest.raises(DataError, match=r"test.jsonl:2: the answer 'Z' is neither an option letter"):
        load_benchmark("medxpertqa-mm", folder)


@pytest.mark.slow
def test_export_makes_a_training_file_that_trains(copies, tmp_path: Path, capsys) -> None:
    out = tmp_path / "pmc-train.jsonl"
    assert main(["export", "pmc-vqa", str(copies["pmc-vqa"]), "--split", "test", "--out", str(out)]) == 0
    assert "wrote 4 records" in capsys.readouterr().out
    loaded = load_samples(out, check_media="decode")
    assert len(loaded.samples) == 4 and loaded.samples[0].meta["answer_type"] == "closed"
    for name in NEW[1:]:
        split = "val" if name == "mmmu-med" else "test"
        got = load_samples(export_training_file(name, copies[name], tmp_path / f"{name}.jsonl", split=split))
        assert len(got.samples) == 4
    rows = run_rl(tmp_path, f"data.train={out}", "data.media.image_min_pixels=3136",
                  "data.media.image_max_pixels=3136", task="image-qa")
    assert len(rows) == 2 and all(r["reward"] == r["reward"] for r in rows)
