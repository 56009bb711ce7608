"""MVBench (OpenGVLab/MVBench): 20 tasks, one JSON file each, videos in per-source folders.

Two public layouts are read:

* **main branch** — ``json/<task>.json`` and the unzipped ``video/*.zip`` folders under ``video/``
  (``video/star/Charades_v1_480/…``). Raw source videos: the tasks with a time bound (``start``/``end``
  seconds) are trimmed to it, as the official notebook does; Episodic Reasoning reads 3-fps JPEG folders
  (``video/tvqa/frames_fps3_hq/<clip>/00001.jpg``).
* **video branch** (``revision=video``, what lmms-eval downloads) — ``json/<task>.json`` and folders at the
  root (``star/Charades_segment/…``, ``ssv2_video_mp4``, ``nturgbd_convert``, ``tvqa/video_fps3_hq_segment``).
  The ``*_segment`` clips are already cut to the bound, so no bound is applied to them.

A JSON item is ``{"video", "question", "candidates", "answer" (the candidate's text), "start"?, "end"?}``;
the answer becomes the candidate's letter. Videos are found whatever the case of their extension. A question whose
video is not there is kept and marked (``meta["missing_media"]``, listed in ``info["missing_media"]``); when no
video at all is found the folder is wrong and a :class:`LayoutError` says so. Task table: the official evaluation
notebook (OpenGVLab/Ask-Anything ``video_chat2/mvbench.ipynb``, cell ``data_list``; MVBench, arXiv 2311.17005).

Protocol (the same notebook, cells ``qa_template``, ``infer_mvbench``, ``get_index``, ``check_ans``): 16 frames, one
from the middle of each of 16 equal segments inside the bound, 224-px frames; the system text :data:`SYSTEM`; the
question, the options as ``(A) …`` lines and "Only give the best option."; the answer pre-filled with
:data:`PREFILL`, greedy, 100 new tokens, ``"(" +`` the first generated line scored. The headline is the mean of
the 20 task accuracies (MVBench papers and its leaderboard's "Avg"). lmms-eval's ``mvbench`` task
(``lmms_eval/tasks/mvbench/utils.py`` and its yaml files) reads the video branch without bounds and asks
``Question:``/``Option:`` (singular) with the post-prompt "Only give the best option.", no pre-fill, 16 new tokens.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from data_pipelines.benchmarks._common import (
    LMMS_SYSTEM,
    Benchmark,
    BenchmarkData,
    MediaIndex,
    check_root,
    copy_media,
    expected_media_path,
    find_media,
    layout_error,
    mark_missing,
    missing_media,
    option_lines,
    plain_options,
    read_json,
    register_benchmark,
    toy_questions,
)
from data_pipelines.schema import MediaItem, Sample, option_letter
from mmrl_common.errors import DataError

TITLE = "MVBench"
# task -> (folder in the official notebook / main branch, folder on the video branch, has bound, frame folder)
TASKS: dict[str, tuple[str, str, bool, bool]] = {
    "action_sequence": ("star/Charades_v1_480", "star/Charades_segment", True, False),
    "action_prediction": ("star/Charades_v1_480", "star/Charades_segment", True, False),
    "action_antonym": ("ssv2_video", "ssv2_video_mp4", False, False),
    "fine_grained_action": ("Moments_in_Time_Raw/videos", "Moments_in_Time_Raw/videos", False, False),
    "unexpected_action": ("FunQA_test/test", "FunQA_test/test", False, False),
    "object_existence": ("clevrer/video_validation", "clevrer/video_validation", False, False),
    "object_interaction": ("star/Charades_v1_480", "star/Charades_segment", True, False),
    "object_shuffle": ("perception/videos", "perception/videos", False, False),
    "moving_direction": ("clevrer/video_validation", "clevrer/video_validation", False, False),
    "action_localization": ("sta/sta_video", "sta/sta_video_segment", True, False),
    "scene_transition": ("scene_qa/video", "scene_qa/video", False, False),
    "action_count": ("perception/videos", "perception/videos", False, False),
    "moving_count": ("clevrer/video_validation", "clevrer/video_validation", False, False),
    "moving_attribute": ("clevrer/video_validation", "clevrer/video_validation", False, False),
    "state_change": ("perception/videos", "perception/videos", False, False),
    "fine_grained_pose": ("nturgbd", "nturgbd_convert", False, False),
    "character_order": ("perception/videos", "perception/videos", False, False),
    "egocentric_navigation": ("vlnqa", "vlnqa", False, False),
    "episodic_reasoning": ("tvqa/frames_fps3_hq", "tvqa/video_fps3_hq_segment", True, True),
    "counterfactual_inference": ("clevrer/video_validation", "clevrer/video_validation", False, False),
}
FRAME_FOLDER_FPS = 3.0  # Episodic Reasoning JPEG folders (official notebook read_frame)

EXPECTED = (
    "json/<task>.json                  one file per task: " + ", ".join(f"{t}.json" for t in TASKS),
    "video/<folder>/<video>            main branch (unzipped video/*.zip), e.g. video/star/Charades_v1_480/",
    "<folder>/<video>                  or the video branch, e.g. star/Charades_segment/, clevrer/video_validation/",
)


def _bases(root: Path, task: str) -> list[tuple[Path, bool]]:
    """Candidate folders for a task's videos, each with whether its clips are pre-trimmed."""
    official, branch, bound, _ = TASKS[task]
    trimmed = bound and branch != official
    out = [(root / "video" / official, False), (root / official, False)]
    if branch != official:
        out += [(root / branch, trimmed), (root / "video" / branch, trimmed)]
    return out


