"""Open any image as 8-bit RGB.

Decisions: transparency (RGBA, LA, PA, P with a transparent colour) is composited on **white**, as
qwen-vl-utils' ``to_rgb`` does. High-bit-depth data (16-bit PNG/TIFF, 32-bit integer, float, DICOM)
is windowed to 8 bits: ``window=(lo, hi)`` maps ``lo -> 0`` and ``hi -> 255`` (values outside clip);
the default window is the image's own min..max (a constant image becomes black). 8-bit images are
never windowed. EXIF orientation is applied. Every failure raises :class:`mmrl_common.errors.MediaError`
naming the file and the cause: a decoder's own error (PIL's ``DecompressionBombError`` for an image over
``2 * Image.MAX_IMAGE_PIXELS`` pixels, ``UnidentifiedImageError``, ``OSError`` of a truncated file, ...) never
leaves :func:`open_image` as it is, so ``data.on_bad_sample=skip`` skips such a file like any other bad one.
"""

from __future__ import annotations

import errno
import importlib.util
import os
import warnings
from pathlib import Path

import numpy as np
from PIL import Image, ImageOps, UnidentifiedImageError

from mmrl_common.errors import MediaError, check_media_path

Window = tuple[float, float]
_TIFF_SUFFIXES = {".tif", ".tiff"}
_HIGH_DEPTH_MODES = {"I", "F"}  # plus every "I;16*" mode


def window_to_uint8(values: np.ndarray, window: Window | None = None) -> np.ndarray:
    """Linearly map ``window=(lo, hi)`` (default: min..max of ``values``) to 0..255, clipping outside."""
    data = np.asarray(values, dtype=np.float64)
    if window is None:
        finite = data[np.isfinite(data)]
        lo, hi = (float(finite.min()), float(finite.max())) if finite.size else (0.0, 0.0)
    else:
        lo, hi = (float(window[0]), float(window[1]))
        if not hi > lo:
            raise ValueError(f"window must be (lo, hi) with hi > lo, got {window}")
    if hi <= lo:
        return np.zeros(data.shape, dtype=np.uint8)
    scaled = (np.nan_to_num(data, nan=lo) - lo) * (255.0 / (hi - lo))
    return np.clip(np.rint(scaled), 0, 255).astype(np.uint8)


def _gray_or_rgb(arr8: np.ndarray) -> Image.Image:
    if arr8.ndim == 2:
        return Image.fromarray(arr8, mode="L").convert("RGB")
    if arr8.ndim == 3 and arr8.shape[2] in (3, 4):
        return Image.fromarray(np.ascontiguousarray(arr8[..., :3]), mode="RGB")
    if arr8.ndim == 3 and arr8.shape[2] in (1, 2):
        return Image.fromarray(np.ascontiguousarray(arr8[..., 0]), mode="L").convert("RGB")
    raise ValueError(f"unsupported pixel array shape {arr8.shape}")


def to_rgb(image: Image.Image, window: Window | None = None) -> Image.Image:
    """Convert a PIL image of any mode to RGB (white behind transparency, high-depth data windowed)."""
    mode = image.mode
    if mode in _HIGH_DEPTH_MODES or mode.startswith("I;16"):
        return _gray_or_rgb(window_to_uint8(np.asarray(image), window))
    if mode == "P":
        image = image.convert("RGBA") if "transparency" in image.info else image.convert("RGB")
        mode = image.mode
    if mode in ("RGBA", "LA", "PA", "La", "RGBa"):
        rgba = image.convert("RGBA")
        canvas = Image.new("RGB", rgba.size, (255, 255, 255))
        canvas.paste(rgba, mask=rgba.getchannel("A"))
        return canvas
    if mode == "L" and "transparency" in image.info:
        return to_rgb(image.convert("LA"))
    return image if mode == "RGB" else image.convert("RGB")


def _is_dicom(path: Path) -> bool:
    with path.open("rb") as fh:
        head = fh.read(132)
    return len(head) == 132 and head[128:132] == b"DICM"


