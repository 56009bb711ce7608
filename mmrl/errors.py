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
        self.reason = reason
        super().__init__(f"{self.path}: {reason}")


class DataError(MmrlError):
    """A bad dataset record. The message names the file and line (or sample id)."""
