"""One ``Benchmark`` spec per benchmark: every registered spec is complete; the evaluator, the report and the
lmms-eval bridge name no benchmark of their own; and the README's "Adding a benchmark" module, run as written
from a file outside the package, is read, evaluated and reported through the normal path with no other edit."""

from __future__ import annotations

import ast
import json
import re
from pathlib import Path

import pytest

from data_pipelines.benchmarks import (
    Benchmark,
    available_benchmarks,
    benchmarks,
    find_benchmark,
    get_benchmark,
    load_benchmark,
)
from data_pipelines.benchmarks._common import BENCHMARKS, SCORINGS
from mmrl.benchmarks.protocols import Protocol, build_prompt, make_protocol
from mmrl.benchmarks.scoring import CONVENTIONS
from video.sampling import available_policies

ROOT = Path(__file__).resolve().parent.parent
README = ROOT / "README.md"
BUILTIN = ("longvideobench", "medxpertqa-mm", "mmmu-med", "mmvu", "mvbench", "omnimedvqa", "pathvqa", "pmc-vqa",
           "slake", "toy", "videomme", "vqa-rad")
PROTOCOL_FIELDS = set(Protocol.__dataclass_fields__) - {"benchmark", "name"}


def readme_module() -> str:
    """The README's benchmark module: the ``py`` block of "Adding a benchmark" (inside "Extending mmrl")."""
    section = README.read_text().split("### Adding a benchmark", 1)[1].split("\n## ", 1)[0]
    (block,) = re.findall(r"```py\n(.*?)```", section, flags=re.DOTALL)
    return block


def test_the_builtin_benchmarks_are_registered_from_their_modules() -> None:
    assert sorted(available_benchmarks()) == sorted(BUILTIN)
    for spec in benchmarks():
        assert isinstance(spec, Benchmark)
        assert spec.reader.__module__.startswith("data_pipelines.benchmarks.")
        assert get_benchmark(spec.name) is spec and all(get_benchmark(a) is spec for a in spec.aliases)


@pytest.mark.parametrize("name", BUILTIN)
def test_every_registered_benchmark_has_a_complete_spec(name: str) -> None:
    spec = get_benchmark(name)
    assert spec.name == name and spec.title and callable(spec.reader) and spec.splits
    assert spec.kind in ("video_mc", "medical", "toy")
    # the official protocol: only Protocol fields, a token cap, and where the settings come from
    assert set(spec.official) <= PROTOCOL_FIELDS and spec.official.get("source")
    assert spec.official.get("max_new_tokens", 0) > 0
    p = make_protocol(name)
    assert p.benchmark == name and p.video_policy in available_policies()
    assert spec.prompt is None or callable(spec.prompt)
    if spec.frame_rule is not None:
        assert name in available_policies()
    # lmms-eval: settings and prompt together; a subtitle task only beside a plain one
    assert (spec.lmms_eval is None) == (spec.lmms_prompt is None)
    if spec.lmms_eval is not None:
        assert set(spec.lmms_eval) <= PROTOCOL_FIELDS and spec.lmms_eval.get("source")
        assert make_protocol(name, "lmms-eval").template == "lmms-eval"
    assert spec.lmms_subtitle_task is None or spec.lmms_task
    assert (spec.subtitles is None) or callable(spec.subtitles)
    # scoring and report: named conventions, breakdowns by meta field
    assert spec.scoring in SCORINGS
    metric, why = spec.headline
    assert metric in CONVENTIONS and why and all(k in CONVENTIONS for k in spec.beside)
    assert all(isinstance(g, str) and g for g in spec.breakdowns)
    assert spec.fixture is not None


def test_specs_are_frozen_and_checked() -> None:
    spec = get_benchmark("mvbench")
    with pytest.raises(AttributeError):
        spec.title = "x"  # type: ignore[misc]
    with pytest.raises(ValueError, match="scoring"):
        Benchmark(name="x", title="X", reader=spec.reader, scoring="f1")
    with pytest.raises(ValueError, match="task_mean_over"):
        Benchmark(name="x", title="X", reader=spec.reader, task_mean_over="task")


