"""``mmrl compare``: spec errors name the key, the plan skips / resumes / starts from the run folders on disk,
the table's statistics on hand-made run folders, and one real end-to-end comparison of two tiny arms."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
from tiny_runs import TINY_RUN

from mmrl.cli import main
from mmrl.cli.compare import (
    LOG,
    RunData,
    curve_points,
    intervals_overlap,
    load_spec,
    mean_curve,
    metric_value,
    plan,
    summarize,
    t975,
    write_report,
)
from mmrl_common.errors import ConfigError

# the tiny trainer-test run with both evaluations on (2 test questions)
TINY = [*TINY_RUN, "eval.before_rl=true", "eval.after_rl=true"]


def write_spec(tmp_path: Path, text: str, name: str = "spec.yaml") -> Path:
    path = tmp_path / name
    path.write_text(text)
    return path


def make_run(folder: Path, *, before: float = 0.1, after: float = 0.5, by_task: dict | None = None,
             rewards: tuple[float, ...] = (0.0, 0.5, 1.0), finished: bool = True) -> None:
    """A run folder as ``mmrl train`` leaves it (finished, or stopped during RL)."""
    folder.mkdir(parents=True)
    (folder / "config.yaml").write_text("task: video-qa\n")
    ev_before = {"accuracy": before, "n": 10, "by_task": {k: before for k in (by_task or {})}}
    ev_after = {"accuracy": after, "n": 10, "by_task": by_task or {}}
    stages = {"eval_before_rl": ev_before, **({"rl": {"steps": len(rewards)}, "eval_after_rl": ev_after}
                                             if finished else {})}
    (folder / "run_state.json").write_text(json.dumps({"stages": stages}))
    with (folder / "metrics.jsonl").open("w") as f:
        for step, r in enumerate(rewards, start=1):
            f.write(json.dumps({"stage": "rl", "step": step, "reward": r, "reward/accuracy": r / 2}) + "\n")
    if finished:
        (folder / "summary.json").write_text(json.dumps({"eval_before_rl": ev_before, "eval_after_rl": ev_after}))


# ---------------------------------------------------------------------------------------------- statistics

def test_t_quantiles_and_interval_by_hand() -> None:
    assert t975(1) == pytest.approx(12.7062, abs=1e-4)
    assert t975(2) == pytest.approx(4.3027, abs=1e-4)
    assert t975(30) == pytest.approx(2.0423, abs=1e-4)
    assert t975(40) == pytest.approx(2.0211, abs=1e-4)  # beyond the table: the expansion
    assert t975(120) == pytest.approx(1.9799, abs=1e-4)
    s = summarize([0.2, 0.4, 0.6])
    half = 4.303 * 0.2 / math.sqrt(3)
    assert (s.n, s.mean, s.sd) == (3, pytest.approx(0.4), pytest.approx(0.2))
    assert (s.lo, s.hi) == (pytest.approx(0.4 - half, abs=1e-4), pytest.approx(0.4 + half, abs=1e-4))
    one = summarize([0.7])
    assert (one.n, one.mean, one.sd, one.lo) == (1, 0.7, None, None)
    assert summarize([]).mean is None
    assert intervals_overlap(s, summarize([0.9, 1.0, 1.1])) is True  # 0.897 > 1.0 - 0.248
    assert intervals_overlap(summarize([0.1, 0.11, 0.12]), summarize([0.9, 0.91, 0.92])) is False
    assert intervals_overlap(s, one) is None


def test_metric_syntax() -> None:
    summary = {"eval_before_rl": {"accuracy": 0.25, "by_task": {"color": 0.5}},
               "eval_after_rl": {"accuracy": 0.75, "by_task": {"color": 1.0}}}
    rows = [{"stage": "sft", "step": 1, "reward": 9.0}, {"stage": "rl", "step": 1, "reward": 0.2},
            {"stage": "rl", "step": 2, "reward": 0.6}, {"stage": "rl", "step": 3}]
    assert metric_value("eval_after_rl.by_task.color", summary, rows) == 1.0
    assert metric_value("gain", summary, rows) == pytest.approx(0.5)
    assert metric_value("gain.by_task.color", summary, rows) == pytest.approx(0.5)
    assert metric_value("last:reward", summary, rows) == 0.6  # RL steps only, the last that has the key
    assert metric_value("mean:reward", summary, rows) == pytest.approx(0.4)
    assert metric_value("max:reward", summary, rows) == 0.6
    assert metric_value("eval_after_rl.by_task.shape", summary, rows) is None
    assert metric_value("reach:reward>=0.5", summary, rows) == 2.0  # the first RL step there (not the SFT row)
    assert metric_value("reach:reward>=0.1", summary, rows) == 1.0
    assert metric_value("reach:reward<=0.3", summary, rows) == 1.0
    assert metric_value("reach:reward>=0.7", summary, rows) is None  # never reached: missing for that run
    with pytest.raises(ValueError, match="reach:KEY>=VALUE"):
        metric_value("reach:reward>0.5", summary, rows)
    assert mean_curve([{1: 0.0, 2: 1.0}, {1: 1.0}]) == [(1, 0.5, pytest.approx(math.sqrt(0.5))), (2, 1.0, 0.0)]


# ---------------------------------------------------------------------------------------------------- spec

@pytest.mark.parametrize(("text", "message"), [
    ("arms: {vas: {overrides: train.steps=3}}", "compare spec arms.vas.overrides: expected a list of key=value"),
    ("arms: {vas: {overrides: [train.steps]}}", "compare spec arms.vas.overrides: expected a list of key=value"),
    ("arms: {vas: {overrides: [train.seed=3]}}", "compare spec arms.vas.overrides: train.seed is set by"),
    ("arms: {vas: {overrides: [train.stpes=3]}}", "compare spec arms.vas: unknown config key 'train.stpes'"),
    ("arms: {vas: {task: vidoe-qa}}", "compare spec arms.vas: unknown task 'vidoe-qa'"),
    ("arms: {vas: {config: nowhere.yaml}}", "compare spec arms.vas.config: file not found: nowhere.yaml"),
    ("arms: {vas: {overides: []}}", "compare spec arms.vas: unknown key 'overides'; did you mean 'overrides'?"),
    ("arms: {a/b: {}}", "compare spec arms.a/b: an arm name is a folder name"),
    ("arms: [grpo]", "compare spec arms: expected a mapping of arm name"),
    ("arms: {grpo: {}}\nseed: [0]", "compare spec: unknown key 'seed'; did you mean 'seeds'?"),
    ("arms: {grpo: {}}\nseeds: [0, x]", "compare spec seeds: expected a list of different integers"),
    ("arms: {grpo: {}}\nseeds: [1, 1]", "compare spec seeds: expected a list of different integers"),
    ("arms: {grpo: {}}\nbase: gpro", "compare spec base: 'gpro' is not an arm; did you mean 'grpo'?"),
    ("arms: {grpo: {}}\nparallel: 0", "compare spec parallel: expected a positive integer"),
    ("arms: {grpo: {}}\nmetrics: [gain, avg:reward]", "compare spec metrics[1]: unknown aggregate 'avg:'"),
    ("arms: {grpo: {}}\nmetrics: [eval_afer_rl.accuracy]", "did you mean 'eval_after_rl'?"),
    ("arms: {grpo: {}}\nmetrics: [eval_after_rl.*.color]", "compare spec metrics[0]: 'eval_after_rl.*.color'"),
    ("arms: {grpo: {}}\ncurves: reward", "compare spec curves: expected a list of metrics.jsonl keys"),
    ("arms: {grpo: {}}\noverrides: [sft.steps]", "compare spec overrides: expected a list of key=value"),
])
def test_spec_errors_name_the_key(tmp_path: Path, text: str, message: str) -> None:
    with pytest.raises(ConfigError) as info:
        load_spec(write_spec(tmp_path, text))
    assert message in str(info.value)
    assert "\n" not in str(info.value)


def test_cli_reports_a_spec_error_in_one_line(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    spec = write_spec(tmp_path, "arms: {vas: {overrides: train.steps=3}}\n")
    assert main(["compare", str(spec), "--dry-run"]) == 2
    err = capsys.readouterr().err.strip()
    assert err == "error: compare spec arms.vas.overrides: expected a list of key=value strings"


def test_shipped_seeds_spec(capsys: pytest.CaptureFixture) -> None:
    spec = load_spec("configs/compare/seeds.yaml")  # checks the arm's configuration too
    assert list(spec.arms) == ["grpo"] and spec.base == "grpo" and spec.seeds == [0, 1, 2]
    assert spec.arms["grpo"].task == "video-qa" and spec.arms["grpo"].all_overrides == []
    assert spec.metrics == ["eval_before_rl.accuracy", "eval_after_rl.accuracy", "gain", "eval_after_rl.by_task.*"]
    assert spec.curves == ["reward", "reward/accuracy", "eval/accuracy"]
    with pytest.raises(SystemExit) as info:
        main(["compare", "--help"])
    assert info.value.code == 0
    out = capsys.readouterr().out
    assert "--dry-run" in out and "--report-only" in out and "last:/mean:/min:/max:" in out


@pytest.mark.parametrize("path", sorted((Path(__file__).resolve().parents[1] / "configs" / "compare").glob("*.yaml")), ids=lambda p: p.stem)
def test_every_shipped_spec_loads(path: Path) -> None:
    spec = load_spec(path)  # every arm's configuration is checked (unknown keys, bad values)
    assert spec.base in spec.arms and spec.seeds and spec.metrics


# ------------------------------------------------------------------------------------------ plan and resume

def test_plan_skips_finished_resumes_interrupted_starts_missing(tmp_path: Path, capsys) -> None:
    spec_path = write_spec(tmp_path, f"""
