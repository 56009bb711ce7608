"""``mmrl data earl-sft``: action-aware SFT trajectories for EARL's first stage (docs/methods/earl.md).

For every record with a video and gold evidence (``meta.gold_span``/``gold_spans`` in seconds, or
``meta.gold_frames``), the ``select_frames`` environment is played on the record's own video with the
frames a run will show it: 0-2 selections of the current frames whose time cell overlaps the gold evidence
(``--rounds auto``: select until a shown frame lies inside a gold span; ``mix``: 0, 1 or 2 drawn per
record; or a fixed number), then the gold answer in the run's answer format. With ``think_answer`` (the
default, EARL's reasoning turns) every call and the answer follow a short reasoning in ``<think></think>``,
templated by :mod:`.reasoning` from which shown frames hold the gold evidence (the paper's trajectories,
written with a strong VLM, are not public). The record is written
unchanged except for its media paths (absolute, so the file can live anywhere) and three ``meta`` keys:

* ``sft_turns``: the assistant turns (``["<think>...</think>select_frames([4])",
  "<think>...</think><answer>B</answer>"]``; without reasoning ``["select_frames([4])", "<answer>B</answer>"]``);
* ``sft_initial_timestamps``: the initial frames the turns were written for (a run that shows other frames
  stops with an error naming both, instead of training on indices that point at the wrong frames);
* ``sft_selected_timestamps``: the times of the frames each selection picks (checked the same way: a run
  whose re-sampling differs, e.g. another ``max_new_frames``, would make a round-2 index mean another frame);
* ``sft_rounds``: the number of selections.

``mmrl sft --data OUT.jsonl rollout.environment=select_frames`` (or the ``earl`` recipe's cold start) trains
on the whole episode, replaying it through the environment with the environment's turns masked
(:func:`mmrl.methods.earl.agent.sft_sequence`). Records without a video or gold are left out and counted.
"""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path
from typing import Any

from mmrl_common.errors import DataError

DEFAULTS = {"frames": 32, "video_policy": "qwen", "max_new_frames": 16, "max_select": 8, "max_rounds": 2,
            "rounds": "auto", "answer_format": "think_answer"}
"""The earl recipe's settings (configs/earl.yaml: EARL's 32 initial frames, 16 new frames, 2 rounds, reasoning)."""


def synthesize(src: str | Path, out: str | Path, *, frames: int = 32, video_policy: str = "qwen",
               max_new_frames: int = 16, max_select: int = 8, max_rounds: int = 2, rounds: str | int = "auto",
               answer_format: str = "think_answer", media_root: str | Path | None = None, seed: int = 0,
               fmt: str = "auto") -> dict[str, Any]:
    """Write the trajectories of ``src``'s records to ``out`` (JSONL); returns counts: ``written``,
    ``skipped`` (by reason) and ``rounds`` (how many records have 0, 1, 2 selections)."""
    from data_pipelines.loaders import load_samples
    from mmrl.config import MediaConfig
    from mmrl.engine.media import MediaPreparer
    from mmrl.engine.sft import answer_text
    from mmrl.methods.earl.environment import FrameSelectionEnvironment
    from mmrl_common.errors import MediaError

    if answer_format not in ("answer", "think_answer"):
        raise DataError(f"answer format {answer_format!r}: use answer or think_answer")
    loaded = load_samples(src, fmt=fmt, media_root=media_root)
    # the frames' timestamps decide the turns; their size does not (decoded small, the run decides the size)
    preparer = MediaPreparer(MediaConfig(video_policy=video_policy, nframes=frames, min_frames=1,
                                         max_frames=max(frames, 1), video_min_pixels=3136, video_max_pixels=3136,
                                         cache_mb=0))
    skipped: Counter[str] = Counter()
    per_rounds: Counter[int] = Counter()
    lines = []
    for sample in loaded.samples:
        if not any(m.type == "video" for m in sample.media):
            skipped["no video"] += 1
            continue
        try:
            media = preparer.prepare(sample)
        except MediaError as exc:
            raise DataError(f"{src}: sample {sample.id}: {exc}") from exc
        env = FrameSelectionEnvironment(sample, media, max_rounds=max_rounds, max_select=max_select,
                                        max_new_frames=max_new_frames)
        turns = env.demonstration(answer_text(sample), rounds, seed=seed, answer_format=answer_format)
        if turns is None:
            skipped["no gold evidence (meta.gold_span, gold_spans or gold_frames)"] += 1
            continue
        record = sample.to_dict()
        record["media"] = [{**m, "path": str(Path(m["path"]).resolve())} for m in record["media"]]
        record["meta"] = {**record["meta"], "sft_turns": turns, "sft_rounds": len(turns) - 1,
                          "sft_initial_timestamps": [round(float(t), 6) for t in env.info["initial_timestamps"]],
                          "sft_selected_timestamps": [[round(float(t), 6) for t in sel["timestamps"]]
                                                      for sel in env.info["selections"]]}
        per_rounds[len(turns) - 1] += 1
        lines.append(json.dumps(record, ensure_ascii=False) + "\n")
    if not lines:
        raise DataError(f"{src}: no record has a video with gold evidence ({dict(skipped)}); EARL's SFT data "
                        "needs meta.gold_span / gold_spans (seconds) or meta.gold_frames")
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text("".join(lines), encoding="utf-8")
    return {"written": len(lines), "skipped": dict(skipped), "rounds": dict(sorted(per_rounds.items())), "out": str(out)}