def _open_dicom(path: Path, window: Window | None) -> Image.Image:
    if importlib.util.find_spec("pydicom") is None:
        raise MediaError(path, "DICOM file, but pydicom is not installed (pip install pydicom)")
    import pydicom

    try:
        ds = pydicom.dcmread(str(path))
        data = ds.pixel_array.astype(np.float64)
    except Exception as exc:
        raise MediaError(path, f"cannot decode DICOM pixels: {exc}") from exc
    data = data * float(getattr(ds, "RescaleSlope", 1) or 1) + float(getattr(ds, "RescaleIntercept", 0) or 0)
    if data.ndim == 3 and data.shape[-1] not in (3, 4):
        data = data[data.shape[0] // 2]  # a multi-frame series: the middle slice
    if window is None and "WindowCenter" in ds and "WindowWidth" in ds:
        centre = float(np.ravel(ds.WindowCenter)[0])
        width = float(np.ravel(ds.WindowWidth)[0])
        window = (centre - width / 2, centre + width / 2)
    arr8 = window_to_uint8(data, window)
    if str(getattr(ds, "PhotometricInterpretation", "")) == "MONOCHROME1":
        arr8 = 255 - arr8
    return _gray_or_rgb(arr8)


def _open_tiff(path: Path, window: Window | None) -> Image.Image:
    import tifffile

    try:
        data = np.asarray(tifffile.imread(str(path)))
    except Exception as exc:
        raise MediaError(path, f"cannot decode TIFF: {exc}") from exc
    while data.ndim > 3 or (data.ndim == 3 and data.shape[-1] not in (1, 2, 3, 4)):
        data = data[0]  # pages / planes: the first one
    if data.dtype == np.uint8:
        return _gray_or_rgb(data)
    return _gray_or_rgb(window_to_uint8(data, window))


def open_image(path: str | os.PathLike[str], *, window: Window | None = None) -> Image.Image:
    """Open ``path`` as an RGB PIL image (fully loaded, EXIF orientation applied).

    ``window=(lo, hi)`` sets the 8-bit window for high-bit-depth images (default min..max).
    DICOM files are read with pydicom when it is installed.
    """
    p = Path(path)
    check_path(p, "image")
    try:
        dicom = p.suffix.lower() == ".dcm" or _is_dicom(p)
    except OSError as exc:  # e.g. no read permission
        raise MediaError(p, f"cannot read the image file: {exc.strerror or exc}") from exc
    if dicom:
        return _open_dicom(p, window)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", Image.DecompressionBombWarning)
            with Image.open(p) as img:
                img.load()
                rotated = ImageOps.exif_transpose(img)
                image = rotated if rotated is not None else img.copy()
    except UnidentifiedImageError as exc:
        if p.suffix.lower() in _TIFF_SUFFIXES:
            return _open_tiff(p, window)
        raise MediaError(p, "not an image (unrecognised format)") from exc
    except (Image.DecompressionBombError, Image.DecompressionBombWarning) as exc:  # the warning when the
        # caller turned warnings into errors
        raise MediaError(p, f"image too large to decode safely ({exc}); shrink it, or raise PIL's "
                            "Image.MAX_IMAGE_PIXELS in your own code if it is genuine") from exc
    except (OSError, SyntaxError, ValueError) as exc:
        if p.suffix.lower() in _TIFF_SUFFIXES:
            return _open_tiff(p, window)
        text = str(exc)
        reason = "truncated image" if "truncated" in text.lower() else f"cannot decode image ({text})"
        raise MediaError(p, reason) from exc
    except MemoryError as exc:
        raise MediaError(p, "not enough memory to decode the image") from exc
    except Exception as exc:  # PIL's plug-ins raise many types (struct.error, EOFError, ...)
        raise MediaError(p, f"cannot decode image ({type(exc).__name__}: {exc})") from exc
    if p.suffix.lower() in _TIFF_SUFFIXES and _tiff_needs_tifffile(image, p):
        return _open_tiff(p, window)
    try:
        return to_rgb(image, window)
    except (OSError, MemoryError) as exc:  # a lazy plug-in decoding late; a bad window stays a ValueError
        raise MediaError(p, f"cannot convert the image to RGB ({type(exc).__name__}: {exc})") from exc


def check_path(path: Path, kind: str) -> None:
    """:func:`mmrl_common.errors.check_media_path`, but a path that cannot be read says why (a symlink loop,
    no permission) instead of "file not found"."""
    try:
        os.stat(path)
    except FileNotFoundError:
        pass  # check_media_path says "file not found"
    except OSError as exc:
        cause = "symlink loop" if exc.errno == errno.ELOOP else (exc.strerror or type(exc).__name__)
        raise MediaError(path, f"cannot open the {kind} file: {cause}") from exc
    check_media_path(path, kind)


def _tiff_needs_tifffile(image: Image.Image, path: Path) -> bool:
    """PIL reads multi-channel 16-bit TIFF badly (or as 8-bit): let tifffile read those."""
    try:
        import tifffile

        with tifffile.TiffFile(str(path)) as tif:
            page = tif.pages[0]
            return page.dtype is not None and page.dtype.itemsize > 1 and page.samplesperpixel > 1
    except (OSError, ValueError, IndexError):
        return False