def _named_constants(path: Path) -> list[tuple[int, str]]:
    """String constants outside docstrings that spell a benchmark's name or alias."""
    names = {n for s in benchmarks() for n in (s.name, *s.aliases)}
    tree = ast.parse(path.read_text())
    docstrings = {id(node.body[0].value) for node in ast.walk(tree)
                  if isinstance(node, (ast.Module, ast.FunctionDef, ast.ClassDef, ast.AsyncFunctionDef))
                  and node.body and isinstance(node.body[0], ast.Expr)
                  and isinstance(node.body[0].value, ast.Constant)}
    return [(node.lineno, node.value) for node in ast.walk(tree)
            if isinstance(node, ast.Constant) and isinstance(node.value, str) and node.value in names
            and id(node) not in docstrings]


def test_the_evaluator_names_no_benchmark_of_its_own() -> None:
    files = [*sorted((ROOT / "mmrl" / "benchmarks").glob("*.py")), ROOT / "mmrl" / "engine" / "evaluate.py",
             ROOT / "data_pipelines" / "benchmarks" / "fixtures.py", ROOT / "data_pipelines" / "benchmarks" / "__init__.py"]
    assert all(f.is_file() for f in files) and ROOT / "mmrl" / "benchmarks" / "lmms_bridge.py" in files, files
    found = {str(f.relative_to(ROOT)): hits for f in files if (hits := _named_constants(f))}
    assert not found, f"benchmark names written into shared code (read the spec instead): {found}"


@pytest.fixture
def readme_benchmark(tmp_path: Path):
    """The README's module saved as a file outside the package and imported as ``imports:`` entries are."""
    from mmrl.config.user_modules import import_entry

    path = tmp_path / "my_bench.py"
    path.write_text(readme_module())
    assert find_benchmark("my-bench") is None
    import_entry(str(path))
    try:
        yield get_benchmark("my-bench")
    finally:
        BENCHMARKS.unregister("my-bench")


def test_readme_benchmark_is_read_evaluated_and_reported_with_no_other_edit(readme_benchmark, tmp_path) -> None:
    from data_pipelines.benchmarks.fixtures import write_fixture
    from mmrl.benchmarks import read_predictions, run_benchmark
    from mmrl.benchmarks.lmms_bridge import build_command
    from mmrl.model import load_policy
    from mmrl.toy.tiny_models import ensure_tiny
    from mmrl_common.errors import MmrlError

    spec = readme_benchmark
    assert spec.name in available_benchmarks() and spec.breakdowns == ("scene",)
    root = write_fixture("my-bench", tmp_path / "data", n=3)
    data = load_benchmark("my-bench", root)
    assert len(data.samples) == 3 and all(s.answer in "ABCD" for s in data.samples)
    first = data.samples[0]
    lines = "\n".join(f"{'ABCD'[i]}. {o}" for i, o in enumerate(first.options))
    assert build_prompt(first, make_protocol("my-bench")) == (
        None, f"{first.question}\n{lines}\nAnswer with the letter.", "")
    tiny = ensure_tiny("qwen2_5_vl")
    m = run_benchmark("my-bench", root, tiny, policy=load_policy(tiny), out=tmp_path / "out", frames=4,
                      max_pixels=56 * 56, max_new_tokens=4, batch_size=2, workers=0, show_progress=False)
    preds = read_predictions(tmp_path / "out" / "predictions.jsonl")
    assert [p["id"] for p in preds] == [s.id for s in data.samples] and m["n"] == 3
    assert all(p["frames"] == 4 and p["group"] == {"scene": "toy"} for p in preds)
    assert m["scores"]["headline"] == {**m["scores"]["headline"], "metric": "accuracy",
                                       "why": "the paper counts every question"}
    assert set(m["scores"]["by_scene"]) == {"toy"} and m["title"] == "My bench"
    assert m["protocol"]["source"] == "the paper, Sec. 4" and m["protocol"]["nframes"] == 4
    results = (tmp_path / "out" / "results.md").read_text()
    assert results.startswith("# My bench") and "## scene" in results
    assert json.loads((tmp_path / "out" / "metrics.json").read_text())["scores"] == m["scores"]
    with pytest.raises(MmrlError, match="no task for 'my-bench'"):  # no lmms-eval task written down
        build_command(tiny, "my-bench", out=tmp_path)