def add_parser(sub: Any) -> None:
    """``mmrl data earl-sft`` (added to ``mmrl data`` by :data:`mmrl.cli.DATA_COMMANDS`)."""
    e = sub.add_parser("earl-sft", help="EARL's action-aware SFT trajectories (reasoning, 0-2 frame selections, "
                                        "then the answer)",
                       description="Play the select_frames environment on each record with gold evidence "
                                   "(meta.gold_span / gold_spans / gold_frames): selections that bring the "
                                   "evidence into view, then the gold answer; write the records with "
                                   "meta.sft_turns for `mmrl sft --task earl --data OUT`.")
    add_arguments(e)
    e.set_defaults(func=run)


def add_arguments(p: Any) -> None:
    """The ``mmrl data earl-sft`` options."""
    p.add_argument("path", help="records with videos and gold evidence (JSONL / JSON / Parquet / datasets folder)")
    p.add_argument("--out", required=True, help="the JSONL file to write")
    p.add_argument("--frames", type=int, default=DEFAULTS["frames"],
                   help="initial frames per video, as the run will sample them (a record's own sampling.nframes "
                        "wins, as in training; default 32, EARL's)")
    p.add_argument("--video-policy", default=DEFAULTS["video_policy"],
                   help="frame-sampling policy of the run (data.media.video_policy; default qwen)")
    p.add_argument("--rounds", default="auto",
                   help="selections per trajectory: auto (until the evidence is seen; default), mix (0-2 at random), "
                        "or 0, 1, 2")
    p.add_argument("--max-new-frames", type=int, default=DEFAULTS["max_new_frames"],
                   help="frames per re-sampling (rollout.environment_kwargs.max_new_frames; default 16)")
    p.add_argument("--max-select", type=int, default=DEFAULTS["max_select"], help="frames per selection (default 8)")
    p.add_argument("--answer-format", choices=["answer", "think_answer"], default=DEFAULTS["answer_format"],
                   help="prompt.answer_format of the run: think_answer (default) puts a reasoning <think></think> "
                        "before every call and before the answer; answer writes calls and the answer alone")
    p.add_argument("--media-root", default=None, help="folder that relative media paths resolve against")
    p.add_argument("--seed", type=int, default=0, help="seed of --rounds mix (default 0)")


def run(args: Any) -> int:
    rounds: str | int = args.rounds
    if args.rounds not in ("auto", "mix"):
        if not str(args.rounds).isdigit():
            raise DataError(f"--rounds {args.rounds!r}: use auto, mix, 0, 1 or 2")
        rounds = int(args.rounds)
    summary = synthesize(args.path, args.out, frames=args.frames, video_policy=args.video_policy, rounds=rounds,
                         max_new_frames=args.max_new_frames, max_select=args.max_select,
                         answer_format=args.answer_format, media_root=args.media_root, seed=args.seed)
    skipped = ", ".join(f"{n} {why}" for why, n in summary["skipped"].items()) or "none"
    print(f"earl-sft: {summary['written']} trajectories -> {summary['out']} (selections per trajectory: "
          f"{summary['rounds']}); skipped: {skipped}")
    print(f"train on them: mmrl sft --task earl --data {summary['out']}")
    return 0
