"""User-facing errors.

Anything derived from :class:`MmrlError` is a problem with the user's input (a file, a key, a value), not a
bug. The CLI prints it as one line, ``error: <message>``, and exits with status 2; no traceback.
"""


class MmrlError(Exception):
    """A problem the user can fix; the message names the file, key or sample and says how."""


class ConfigError(MmrlError):
    """A bad configuration key or value."""


class MediaError(MmrlError):
    """An image or video that cannot be opened or decoded. The message names the file."""

    def __init__(self, path, reason: str):
        self.path = str(path)
        # a decoder's message that already starts with the file (video.sampling's) is not prefixed twice
        self.reason = str(reason).removeprefix(f"{self.path}: ")
        super().__init__(f"{self.path}: {self.reason}")


class DataError(MmrlError):
    """A bad dataset record. The message names the file and line (or sample id)."""


def check_media_path(path, kind: str) -> None:
    """Raise :class:`MediaError` when ``path`` is missing, a folder, or empty; ``kind`` is "image" or "video"."""
    from pathlib import Path

    path = Path(path)
    if not path.exists():
        raise MediaError(path, "file not found")
    if path.is_dir():
        raise MediaError(path, f"is a directory, not {'an' if kind[0] in 'aeiou' else 'a'} {kind} file")
    if path.stat().st_size == 0:
        raise MediaError(path, "file is empty (0 bytes)")
