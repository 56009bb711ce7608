"""``mmrl data inspect``: what is in a dataset, as tables and a PNG contact sheet.

Counts by problem type, task, difficulty and answer; media statistics (videos: duration, fps, resolution,
frame count as min / median / max; images: sizes); and a contact sheet with one row per sample (8
uniformly spaced frames of its first video, or its images) under the question text.
"""

from __future__ import annotations

import sys
import textwrap
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TextIO

import numpy as np

from .loaders import load_samples
from .media_check import quiet_native_stderr, short_reason
from .schema import Sample


@dataclass
class InspectReport:
    path: Path
    total: int
    skipped: int
    counts: dict[str, Counter] = field(default_factory=dict)
    video_stats: dict[str, list[float]] = field(default_factory=dict)
    image_sizes: list[tuple[int, int]] = field(default_factory=list)
    media_errors: list[str] = field(default_factory=list)
    media_probed: int = 0
    media_total: int = 0
    contact_sheet: Path | None = None
    skipped_records: list[str] = field(default_factory=list)  # FILE:LINE: reason of each skipped record

    def table(self) -> str:
        lines = [f"dataset: {self.path}", f"records: {self.total} loaded, {self.skipped} skipped (bad)"
                 + (":" if self.skipped_records else "")]
        lines += [f"  {p}" for p in self.skipped_records]
        for name, counter in self.counts.items():
            if not counter:
                continue
            rows = [(str(k), str(v), f"{100.0 * v / max(1, sum(counter.values())):.1f}%") for k, v in sorted(
                counter.items(), key=lambda kv: (-kv[1], str(kv[0])))]
            lines += ["", format_table([name, "count", "share"], rows)]
        n_videos = len(self.video_stats.get("duration_s", []))
        if n_videos:
            rows = []
            for key, label in (("duration_s", "duration (s)"), ("fps", "fps"), ("width", "width"),
                               ("height", "height"), ("num_frames", "frames")):
                vals = np.asarray(self.video_stats[key], dtype=float)
                rows.append((label, _num(vals.min()), _num(np.median(vals)), _num(vals.max())))
            lines += ["", f"videos: {n_videos} files", format_table(["video", "min", "median", "max"], rows)]
        if self.image_sizes:
            sizes = Counter(f"{w}x{h}" for w, h in self.image_sizes)
            rows = [(k, str(v)) for k, v in sizes.most_common(8)]
            lines += ["", f"images: {len(self.image_sizes)} files", format_table(["image size", "count"], rows)]
        if self.media_probed < self.media_total:
            lines.append(f"(media statistics from {self.media_probed} of {self.media_total} files)")
        if self.media_errors:
            lines += ["", (f"{len(self.media_errors)} media files could not be read (each named at its first "
                          "record; re-encode or replace them, or pass data.on_bad_sample=skip to train without "
                          "their records; `mmrl data validate` lists every record):")]
            lines += [f"  {e}" for e in self.media_errors[:5]]
            if len(self.media_errors) > 5:
                lines.append(f"  ... and {len(self.media_errors) - 5} more")
        if self.contact_sheet is not None:
            lines += ["", f"contact sheet: {self.contact_sheet}"]
        return "\n".join(lines)


def _num(x: float) -> str:
    return str(int(x)) if float(x).is_integer() else f"{x:.2f}"


def format_table(headers: list[str], rows: list[tuple[str, ...]]) -> str:
    widths = [max(len(str(r[i])) for r in [tuple(headers), *rows]) for i in range(len(headers))]
    def fmt(row: tuple[str, ...] | list[str]) -> str:
        return "  ".join(str(c).ljust(w) if i == 0 else str(c).rjust(w) for i, (c, w) in enumerate(zip(row, widths)))
    return "\n".join([fmt(headers), "  ".join("-" * w for w in widths), *(fmt(r) for r in rows)])


