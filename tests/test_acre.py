"""ACRE: the option permutation and its inverse, the five cases and their values by hand, the second pass
(eval mode, no gradient, the training log-probs untouched), the reward inside a real trainer, and the
option-shuffling check of `mmrl eval --check consistency` / the `eval_consistency` plug-in (mmrl.methods.acre)."""

from __future__ import annotations

import itertools
import json
import random
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
from tiny_runs import TINY_RUN, module_cache, rl_rows  # noqa: F401 (module_cache is a fixture)

from data_pipelines.schema import Sample
from mmrl import cli
from mmrl.engine.service import Answer
from mmrl.methods import acre  # noqa: F401  (registers the acre reward)
from mmrl_common.errors import ConfigError
from rewards import consistency as C
from rewards.registry import CombinedReward

pytestmark = pytest.mark.usefixtures("module_cache")

OPTIONS = ["red", "green", "blue", "yellow"]


# ------------------------------------------------------------------------------------------ permutations
def test_permutation_shuffles_and_maps_back() -> None:
    perm = [2, 0, 3, 1]  # slot A shows option C ("blue"), slot B shows A, slot C shows D, slot D shows B
    assert C.shuffle_options(OPTIONS, perm) == ["blue", "red", "yellow", "green"]
    assert C.inverse_permutation(perm) == [1, 3, 0, 2]
    assert [C.from_shuffled_letter(x, perm) for x in "ABCD"] == ["C", "A", "D", "B"]
    assert [C.to_shuffled_letter(x, perm) for x in "ABCD"] == ["B", "D", "A", "C"]
    assert C.from_shuffled_letter(None, perm) is None
    for p in itertools.permutations(range(4)):
        for x in "ABCD":
            assert C.from_shuffled_letter(C.to_shuffled_letter(x, p), p) == x
            # the option named in the shuffled list is the same text as the original letter's
            shown = C.shuffle_options(OPTIONS, p)
            assert shown[ord(C.to_shuffled_letter(x, p)) - 65] == OPTIONS[ord(x) - 65]
    with pytest.raises(ValueError, match="not a permutation"):
        C.shuffle_options(OPTIONS, [0, 0, 1, 2])
    with pytest.raises(ValueError, match="not one of the 4"):
        C.from_shuffled_letter("E", perm)


def test_identity_permutation_is_drawn_unless_excluded() -> None:
    rng = random.Random(0)
    drawn = {tuple(C.draw_permutation(2, rng)) for _ in range(100)}
    assert drawn == {(0, 1), (1, 0)}
    rng = random.Random(0)
    assert {tuple(C.draw_permutation(2, rng, exclude_identity=True)) for _ in range(100)} == {(1, 0)}
    assert all(sorted(p) == [0, 1, 2] and p != [0, 1, 2]
               for p in (C.draw_permutation(3, rng, exclude_identity=True) for _ in range(50)))
    # one stream per (seed, step, sample, rollout): the same permutation on a resumed run
    assert C.draw_permutation(4, C.rollout_rng(0, 3, "s1", 2)) == C.draw_permutation(4, C.rollout_rng(0, 3, "s1", 2))


# ------------------------------------------------------------------------------------------ the cases
def test_five_cases_by_hand() -> None:
    gold = "B"
    assert C.consistency_case("B", "B", gold) == "consistent_correct"
    assert C.consistency_case("B", "C", gold) == "correct_then_wrong"
    assert C.consistency_case("B", None, gold) == "correct_then_wrong"  # no option named: a wrong one
    assert C.consistency_case("A", "B", gold) == "wrong_then_correct"
    assert C.consistency_case("A", "A", gold) == "consistent_wrong"
    assert C.consistency_case("A", "D", gold) == "inconsistent_wrong"
    assert C.consistency_case("A", None, gold) == "inconsistent_wrong"
    assert C.consistency_case(None, None, gold) == "unanswered"
    cases = ["consistent_correct", "consistent_wrong", "inconsistent_wrong", "correct_then_wrong", "unanswered"]
    assert C.oscr(cases) == pytest.approx(2 / 4)
    shares = C.case_shares(cases)
    assert shares["consistent_correct"] == pytest.approx(0.25) and shares["unanswered"] == pytest.approx(0.2)
    assert shares["wrong_then_correct"] == 0.0


