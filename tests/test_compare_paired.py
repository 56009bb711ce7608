"""``mmrl compare``'s paired differences (issue 50): the arms of a spec share their seeds, so per metric and
non-base arm the report gives the per-seed differences arm − base on the seeds both finished -- their mean,
sd, 95% t-interval and how many seeds the arm is higher / lower / tied on -- beside the per-arm intervals, in
compare.md and compare.json. Checked by hand on planted run folders, with the t quantile from scipy."""

from __future__ import annotations

import json
import math
import statistics
from pathlib import Path

import pytest
from scipy.stats import t as student_t
from test_compare import make_run, write_spec

from mmrl.cli import main
from mmrl.cli.compare import LOG

# eval_after_rl.accuracy per seed: seeds 0..3. "method" beats grpo on every seed by 0.08..0.15 although the
# two arms' own intervals overlap (the seeds move both arms alike); "same" ties, wins and loses once, and its
# seed 3 failed, so it pairs with grpo on seeds 0..2 only.
GRPO = [0.30, 0.50, 0.40, 0.60]
METHOD = [0.45, 0.58, 0.50, 0.72]
SAME = [0.30, 0.40, 0.50]


def expected(arm: list[float], base: list[float]) -> dict:
    d = [a - b for a, b in zip(arm, base)]
    n, mean, sd = len(d), statistics.fmean(d), statistics.stdev(d)
    half = student_t.ppf(0.975, n - 1) * sd / math.sqrt(n)
    return {"n": n, "mean": mean, "sd": sd, "lo": mean - half, "hi": mean + half,
            "higher": sum(x > 0 for x in d), "lower": sum(x < 0 for x in d), "tied": sum(x == 0 for x in d)}


@pytest.fixture
def report(tmp_path: Path) -> tuple[Path, dict, str]:
    out = tmp_path / "out"
    spec = write_spec(tmp_path, f"arms: {{grpo: {{}}, method: {{}}, same: {{}}}}\nseeds: [0, 1, 2, 3]\nout: {out}\n"
                                "metrics: [eval_after_rl.accuracy, last:reward]\n")
    for seed in range(4):
        make_run(out / "grpo" / f"seed-{seed}", after=GRPO[seed], rewards=(0.0, 1.0 + seed))
        make_run(out / "method" / f"seed-{seed}", after=METHOD[seed], rewards=(0.0, 1.5 + seed * 1.25))
    for seed in range(3):
        make_run(out / "same" / f"seed-{seed}", after=SAME[seed], rewards=(0.0, 1.0 + seed))
    (out / "same" / "seed-3").mkdir(parents=True)
    (out / "same" / "seed-3" / LOG).write_text("$ python -m mmrl train ...\nerror: out of memory\n"
                                               "[mmrl compare] exit status 2\n")
    assert main(["compare", str(spec), "--report-only"]) == 0
    return out, json.loads((out / "compare.json").read_text())["metrics"], (out / "compare.md").read_text()


def test_paired_differences_in_the_json_by_hand(report) -> None:
    _, m, _ = report
    acc = m["eval_after_rl.accuracy"]
    assert acc["grpo"]["paired"] is None  # the base arm has no difference to itself
    want = expected(METHOD, GRPO)
    got = acc["method"]["paired"]
    assert got["seeds"] == [0, 1, 2, 3] and got["n"] == 4
    assert got["mean"] == pytest.approx(want["mean"]) and got["sd"] == pytest.approx(want["sd"])
    assert got["ci95"] == [pytest.approx(want["lo"]), pytest.approx(want["hi"])]
    assert (got["higher"], got["lower"], got["tied"]) == (4, 0, 0)
    assert want["lo"] > 0 and got["excludes_zero"] is True  # the pairs separate the arms ...
    assert acc["method"]["intervals_overlap"] is True  # ... where the two arms' own intervals overlap
    same = acc["same"]["paired"]  # seed 3 failed: paired on seeds 0, 1, 2
    want = expected(SAME, GRPO[:3])
    assert same["seeds"] == [0, 1, 2] and same["n"] == 3
    assert same["mean"] == pytest.approx(0.0, abs=1e-12) and same["sd"] == pytest.approx(want["sd"])
    assert same["ci95"] == [pytest.approx(want["lo"]), pytest.approx(want["hi"])]
    assert (same["higher"], same["lower"], same["tied"]) == (1, 1, 1) and same["excludes_zero"] is False
    # an unbounded metric: last reward per seed, method - grpo = 0.5 + 0.25 * seed
    reward = m["last:reward"]["method"]["paired"]
    want = expected([1.5 + s * 1.25 for s in range(4)], [1.0 + s for s in range(4)])
    assert reward["mean"] == pytest.approx(0.875) and reward["ci95"] == [pytest.approx(want["lo"]),
                                                                         pytest.approx(want["hi"])]
    # every seed the same difference: a zero-width interval is no test
    assert m["last:reward"]["same"]["paired"]["sd"] == 0.0 and m["last:reward"]["same"]["paired"]["excludes_zero"] is None


def test_compare_md_shows_the_paired_differences_beside_the_intervals(report) -> None:
    _, _, md = report
    lines = md.splitlines()
    head = next(i for i, line in enumerate(lines) if line.startswith("| metric | arm − base |"))
    assert head > next(i for i, line in enumerate(lines) if line.startswith("| metric | arm | seeds |"))
    rows = {tuple(c.strip() for c in line.split(" | ")[:2]): line for line in lines[head + 2:] if line.startswith("| ")}
    want = expected(METHOD, GRPO)
    assert rows[("| eval_after_rl.accuracy", "method − grpo")] == (
        f"| eval_after_rl.accuracy | method − grpo | 4 | {want['mean']:+.3f} | {want['sd']:.3f} | "
        f"[{want['lo']:+.3f}, {want['hi']:+.3f}] | 4 higher, 0 lower, 0 tied | **excludes 0** |")
    want = expected(SAME, GRPO[:3])
    assert rows[("| eval_after_rl.accuracy", "same − grpo")] == (
        f"| eval_after_rl.accuracy | same − grpo | 3 of 4 | +0.000 | {want['sd']:.3f} | "
        f"[{want['lo']:+.3f}, {want['hi']:+.3f}] | 1 higher, 1 lower, 1 tied | includes 0 |")
    assert "every seed the same difference" in rows[("| last:reward", "same − grpo")]
    assert "paired" in md and "t(0.975, n − 1)" in md


def test_compare_md_gives_each_arms_min_median_and_max(report) -> None:
    _, _, md = report
    rows = {tuple(c.strip() for c in line.split(" | ")[:2]): line.split(" | ") for line in md.splitlines()
            if line.startswith("| eval_after_rl.accuracy | ")}
    for arm, values in (("grpo (base)", GRPO), ("method", METHOD), ("same", SAME)):
        assert rows[("| eval_after_rl.accuracy", arm)][6] == (
            f"{min(values):.3f} / {statistics.median(values):.3f} / {max(values):.3f}")