def inspect_dataset(
    path: str | Path,
    *,
    media_root: str | Path | None = None,
    fmt: str = "auto",
    columns: dict[str, str] | None = None,
    out: str | Path | None = None,
    samples: int = 6,
    frames: int = 8,
    max_media: int = 2000,
    progress: bool = False,
) -> InspectReport:
    """Statistics of the dataset at ``path`` and a contact sheet of ``samples`` samples written to
    ``out/<name>_contact_sheet.png`` (``out`` defaults to ``<dataset folder>/inspect``)."""
    path = Path(path)
    result = load_samples(path, fmt=fmt, columns=columns, media_root=media_root, on_bad_sample="skip")
    report = InspectReport(path=path, total=len(result.samples), skipped=result.skipped,
                           skipped_records=[str(p) for p in result.problems])
    report.counts = {
        "problem type": Counter(s.problem_type for s in result.samples),
        "task": Counter(str(s.meta["task"]) for s in result.samples if "task" in s.meta),
        "difficulty": Counter(str(s.meta["difficulty"]) for s in result.samples if "difficulty" in s.meta),
        "answer (multiple choice)": Counter(str(s.answer) for s in result.samples
                                            if s.problem_type == "multiple_choice"),
    }
    _media_stats(result.samples, report, max_media, progress, result.locations)
    if samples > 0:
        out_dir = Path(out) if out is not None else (path if path.is_dir() else path.parent) / "inspect"
        chosen = pick_samples(result.samples, samples)
        if chosen:
            report.contact_sheet = contact_sheet(chosen, out_dir / f"{path.stem}_contact_sheet.png", frames=frames)
    return report


def _media_stats(samples: list[Sample], report: InspectReport, max_media: int, progress: bool,
                 locations: list[str] | None = None) -> None:
    from tqdm import tqdm

    files: dict[str, str] = {}
    first_use: dict[str, str] = {}  # file -> "FILE:LINE: sample 'id'" of its first record
    for i, s in enumerate(samples):
        for m in s.media:
            if not m.is_remote():
                files.setdefault(m.path, m.type)
                if locations is not None and i < len(locations):
                    first_use.setdefault(m.path, f"{locations[i]}: sample {s.id!r}")
    report.media_total = len(files)
    items = list(files.items())[:max_media]
    report.media_probed = len(items)
    stats: dict[str, list[float]] = {k: [] for k in ("duration_s", "fps", "width", "height", "num_frames")}
    with quiet_native_stderr() as console:  # the decoders' own messages would repeat ours
        for p, kind in tqdm(items, desc="media", unit="file", leave=False, file=console, disable=not progress):
            _probe(p, kind, stats, report, first_use.get(p))
    report.video_stats = stats if stats["duration_s"] else {}


def _probe(p: str, kind: str, stats: dict[str, list[float]], report: InspectReport, where: str | None = None
           ) -> None:
    from mmrl_common.errors import MediaError, MmrlError

    at = f"{where}: " if where else ""
    try:
        if kind == "video":
            from video.decoders import DEFAULT_DECODE_TIMEOUT
            from video.reader import open_video

            with open_video(p, timeout=DEFAULT_DECODE_TIMEOUT) as r:
                for key, value in (("duration_s", r.duration), ("fps", r.fps), ("width", r.width),
                                   ("height", r.height), ("num_frames", r.num_frames)):
                    stats[key].append(float(value))
        else:
            from vision import open_image

            img = open_image(p)
            report.image_sizes.append((img.width, img.height))
    except MediaError as exc:  # its reason may name the file again
        report.media_errors.append(f"{at}{p}: {short_reason(exc.reason, p)}")
    except (MmrlError, OSError, ValueError) as exc:
        report.media_errors.append(f"{at}{p}: {short_reason(str(exc), p)}")


def pick_samples(samples: list[Sample], n: int) -> list[Sample]:
    """Up to ``n`` samples with media, round-robin over tasks (or problem types) so the sheet is varied."""
    groups: dict[str, list[Sample]] = {}
    for s in samples:
        if s.media:
            groups.setdefault(str(s.meta.get("task", s.problem_type)), []).append(s)
    chosen: list[Sample] = []
    depth = 0
    while len(chosen) < n and any(depth < len(g) for g in groups.values()):
        for g in groups.values():
            if depth < len(g) and len(chosen) < n:
                chosen.append(g[depth])
        depth += 1
    return chosen