arms:
  grpo: {{}}
  kl: {{overrides: [grpo.kl_coef=0.05]}}
seeds: [0, 1, 2]
overrides: [train.steps=3]
out: {tmp_path / 'out'}
""")
    spec = load_spec(spec_path)
    out = tmp_path / "out"
    make_run(out / "grpo" / "seed-0")
    make_run(out / "grpo" / "seed-1", finished=False)  # killed during RL
    make_run(out / "kl" / "seed-0")
    (out / "kl" / "seed-0" / "run_state.json").write_text('{"stages": {}}')  # summary.json but RL not done
    (out / "kl" / "seed-2").mkdir(parents=True)  # a start that failed before writing config.yaml
    (out / "kl" / "seed-2" / LOG).write_text("error: something\n")
    actions = {(r.arm, r.seed): r.action for r in plan(spec)}
    assert actions == {("grpo", 0): "skip", ("grpo", 1): "resume", ("grpo", 2): "start",
                       ("kl", 0): "resume", ("kl", 1): "start", ("kl", 2): "start"}
    commands = {(r.arm, r.seed): r.command for r in plan(spec)}
    assert commands[("grpo", 0)] == []
    assert commands[("grpo", 1)][-3:] == ["--out", str(out / "grpo" / "seed-1"), "--resume"]  # its saved config
    assert commands[("kl", 1)][-3:] == ["train.steps=3", "grpo.kl_coef=0.05", "train.seed=1"]
    assert commands[("kl", 1)][commands[("kl", 1)].index("--out") + 1] == str(out / "kl" / "seed-1")
    assert main(["compare", str(spec_path), "--dry-run"]) == 0
    printed = capsys.readouterr().out
    assert "6 runs" in printed and "1 finished, 2 to resume, 3 to start" in printed
    assert not (out / "compare.md").exists()  # a dry run writes nothing
    assert main(["compare", str(spec_path), "--dry-run", "--arms", "kl"]) == 0
    printed = capsys.readouterr().out
    assert "3 runs" in printed and "0 finished, 1 to resume, 2 to start" in printed and "grpo seed" not in printed
    assert main(["compare", str(spec_path), "--dry-run", "--arms", "kl,ppo"]) == 2
    assert "ppo not in spec.yaml (its arms: grpo, kl)" in capsys.readouterr().err


def test_runs_made_with_other_settings_are_refused_unless_forced(tmp_path: Path, capsys) -> None:
    import yaml

    from mmrl.config import load_run_config
    from mmrl.config.io import to_dict

    out = tmp_path / "out"
    spec_path = write_spec(tmp_path, f"arms: {{grpo: {{}}, kl: {{overrides: [grpo.kl_coef=0.05]}}}}\n"
                                     f"seeds: [0]\noverrides: [train.steps=30]\nout: {out}\n")
    for arm, steps, extra in (("grpo", 15, []), ("kl", 30, ["grpo.kl_coef=0.05"])):  # grpo: made with 15 steps
        folder = out / arm / "seed-0"
        make_run(folder)
        cfg = load_run_config("video-qa", overrides=[f"train.steps={steps}", *extra, "train.seed=0"],
                              extra={"out": str(folder)})
        (folder / "config.yaml").write_text(yaml.safe_dump(to_dict(cfg), sort_keys=False))
    runs = {r.arm: r for r in plan(load_spec(spec_path))}
    assert runs["grpo"].differences == ["train.steps: 15 -> 30"] and runs["kl"].differences == []
    assert main(["compare", str(spec_path), "--dry-run"]) == 2
    err = capsys.readouterr().err
    assert f"grpo seed 0 ({out / 'grpo' / 'seed-0'}, finished): train.steps: 15 -> 30" in err
    assert "kl seed" not in err and "--force" in err and "Traceback" not in err
    assert main(["compare", str(spec_path), "--dry-run", "--arms", "kl"]) == 0  # kl's run matches the spec
    assert main(["compare", str(spec_path), "--dry-run", "--force"]) == 0
    printed = capsys.readouterr().out
    assert "--force: reusing 1 runs" in printed and "2 finished, 0 to resume, 0 to start" in printed


# ------------------------------------------------------------------------------------------------ the report

def test_report_says_when_intervals_cannot_separate_and_why_runs_stopped(tmp_path: Path) -> None:
    out = tmp_path / "out"
    spec_path = write_spec(tmp_path, f"arms: {{grpo: {{}}, method: {{}}}}\nseeds: [0, 1, 2]\nout: {out}\n"
                                     "metrics: [eval_after_rl.accuracy, gain]\n")
    for seed in (0, 1):  # two questions: every seed of an arm lands on the same accuracy
        make_run(out / "grpo" / f"seed-{seed}", before=0.5, after=0.5)
        make_run(out / "method" / f"seed-{seed}", before=0.5, after=1.0)
    for arm in ("grpo", "method"):
        state = json.loads((out / arm / "seed-0" / "run_state.json").read_text())
        summary = json.loads((out / arm / "seed-0" / "summary.json").read_text())
        assert state["stages"]["eval_after_rl"]["n"] == summary["eval_after_rl"]["n"] == 10
    killed, failed = out / "grpo" / "seed-2", out / "method" / "seed-2"
    killed.mkdir(parents=True)
    (killed / LOG).write_text("$ python -m mmrl train ...\n[2026-11-26 02:00:01,000] [WARNING] "
                              "[real_accelerator.py:209:get_accelerator] Setting ds_accelerator to cpu\n"
                              "rl:  45%|####5     | 9/20 [00:40<00:49,  4.5s/step]\n")
    failed.mkdir(parents=True)
    (failed / LOG).write_text("$ python -m mmrl train ...\nRuntimeError: CUDA error: device-side assert\n"
                              "[2026-11-26 02:00:01,000] [WARNING] [real_accelerator.py:209] Setting ds_accelerator"
                              "\n[mmrl compare] exit status 1\n")
    assert main(["compare", str(spec_path), "--report-only"]) == 0
    md = (out / "compare.md").read_text()
    rows = {line.split(" | ")[0] + line.split(" | ")[1]: line for line in md.splitlines() if line.startswith("| ")}
    assert "**no overlap**" not in md  # two zero-width intervals [0.5, 0.5] and [1.0, 1.0] separate nothing
    assert "interval has zero width" in rows["| eval_after_rl.accuracymethod"]
    assert "Few questions" in md and "10 questions per run" in md
    assert "real_accelerator" not in md
    assert f"log `{killed / LOG}`: no exit status and no error line: killed, or still running |" in md
    assert f"log `{failed / LOG}`: RuntimeError: CUDA error: device-side assert |" in md


def test_bounded_metrics_keep_their_intervals_inside_their_range(tmp_path: Path) -> None:
    out = tmp_path / "out"
    spec_path = write_spec(tmp_path, f"arms: {{grpo: {{}}}}\nseeds: [0, 1]\nout: {out}\n"
                                     "metrics: [eval_after_rl.accuracy, gain, eval_after_rl.n, last:reward]\n")
    make_run(out / "grpo" / "seed-0", before=0.0, after=0.05, rewards=(2.0,))
    make_run(out / "grpo" / "seed-1", before=0.0, after=0.95, rewards=(5.0,))
    assert main(["compare", str(spec_path), "--report-only"]) == 0
    m = json.loads((out / "compare.json").read_text())["metrics"]
    half = 12.706205 * math.sqrt(0.405) / math.sqrt(2)  # t-interval half width of (0.05, 0.95)
    assert m["eval_after_rl.accuracy"]["grpo"]["ci95"] == [0.0, 1.0]  # 0.5 -+ 5.7
    assert m["gain"]["grpo"]["ci95"] == [-1.0, 1.0]
    assert m["last:reward"]["grpo"]["ci95"] == [pytest.approx(3.5 - 3 * half / 0.9), pytest.approx(3.5 + 3 * half / 0.9)]
    assert m["last:reward"]["grpo"]["ci95"][0] < 0  # a reward has no known range: not clipped


def test_eval_curve_has_the_points_before_and_after_rl() -> None:
    summary = {"eval_before_rl": {"accuracy": 0.25}, "eval_after_rl": {"accuracy": 0.75},
               "stages": {"rl": {"steps": 30}}}
    rows = [{"stage": "rl", "step": s, "reward": 0.1} for s in range(1, 31)]
    rows[9]["eval/accuracy"], rows[19]["eval/accuracy"] = 0.4, 0.6
    run = RunData("grpo", 0, Path("x"), "finished", summary, rows)
    assert curve_points(run, "eval/accuracy") == {0: 0.25, 10: 0.4, 20: 0.6, 30: 0.75}
    assert curve_points(run, "reward") == {s: 0.1 for s in range(1, 31)}  # not an evaluation: RL steps only


def test_report_statistics_on_hand_made_runs(tmp_path: Path) -> None:
    out = tmp_path / "out"
    spec_path = write_spec(tmp_path, f"""