def _item(task: str, index: int, raw: Any, path: Path, root: Path, media: MediaIndex) -> Sample:
    where = f"{path}: item {index}"
    if not isinstance(raw, dict):
        raise DataError(f"{where}: expected an object, got {type(raw).__name__}")
    for key in ("video", "question", "candidates", "answer"):
        if key not in raw:
            raise DataError(f"{where}: missing field '{key}' (MVBench items have video, question, candidates, answer)")
    candidates = [str(c) for c in raw["candidates"]]
    answer = str(raw["answer"])
    if answer not in candidates:
        raise DataError(f"{where}: answer {answer!r} is not one of the candidates {candidates}")
    bases = _bases(root, task)
    frame_folder = TASKS[task][3]
    found, base = find_media([b for b, _ in bases], str(raw["video"]), allow_dir=frame_folder, index=media)
    meta: dict[str, Any] = {"task": task, "answer_text": answer, "video": str(raw["video"]), "source": "mvbench"}
    if found is None:
        found = expected_media_path([b for b, _ in bases], str(raw["video"]))
        mark_missing(meta, f"task {task}: video '{raw['video']}' ({where}) not found; looked in "
                           f"{', '.join(str(b) for b, _ in bases)}")
        trimmed = False
    else:
        trimmed = dict(bases)[base]
    meta["trimmed_clip"] = trimmed
    sampling: dict[str, Any] = {}
    if TASKS[task][2] and not trimmed and "start" in raw and "end" in raw:
        sampling = {"start": float(raw["start"]), "end": float(raw["end"])}
    if found.is_dir():
        sampling["folder_fps"] = FRAME_FOLDER_FPS
    return Sample(
        id=f"{task}/{index}", problem_type="multiple_choice", question=str(raw["question"]),
        options=candidates, answer=option_letter(candidates.index(answer)),
        media=[MediaItem("video", str(found), sampling)], meta=meta,
    )


def load_mvbench(root: Path, *, split: str, media_cache: Path, tasks: list[str] | None = None,
                 **_: Any) -> BenchmarkData:
    root = check_root(TITLE, root, EXPECTED)
    json_dir = root / "json"
    if not json_dir.is_dir():
        raise layout_error(TITLE, root, f"no json/ folder in {root}", EXPECTED)
    wanted = list(tasks) if tasks else list(TASKS)
    unknown = [t for t in wanted if t not in TASKS]
    if unknown:
        raise DataError(f"unknown MVBench task(s) {unknown}; tasks: {', '.join(TASKS)}")
    present = [t for t in wanted if (json_dir / f"{t}.json").is_file()]
    if not present:
        raise layout_error(TITLE, root, f"none of the task files are in {json_dir}", EXPECTED)
    samples: list[Sample] = []
    media = MediaIndex()
    for task in present:
        path = json_dir / f"{task}.json"
        items = read_json(path)
        if not isinstance(items, list):
            raise DataError(f"{path}: expected a JSON list of questions, got {type(items).__name__}")
        samples.extend(_item(task, i, raw, path, root, media) for i, raw in enumerate(items))
    missing = [t for t in wanted if t not in present]
    return BenchmarkData("mvbench", root, samples, {
        "split": split, "tasks": present, "tasks_missing": missing,
        "layout": "video branch" if any(s.meta["trimmed_clip"] for s in samples) else "main branch / raw videos",
        "missing_media": missing_media(TITLE, root, samples, EXPECTED),
    })