def _sample_frames(sample: Sample, frames: int) -> tuple[list[np.ndarray], list[str]]:
    """Frames to show for a sample and a label for each."""
    out: list[np.ndarray] = []
    labels: list[str] = []
    for item in sample.media:
        try:
            if item.type == "video":
                from video.decoders import DEFAULT_DECODE_TIMEOUT
                from video.reader import open_video

                with open_video(item.path, timeout=DEFAULT_DECODE_TIMEOUT) as r:
                    idx = np.unique(np.linspace(0, max(0, r.num_frames - 1), frames).round().astype(int)).tolist()
                    arr = r.get_frames(idx)
                    fps = float(r.fps) or 1.0
                out += list(arr)
                labels += [f"{i / fps:.1f}s" for i in idx]
            else:
                from vision import open_image

                out.append(np.asarray(open_image(item.path).convert("RGB")))
                labels.append("image")
        except Exception as exc:  # noqa: BLE001 -- a sheet with a gap beats no sheet; validate explains
            out.append(np.zeros((64, 64, 3), np.uint8))
            labels.append(f"error: {type(exc).__name__}")
        if len(out) >= frames:
            break
    return out[:frames], labels[:frames]


def contact_sheet(samples: list[Sample], out_png: str | Path, *, frames: int = 8, thumb: int = 96) -> Path:
    """One row per sample: its frames (thumbnails ``thumb`` px high) under its question and answer."""
    from PIL import Image, ImageDraw, ImageFont

    font = ImageFont.load_default()
    pad, caption_h, label_h = 6, 30, 12
    cell_w = thumb
    width = pad + frames * (cell_w + pad)
    width = max(width, 480)
    rows: list[tuple[list[np.ndarray], list[str], str]] = []
    for s in samples:
        imgs, labels = _sample_frames(s, frames)
        cap = f"[{s.id}] {s.question}"
        if s.options:
            cap += "  " + "  ".join(f"{chr(65 + i)}. {o}" for i, o in enumerate(s.options))
        cap += f"  -> {_answer(s)}"
        rows.append((imgs, labels, cap))
    row_h = caption_h + thumb + label_h + pad
    sheet = Image.new("RGB", (width, pad + row_h * len(rows)), (255, 255, 255))
    draw = ImageDraw.Draw(sheet)
    y = pad
    chars = max(20, (width - 2 * pad) // 6)
    for imgs, labels, cap in rows:
        lines = textwrap.wrap(cap, chars)[:2]
        for k, line in enumerate(lines):
            draw.text((pad, y + k * 13), line, fill=(0, 0, 0), font=font)
        x = pad
        for arr, label in zip(imgs, labels):
            im = Image.fromarray(np.ascontiguousarray(arr[..., :3]).astype(np.uint8))
            w = max(1, round(im.width * thumb / max(1, im.height)))
            im = im.resize((min(w, cell_w), thumb), Image.NEAREST)
            sheet.paste(im, (x, y + caption_h))
            draw.text((x, y + caption_h + thumb + 1), label, fill=(80, 80, 80), font=font)
            x += cell_w + pad
        y += row_h
    out_png = Path(out_png)
    out_png.parent.mkdir(parents=True, exist_ok=True)
    sheet.save(out_png)
    return out_png


def _answer(s: Sample) -> Any:
    if s.problem_type == "multiple_choice" and s.options:
        return f"{s.answer} ({s.answer_text()})"
    return s.answer


def run_inspect(path: str | Path, *, out: str | Path | None = None, samples: int = 6,
                media_root: str | Path | None = None, fmt: str = "auto", columns: dict[str, str] | None = None,
                stream: TextIO | None = None) -> int:
    report = inspect_dataset(path, out=out, samples=samples, media_root=media_root, fmt=fmt, columns=columns,
                             progress=True)
    print(report.table(), file=stream or sys.stdout)
    return 0
