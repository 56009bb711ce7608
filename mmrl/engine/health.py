"""Run-health warnings: say so, once, when a run cannot be learning.

:class:`RunHealth` is a built-in plug-in (every trainer has one, ``train.health_window`` steps wide; 0 turns
it off). It watches every drawn group and, over the last ``health_window`` RL steps (or all of them at the
last step of a shorter run), warns when

* a reward component has the same value, 0 or a penalty, on every rollout (``no_reward_signal.<label>``): it
  gives GRPO nothing to compare, e.g. a format reward that no completion earns;
* most multiple-choice answers name the same option although the data's answers do not
  (``one_answer``): the policy collapsed onto one answer;
* most groups have the same reward for every rollout (``equal_reward_groups``): their advantages are 0;
* the train/rollout log-prob gap (``rollout_logprob_gap``, logged with ``rollout.record_logprobs``: on by
  default with the vLLM backend) grows (``logprob_gap``): over the window's last quarter it is above
  :data:`GAP_FLOOR` nats per token and :data:`GAP_GROWTH` times what it was over the run's first steps, or
  above :data:`GAP_HIGH` whatever it started at. The engine then samples from another distribution than the
  one training scores, and the update is off-policy by that much (a known road to collapse in RL with a
  separate inference engine).

Each warning is printed once with what to try, and logged as ``warning/<kind>`` in that step's line of
``metrics.jsonl``; the report lists them (:func:`mmrl.run.report.run_warnings`). Which warnings fired is saved
with the checkpoints, so a resumed run does not repeat them.
"""

from __future__ import annotations

from collections import Counter, deque
from typing import TYPE_CHECKING, Any

from tqdm import tqdm

from mmrl.engine.plugins import Callback

if TYPE_CHECKING:
    from mmrl.engine.batch import RolloutBatch
    from mmrl.engine.plugins import StepContext

NOT_REWARDS = ("kl_penalty", "overlong_penalty")  # engine terms that are legitimately constant
COLLAPSE_SHARE = 0.9  # one option named by this share of the answered multiple-choice rollouts...
COLLAPSE_MIN_ANSWERS = 20  # ...of at least this many...
COLLAPSE_MAX_GOLD_SHARE = 0.6  # ...while it is the right answer of less than this share of them
EQUAL_GROUPS_SHARE = 0.8
GAP_FLOOR = 0.02  # mean |training - rollout| log-prob per token below which a growing gap is round-off
GAP_GROWTH = 2.0  # the gap at the window's end over the run's first steps
GAP_HIGH = 0.1  # a gap this large is an alarm whatever it started at