# ------------------------------------------------------------------------------------------------ prompts
SYSTEM = (
    "Carefully watch the video and pay attention to the cause and sequence of events, the detail and movement "
    "of objects, and the action and pose of persons. Based on your observations, select the best option that "
    "accurately addresses the question.\n"
)
PREFILL = "Best option:("


def official_prompt(sample: Sample, subtitles: str | None = None) -> tuple[str | None, str, str]:
    opts = option_lines(plain_options(sample.options), "({letter}) {text}")
    return SYSTEM, f"Question: {sample.question.strip()}\nOptions:\n{opts}\nOnly give the best option.", PREFILL


def lmms_prompt(sample: Sample, subtitles: str | None = None) -> tuple[str | None, str, str]:
    """lmms-eval's ``mvbench_doc_to_text`` with the yaml's post-prompt."""
    opts = option_lines(plain_options(sample.options), "({letter}) {text}")
    return LMMS_SYSTEM, f"Question:{sample.question.strip()}\nOption:\n{opts}\nOnly give the best option.\n", ""


# ------------------------------------------------------------------------------------------------ fixture
def _frame_folder(video: Path, folder: Path) -> None:
    from PIL import Image

    from video import open_video

    folder.mkdir(parents=True, exist_ok=True)
    with open_video(video) as reader:
        frames = reader.get_frames(range(reader.num_frames))
    for k, frame in enumerate(frames, start=1):  # the official reader counts files from 00001.jpg
        Image.fromarray(frame).save(folder / f"{k:05d}.jpg", quality=95)


def mvbench_fixture(out: Path, *, n: int, seed: int, **_: Any) -> None:
    """Three tasks of the main-branch layout: a bounded MP4 task (one file stored as ``.MP4``), an unbounded one
    and Episodic Reasoning's 3-fps frame folders, plus one question whose frame folder is missing (read last)."""
    (out / "json").mkdir(parents=True, exist_ok=True)
    layout = [  # (task, folder under video/, file name in the JSON, bounded)
        ("action_sequence", "star/Charades_v1_480", "{i}.mp4", True),
        ("object_existence", "clevrer/video_validation", "video_{i}.mp4", False),
        ("episodic_reasoning", "tvqa/frames_fps3_hq", "clip_{i}", True),
    ]
    with toy_questions("color", n, seed) as recs:
        for k, (task, folder, pattern, bounded) in enumerate(layout):
            items = []
            for j, r in enumerate(recs[k::len(layout)]):
                name = pattern.format(i=j)
                target = out / "video" / folder / name
                if task == "episodic_reasoning":
                    _frame_folder(r["file"], target)
                else:  # action_sequence/0 is stored as 0.MP4 (the JSON says 0.mp4)
                    copy_media(r["file"], target.with_suffix(".MP4") if (k, j) == (0, 0) else target)
                item = {"video": name, "question": r["question"],
                        "candidates": r["options"], "answer": r["options"]["ABCD".index(r["answer"])]}
                if bounded:
                    item.update(start=0.3, end=1.7)
                items.append(item)
            if task == "episodic_reasoning":  # the extra question, read last: its frame folder is not there
                r = recs[0]
                items.append({"video": "clip_missing", "question": r["question"], "candidates": r["options"],
                              "answer": r["options"]["ABCD".index(r["answer"])], "start": 0.3, "end": 1.7})
            (out / "json" / f"{task}.json").write_text(json.dumps(items, indent=1))


MVBENCH = register_benchmark(Benchmark(
    name="mvbench", title=TITLE, reader=load_mvbench, kind="video_mc",
    official={"video_policy": "segments", "nframes": 16, "video_max_pixels": 224 * 224, "max_new_tokens": 100,
              "source": "MVBench notebook (Ask-Anything video_chat2/mvbench.ipynb)"},
    prompt=official_prompt,
    lmms_eval={"max_new_tokens": 16, "source": "lmms-eval tasks/mvbench (video branch, no bound applied)"},
    lmms_prompt=lmms_prompt, lmms_task="mvbench",
    breakdowns=("task",), task_mean_over="task",
    headline=("task_mean", "MVBench papers report the mean of the 20 task accuracies"),
    beside=("overall_share", "accuracy_answered"),
    fixture=mvbench_fixture,
))
