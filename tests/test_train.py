"""``mmrl train / sft / eval`` end to end on the tiny model and a tiny toy set.

* configuration and path errors: one line naming the key or path, exit status 2, no traceback, no work;
* a run killed with SIGKILL after its second checkpoint and restarted with ``--resume`` ends with weights
  bitwise equal to an uninterrupted run with the same seed;
* a run's folder holds everything it promises (summary, logs, report with plots, config, a reloadable
  final model that ``mmrl eval`` evaluates);
* ``mmrl sft`` writes a model, and its loss covers the assistant's tokens only.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
import yaml
from synthetic_media import weights

from mmrl import cli
from mmrl.toy.tiny_models import make_tiny

MMRL = str(Path(sys.executable).with_name("mmrl"))
# Everything that matters for speed is pinned here, so recipe edits do not slow the tests down.
TINY = [
    "model.tiny_family=qwen2_5_vl", "model.init=random",
    "data.toy_size={train: 4, val: 2, test: 2}", "data.toy_tasks=[color]",
    "data.problem_types=[multiple_choice]",
    "data.media.min_frames=4", "data.media.max_frames=4",
    "data.media.video_min_pixels=3136", "data.media.video_max_pixels=3136",
    "rollout.group_size=2", "rollout.max_new_tokens=4", "rollout.max_turns=1",
    "train.prompts_per_step=2", "train.micro_batch_size=4", "train.eval_every=0",
    "sft.steps=2", "sft.batch_size=2",
    "eval.limit=4", "eval.batch_size=4", "eval.max_new_tokens=4",
    # zero-variance rewards give zero advantages; the entropy bonus makes every RL step move the weights
    # (through the sampled rollouts), so a resume that replayed different rollouts would show
    "grpo.entropy_coef=0.01",
    "train.cpu_threads=1",  # not the load-dependent `auto`: the resumed and the uninterrupted run must match
]
RUN = ["train.steps=4", "train.save_every=1", "train.keep_checkpoints=4", "train.seed=3", *TINY]


@pytest.fixture(scope="module")
def cache(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("mmrl-cache")


def env_with(cache: Path) -> dict[str, str]:
    return {**os.environ, "MMRL_CACHE": str(cache), "TQDM_DISABLE": "1"}


def train_cmd(out: Path, *extra: str) -> list[str]:
    return [MMRL, "train", "--quiet", "--out", str(out), *extra, *RUN]


@pytest.fixture(scope="module")
def runs(cache: Path, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """An uninterrupted run, and a run SIGKILLed after checkpoint-2 then resumed (same seed)."""
    root = tmp_path_factory.mktemp("runs")
    env = env_with(cache)
    straight = root / "straight"
    done = subprocess.run(train_cmd(straight), check=False, env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]

    killed = root / "killed"
    proc = subprocess.Popen(train_cmd(killed), env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    while not (killed / "checkpoint-2" / "trainer_state.pt").is_file():  # the run itself ends the wait
        assert proc.poll() is None, proc.stderr.read().decode()[-3000:]
        time.sleep(0.02)
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()
    proc.stderr.close()
    assert proc.returncode == -signal.SIGKILL
    assert not (killed / "final").exists() and not (killed / "checkpoint-4").exists()
    resumed = subprocess.run(train_cmd(killed, "--resume"), check=False, env=env, capture_output=True, text=True, timeout=300)
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert "resumed from" in resumed.stdout + resumed.stderr
    return {"straight": straight, "killed": killed}


@pytest.mark.slow
def test_resume_after_sigkill_is_bitwise_identical(runs: dict[str, Path]) -> None:
    a, b = weights(runs["straight"] / "final"), weights(runs["killed"] / "final")
    assert set(a) == set(b)
    differ = [k for k in a if not torch.equal(a[k], b[k])]
    assert not differ, f"{len(differ)} tensors differ after resume, e.g. {differ[:5]}"
    # the RL steps after the kill point really changed the weights (so the comparison means something)
    at_kill = weights(runs["straight"] / "checkpoint-2")
    assert any(not torch.equal(a[k], at_kill[k]) for k in a)
    # the resumed run's logs hold each step once, as the uninterrupted run's do
    for run in runs.values():
        steps = [r["step"] for r in map(json.loads, (run / "metrics.jsonl").read_text().splitlines())
                 if r["stage"] == "rl"]
        assert steps == [1, 2, 3, 4]
    metrics = [[json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
               for run in runs.values()]
    for ra, rb in zip(*metrics):
        assert ra["stage"] == rb["stage"] and ra["step"] == rb["step"]
        for key in ("loss", "reward", "entropy", "grad_norm"):
            assert ra.get(key) == rb.get(key), (ra["stage"], ra["step"], key)


@pytest.mark.slow
def test_run_folder_and_final_model(runs: dict[str, Path], cache: Path, tmp_path: Path,
                                    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture) -> None:
    from transformers import AutoModelForImageTextToText, AutoProcessor

    run = runs["straight"]
    summary = json.loads((run / "summary.json").read_text())
    for key in ("eval_before_rl", "eval_after_rl"):
        acc = summary[key]["accuracy"]
        assert isinstance(acc, float) and 0.0 <= acc <= 1.0 and summary[key]["n"] > 0
    records = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    assert {r["stage"] for r in records} == {"sft", "rl", "checkpoint"}  # checkpoint: each save's memory
    assert all("reward" in r and "loss" in r for r in records if r["stage"] == "rl")
    rollouts = [json.loads(line) for line in (run / "rollouts.jsonl").read_text().splitlines()]
    assert rollouts and all(r["turns"] and "rewards" in r for r in rollouts)
    # the prompt as the model saw it: the chat template, the question, the video as one counted placeholder run
    assert all(r["prompt"].startswith("<|im_start|>") and r["prompt"].rstrip().endswith("assistant")
               and "<|video_pad|>×" in r["prompt"] for r in rollouts)
    report = (run / "report.md").read_text()
    pngs = [line.split("(")[-1].rstrip(")") for line in report.splitlines() if line.startswith("![")]
    assert len(pngs) >= 3
    for png in pngs:
        assert (run / png).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n", png
    cfg = yaml.safe_load((run / "config.yaml").read_text())
    assert cfg["train"]["steps"] == 4 and cfg["rollout"]["group_size"] == 2

    final = run / "final"
    model = AutoModelForImageTextToText.from_pretrained(final)
    processor = AutoProcessor.from_pretrained(final)
    assert model.config.model_type == "qwen2_5_vl" and processor.tokenizer.convert_tokens_to_ids("<|video_pad|>")
    saved = weights(final)
    name = "lm_head.weight"
    assert torch.equal(model.state_dict()[name], saved[name])

    monkeypatch.setenv("MMRL_CACHE", str(cache))
    out = tmp_path / "eval"
    rc = cli.main(["eval", "--quiet", "--model", str(final), "--out", str(out), "--limit", "2", *TINY])
    assert rc == 0
    metrics = json.loads((out / "metrics.json").read_text())
    assert metrics["n_total"] == 2 and isinstance(metrics["accuracy"], float)
    assert len((out / "predictions.jsonl").read_text().splitlines()) == 2
    assert "accuracy" in capsys.readouterr().out


@pytest.fixture(scope="module")
def noproc_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    full = make_tiny("qwen2_vl", tmp_path_factory.mktemp("full") / "m", seed=0)
    bare = tmp_path_factory.mktemp("bare") / "weights-only"
    bare.mkdir()
    for f in full.iterdir():
        if f.name == "config.json" or f.suffix == ".safetensors":
            (bare / f.name).write_bytes(f.read_bytes())
    return bare


@pytest.mark.parametrize("case", ["unknown-key", "wrong-type", "missing-data", "no-processor", "missing-model"])
def test_cli_errors_are_one_line(case: str, noproc_model: Path, cache: Path, tmp_path: Path,
                                 monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture) -> None:
    monkeypatch.setenv("MMRL_CACHE", str(tmp_path / "empty-cache"))
    out = tmp_path / "run"
    args, expected = {
        "unknown-key": (["train.stepz=3"], ["train.stepz", "did you mean 'train.steps'"]),
        "wrong-type": (["train.steps=abc"], ["train.steps", "abc"]),
        "missing-data": (["--data", "/nope.jsonl"], ["/nope.jsonl", "not found"]),
        "no-processor": (["--model", str(noproc_model)], [str(noproc_model), "processor"]),
        "missing-model": (["--model", str(tmp_path / "absent")], [str(tmp_path / "absent"), "not found"]),
    }[case]
    rc = cli.main(["train", "--quiet", "--out", str(out), *args])
    err = capsys.readouterr().err
    assert rc == 2
    lines = [line for line in err.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("error: "), err
    assert "Traceback" not in err
    for word in expected:
        assert word in lines[0], (word, lines[0])
    # it failed before doing any work: no run folder, no model or data built
    assert not out.exists() and not (tmp_path / "empty-cache").exists()


@pytest.mark.slow
def test_cli_error_from_a_subprocess_has_no_traceback(tmp_path: Path) -> None:
    env = env_with(tmp_path / "cache")
    proc = subprocess.run([MMRL, "train", "--out", str(tmp_path / "r"), "train.stepz=3"], check=False, env=env,
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2
    assert proc.stderr.strip().count("\n") == 0 and "train.stepz" in proc.stderr
    assert "Traceback" not in proc.stderr


def test_sft_command_writes_a_model(cache: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                    capsys: pytest.CaptureFixture) -> None:
    monkeypatch.setenv("MMRL_CACHE", str(cache))
    out = tmp_path / "sft"
    rc = cli.main(["sft", "--quiet", "--steps", "2", "--out", str(out), *TINY])
    assert rc == 0
    final = out / "final"
    assert (final / "config.json").is_file() and weights(final)
    assert (final / "processor_config.json").is_file() or (final / "preprocessor_config.json").is_file()
    records = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in records if r["stage"] == "sft"] == [1, 2]
    assert "sft: 2 steps" in capsys.readouterr().out


def sft_on_tiny(cache: Path, monkeypatch: pytest.MonkeyPatch, *overrides: str):
    """Run ``run_sft`` on the tiny toy set; returns (result, the sequences it trained on, samples, policy)."""
    from mmrl.config import load_run_config
    from mmrl.engine.sft import run_sft
    from mmrl.model import load_policy
    from mmrl.run import load_split, resolve_model

    monkeypatch.setenv("MMRL_CACHE", str(cache))
    cfg = load_run_config(overrides=[*TINY, *overrides])
    samples, _ = load_split(cfg, "train")
    policy = load_policy(resolve_model(cfg))
    seen = []
    original = policy.forward_logprobs

    def recording(seqs, **kw):  # the real method; only records what SFT trains on
        seen.extend(seqs)
        return original(seqs, **kw)

    policy.forward_logprobs = recording
    result = run_sft(cfg, policy, samples, show_progress=False)
    return result, seen, samples, policy


def test_sft_loss_covers_assistant_tokens_only(cache: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    result, seen, samples, policy = sft_on_tiny(cache, monkeypatch, "sft.target=gold", "sft.steps=1",
                                                "sft.batch_size=3", "prompt.answer_format=answer")
    assert result["loss"] > 0 and len(seen) == 3
    tok = policy.tokenizer
    by_answer = {s.answer for s in samples}
    for seq in seen:
        mask = seq.loss_mask
        first = mask.index(1)
        assert all(mask[first:]) and not any(mask[:first]), "the trained tokens are one final block"
        prompt_text = tok.decode(seq.ids[:first])
        assert prompt_text.endswith("<|im_start|>assistant\n") and prompt_text.count("<|im_start|>assistant") == 1
        trained = tok.decode(seq.ids[first:])
        assert trained.startswith("<answer>") and trained.endswith("</answer><|im_end|>"), trained
        assert trained[len("<answer>"):-len("</answer><|im_end|>")] in by_answer
        assert all(t != policy.video_token_id for t in seq.ids[first:])


def test_gold_targets_answer_with_the_option_text_when_asked(cache: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    _, seen, samples, policy = sft_on_tiny(cache, monkeypatch, "sft.target=gold", "sft.steps=1", "sft.batch_size=4",
                                           "prompt.answer_format=answer", "sft.mc_answer=option")
    colours = {s.options[ord(s.answer) - ord("A")] for s in samples}
    for seq in seen:
        trained = policy.tokenizer.decode(seq.ids[seq.loss_mask.index(1):])
        assert trained[len("<answer>"):-len("</answer><|im_end|>")] in colours, trained


def test_reasoning_cold_start_trains_on_think_then_the_answer_in_words(cache: Path,
                                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    _, seen, samples, policy = sft_on_tiny(cache, monkeypatch, "sft.target=reasoning", "sft.steps=2",
                                           "sft.batch_size=4", "prompt.answer_format=think_answer",
                                           "sft.mc_answer=option")
    assert len(seen) == 8
    colours = {s.options[ord(s.answer) - ord("A")] for s in samples}
    for seq in seen:
        first = seq.loss_mask.index(1)
        trained = policy.tokenizer.decode(seq.ids[first:])
        assert trained.startswith("<think>") and trained.endswith("</answer><|im_end|>"), trained
        think, answer = trained[len("<think>"):-len("</answer><|im_end|>")].split("</think><answer>")
        assert answer in colours, trained
        assert f"The moving object is {answer}." in think or "It is a " in think, trained
