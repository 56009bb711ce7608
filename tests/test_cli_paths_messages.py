"""Issue 61: the messages a new user met that misled (item 7 and the cosmetic ones), each now one line saying
what is wrong and the fix: a text-only model folder, a Hub id given as --model, dotted keys in a YAML config,
a quoted "false", ``lora: true``, and the training file given again as --eval-data."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from tiny_runs import module_cache  # noqa: F401 (a fixture)

from mmrl import cli


def _error(capsys: pytest.CaptureFixture, *argv: str) -> str:
    capsys.readouterr()
    assert cli.main(list(argv)) == 2
    err = capsys.readouterr().err
    assert "Traceback" not in err and len(err.strip().splitlines()) == 1, err
    return err.strip()


# ------------------------------------------------------------------------ item 7: a text-only model folder
def test_a_text_only_qwen2_folder_is_named_as_such_not_asked_for_a_processor(
        tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    folder = tmp_path / "Qwen2.5-0.5B-Instruct"  # as downloaded: config, tokenizer, weights; no processor
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps({"architectures": ["Qwen2ForCausalLM"], "model_type": "qwen2",
                                                    "hidden_size": 896, "num_hidden_layers": 24}))
    (folder / "tokenizer_config.json").write_text("{}")
    err = _error(capsys, "train", "--quiet", "--model", str(folder), "--out", str(tmp_path / "run"))
    assert err.startswith(f"error: {folder}: model type 'qwen2' is a text-only language model (no vision tower); "
                          "mmrl trains Qwen vision-language models (qwen2_vl, qwen2_5_vl, qwen3_vl")
    assert "processor" not in err
    assert _error(capsys, "eval", "--quiet", "--model", str(folder), "--eval-data", str(folder / "config.json")) \
        .startswith(f"error: {folder}: model type 'qwen2' is a text-only language model")


def test_a_vision_model_of_another_family_is_named(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    folder = tmp_path / "llava"
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps({"model_type": "llava", "vision_config": {}, "text_config": {}}))
    (folder / "preprocessor_config.json").write_text("{}")
    err = _error(capsys, "train", "--quiet", "--model", str(folder), "--out", str(tmp_path / "run"))
    assert err.startswith(f"error: {folder}: model type 'llava' is not a family mmrl trains (qwen2_vl, ")


# ------------------------------------------------------------------------ a Hub id as --model
def test_a_hub_id_as_model_says_to_download_it_first(tmp_path: Path, capsys: pytest.CaptureFixture,
                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    err = _error(capsys, "train", "--quiet", "--model", "Qwen/Qwen2.5-VL-3B-Instruct")
    assert err.startswith("error: model.path: folder not found: Qwen/Qwen2.5-VL-3B-Instruct; ")
    assert ("looks like a Hugging Face Hub id, and mmrl loads a local folder: download it first (huggingface-cli "
            "download Qwen/Qwen2.5-VL-3B-Instruct --local-dir models/Qwen2.5-VL-3B-Instruct) and give --model "
            "models/Qwen2.5-VL-3B-Instruct") in err
    # a path that is not an owner/name pair, or whose first folder is there (a typo in a local path), gets no hint
    (tmp_path / "models").mkdir()
    assert "Hub id" not in _error(capsys, "train", "--quiet", "--model", "models/missing")
    assert "Hub id" not in _error(capsys, "train", "--quiet", "--model", "./a/b/c")


# ------------------------------------------------------------------------ YAML configs
@pytest.mark.parametrize(("text", "expected"), [
    ("train.lr: 1e-3\n", ("error: unknown config key 'train.lr': a YAML config nests its sections, a dotted key is "
                         "for KEY=VALUE on the command line; nest it: train: {lr: 1e-3}")),
    ("rollout:\n  temperature: 0.7\n  vllm.tensor_parallel_size: 2\n",
     ("error: unknown config key 'rollout.vllm.tensor_parallel_size': a YAML config nests its sections, a dotted "
     "key is for KEY=VALUE on the command line; nest it: vllm: {tensor_parallel_size: 2}")),
    ('eval:\n  before_rl: "false"\n', ("error: eval.before_rl: expected true or false, got the string 'false' "
                                      "(quoted); write it without quotes: before_rl: false")),
    ("eval:\n  after_rl: 'yes'\n", ("error: eval.after_rl: expected true or false, got the string 'yes' (quoted); "
                                   "write it without quotes: after_rl: true")),
    ("model:\n  lora: true\n", ("error: model.lora: true does not switch this section on or off: give a mapping of "
                               "its settings (r, alpha, dropout, target_modules); model.lora={} (in YAML `lora: "
                               "{}`) takes the defaults, null or leaving it out turns it off")),
])
def test_config_file_mistakes_say_the_fix(text: str, expected: str, tmp_path: Path,
                                          capsys: pytest.CaptureFixture) -> None:
    (tmp_path / "my.yaml").write_text(text)
    assert _error(capsys, "config", "show", "--config", str(tmp_path / "my.yaml")) == expected


def test_lora_true_as_an_override_says_the_fix(capsys: pytest.CaptureFixture) -> None:
    assert "model.lora={} (in YAML `lora: {}`) takes the defaults" in _error(
        capsys, "config", "show", "model.lora=true")


# ------------------------------------------------------------------------ --data FILE --eval-data FILE
CHEAP = ["model.tiny_family=qwen2_5_vl", "model.init=random", "rollout.max_new_tokens=2", "eval.max_new_tokens=2",
         "train.cpu_threads=1", "train.steps=1", "rollout.group_size=2", "train.prompts_per_step=1",
         "train.save_every=0", "sft.steps=0", "prompt.answer_format=answer"]


def test_the_training_file_given_as_eval_data_is_not_reported_as_held_out(
        tmp_path: Path, module_cache: None, capsys: pytest.CaptureFixture) -> None:  # noqa: F811
    data = tmp_path / "mine.jsonl"
    data.write_text("".join(json.dumps({"id": f"q{i}", "problem_type": "multiple_choice", "question": "Which?",
                                        "options": ["red", "green"], "answer": "A", "media": []}) + "\n"
                            for i in range(2)))
    capsys.readouterr()
    assert cli.main(["train", "--quiet", "--data", str(data), "--eval-data", str(data), "--out",
                     str(tmp_path / "run"), *CHEAP]) == 0
    out = capsys.readouterr().out
    assert (f"warning: data.test {data} is the training data (data.train, --data): its accuracy is measured on "
            "questions the model trains on, not held-out ones") in out
    accuracy = [line for line in out.splitlines() if line.startswith("accuracy before RL")]
    assert len(accuracy) == 1 and accuracy[0].endswith("(on the training data, not held out)"), out
    report = (tmp_path / "run" / "report.md").read_text()  # the report says it too, and not "held-out"
    assert "## Evaluation on the training data (not held out)" in report and "Held-out" not in report, report
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert summary["eval_on_training_data"].startswith(f"data.test {data} is the training data")


def test_held_out_data_of_its_own_gets_no_warning() -> None:
    from mmrl.config import load_run_config
    from mmrl.run.helpers import evaluated_on_training_data

    cfg = load_run_config("video-qa", overrides=["data.train=a.jsonl", "data.test=b.jsonl", "eval.split=test"])
    assert evaluated_on_training_data(cfg) is None
    cfg = load_run_config("video-qa", overrides=["data.train=my_dd", "data.test=./my_dd:train", "eval.split=test"])
    assert evaluated_on_training_data(cfg) is None  # my_dd is not a folder here: its `train` split is not assumed
    cfg = load_run_config("video-qa", overrides=["data.train=a.jsonl", "data.test=./a.jsonl", "eval.split=test"])
    assert evaluated_on_training_data(cfg) is not None