class ScriptedService:
    """The rollout service's interface with scripted second answers: each sample's second answer names the
    option *text* given in ``script`` (so the letter it returns depends on the shuffled order it is shown)."""

    def __init__(self, script: dict[str, str | None]):
        self.script = script
        self.asks: list = []

    def generate(self, samples, asks, **kwargs):
        self.asks.extend(asks)
        out = []
        for s, ask in zip(samples, asks):
            text = self.script[s.id]
            letter = None if text is None else chr(65 + ask.options.index(text))
            out.append([Answer(text=f"{text}</answer>", answer=letter, token_ids=[], finished=True,
                               options=ask.options)])
        return out


def _mc(sid: str, answer: str = "B") -> Sample:
    return Sample(id=sid, problem_type="multiple_choice", question="What colour?", answer=answer,
                  options=list(OPTIONS))


def _run_reward(samples, completions, script, **kwargs):
    service = ScriptedService(script)
    metrics: dict[str, float] = {}
    reward = CombinedReward([{"name": "acre", "kwargs": kwargs}])
    columns = {"id": [s.id for s in samples], "problem_type": [s.problem_type for s in samples],
               "options": [s.options for s in samples], "answer": [s.answer for s in samples],
               "meta": [s.meta for s in samples], "rollout_service": service,
               "rollout_batch": SimpleNamespace(samples=samples),
               "trainer_state": SimpleNamespace(global_step=5),
               "log_metric": lambda k, v: metrics.__setitem__(k, v)}
    return reward.compute(completions, columns).components["acre"], metrics, service


def test_reward_values_of_every_case_by_hand() -> None:
    # gold B = "green"; the second answers name option texts, whatever order they are shown in
    samples = [_mc(f"q{i}") for i in range(6)] + [
        Sample(id="n", problem_type="numeric", question="How many?", answer="3")]
    completions = ["<answer>B</answer>", "<answer>green</answer>", "<answer>A</answer>", "<answer>red</answer>",
                   "<answer>red</answer>", "no answer here", "<answer>3</answer>"]
    script = {"q0": "green", "q1": "blue", "q2": "green", "q3": "red", "q4": "yellow", "q5": "red"}
    values, metrics, service = _run_reward(samples, completions, script)
    #   q0 correct & consistent 1.0 | q1 correct then wrong 0.5 | q2 wrong then correct 0 (the trained answer is
    #   wrong) | q3 the same wrong option 0 | q4 two wrong options 0 | q5 unanswered 0 (no second pass) | numeric:
    #   accuracy
    assert values == [1.0, 0.5, 0.0, 0.0, 0.0, 0.0, 1.0]
    assert len(service.asks) == 5  # q5 gave no answer: not re-asked; the numeric question neither
    assert all(a.prefix == "<answer>" for a in service.asks)  # no reasoning in these completions
    assert metrics["acre/oscr"] == pytest.approx(2 / 5)
    assert metrics["acre/consistent_correct"] == pytest.approx(1 / 5)
    assert metrics["acre/unanswered"] == pytest.approx(1 / 6)
    assert metrics["acre/shuffled_accuracy"] == pytest.approx(2 / 5)

    custom = {"consistent_correct": 2.0, "correct_then_wrong": -1.0, "wrong_then_correct": 0.5,
              "consistent_wrong": -0.5, "inconsistent_wrong": -0.25, "unanswered": -2.0}
    values, _, _ = _run_reward(samples, completions, script, values=custom)
    assert values == [2.0, -1.0, 0.5, -0.5, -0.25, -2.0, 1.0]
    values, _, _ = _run_reward(samples, completions, script, values=custom, mode="add")
    assert values == [3.0, 0.0, 0.5, -0.5, -0.25, -2.0, 1.0]  # + accuracy of the first answer


