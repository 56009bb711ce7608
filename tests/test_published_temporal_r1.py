"""configs/temporal-grounding.yaml is Temporal-R1 as released (arXiv 2506.01908, appletea233/Temporal-R1): its
values equal the table below, written from the released TVG code (examples/run_qwen2_5_vl_3b_tvg.sh over
examples/grpo_example.yaml, verl/utils/reward_score/tvg.py, verl/workers/actor/config.py), not from the
recipe. The paper's own training settings are not public; the README's results came from this code.

The recipe's ``temporal_r1`` reward is checked against a re-implementation of ``tvg_compute_score`` written here
from appletea233/Temporal-R1 ``verl/utils/reward_score/tvg.py`` (not from mmrl's code), on random completions that
include the forms the code scores 0 (``[s, e]``, "s to e", JSON with unquoted keys) and the JSON its format regex
rejects (unquoted numbers, keys in the other order, text around the blocks)."""

from __future__ import annotations

import json
import random
import re

import pytest
from published import assert_published

from mmrl.config import load_run_config
from rewards.answers import parse_span
from rewards.registry import CombinedReward

# (config path, value, source)
PUBLISHED = [
    ("rollout.group_size", 8, "run_qwen2_5_vl_3b_tvg.sh: worker.rollout.n=8"),
    ("rollout.temperature", 1.0, "grpo_example.yaml: worker.rollout.temperature 1.0"),
    ("rollout.max_new_tokens", 2048, "run_qwen2_5_vl_3b_tvg.sh: data.max_response_length=2048"),
    ("grpo.kl_coef", 1e-2, "run_qwen2_5_vl_3b_tvg.sh: worker.actor.kl_loss_coef=1e-2"),
    ("grpo.kl_estimator", "k3", "grpo_example.yaml: kl_loss_type low_var_kl"),
    ("grpo.entropy_coef", 1e-3, "run_qwen2_5_vl_3b_tvg.sh: worker.actor.entropy_coeff=1e-3"),
    ("grpo.clip_low", 0.2, "verl/workers/actor/config.py: clip_ratio 0.2"),
    ("grpo.clip_high", 0.2, "verl/workers/actor/config.py: clip_ratio 0.2"),
    ("train.lr", 1e-6, "grpo_example.yaml: optim lr 1e-6"),
    ("train.weight_decay", 1e-2, "grpo_example.yaml: weight_decay 1e-2"),
    ("train.warmup_steps", 0, "grpo_example.yaml: lr_warmup_ratio 0"),
    ("train.lr_schedule", "constant", "verl/workers/fsdp_workers.py: get_constant_schedule_with_warmup"),
    ("train.max_grad_norm", 1.0, "grpo_example.yaml: max_grad_norm 1.0"),
    ("train.prompts_per_step", 16, "run_qwen2_5_vl_3b_tvg.sh: data.rollout_batch_size=16"),
    ("data.media.video_min_pixels", 3136, "run_qwen2_5_vl_3b_tvg.sh: data.min_pixels=3136"),
    ("data.media.video_total_pixels", 1605632,
     ("run_qwen2_5_vl_3b_tvg.sh: data.max_pixels=1605632, passed to qwen-vl-utils as the video's total_pixels "
      "(verl/utils/dataset_video.py)")),
    ("data.media.video_max_pixels", 768 * 28 * 28, "dataset_video.py gives no max_pixels: qwen-vl-utils' VIDEO_MAX_PIXELS"),
    ("data.media.fps", 2.0, "dataset_video.py gives no fps: qwen-vl-utils' FPS 2.0"),
    ("data.media.min_frames", 4, "dataset_video.py gives no frame count: qwen-vl-utils' FPS_MIN_FRAMES 4"),
    ("data.media.max_frames", 768, "dataset_video.py gives no frame count: qwen-vl-utils' FPS_MAX_FRAMES 768"),
    ("sft.steps", 0, "the TVG script runs RL from Qwen2.5-VL-3B-Instruct"),
    ("train.steps", 15 * (12408 // 16),
     ("grpo_example.yaml: trainer.total_episodes 15; ray_trainer.py: len(train_dataloader) (drop_last) x episodes, "
      "over Charades-STA's 12,408 training queries at 16 a step")),
    ("rewards[0].kwargs.format_mode", "tvg_json", "tvg.py tvg_format_reward: the regex of the JSON answer"),
    ("rewards[0].kwargs.span_form", "json", "tvg.py tvg_accuracy_reward: json.loads of the first <answer> block"),
    ("prompt.template", "temporal-r1", "verl/utils/dataset_video.py: the video, then the problem text alone"),
    ("prompt.system", ("You FIRST think about the reasoning process as an internal monologue and then provide the "
                       "final answer. The reasoning process MUST BE enclosed within <think> </think> tags. The final "
                       "answer MUST BE put in <answer> </answer> tags. Output the final answer in JSON format."),
     "run_qwen2_5_vl_3b_tvg.sh SYSTEM_PROMPT as data.system_prompt (OmegaConf.from_cli folds its line break)"),
]

# tvg.py at HEAD: 0.5 tIoU + 0.5 format (think, then answer), tIoU on the span as predicted
PUBLISHED_REWARD = {"format_weight": 0.5, "iou_weight": 0.5, "format_mode": "tvg_json", "clip_to_shown": False,
                    "strict_tags": True, "span_form": "json"}  # tvg.py: the JSON of the first <answer> block or 0


@pytest.mark.parametrize(("path", "value", "source"), PUBLISHED, ids=[row[0] for row in PUBLISHED])
def test_recipe_value_is_the_published_one(path: str, value: object, source: str) -> None:
    assert_published("temporal-grounding", path, value, source)


def test_dual_reward_is_the_released_one() -> None:
    cfg = load_run_config("temporal-grounding")
    (spec,) = [r for r in cfg.rewards if r.name == "temporal_r1"]
    assert {k: spec.kwargs[k] for k in PUBLISHED_REWARD} == PUBLISHED_REWARD


# ---------------------------------------------------------------------------------------------------------------
# tvg.py, re-implemented from appletea233/Temporal-R1 verl/utils/reward_score/tvg.py (the ground truth is the span
# divided by the video's length, as the code's records give it; the prediction is divided by video_length there)
# ---------------------------------------------------------------------------------------------------------------

TVG_FORMAT = (r'<think>.*?</think>\s*<answer>\s*{\s*"start_time"\s*:\s*"([\d.]+)"\s*,\s*"end_time"\s*:\s*"([\d.]+)"'
              r'\s*}\s*</answer>')


def source_format(text: str) -> float:
    return 1.0 if re.fullmatch(TVG_FORMAT, text, re.DOTALL) else 0.0


def source_iou(a: list[float], b: list[float]) -> float:
    inter = max(min(a[1], b[1]) - max(a[0], b[0]), 0)
    return max(0, inter / (max(a[1], b[1]) - min(a[0], b[0])))


def source_accuracy(text: str, ground_truth: list[float], video_length: float) -> float:
    try:
        block = re.search(r"<answer>(.*?)</answer>", text, re.DOTALL).group(1).strip()
        data = json.loads(block)
        pred = [float(data["start_time"]) / video_length, float(data["end_time"]) / video_length]
        return source_iou(pred, ground_truth)
    # the code catches every Exception: no block (None.group), not JSON, not an object, no key, not a number,
    # a zero union
    except (AttributeError, ValueError, TypeError, KeyError, OverflowError, ZeroDivisionError, RecursionError):
        return 0.0


def source_score(text: str, ground_truth: list[float], video_length: float) -> float:
    return 0.5 * source_accuracy(text, ground_truth, video_length) + 0.5 * source_format(text)


def _number(rng: random.Random, length: float) -> str:
    value = rng.uniform(-0.1 * length, 1.1 * length)
    return rng.choice([f"{value:.1f}", f"{value:.2f}", str(int(value)), f"{value:.1e}", "nan", "inf", f"{value:.1f}s"])


def _span(rng: random.Random, s: str, e: str) -> str:
    """A span in one of the forms a model writes: the code's JSON object among them, most not."""
    sp = rng.choice(["", " ", "\n", "  "])
    forms = [
        f'{{"start_time": "{s}", "end_time": "{e}"}}',
        f'{{{sp}"start_time"{sp}:{sp}"{s}"{sp},{sp}"end_time"{sp}:{sp}"{e}"{sp}}}',
        f'{{"start_time": {s}, "end_time": {e}}}',          # unquoted numbers: json reads them, the regex does not
        f'{{"end_time": "{e}", "start_time": "{s}"}}',      # keys in the other order: the regex does not
        f'{{"start_time": "{s}", "end_time": "{e}", "note": "x"}}',
        f"{{start_time: {s}, end_time: {e}}}",              # unquoted keys: not JSON
        f"{{'start_time': '{s}', 'end_time': '{e}'}}",      # single quotes: not JSON
        f"[{s}, {e}]", f"{s} to {e}", f"{s} - {e} seconds", f"from {s}s to {e}s", f"({s}, {e})",
        f'[{{"start_time": "{s}", "end_time": "{e}"}}]',    # a list around the object
        f'{{"start_time": null, "end_time": "{e}"}}', f'{{"start": "{s}", "end": "{e}"}}',
    ]
    return rng.choice(forms)


def _completion(rng: random.Random, span: str) -> str:
    sp = rng.choice(["", " ", "\n", "\n\n"])
    return rng.choice([
        f"<think>the door opens</think>{sp}<answer>{sp}{span}{sp}</answer>",
        f"<think>a\nb</think><answer>{span}</answer>",
        f"<answer>{span}</answer>",                                   # no think block
        f" <think>x</think><answer>{span}</answer>",                 # text before: fullmatch fails
        f"<think>x</think><answer>{span}</answer> done",             # text after
        f"<think>x</think><answer>{span}</answer>\n",
        f"<think>x</think><answer>[1, 2]</answer><answer>{span}</answer>",  # the first block counts
        f"<think>x</think><ANSWER>{span}</ANSWER>",                   # re.search is case-sensitive
        f"<think>x</think><answer>{span}",                            # cut off
        f"<think>x</think>{span}",
    ])


def _cases(n: int, seed: int = 0) -> list[tuple[str, list[float], float]]:
    rng = random.Random(seed)
    out = []
    for _ in range(n):
        length = rng.uniform(10.0, 60.0)
        a, b = sorted(rng.uniform(0.0, length) for _ in range(2))
        if rng.random() < 0.05:
            b = a  # a single-point gold span
        gold = [round(a, 2), round(b, 2)]
        if rng.random() < 0.5:  # near the gold span, so that the tIoU is often above 0
            s, e = (f"{gold[0] + rng.uniform(-3, 3):.1f}", f"{gold[1] + rng.uniform(-3, 3):.1f}")
        else:
            s, e = _number(rng, length), _number(rng, length)
        if rng.random() < 0.05:
            e = s  # a zero-length prediction
        out.append((_completion(rng, _span(rng, s, e)), gold, length))
    return out


def _recipe_reward() -> CombinedReward:
    cfg = load_run_config("temporal-grounding")
    return CombinedReward([r for r in cfg.rewards if r.name == "temporal_r1"])


def _scores(reward: CombinedReward, cases: list[tuple[str, list[float], float]]) -> list[float]:
    n = len(cases)
    columns = {"id": [f"s{i}" for i in range(n)], "problem_type": ["temporal_grounding"] * n,
               "answer": [gold for _, gold, _ in cases], "options": [None] * n,
               "meta": [{"duration": length} for _, _, length in cases]}
    return reward.compute([text for text, _, _ in cases], columns).components["temporal_r1"]


def test_the_recipe_scores_grounding_as_tvg_py_on_random_completions() -> None:
    cases = _cases(3000)
    got = _scores(_recipe_reward(), cases)
    want = [source_score(text, [g / length for g in gold], length) for text, gold, length in cases]
    assert got == pytest.approx(want, abs=1e-9)
    # the cases include what issue 62 found scored differently: tIoU for spans not written as the JSON object
    # (mmrl's lenient reading), and format credit for JSON the code's regex rejects
    lenient = [c for c, w in zip(cases, want)
               if source_accuracy(c[0], [g / c[2] for g in c[1]], c[2]) == 0 and (span := parse_span(c[0]))
               and span[0] < span[1] and min(span[1], c[1][1]) > max(span[0], c[1][0])]
    assert len(lenient) > 100
    unquoted = [text for text, _, _ in cases if re.search(r'"start_time": [\d-]', text) and "<think>" in text]
    assert unquoted and all(source_format(t) == 0 for t in unquoted)
    assert 0 < sum(w > 0.5 for w in want) < len(want)  # both terms earn, and not everywhere


def test_the_edge_cases_of_tvg_py() -> None:
    gold, length = [2.0, 4.0], 10.0
    texts = {
        "json": '<think>x</think><answer>{"start_time": "2", "end_time": "4"}</answer>',
        "list": "<think>x</think><answer>[2, 4]</answer>",
        "to": "<think>x</think><answer>2 to 4</answer>",
        "unquoted_keys": "<think>x</think><answer>{start_time: 2, end_time: 4}</answer>",
        "unquoted_numbers": '<think>x</think><answer>{"start_time": 2, "end_time": 4}</answer>',
        "inverted": '<think>x</think><answer>{"start_time": "4", "end_time": "2"}</answer>',
        "point": '<think>x</think><answer>{"start_time": "3", "end_time": "3"}</answer>',
        "negative": '<think>x</think><answer>{"start_time": "-1", "end_time": "3"}</answer>',
        "nan": '<think>x</think><answer>{"start_time": "nan", "end_time": "3"}</answer>',
        "upper": '<think>x</think><ANSWER>{"start_time": "2", "end_time": "4"}</ANSWER>',
        "trailing": '<think>x</think><answer>{"start_time": "2", "end_time": "4"}</answer>.',
    }
    got = dict(zip(texts, _scores(_recipe_reward(), [(t, gold, length) for t in texts.values()])))
    want = {k: source_score(t, [0.2, 0.4], length) for k, t in texts.items()}
    assert got == pytest.approx(want, abs=1e-12)
    assert want["json"] == 1.0 and want["list"] == want["to"] == want["unquoted_keys"] == 0.0  # neither term
    assert want["unquoted_numbers"] == want["trailing"] == 0.5  # tIoU 1, format 0
    assert want["inverted"] == want["point"] == 0.5  # format 1, tIoU 0 (a zero-length span against [2, 4])
    assert want["negative"] == pytest.approx(0.5 * 0.2)  # no format ("-1"), tIoU 1/5
    assert want["nan"] == want["upper"] == 0.0


def test_the_lenient_reading_stays_behind_a_setting() -> None:
    """span_form: any (the default, other grounding setups) still reads [s, e] and "s to e"."""
    reward = CombinedReward([{"name": "temporal_r1", "kwargs": {"format_weight": 0.0, "iou_weight": 1.0}}])
    cases = [("<answer>[2, 4]</answer>", [2.0, 4.0], 10.0), ("<answer>2 to 3</answer>", [2.0, 4.0], 10.0)]
    assert _scores(reward, cases) == [1.0, 0.5]


def test_span_form_is_checked() -> None:
    from mmrl_common.errors import ConfigError
    from rewards.registry import get_reward

    with pytest.raises(ConfigError, match="span_form must be one of any, json"):
        get_reward("temporal_r1")(["<answer>[2, 4]</answer>"], problem_type=["temporal_grounding"],
                                  answer=[[2.0, 4.0]], span_form="JSON")
