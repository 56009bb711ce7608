"""Check that a sample's media files exist and decode (used by ``mmrl data validate`` and the loaders).

Images are fully decoded with :func:`vision.open_image`; videos are opened with
:func:`video.reader.open_video` and their first, middle and last frames decoded, which catches truncated
MP4 files whose header still reads fine.
"""

from __future__ import annotations

from pathlib import Path

from mmrl_common.errors import MediaError

from .schema import MediaItem, Sample


def check_media_file(path: str | Path, kind: str, *, decode: bool = True) -> str | None:
    """The reason ``path`` is not a usable ``kind`` ("image"/"video") file, or None when it is."""
    p = Path(path)
    if not p.exists():
        return f"{kind} file not found: {p}; check the path or pass --media-root / media_root"
    if p.is_dir():
        return f"{kind} path is a folder, not a file: {p}"
    size = p.stat().st_size
    if size == 0:
        return f"{kind} file is empty (0 bytes): {p}; re-create or re-download it"
    if not decode:
        return None
    try:
        if kind == "image":
            from vision import open_image

            img = open_image(p)
            img.load()
            if img.width == 0 or img.height == 0:
                return f"image has no pixels: {p}"
        elif kind == "video":
            from video.reader import open_video

            with open_video(p) as reader:
                n = int(reader.num_frames)
                if n <= 0:
                    return f"video has no frames: {p}; re-encode it"
                idx = sorted({0, n // 2, n - 1})
                frames = reader.get_frames(idx)
            if len(frames) != len(idx):
                return f"video decoded {len(frames)} of frames {idx}: {p}; the file looks truncated, re-encode it"
        else:
            return f"unknown media type {kind!r} for {p}"
    except MediaError as exc:
        return f"cannot decode {kind}: {exc.reason} ({p}); the file may be truncated or corrupt, replace it"
    except Exception as exc:  # noqa: BLE001 -- decoders raise many types; all mean "bad file" here
        return f"cannot decode {kind} {p}: {type(exc).__name__}: {exc}; the file may be truncated or corrupt"
    return None


def check_sample_media(
    sample: Sample,
    base_dir: str | Path | None,
    *,
    decode: bool = True,
    cache: dict[tuple[str, str], str | None] | None = None,
) -> list[str]:
    """Reasons for each bad media item of ``sample`` (``media[i]: ...``). ``cache`` avoids re-checking a
    file several samples share."""
    reasons = []
    for i, item in enumerate(sample.media):
        if item.is_remote():
            continue
        reason = _cached(item, base_dir, decode, cache)
        if reason:
            shown = "" if Path(item.path).is_absolute() else f" (path {item.path!r})"
            reasons.append(f"media[{i}]{shown}: {reason}")
    return reasons


def _cached(item: MediaItem, base_dir: str | Path | None, decode: bool,
            cache: dict[tuple[str, str], str | None] | None) -> str | None:
    path = item.resolve(base_dir)
    key = (str(path), f"{item.type}:{decode}")
    if cache is not None and key in cache:
        return cache[key]
    reason = check_media_file(path, item.type, decode=decode)
    if cache is not None:
        cache[key] = reason
    return reason
