"""The video decoders mmrl can read with (``data.media.decoder``) and whether each one can run here.

Importing this module costs nothing (no NumPy, no torch): the run config checks its ``data.media.decoder`` with it
when the config is built. :mod:`video.reader` holds the readers themselves.

* ``auto``: decord, falling back to PyAV where decord is not installed or cannot open a file (mmrl's behaviour
  before the setting existed);
* ``decord``: decord only (it bundles its own FFmpeg);
* ``pyav``: PyAV only (a core dependency; its wheels bundle FFmpeg);
* ``torchcodec``: PyTorch's decoder (``torchcodec.decoders.VideoDecoder``). It is not a dependency of mmrl and it
  does not bundle FFmpeg: it loads the system's FFmpeg shared libraries (libavcodec, libavformat, ...) when it is
  first used, and without them it cannot decode anything.
"""

from __future__ import annotations

import functools
import importlib.util

DECODERS = ("auto", "decord", "pyav", "torchcodec")
"""The values of ``data.media.decoder``."""

DEFAULT_DECODE_TIMEOUT = 60.0
"""Seconds one call into a decoder (opening a video, or reading a batch of its frames) may take in a run before
the video counts as bad (``data.media.decode_timeout``)."""

_MODULE = {"decord": "decord", "pyav": "av", "torchcodec": "torchcodec"}
_INSTALL = {"decord": "pip install decord", "pyav": "pip install av",
            "torchcodec": "pip install torchcodec (the release that matches your torch), with FFmpeg's shared "
                          "libraries"}


def installed(decoder: str) -> bool:
    """Whether the Python package of ``decoder`` (decord, pyav, torchcodec) can be found (not imported)."""
    try:
        return importlib.util.find_spec(_MODULE[decoder]) is not None
    except ValueError:  # a module put in sys.modules without a spec
        return True


@functools.cache
def torchcodec_problem() -> str | None:
    """Why torchcodec cannot decode videos in this process, or None when it can. Imports torchcodec (and torch),
    which loads the FFmpeg libraries it finds; the answer is kept for the process."""
    if not installed("torchcodec"):
        return f"torchcodec is not installed: {_INSTALL['torchcodec']}, or choose data.media.decoder=pyav"
    try:
        import torchcodec
    except Exception as exc:  # noqa: BLE001 -- a broken install raises anything; said in one line
        said = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        return (f"torchcodec does not import ({type(exc).__name__}: {said}): reinstall the torchcodec release that "
                "matches your torch, or choose data.media.decoder=pyav")
    # torchcodec exposes the FFmpeg major version it loaded (None: no FFmpeg it supports, or a torch it was not
    # built for); torchcodec/__init__.py, meta-pytorch/torchcodec
    if getattr(torchcodec, "ffmpeg_major_version", None) is None:
        return ("torchcodec could not load FFmpeg: install FFmpeg's shared libraries (libavcodec, libavformat, ...: "
                "e.g. apt-get install ffmpeg, or conda install ffmpeg) in a version your torchcodec supports, and a "
                "torchcodec release that matches your torch; or choose data.media.decoder=pyav")
    return None


def decoder_problem(decoder: str, *, load: bool = True) -> str | None:
    """Why ``decoder`` (a value of ``data.media.decoder``) cannot be used here, in one line, or None when it can.
    ``load``: for torchcodec, also load it and its FFmpeg (:func:`torchcodec_problem`), which imports torch."""
    if decoder not in DECODERS:
        return f"unknown video decoder {decoder!r}: use one of {', '.join(DECODERS)}"
    if decoder == "auto":
        return None if installed("decord") or installed("pyav") else \
            f"neither decord nor PyAV is installed: {_INSTALL['pyav']}"
    if decoder == "torchcodec" and load:
        return torchcodec_problem()
    if not installed(decoder):
        return f"{decoder} is not installed: {_INSTALL[decoder]}, or choose data.media.decoder=auto"
    return None