arms: {{grpo: {{}}, method: {{overrides: [grpo.kl_coef=0.05]}}}}
seeds: [0, 1, 2]
out: {out}
metrics: [eval_after_rl.accuracy, gain, eval_after_rl.by_task.*, last:reward]
curves: [reward, reward/accuracy]
""")
    for seed, after in enumerate([0.2, 0.4, 0.6]):
        make_run(out / "grpo" / f"seed-{seed}", before=0.1, after=after, by_task={"color": after})
    make_run(out / "method" / "seed-0", before=0.1, after=0.7, by_task={"color": 0.7, "shape": 0.3},
             rewards=(0.0, 1.0))
    make_run(out / "method" / "seed-1", before=0.1, after=0.8, by_task={"color": 0.8}, rewards=(0.0, 0.5))
    (out / "method" / "seed-2").mkdir(parents=True)  # this one failed
    (out / "method" / "seed-2" / LOG).write_text("$ python -m mmrl train ...\nerror: out of memory\n"
                                                 "[mmrl compare] exit status 2\n")
    assert main(["compare", str(spec_path), "--report-only"]) == 0
    data = json.loads((out / "compare.json").read_text())
    m = data["metrics"]
    assert list(m) == ["eval_after_rl.accuracy", "gain", "eval_after_rl.by_task.color",
                       "eval_after_rl.by_task.shape", "last:reward"]
    base = m["eval_after_rl.accuracy"]["grpo"]
    half = 4.302653 * 0.2 / math.sqrt(3)
    assert base["n"] == 3 and base["mean"] == pytest.approx(0.4) and base["sd"] == pytest.approx(0.2)
    assert base["ci95"] == [0.0, pytest.approx(0.4 + half)]  # 0.4 - half < 0: clipped
    assert base["diff_to_base"] is None
    arm = m["eval_after_rl.accuracy"]["method"]  # the failed seed does not count: values 0.7, 0.8
    half2 = 12.706205 * math.sqrt(0.005) / math.sqrt(2)
    assert arm["n"] == 2 and arm["mean"] == pytest.approx(0.75) and arm["sd"] == pytest.approx(math.sqrt(0.005))
    assert arm["ci95"] == [pytest.approx(0.75 - half2), 1.0]  # 0.75 + half2 > 1: clipped
    assert arm["diff_to_base"] == pytest.approx(0.35) and arm["intervals_overlap"] is True
    assert m["gain"]["grpo"]["mean"] == pytest.approx(0.3)
    assert m["eval_after_rl.by_task.shape"]["method"]["n"] == 1 and m["eval_after_rl.by_task.shape"]["grpo"]["n"] == 0
    assert m["last:reward"]["grpo"]["mean"] == 1.0 and m["last:reward"]["method"]["mean"] == pytest.approx(0.75)
    runs = {(r["arm"], r["seed"]): r for r in data["runs"]}
    assert runs[("method", 2)]["status"] == "failed" and runs[("method", 2)]["exit"] == 2
    md = (out / "compare.md").read_text()
    table_rows = [line for line in md.splitlines() if line.startswith("| ")]
    # the t-intervals [-0.097, 0.897] and [0.115, 1.385] clipped to an accuracy's range
    assert ("| eval_after_rl.accuracy | grpo (base) | 3 | 0.400 | 0.200 | [0.000, 0.897] | 0.200 / 0.400 / 0.600 | – "
            "| – |") in table_rows
    assert ("| eval_after_rl.accuracy | method | 2 of 3 | 0.750 | 0.071 | [0.115, 1.000] | 0.700 / 0.750 / 0.800 | "
            "+0.350 | overlap |") in table_rows
    failed = [line for line in table_rows if "failed" in line]
    log = out / "method" / "seed-2" / LOG
    assert failed == [f"| **run failed (exit 2)** | method | seed 2 | | | | | | log `{log}`: error: out of memory |"]
    assert sorted(p.name for p in out.glob("*.png")) == ["curve-reward.png", "curve-reward_accuracy.png"]
    assert "![reward](curve-reward.png)" in md and "![reward/accuracy](curve-reward_accuracy.png)" in md
    assert (out / "curve-reward.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_report_only_needs_the_folder(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    spec = write_spec(tmp_path, f"arms: {{grpo: {{}}}}\nout: {tmp_path / 'none'}\n")
    assert main(["compare", str(spec), "--report-only"]) == 2
    assert "--report-only" in capsys.readouterr().err
    spec_obj = load_spec(spec, check=False)
    spec_obj.out.mkdir()
    write_report(spec_obj)  # no run yet: every run is listed as not run
    assert "| **run not run** | grpo | seed 0 |" in (spec_obj.out / "compare.md").read_text()


# ------------------------------------------------------------------------------------------------ end to end

@pytest.mark.slow
def test_compare_end_to_end(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys) -> None:
    monkeypatch.setenv("MMRL_CACHE", str(tmp_path / "cache"))
    out = tmp_path / "out"
    overrides = ", ".join(json.dumps(o) for o in TINY)
    spec = write_spec(tmp_path, f"""
