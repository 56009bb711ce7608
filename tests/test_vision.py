"""Opening images of every mode as RGB, pixel budgets, crops and zoom-ins — on real files."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import tifffile
from PIL import Image

from mmrl_common.errors import MediaError
from vision import box_to_pixels, crop, fit_pixels, fitted_size, open_image, validate_box, zoom


def rgb(img: Image.Image) -> np.ndarray:
    assert img.mode == "RGB"
    return np.asarray(img).astype(int)


@pytest.fixture(scope="session")
def files(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("images")
    out: dict[str, Path] = {}

    def save(name: str, img: Image.Image, **kw) -> None:
        out[name] = root / name
        img.save(out[name], **kw)

    grad = np.tile(np.arange(0, 256, 4, dtype=np.uint8), (16, 1))  # 16x64, 0..252
    colour = np.zeros((16, 64, 3), np.uint8)
    colour[:, :32] = (200, 30, 10)
    colour[:, 32:] = (10, 40, 220)
    save("rgb.png", Image.fromarray(colour))
    rgba = np.zeros((16, 64, 4), np.uint8)
    rgba[..., :3] = (0, 128, 0)
    rgba[:, :32, 3] = 255  # opaque green left, fully transparent right
    save("rgba.png", Image.fromarray(rgba, "RGBA"))
    pal = Image.fromarray(colour).quantize(colors=2)
    save("p.png", pal)
    save("l.png", Image.fromarray(grad, "L"))
    la = np.stack([grad, np.full_like(grad, 255)], -1)
    la[:, 32:, 1] = 0
    save("la.png", Image.fromarray(la, "LA"))
    i16 = (np.arange(16 * 64, dtype=np.uint16).reshape(16, 64) * 50 + 1000).astype(np.uint16)
    save("i16.png", Image.fromarray(i16))
    save("i16.tif", Image.fromarray(i16))
    save("i32.tif", Image.fromarray((grad.astype(np.int32) - 100) * 1000))
    save("f.tif", Image.fromarray(grad.astype(np.float32) / 252.0 * 3.0 - 1.0))
    save("cmyk.tif", Image.new("CMYK", (8, 8), (255, 0, 0, 0)))  # pure cyan
    save("cmyk.jpg", Image.new("CMYK", (8, 8), (0, 0, 255, 0)), quality=95)  # pure yellow
    rgb16 = np.zeros((8, 8, 3), np.uint16)
    rgb16[..., 0] = 40000
    rgb16[..., 1] = 20000
    rgb16[0, 0] = (60000, 60000, 60000)
    rgb16[1, 1] = (20000, 20000, 20000)
    out["rgb16.tif"] = root / "rgb16.tif"
    tifffile.imwrite(out["rgb16.tif"], rgb16)
    # EXIF orientation 6: stored 40x20 (red left half, blue right half), displayed rotated 90° clockwise
    stored = np.zeros((20, 40, 3), np.uint8)
    stored[:, :20] = (255, 0, 0)
    stored[:, 20:] = (0, 0, 255)
    exif = Image.Exif()
    exif[0x0112] = 6
    save("exif6.jpg", Image.fromarray(stored), exif=exif.tobytes(), quality=95)
    noise = (np.random.default_rng(0).random((64, 64, 3)) * 255).astype(np.uint8)
    save("noise.png", Image.fromarray(noise))
    save("noise.jpg", Image.fromarray(noise))
    return out


# --- modes --------------------------------------------------------------------------------------------


def test_plain_modes_open_as_rgb(files: dict[str, Path]) -> None:
    a = rgb(open_image(files["rgb.png"]))
    assert a.shape == (16, 64, 3) and tuple(a[0, 0]) == (200, 30, 10) and tuple(a[0, 63]) == (10, 40, 220)
    p = rgb(open_image(files["p.png"]))
    assert np.abs(p - a).max() <= 10  # two-colour palette reproduces the colours
    gray = rgb(open_image(files["l.png"]))
    assert (gray[..., 0] == gray[..., 1]).all() and (gray[..., 1] == gray[..., 2]).all()
    assert gray[0, 0, 0] == 0 and gray[0, 63, 0] == 252  # 8-bit data is not windowed


def test_transparency_is_composited_on_white(files: dict[str, Path]) -> None:
    a = rgb(open_image(files["rgba.png"]))
    assert tuple(a[5, 0]) == (0, 128, 0) and tuple(a[5, 63]) == (255, 255, 255)
    la = rgb(open_image(files["la.png"]))
    assert tuple(la[0, 10]) == (40, 40, 40) and tuple(la[0, 40]) == (255, 255, 255)


def test_cmyk_converts(files: dict[str, Path]) -> None:
    assert tuple(rgb(open_image(files["cmyk.tif"]))[3, 3]) == (0, 255, 255)
    yellow = rgb(open_image(files["cmyk.jpg"]))[3, 3]
    assert yellow[0] > 240 and yellow[1] > 240 and yellow[2] < 15


@pytest.mark.parametrize("name", ["i16.png", "i16.tif", "i32.tif", "f.tif"])
def test_high_depth_min_max_window(files: dict[str, Path], name: str) -> None:
    raw = np.asarray(Image.open(files[name]))
    assert raw.dtype != np.uint8
    img = rgb(open_image(files[name]))
    g = img[..., 0]
    assert g.shape == raw.shape
    assert g[raw == raw.min()].max() == 0 and g[raw == raw.max()].min() == 255
    order = np.argsort(raw, axis=None, kind="stable")
    assert (np.diff(g.ravel()[order]) >= 0).all()  # monotonic in the raw values
    assert len(np.unique(g)) > 50  # real gradation, not a threshold


def test_explicit_window(files: dict[str, Path]) -> None:
    raw = np.asarray(Image.open(files["i16.png"])).astype(float)  # 1000 .. 52150
    g = rgb(open_image(files["i16.png"], window=(11000, 21000)))[..., 0]
    assert (g[raw <= 11000] == 0).all() and (g[raw >= 21000] == 255).all()
    mid = np.argwhere(raw == 16000)[0]
    assert abs(g[tuple(mid)] - 127.5) <= 1
    with pytest.raises(ValueError, match="hi > lo"):
        open_image(files["i16.png"], window=(5, 5))


def test_16_bit_rgb_tiff_read_with_tifffile(files: dict[str, Path]) -> None:
    img = rgb(open_image(files["rgb16.tif"]))
    # one window (0..60000) for all channels keeps the colour balance
    assert tuple(img[0, 0]) == (255, 255, 255) and tuple(img[1, 1]) == (85, 85, 85)
    assert tuple(img[3, 3]) == (170, 85, 0)


def test_exif_orientation_applied(files: dict[str, Path]) -> None:
    img = open_image(files["exif6.jpg"])
    assert img.size == (20, 40)  # width, height swapped
    a = rgb(img)
    assert a[5, 10, 0] > 200 and a[5, 10, 2] < 60  # top is the stored left half (red)
    assert a[35, 10, 2] > 200 and a[35, 10, 0] < 60


# --- errors -------------------------------------------------------------------------------------------


def test_errors_name_the_file(files: dict[str, Path], tmp_path: Path) -> None:
    empty = tmp_path / "empty.png"
    empty.write_bytes(b"")
    text = tmp_path / "notes.png"
    text.write_text("this is not a picture\n")
    cases = [(tmp_path / "missing.png", "not found"), (empty, "empty"), (text, "not an image")]
    for name in ("noise.png", "noise.jpg"):
        cut = tmp_path / f"cut_{name}"
        data = files[name].read_bytes()
        cut.write_bytes(data[: len(data) // 2])
        cases.append((cut, "truncated"))
    dcm = tmp_path / "scan.dcm"
    dcm.write_bytes(b"\0" * 128 + b"DICM" + b"\0" * 64)
    cases.append((dcm, "pydicom" if not _has_pydicom() else "DICOM"))
    for path, reason in cases:
        with pytest.raises(MediaError, match=reason) as err:
            open_image(path)
        assert err.value.path == str(path) and str(err.value).startswith(str(path))


def _has_pydicom() -> bool:
    import importlib.util

    return importlib.util.find_spec("pydicom") is not None


# --- pixel budgets --------------------------------------------------------------------------------------


def test_fit_pixels_matches_smart_resize() -> None:
    from qwen_vl_utils import fetch_image, smart_resize
    from transformers.models.qwen2_vl.image_processing_qwen2_vl import smart_resize as hf_smart_resize

    for (h, w), lo, hi, f in [
        ((48, 64), 4 * 28 * 28, 16384 * 28 * 28, 28),
        ((1000, 300), 256 * 28 * 28, 512 * 28 * 28, 28),
        ((37, 901), 64 * 32 * 32, 256 * 32 * 32, 32),
        ((2000, 1500), 4 * 28 * 28, 100 * 28 * 28, 28),
    ]:
        img = Image.new("RGB", (w, h), (10, 20, 30))
        out = fit_pixels(img, lo, hi, factor=f)
        assert (out.height, out.width) == smart_resize(h, w, factor=f, min_pixels=lo, max_pixels=hi)
        assert (out.height, out.width) == hf_smart_resize(h, w, factor=f, min_pixels=lo, max_pixels=hi)
        assert (out.height, out.width) == fitted_size(h, w, lo, hi, f)
        assert out.height % f == 0 and out.width % f == 0 and lo <= out.height * out.width <= hi
        ref = fetch_image({"image": img, "min_pixels": lo, "max_pixels": hi}, image_patch_size=f // 2)
        assert ref.size == out.size
    small = Image.new("RGB", (56, 28))
    assert fit_pixels(small, 28 * 28, 10**6) is small  # already fits: untouched


# --- crop / zoom ----------------------------------------------------------------------------------------


def test_box_maths_and_crop() -> None:
    arr = np.zeros((50, 100, 3), np.uint8)
    arr[10:30, 25:75] = (255, 255, 0)
    img = Image.fromarray(arr)
    assert box_to_pixels([0.25, 0.2, 0.75, 0.6], 100, 50) == (25, 10, 75, 30)
    c = crop(img, [0.25, 0.2, 0.75, 0.6])
    assert c.size == (50, 20) and (np.asarray(c) == (255, 255, 0)).all()
    # outward rounding: a sliver still gives at least one pixel, inside the image
    assert box_to_pixels([0.999, 0.0, 1.0, 0.001], 100, 50) == (99, 0, 100, 1)
    assert box_to_pixels([0.251, 0.21, 0.749, 0.59], 100, 50) == (25, 10, 75, 30)
    assert crop(img, [0, 0, 1, 1]).size == (100, 50)


@pytest.mark.parametrize(
    "box,msg",
    [
        ([0.1, 0.2, 0.3], "4 numbers"),
        ([0.5, 0.1, 0.4, 0.9], "x0 < x1"),
        ([0.1, 0.5, 0.4, 0.5], "y0 < y1"),
        ([-0.2, 0.1, 0.4, 0.9], r"\[0, 1\]"),
        ([0.1, 0.1, 1.5, 0.9], r"\[0, 1\]"),
        ([0.1, float("nan"), 0.4, 0.9], "non-finite"),
        (["a", 0, 1, 1], "4 numbers"),
        (None, "4 numbers"),
    ],
)
def test_bad_boxes(box, msg: str) -> None:
    with pytest.raises(ValueError, match=msg):
        validate_box(box)


def test_zoom_fills_budget_and_keeps_content() -> None:
    arr = np.zeros((60, 80, 3), np.uint8)
    arr[:, :40] = (255, 0, 0)
    arr[:, 40:] = (0, 0, 255)
    img = Image.fromarray(arr)
    budget = 64 * 28 * 28
    z = zoom(img, [0.25, 0.0, 0.75, 0.5], max_pixels=budget)  # a 40x30 region, red | blue
    assert z.width % 28 == 0 and z.height % 28 == 0
    assert 0.75 * budget <= z.width * z.height <= budget
    assert abs(z.width / z.height - 40 / 30) < 0.15
    a = np.asarray(z).astype(int)
    assert a[z.height // 2, 2, 0] > 200 and a[z.height // 2, z.width - 3, 2] > 200
    shrunk = zoom(img, [0, 0, 1, 1], max_pixels=4 * 28 * 28)
    assert shrunk.size == (56, 56)