def test_a_re_answer_that_flips_under_shuffling_earns_less_than_a_consistent_one() -> None:
    """ACRE's signature: four rollouts give the same first answer; the re-answer of some follows the option's
    *content* through the shuffle, that of the others keeps the *position* it answered first (a letter
    bias). The consistent rollouts earn more, whether the first answer was right or wrong, and only a correct
    first answer can earn anything. The second answer is read in the shuffled lettering, so "the same letter"
    is "another option" whenever the permutation moved it."""
    samples = [_mc(f"q{i}") for i in range(4)]
    completions = ["<answer>B</answer>", "<answer>B</answer>", "<answer>A</answer>", "<answer>A</answer>"]

    class PositionBiased(ScriptedService):
        def generate(self, samples, asks, **kwargs):  # answers the slot the first answer took, whatever is there
            self.asks.extend(asks)
            slot = {"q1": 1, "q3": 0}
            return [[Answer(text="", answer=chr(65 + slot[s.id]) if s.id in slot else
                            chr(65 + a.options.index(self.script[s.id])), token_ids=[], finished=True,
                            options=a.options)] for s, a in zip(samples, asks)]

    service = PositionBiased({"q0": "green", "q2": "red"})
    reward = CombinedReward([{"name": "acre", "kwargs": {"exclude_identity": True}}])
    columns = {"id": [s.id for s in samples], "problem_type": [s.problem_type for s in samples],
               "options": [s.options for s in samples], "answer": [s.answer for s in samples],
               "meta": [s.meta for s in samples], "rollout_service": service,
               "rollout_batch": SimpleNamespace(samples=samples), "trainer_state": SimpleNamespace(global_step=0)}
    perms = [C.draw_permutation(4, C.rollout_rng(0, 0, s.id, i), exclude_identity=True)
             for i, s in enumerate(samples)]
    flipped = [i for i in (1, 3) if perms[i][(1, 0)[i // 2]] != (1, 0)[i // 2]]  # the slot now shows another option
    assert flipped == [1, 3]  # these seeds move both options (so the position-biased re-answers flip)
    values = reward.compute(completions, columns).components["acre"]
    consistent_correct, flipped_correct, consistent_wrong, flipped_wrong = values
    assert consistent_correct == 1.0 and flipped_correct == 0.5 < consistent_correct
    assert consistent_wrong == flipped_wrong == 0.0  # a wrong first answer earns nothing either way
    # and a wrong first answer that the shuffle turns right earns nothing by default (the table's third row)
    assert C.resolve_values(None)["wrong_then_correct"] == 0.0
    assert C.resolve_values({"wrong_then_correct": 0.25})["wrong_then_correct"] == 0.25  # configurable


def test_reward_reuses_the_reasoning_trace_and_draws_one_permutation_per_rollout() -> None:
    samples = [_mc("q0"), _mc("q0")]
    completions = ["<think>it is the green one</think><answer>B</answer>", "<think>x</think><answer>B</answer>"]
    _, _, service = _run_reward(samples, completions, {"q0": "green"}, exclude_identity=True)
    assert [a.prefix for a in service.asks] == ["<think>it is the green one</think><answer>",
                                                "<think>x</think><answer>"]
    assert all(a.options != OPTIONS and sorted(a.options) == sorted(OPTIONS) for a in service.asks)
    _, _, service = _run_reward(samples, completions, {"q0": "green"}, reuse_trace=False)
    assert [a.prefix for a in service.asks] == ["<answer>", "<answer>"]


def test_reward_settings_are_checked() -> None:
    samples, completions = [_mc("q0")], ["<answer>B</answer>"]
    with pytest.raises(Exception, match="unknown case 'consistent'"):
        _run_reward(samples, completions, {"q0": "green"}, values={"consistent": 1.0})
    with pytest.raises(Exception, match="mode must be one of replace, add"):
        _run_reward(samples, completions, {"q0": "green"}, mode="sum")
    with pytest.raises(Exception, match="inside `mmrl train`"):
        CombinedReward(["acre"]).compute(completions, {"problem_type": ["multiple_choice"], "answer": ["B"]})
    with pytest.raises(Exception, match="train_second_pass=true .* rollout.environment=acre_reanswer"):
        _run_reward(samples, completions, {"q0": "green"}, train_second_pass=True)
    with pytest.raises(ConfigError, match="values.consistent_correct must be a number"):
        C.resolve_values({"consistent_correct": "high"})


def test_letter_balance() -> None:
    bal = C.letter_balance(["A", "A", "A", "B", None], ["A", "B", "C", "D", "A"])
    assert bal["top_letter"] == "A"
    assert bal["top_letter_share"] == pytest.approx(3 / 5)
    assert bal["top_letter_gold_share"] == pytest.approx(2 / 5)
    assert bal["top_letter_gap"] == pytest.approx(1 / 5)


# ------------------------------------------------------------------------------------------ the second pass
@pytest.fixture(scope="module")
def trainer(tmp_path_factory: pytest.TempPathFactory):
    from mmrl.config import load_run_config
    from mmrl.engine.trainer import GRPOTrainer
    from mmrl.model import load_policy
    from mmrl.run import load_split, resolve_model

    cfg = load_run_config("video-qa", overrides=[
        *TINY_RUN, "imports=[mmrl.methods.acre]",
        "rewards=[{name: accuracy, weight: 0}, {name: acre, kwargs: {exclude_identity: true}}]"])
    samples, _ = load_split(cfg, "train", show_progress=False)
    policy = load_policy(resolve_model(cfg), device="cpu")
    return GRPOTrainer(cfg, policy, samples, run_dir=tmp_path_factory.mktemp("acre") / "run", show_progress=False)


@pytest.mark.slow
def test_second_pass_runs_in_eval_mode_without_gradient_and_leaves_logprobs_unchanged(trainer) -> None:
    policy = trainer.policy
    batch = trainer.rollout_round(2)
    # the tiny random model names no option: give each rollout a parseable answer, the gold one or not
    golds = [s.answer for s in batch.samples]
    batch.completions = [f"<answer>{g if i % 2 else 'A'}</answer>" for i, g in enumerate(golds)]
    policy.model.train()
    with torch.no_grad():
        before, _, _ = policy.forward_logprobs(batch.seqs)
    seen: list[tuple[bool, bool]] = []
    hook = policy.model.register_forward_hook(
        lambda module, args, out: seen.append((module.training, torch.is_grad_enabled())))
    calls = trainer.service.calls
    try:
        trainer.score(batch)
    finally:
        hook.remove()
    assert trainer.service.calls == calls + 1  # one generate call for the whole batch
    assert seen and all(training is False and grad is False for training, grad in seen)
    assert policy.model.training  # back in train mode for the update
    with torch.no_grad():
        after, _, _ = policy.forward_logprobs(batch.seqs)
    assert torch.equal(before, after)
    assert all(p.grad is None for p in policy.model.parameters())
    values = batch.component("acre").tolist()
    assert set(values) <= {1.0, 0.5, 0.25, 0.0}
    metrics = batch.extra["reward_metrics"]
    assert metrics["acre/unanswered"] == 0.0 and 0.0 <= metrics["acre/oscr"] <= 1.0


@pytest.mark.slow
def test_train_logs_case_shares_and_eval_consistency_lands_in_the_summary(tmp_path: Path) -> None:
    out = tmp_path / "run"
    args = ["train", "--quiet", "--out", str(out), *TINY_RUN, "train.steps=1", "eval.after_rl=true",
            "imports=[mmrl.methods.acre]", "plugins={eval_consistency: {}}",
            "rewards=[{name: accuracy, weight: 0}, {name: acre}]"]
    assert cli.main(args) == 0
    row = rl_rows(out)[0]
    assert "reward/acre" in row and "reward_metric/acre/unanswered" in row
    summary = json.loads((out / "summary.json").read_text())
    c = summary["eval_after_rl"]["consistency"]
    assert c["n"] == 2 and set(c["cases"]) == {*C.CASES, "unanswered"}
    with pytest.raises(ConfigError, match="unknown setting"):
        from mmrl.methods.acre import EvalConsistency

        EvalConsistency(SimpleNamespace(service=SimpleNamespace(evaluation={})), shuffle=True)


def test_eval_command_consistency_and_shuffled_frames(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    out = tmp_path / "eval"
    assert cli.main(["eval", "--quiet", "--consistency", "--shuffled-frames", "--out", str(out), *TINY_RUN]) == 0
    metrics = json.loads((out / "metrics.json").read_text())
    assert metrics["consistency"]["n"] == 2 and metrics["shuffled_frames"]["n"] == 2
    preds = [json.loads(line) for line in (out / "predictions.jsonl").read_text().splitlines()]
    assert all(p["case"] in (*C.CASES, "unanswered") and "shuffled_frames_score" in p for p in preds)
    printed = capsys.readouterr().out
    assert "option-shuffling consistency (OSCR)" in printed and "shuffled frames" in printed
    assert cli.main(["eval", "--check", "consistensy", "--out", str(tmp_path / "x"), *TINY_RUN]) == 2
    assert "unknown evaluation check 'consistensy'" in capsys.readouterr().err  # the nearest is named


# ------------------------------------------------------------------------------------------ trained second pass
def test_the_reanswer_environment_shuffles_and_the_reward_reads_the_trained_turn() -> None:
    """train_second_pass: the second pass is the episode's second turn (the acre_reanswer environment): the
    environment shows the options in another order, the reward maps the second turn's letter back and scores
    the case without re-asking the service."""
    from mmrl.methods.acre import ReanswerEnvironment

    samples = [_mc("t0"), _mc("t1"), _mc("t2")]
    envs = [ReanswerEnvironment(s, [], seed=3, exclude_identity=True) for s in samples]
    firsts = ["<think>it is green</think><answer>B</answer>", "<answer>B</answer>", "I cannot tell"]
    obs = [env.step(text) for env, text in zip(envs, firsts)]
    assert obs[2] is None and envs[2].info["acre"] == {"first": None, "perm": None}  # nothing to re-answer
    perms = [env.info["acre"]["perm"] for env in envs[:2]]
    for o, perm in zip(obs[:2], perms):
        assert perm != sorted(perm) and o.text.startswith("The same question with its options in another order")
        shown = [OPTIONS[j] for j in perm]
        assert all(f"{chr(65 + k)}. {text}" in o.text for k, text in enumerate(shown))
    # t0 re-answers green (consistent), t1 names another colour in the shuffled lettering (flips)
    second = [f"<answer>{chr(65 + [OPTIONS[j] for j in perms[0]].index('green'))}</answer>",
              f"<answer>{chr(65 + [OPTIONS[j] for j in perms[1]].index('red'))}</answer>", None]
    turns = [[f, t] if t else [f] for f, t in zip(firsts, second)]
    service = ScriptedService({})
    reward = CombinedReward([{"name": "acre", "kwargs": {"train_second_pass": True}}])
    columns = {"id": [s.id for s in samples], "problem_type": [s.problem_type for s in samples],
               "options": [s.options for s in samples], "answer": [s.answer for s in samples],
               "meta": [s.meta for s in samples], "rollout_service": service,
               "rollout_batch": SimpleNamespace(samples=samples, turns=turns),
               "env_info": [env.info for env in envs], "trainer_state": SimpleNamespace(global_step=1)}
    values = reward.compute(["\n".join(t) for t in turns], columns).components["acre"]
    assert values == [1.0, 0.5, 0.0] and service.asks == []  # consistent, flipped, unanswered; nobody re-asked


def test_the_trained_second_turn_is_in_the_loss_mask() -> None:
    """The re-answer is the policy's own turn: its tokens are trained; the shuffled options are masked."""
    from mmrl.engine.rollout import SamplingParams, run_episodes
    from mmrl.methods.acre import ReanswerEnvironment
    from mmrl.model import Generation, load_policy
    from mmrl.toy.tiny_models import ensure_tiny

    policy = load_policy(ensure_tiny("qwen2_5_vl"))
    tok = policy.tokenizer

    class Scripted:
        def __init__(self, script):
            self.script, self.calls = script, 0

        def generate(self, seqs, *, n, params):
            text = self.script[self.calls]
            self.calls += 1
            ids = tok(text, add_special_tokens=False)["input_ids"] + [tok.convert_tokens_to_ids("<|im_end|>")]
            return [[Generation(token_ids=ids, text=text, logprobs=[0.0] * len(ids), finished=True)
                     for _ in range(n)] for _ in seqs]

    sample = _mc("m0")
    prompt = policy.encode(policy.render([{"role": "user", "content": [{"type": "text", "text": "What colour?"}]}]))
    eps = run_episodes(policy, Scripted(["<answer>B</answer>", "<answer>C</answer>"]), [prompt], [sample], n=1,
                       params=SamplingParams(max_new_tokens=8), environment=lambda s: ReanswerEnvironment(s, []),
                       max_turns=2)
    seq = eps[0].seq
    trained = tok.decode([i for i, m in zip(seq.ids, seq.loss_mask) if m])
    masked_tail = tok.decode([i for i, m in zip(seq.ids[len(prompt.ids):], seq.loss_mask[len(prompt.ids):]) if not m])
    assert trained.count("<answer>") == 2 and "<answer>B</answer>" in trained and "<answer>C</answer>" in trained
    assert "another order" in masked_tail and "another order" not in trained
    assert eps[0].turns == ["<answer>B</answer>", "<answer>C</answer>"] and "acre" in eps[0].env.info


def test_the_benchmark_form_reletters_and_reads_the_cases(tmp_path: Path) -> None:
    """consistency_on_benchmark: multiple-choice questions whose letter was read are asked again with their
    options permuted (labelled options re-lettered, as Video-MME stores them), the reasoning trace continued
    when there is one; the answers, in the shuffled lettering, are mapped back and each row gets its case."""
    from data_pipelines.benchmarks import load_benchmark
    from data_pipelines.benchmarks.fixtures import write_fixture
    from mmrl.benchmarks.protocols import plain_options, shuffled_options
    from mmrl.methods.acre import consistency_on_benchmark

    assert shuffled_options(["A. cat", "B. dog", "C. owl"], [2, 0, 1]) == ["A. owl", "B. cat", "C. dog"]
    assert shuffled_options(["cat", "dog", "owl"], [2, 0, 1]) == ["owl", "cat", "dog"]
    samples = [s for s in load_benchmark("videomme", write_fixture("videomme", tmp_path / "v", n=4),
                                          media_cache=tmp_path / "m").samples][:3]
    golds = [str(s.answer) for s in samples]
    other = [next(c for c in "ABCD" if c != g) for g in golds]
    rows = [{"pred": golds[0], "completion": "<think>it is red</think><answer>x</answer>"},  # stays with gold
            {"pred": other[1], "completion": "B"},  # wrong, then moves to the gold option
            {"pred": None, "completion": "no idea"}]
    seen = []

    def ask(requests):
        seen.extend(requests)
        out = []
        for i, variant, prefix in requests:
            perm = rows[i]["permutation"]
            target = golds[i]  # both answer the gold option the second time, named in the shuffled lettering
            shown = "ABCD"[perm.index("ABCD".index(target))]
            assert plain_options(variant.options) == [plain_options(samples[i].options)[k] for k in perm]
            assert variant.options[0].startswith("A. ") and variant.question == samples[i].question
            out.append({"completion": prefix + shown, "pred": shown, "prompt": f"p{i}"})
        return out

    consistency_on_benchmark(samples, rows, ask, seed=3)
    assert [r[0] for r in seen] == [0, 1]  # the unanswered question is not asked again
    assert seen[0][2] == "<think>it is red</think><answer>" and seen[1][2] == ""  # the trace, when there is one
    assert [r["case"] for r in rows] == ["consistent_correct", "wrong_then_correct", "unanswered"]
    assert rows[0]["shuffled_letter"] == golds[0] and rows[2]["shuffled_letter"] is None
    assert all(r["permutation"] != sorted(r["permutation"]) for r in rows)
