"""TRL's own reward functions, unchanged, inside ``mmrl train``.

A config names ``trl:think_format_reward``, ``trl:accuracy_reward`` (math-verify, from the dev extra) and
``trl:get_soft_overlong_punishment`` (a factory, built with ``init``) directly. A plug-in records what each
step's rollouts were; the test then calls the same TRL functions the way TRL's ``GRPOTrainer`` calls them
(``prompts=, completions=`` in the conversational form, ``completion_ids=`` the generated tokens, the
dataset columns, ``trainer_state``, ``log_extra``, ``log_metric``) and finds the values the run used.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from tiny_runs import TINY_RUN, module_cache  # noqa: F401 -- module_cache is a fixture
from transformers import TrainerState
from trl.rewards import accuracy_reward, get_soft_overlong_punishment, think_format_reward

from mmrl.config import load_run_config
from mmrl.engine.plugins import Callback, register_plugin
from mmrl.run import load_split, train
from rewards import CombinedReward, register_reward, unregister_reward

pytestmark = pytest.mark.usefixtures("module_cache")

RECORDED: list[dict] = []
SOLUTIONS = [r"$\frac{1}{2}$", "$3$", "$x+1$", "no number here"]
REWARDS = ('[{name: "trl:think_format_reward"}, {name: "trl:accuracy_reward"}, '
           '{name: "trl:get_soft_overlong_punishment", init: {max_completion_len: 10, soft_punish_cache: 6}}]')


@register_plugin("t_trl_record")
class Record(Callback):
    """What every round's rewards saw: completions, generated tokens, the dataset's solutions, the values."""

    def after_rewards(self, batch) -> None:
        tok = self.ctx.service.policy.tokenizer
        ids = [[t for t, m in zip(seq.ids, batch.loss_mask[i].tolist()) if m > 0] for i, seq in enumerate(batch.seqs)]
        RECORDED.append({
            "texts": list(batch.completions), "ids": ids,
            "decoded": [tok.decode(x, skip_special_tokens=True) for x in ids],
            "lengths": batch.response_length.tolist(),
            "solution": [s.meta["solution"] for s in batch.samples],
            "values": {k: v.tolist() for k, v in batch.reward_components.items()},
            "logged": sorted(batch.extra.get("reward_extra", {})),
        })


@pytest.fixture(scope="module")
def trl_run(module_cache: None, tmp_path_factory: pytest.TempPathFactory) -> Path:  # noqa: F811
    cfg = load_run_config("video-qa", overrides=TINY_RUN)
    _, info = load_split(cfg, "train", show_progress=False)
    toy = Path(info["path"])
    rows = [json.loads(line) for line in toy.read_text().splitlines() if line.strip()][:4]
    for r, solution in zip(rows, SOLUTIONS):
        r["solution"] = solution  # an extra dataset column, as a TRL dataset has it
        for m in r["media"]:
            m["path"] = str((toy.parent / m["path"]).resolve())
    root = tmp_path_factory.mktemp("trl")
    data = root / "math.jsonl"
    data.write_text("".join(json.dumps(r) + "\n" for r in rows))
    cfg = load_run_config("video-qa", overrides=[
        *TINY_RUN, f"data.train={data}", f"rewards={REWARDS}", "plugins={t_trl_record: {}}",
        "prompt.answer_format=think_answer", "rollout.max_new_tokens=8", "rollout.stop=[]"])
    RECORDED.clear()
    train(cfg, run_dir=root / "run", show_progress=False)
    return root / "run"


def test_trl_rewards_get_what_trl_passes(trl_run: Path) -> None:
    assert len(RECORDED) == 2  # two steps, one round each
    logged: dict[str, list] = {}
    skipped = []
    for rec in RECORDED:
        completions = [[{"role": "assistant", "content": t}] for t in rec["texts"]]
        prompts = [[{"role": "user", "content": [{"type": "video"}, {"type": "text", "text": "q"}]}]] * len(completions)
        extra: dict[str, list] = {}
        kwargs = {"solution": rec["solution"], "trainer_state": TrainerState(),
                  "log_extra": extra.__setitem__, "log_metric": lambda name, value: None}
        common = {"prompts": prompts, "completions": completions, "completion_ids": rec["ids"], **kwargs}
        think = think_format_reward(**common)
        acc = accuracy_reward(**common)
        over = get_soft_overlong_punishment(max_completion_len=10, soft_punish_cache=6)(**common)
        assert rec["values"]["think_format_reward"] == think
        assert rec["values"]["accuracy_reward"] == [0.0 if a is None else a for a in acc]
        assert rec["values"]["get_soft_overlong_punishment"] == pytest.approx(over)
        skipped += [a is None for a in acc]
        # completion_ids are the generated tokens of each completion
        assert rec["decoded"] == rec["texts"] and [len(x) for x in rec["ids"]] == rec["lengths"]
        logged.update(extra)
        assert rec["logged"] == sorted(extra)  # accuracy_reward's log_extra columns reached the batch
        chars = get_soft_overlong_punishment(10, 6)([[0] * len(t) for t in rec["texts"]])
        rec["chars_differ"] = chars != over
    # the overlong punishment measured tokens: counting characters would have given other values
    assert any(rec["chars_differ"] for rec in RECORDED)
    assert any(skipped) and not all(skipped)  # the unparseable solution is "not applicable" (None), as in TRL
    assert {"solution", "gold_parsed", "answer_parsed"} <= set(logged)
    rows = [json.loads(line) for line in (trl_run / "metrics.jsonl").read_text().splitlines()]
    assert all("reward/get_soft_overlong_punishment" in r for r in rows if r["stage"] == "rl")


def test_trl_functions_registered_or_imported_read_the_conversational_form() -> None:
    texts = ["<think>a</think>b", "no tags"]
    register_reward("t_think", think_format_reward)  # a function of the trl package: the messages form
    try:
        combined = CombinedReward(["t_think", {"name": "trl.rewards.think_format_reward", "label": "dotted"},
                                   "trl:think_format_reward"])
        got = combined.compute(texts, {"id": ["a", "b"]})
        assert got.components == {"t_think": [1.0, 0.0], "dotted": [1.0, 0.0], "think_format_reward": [1.0, 0.0]}
    finally:
        unregister_reward("t_think")