class RunHealth(Callback):
    """The warnings above; ``window`` steps wide."""

    def __init__(self, ctx: StepContext, window: int):
        super().__init__(ctx, window=window)
        self.window = window
        self.fired: list[str] = []
        self.steps: deque[dict[str, Any]] = deque(maxlen=max(1, window))
        self.current = self._empty()
        self.gap_start: list[float] = []  # the run's first rollout_logprob_gap values (its baseline)

    @property
    def gap_span(self) -> int:
        """Steps the gap's baseline (the run's first) and its recent level (the window's last) each average."""
        return max(1, self.window // 4)

    @staticmethod
    def _empty() -> dict[str, Any]:
        return {"components": {}, "groups": [], "answers": [], "gold": []}

    # ------------------------------------------------------------------------------------ hooks
    def after_rewards(self, batch: RolloutBatch) -> None:
        from mmrl.engine.service import parse_answer

        cur = self.current
        for label, values in batch.reward_components.items():
            if label not in NOT_REWARDS:
                cur["components"].setdefault(label, []).extend(float(v) for v in values)
        lo, hi = float(batch.rewards.min()), float(batch.rewards.max())
        for rows in batch.groups():
            r = batch.rewards[rows]
            if float(r.max() - r.min()) < 1e-6:
                cur["groups"].append("low" if float(r[0]) <= lo + 1e-6 else "high" if float(r[0]) >= hi - 1e-6
                                     else "mid")
            else:
                cur["groups"].append("varied")
        for sample, text in zip(batch.samples, batch.completions):
            if sample.problem_type == "multiple_choice" and sample.options:
                cur["answers"].append(parse_answer(text, sample, sample.options))
                cur["gold"].append(str(sample.answer))

    def on_step_end(self, step: int, stats: dict[str, Any]) -> None:
        gap = stats.get("rollout_logprob_gap")
        gap = float(gap) if isinstance(gap, (int, float)) else None
        if gap is not None and len(self.gap_start) < self.gap_span:
            self.gap_start.append(gap)
        self.steps.append({**self.current, "step": step, "entropy": stats.get("entropy"),
                           "truncated": stats.get("truncated_frac"), "gap": gap})
        self.current = self._empty()
        last = step >= self.ctx.cfg.train.steps
        if len(self.steps) < self.window and not (last and len(self.steps) >= 2):
            return
        for kind, text in self.check():
            if kind not in self.fired:
                self.fired.append(kind)
                stats[f"warning/{kind}"] = text
                tqdm.write(f"warning (step {step}): {text}")

    def state_dict(self) -> dict[str, Any]:
        # the window too: a resumed run must see the steps before its checkpoint, or its warnings (and when
        # they fire) would differ from an unbroken run's
        return {"fired": list(self.fired), "gap_start": list(self.gap_start), "steps": list(self.steps)}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.fired = list(state.get("fired", []))
        self.gap_start = [float(g) for g in state.get("gap_start", [])]
        self.steps.clear()
        self.steps.extend(state.get("steps", []))

    # ------------------------------------------------------------------------------------ checks
    def check(self) -> list[tuple[str, str]]:
        """``(kind, text)`` of every condition that holds over the window."""
        steps = list(self.steps)
        span = f"steps {steps[0]['step']}-{steps[-1]['step']}"
        out: list[tuple[str, str]] = []
        labels = sorted({k for s in steps for k in s["components"]})
        trunc = [s["truncated"] for s in steps if isinstance(s["truncated"], (int, float))]
        for label in labels:
            values = [v for s in steps for v in s["components"].get(label, [])]
            # a reward every completion earns in full is no alarm; one none earns (or a penalty all get) is
            if values and max(values) - min(values) < 1e-9 and values[0] <= 0:
                if values[0] == 0:
                    hint = ("no completion earns it: read a few completions in rollouts.jsonl, check that the "
                            "prompt asks for what it scores (prompt.answer_format and the reward's kwargs) and "
                            "that completions are long enough (rollout.max_new_tokens"
                            + (f"; {100 * sum(trunc) / len(trunc):.0f}% were cut at it" if trunc else "") + ")")
                else:
                    hint = ("every completion gets the same penalty: it adds nothing to learn from; check its "
                            "settings against the completions (rollouts.jsonl)")
                out.append((f"no_reward_signal.{label}",
                            (f"reward '{label}' was {values[0]:.3f} on all {len(values)} rollouts of {span}, so it "
                            f"gives GRPO no signal; {hint}")))
        answers = [a for s in steps for a in s["answers"]]
        gold = [g for s in steps for g in s["gold"]]
        named = [a for a in answers if a is not None]
        if len(named) >= COLLAPSE_MIN_ANSWERS:
            letter, count = Counter(named).most_common(1)[0]
            gold_share = gold.count(letter) / max(1, len(gold))
            if count / len(named) >= COLLAPSE_SHARE and gold_share < COLLAPSE_MAX_GOLD_SHARE:
                ent = [s["entropy"] for s in steps if isinstance(s["entropy"], (int, float))]
                ent_s = f", entropy {ent[-1]:.2f}" if ent else ""
                out.append(("one_answer",
                            (f"{count} of {len(named)} multiple-choice answers in {span} were '{letter}' (the right "
                            f"answer in {100 * gold_share:.0f}% of those questions{ent_s}): the policy collapsed "
                            "onto one answer; try a lower train.lr, a higher rollout.temperature, an entropy bonus "
                            "(grpo.entropy_coef=0.001), a KL pull (grpo.kl_coef=0.01), or data whose answer "
                            "letters are balanced")))
        groups = [g for s in steps for g in s["groups"]]
        equal = [g for g in groups if g != "varied"]
        if groups and len(equal) / len(groups) >= EQUAL_GROUPS_SHARE:
            low, high = equal.count("low"), equal.count("high")
            out.append(("equal_reward_groups",
                        (f"{len(equal)} of {len(groups)} groups in {span} gave every rollout the same reward "
                        f"({low} all at the step's lowest reward, {high} all at its highest), so their advantage "
                        "is 0 and they teach nothing; if most are low the questions are too hard for the model "
                        "(a cold start, easier data), if high too easy; grpo.dynamic_sampling=true draws more "
                        "groups until enough differ, a larger rollout.group_size or rollout.temperature makes "
                        "differences likelier")))
        gap = self._gap_warning(steps)
        if gap is not None:
            out.append(("logprob_gap", gap))
        return out

    def _gap_warning(self, steps: list[dict[str, Any]]) -> str | None:
        """The ``logprob_gap`` warning's text when the gap grew or is high (see the module docstring)."""
        gaps = [(s["step"], s["gap"]) for s in steps if s.get("gap") is not None]
        k = self.gap_span
        if len(gaps) < k or not self.gap_start:
            return None
        recent_steps = gaps[-k:]
        recent = sum(g for _, g in recent_steps) / k
        start = sum(self.gap_start) / len(self.gap_start)
        grown = (len(self.gap_start) == k and recent > GAP_FLOOR and recent > GAP_GROWTH * start
                 and recent_steps[0][0] > k)  # the recent steps are not the baseline's own
        if not grown and recent <= GAP_HIGH:
            return None
        span = f"steps {recent_steps[0][0]}-{recent_steps[-1][0]}"
        how = (f"grew from {start:.4f} over the run's first {len(self.gap_start)} steps" if grown
               else f"started at {start:.4f}")
        return (f"the train/rollout log-prob gap (rollout_logprob_gap: mean |training - rollout| log-prob per "
                f"token) was {recent:.4f} over {span}; it {how}: the rollout engine samples from another "
                "distribution than the one training scores, so the update is off-policy by that much (a known "
                "road to collapse); check that every update reaches the engine (time/sync_s) and that both run "
                "in the same dtype (model.dtype), correct for it with grpo.tis_cap=2 (truncated importance "
                "sampling), or lower train.lr")


def health_plugin(ctx: StepContext, window: int) -> RunHealth | None:
    """The run-health plug-in of a run (``train.health_window`` steps wide; 0: none)."""
    return RunHealth(ctx, window) if window > 0 else None
