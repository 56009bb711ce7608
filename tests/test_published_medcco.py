"""configs/medcco.yaml is MedCCO's paper recipe: its values against a table of the published settings, written
from the sources (docs/methods/medcco.md), not from the recipe. MedCCO (arXiv 2505.19213) publishes its stages
and rewards in two overview figures but no hyper-parameters; those rows come from MedVLThinker's released verl
GRPO script for the same base model, which the recipe follows where MedCCO is silent. The toy comparison
(configs/compare/medcco.yaml) overrides only the toy world's keys and keeps the recipe's method."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

import mmrl.methods.medcco  # noqa: F401 (registers the plug-in and the medical rewards)
from mmrl.cli.compare import load_spec
from mmrl.config import load_run_config

ROOT = Path(__file__).resolve().parent.parent
FIG25 = "MedCCO overview figure 2025 (shaohao011.github.io images/medcco_overview.png @cfde72b)"
FIG26 = "MedCCO overview figure 2026 (same file @307f1b2)"
MVLT = "MedVLThinker train/train-qwen2_5_vl_7b-pmc_vqa-easy_to_hard.sh"

# (what, expected, source); `what` is read by value() below
PUBLISHED: list[tuple[str, Any, str]] = [
    ("base model", "Qwen/Qwen2.5-VL-7B-Instruct", "our reading: Med-RwR (arXiv 2510.18303) Table 1 lists MedCCO as 7B; figure 2026 compares it with Qwen2.5-VL-7B"),
    ("answer format", "think_answer", f"{FIG25}: <think> ... </think> <answer> ... </answer>"),
    ("algorithm", "grpo", f"{FIG25}, {FIG26}: GRPO in both stages"),
    ("number of stages", 2, f"{FIG26}: stage 1 factual anchoring, stage 2 generative reasoning"),
    ("stage 1 questions", ["closed"], f"{FIG25}: step 1 close-ended VQA"),
    ("stage 2 questions", ["open"], f"{FIG25}: step 2 open-ended VQA"),
    ("stage 1 accuracy reward", "medical_closed", f"{FIG25}: R_acc = 1 if o = g else 0"),
    ("stage 2 reward terms", {"lexical", "semantic"}, f"{FIG25}: lam/2 (BLEU + ROUGE) + (1 - lam) BERTScore"),
    ("stage 2 lexical + semantic weights", 1.0, f"{FIG25}: lam + (1 - lam)"),
    ("stage 2 semantic metric", "bertscore", f"{FIG25}: BERTScore(o, g)"),
    ("stage 2 reference reset", True, f"{FIG26}: curriculum bridge pi_ref = pi_theta*(stage 1)"),
    ("stage 2 closed replay", 0.0, f"{FIG26}: joint training of the two reward kinds conflicts; not mixed"),
]
BORROWED: list[tuple[str, Any, str]] = [  # MedCCO: not published
    ("rollouts per prompt", 8, f"{MVLT}: 8 rollouts"),
    ("learning rate", 1e-6, f"{MVLT}: lr 1e-6"),
    ("prompts per step", 256, f"{MVLT}: batch 256"),
    ("sequences per mini-batch", 128 * 8, f"{MVLT}: mini-batch 128 prompts of 8 rollouts"),
    ("KL coefficient", 0.01, f"{MVLT}: KL loss 0.01"),
    ("KL estimator", "k3", f"{MVLT}: low-variance KL"),
    ("KL in the loss, not the reward", False, f"{MVLT}: KL loss"),
    ("entropy bonus", 0.0, f"{MVLT}: no entropy bonus"),
    ("clip ratios (low, high)", [0.2, 0.2], f"{MVLT}: sets none, so verl's symmetric clip_ratio 0.2"),
    ("max response tokens", 4096, f"{MVLT}: max response 4096"),
    ("dual-clip bound", 3.0, f"{MVLT}: sets none, so verl's ppo_trainer.yaml actor clip_ratio_c 3.0"),
    ("weight decay", 0.01, f"{MVLT}: sets none, so verl's ppo_trainer.yaml actor optim weight_decay 0.01"),
]


def value(cfg, what: str) -> Any:
    stages = cfg.plugins["curriculum"]["stages"]
    s1, s2 = stages[0], stages[-1]
    names = lambda stage: {r["name"] if r["name"] != "armed" else r.get("label") for r in stage["rewards"]}
    weights = {r["name"]: r.get("weight", 1.0) for r in s2["rewards"]}
    semantic = next(r for r in s2["rewards"] if r["name"] == "semantic")
    return {
        "base model": cfg.model.path, "answer format": cfg.prompt.answer_format,
        "algorithm": cfg.grpo.advantage_estimator, "number of stages": len(stages),
        "stage 1 questions": s1["select"]["answer_types"], "stage 2 questions": s2["select"]["answer_types"],
        "stage 1 accuracy reward": s1["rewards"][0]["name"],
        "stage 2 reward terms": names(s2) - {"format"},
        "stage 2 lexical + semantic weights": weights["lexical"] + weights["semantic"],
        "stage 2 semantic metric": semantic["kwargs"]["metric"],
        "stage 2 reference reset": s2.get("reset_reference"), "stage 2 closed replay": s2.get("replay", 0.0),
        "rollouts per prompt": cfg.rollout.group_size, "learning rate": cfg.train.lr,
        "prompts per step": cfg.train.prompts_per_step, "sequences per mini-batch": cfg.grpo.ppo_mini_batch_size,
        "KL coefficient": cfg.grpo.kl_coef, "KL estimator": cfg.grpo.kl_estimator,
        "KL in the loss, not the reward": cfg.grpo.kl_in_reward, "entropy bonus": cfg.grpo.entropy_coef,
        "clip ratios (low, high)": [cfg.grpo.clip_low, cfg.grpo.clip_high],
        "max response tokens": cfg.rollout.max_new_tokens,
        "dual-clip bound": cfg.grpo.dual_clip_c, "weight decay": cfg.train.weight_decay,
    }[what]


@pytest.fixture(scope="module")
def recipe():
    return load_run_config("medcco")


@pytest.mark.parametrize("what, expected, source", PUBLISHED + BORROWED, ids=[r[0] for r in PUBLISHED + BORROWED])
def test_the_recipe_has_the_published_setting(recipe, what: str, expected: Any, source: str) -> None:
    got = value(recipe, what)
    assert got == (pytest.approx(expected) if isinstance(expected, float) else expected), f"{what}: {source}"


def test_every_unpublished_choice_in_the_recipe_says_so() -> None:
    text = (ROOT / "configs" / "medcco.yaml").read_text()
    for key in ("lam = 0.5", "reset_optimizer: true", "replay: 0.0", "switch: {rule: steps"):
        line = next(ln for ln in text.splitlines() if key in ln)
        assert "not published: our choice" in line, line


def test_the_toy_comparison_keeps_the_recipes_method(recipe) -> None:
    spec = load_spec(ROOT / "configs" / "compare" / "medcco.yaml")
    cur = spec.arms["curriculum"]
    toy = load_run_config(cur.task, cur.config, [*cur.all_overrides, "train.seed=0"])
    for what, _, _ in PUBLISHED:
        if what != "base model" and what != "answer format":  # the toy base answers in a few words, no think
            assert value(toy, what) == value(recipe, what), what
    assert toy.model.path is None and toy.model.init == "toy_base" and toy.data.toy_tasks == ["scan"]
    s2_recipe, s2_toy = recipe.plugins["curriculum"]["stages"][1], toy.plugins["curriculum"]["stages"][1]
    assert s2_toy["reset_optimizer"] is s2_recipe["reset_optimizer"] is True
    assert [r.get("kwargs", {}).get("layer") for r in s2_toy["rewards"]] == \
        [r.get("kwargs", {}).get("layer") for r in s2_recipe["rewards"]]
    header = (ROOT / "configs" / "compare" / "medcco.yaml").read_text().split("\noverrides:")[0]
    for key in {o.split("=")[0].strip('"').split(".")[0] for o in cur.shared}:  # each overridden section is explained
        assert f"#   {key}" in header or f", {key}" in header or f"#   rewards, {key}" in header, key
