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
video at all is found the folder is wrong and a :class:`LayoutError` says so. Task table: research/eval.md §1.1.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from data_pipelines.benchmarks._common import (
    BenchmarkData,
    MediaIndex,
    check_root,
    expected_media_path,
    find_media,
    layout_error,
    mark_missing,
    missing_media,
    read_json,
    register_benchmark,
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


@register_benchmark("mvbench", title=TITLE, kind="video_mc")
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