arms:
  grpo: {{task: video-qa}}
  rloo: {{overrides: [grpo.advantage_estimator=rloo]}}
seeds: [3]
overrides: [{overrides}]
metrics: [eval_after_rl.accuracy, gain, eval_after_rl.by_task.*, last:reward/accuracy]
curves: [reward]
parallel: 2
out: {out}
""")
    assert main(["compare", str(spec), "--quiet"]) == 0
    md = (out / "compare.md").read_text()
    per_arm = md.split("Paired differences")[0]  # the per-arm table (the paired one follows it)
    rows = [line for line in per_arm.splitlines() if line.startswith("| eval_after_rl.accuracy |")]
    assert [row.split(" | ")[1] for row in rows] == ["grpo (base)", "rloo"]
    assert all(row.split(" | ")[2] == "1" for row in rows)  # one finished seed each
    assert "| eval_after_rl.by_task.color |" in md and "failed" not in md
    for arm in ("grpo", "rloo"):
        folder = out / arm / "seed-3"
        assert (folder / "summary.json").is_file() and (folder / "report.md").is_file()
        log = (folder / LOG).read_text()
        assert "train.seed=3" in log and log.rstrip().endswith("[mmrl compare] exit status 0")
    assert "grpo.advantage_estimator=rloo" in (out / "rloo" / "seed-3" / LOG).read_text()
    assert (out / "curve-reward.png").is_file()
    capsys.readouterr()
    assert main(["compare", str(spec), "--quiet"]) == 0  # a re-run has nothing left to do
    assert "2 finished, 0 to resume, 0 to start" in capsys.readouterr().out
    assert (out / "grpo" / "seed-3" / LOG).read_text().count("$ ") == 1
