"""Synthetic grey-scale "scans" for the medical-style curriculum.

Each image (``R x R`` grey PNG) shows a dark field, an elliptical "body" with a smooth noise texture, and
optionally one round lesion, brighter or darker than the tissue, in one quadrant of the body. Like real
anatomy, the tissue looks different by region (v2): it brightens from top to bottom and its left half is
striated, so every part of the body, and a lesion in it, carries where it is in its own pixels. (v1 tissue
was the same everywhere: the tiny models, whose attention encodes position only in rotations of queries and
keys, could tell that a lesion was there but not where; the toy base named the quadrant at chance.) Question
kinds (cycled, so each is a quarter of the records), with ``meta.stage`` for a closed -> open curriculum:

* ``presence`` (stage 0, ``yes_no``): "Is there a lesion in this scan?" -- half yes, half no.
* ``location_mc`` (stage 1, ``multiple_choice``): options ``upper left, upper right, lower left,
  lower right`` (image orientation: left of the image is left).
* ``location_open`` (stage 2, ``open``): reference e.g. ``"upper left"``; ``meta.synonyms``
  lists synonyms (``"left upper"``, ``"top left"``, ...).
* ``polarity_open`` (stage 2, ``open``): ``"bright"`` or ``"dark"`` with synonyms (``hyperintense``...).

Difficulty: easy = large (12 % of the side), high-contrast lesion; medium = 8 %, medium contrast;
hard = 5 %, low contrast.
"""

from __future__ import annotations

import numpy as np

from .draw import disk, ellipse, grid, smooth_noise
from .registry import ToyConfig, ToyItem, cycle, register_task

LOCATIONS = ("upper left", "upper right", "lower left", "lower right")
LOCATION_SYNONYMS = {
    "upper left": ["upper left", "left upper", "top left", "left top", "upper-left", "top-left",
                   "upper left quadrant", "left upper quadrant"],
    "upper right": ["upper right", "right upper", "top right", "right top", "upper-right", "top-right",
                    "upper right quadrant", "right upper quadrant"],
    "lower left": ["lower left", "left lower", "bottom left", "left bottom", "lower-left", "bottom-left",
                   "lower left quadrant", "left lower quadrant"],
    "lower right": ["lower right", "right lower", "bottom right", "right bottom", "lower-right", "bottom-right",
                    "lower right quadrant", "right lower quadrant"],
}
POLARITIES = ("bright", "dark")
POLARITY_SYNONYMS = {
    "bright": ["bright", "brighter", "hyperintense", "hyperdense", "light", "white"],
    "dark": ["dark", "darker", "hypointense", "hypodense", "black"],
}
KINDS = ("presence", "location_mc", "location_open", "polarity_open")
STAGES = {"presence": 0, "location_mc": 1, "location_open": 2, "polarity_open": 2}
TISSUE_RAMP = 25.0  # grey levels from the centre to the top (darker) or bottom (brighter) of the body
STRIPE_AMP, STRIPE_PERIOD = 14.0, 6 / 64  # the left half's stripes: amplitude, period as a share of the side
LEVELS = {  # difficulty -> (lesion radius as a fraction of the side, contrast in grey levels)
    "easy": (0.12, 90.0),
    "medium": (0.08, 55.0),
    "hard": (0.05, 35.0),
}


def render_scan(rng: np.random.Generator, r: int, lesion: dict | None) -> np.ndarray:
    """uint8 ``(r, r)`` grey image. ``lesion``: ``{"location", "polarity", "radius", "contrast"}``;
    the chosen centre is written back into it as ``center`` ([x, y] pixels)."""
    img = np.full((r, r), 12.0, np.float32) + rng.normal(0, 3, (r, r)).astype(np.float32)
    cx, cy = r / 2 + rng.uniform(-0.03, 0.03) * r, r / 2 + rng.uniform(-0.03, 0.03) * r
    ax, ay = r * rng.uniform(0.40, 0.45), r * rng.uniform(0.33, 0.40)
    body = ellipse(r, r, cx, cy, ax, ay)
    yy, xx = grid(r, r)
    tissue = 115.0 + smooth_noise(r, r, rng, cell=max(4, r // 8), amp=6.0) + rng.normal(0, 4, (r, r))
    tissue += TISSUE_RAMP * np.clip((yy - cy) / ay, -1.0, 1.0)  # darker at the top, brighter at the bottom
    stripes = np.sign(np.sin(2 * np.pi * xx / (STRIPE_PERIOD * r)))
    tissue += np.where(xx < cx, STRIPE_AMP * stripes, 0.0)  # the left half is striated
    img[body] = tissue[body]
    if lesion is not None:
        rad = lesion["radius"]
        sx = -1 if "left" in lesion["location"] else 1
        sy = -1 if "upper" in lesion["location"] else 1
        # centre inside the quadrant of the body, away from the midlines and the edge
        lx = cx + sx * rng.uniform(0.35, 0.6) * ax
        ly = cy + sy * rng.uniform(0.35, 0.6) * ay
        mask = disk(r, r, lx, ly, rad) & body
        sign = 1.0 if lesion["polarity"] == "bright" else -1.0
        img[mask] += sign * lesion["contrast"]
        lesion["center"] = [round(float(lx), 2), round(float(ly), 2)]
    return np.clip(img, 0, 255).astype(np.uint8)


@register_task("scan", kind="image", version=2, description="grey-scale scans: lesion presence/location/"
                                                            "polarity, closed and open questions")
def scan_task(rng: np.random.Generator, index: int, cfg: ToyConfig) -> ToyItem:
    r = cfg.resolution
    kind = KINDS[index % len(KINDS)]
    j = index // len(KINDS)
    n_classes = {"presence": 2, "location_mc": 4, "location_open": 4, "polarity_open": 2}[kind]
    cls, variant = cycle(j, n_classes, 3)
    difficulty = ("easy", "medium", "hard")[variant]
    radius, contrast = LEVELS[difficulty]
    present = not (kind == "presence" and cls == 1)
    location = LOCATIONS[cls] if kind.startswith("location") else LOCATIONS[int(rng.integers(4))]
    polarity = POLARITIES[cls] if kind == "polarity_open" else POLARITIES[int(rng.integers(2))]
    lesion = {"location": location, "polarity": polarity, "radius": round(radius * r, 2),
              "contrast": contrast} if present else None
    image = render_scan(rng, r, lesion)
    finding = {"present": present, **(lesion or {})}
    meta = {"question_kind": kind, "stage": STAGES[kind], "finding": finding}
    if kind == "presence":
        return ToyItem(question="Is there a lesion in this scan?", problem_type="yes_no",
                       answer="yes" if present else "no", difficulty=difficulty, image=image, meta=meta)
    if kind == "location_mc":
        return ToyItem(question="Where is the lesion located in this scan?", problem_type="multiple_choice",
                       options=list(LOCATIONS), answer=location, difficulty=difficulty, image=image, meta=meta)
    if kind == "location_open":
        meta["synonyms"] = list(LOCATION_SYNONYMS[location])
        return ToyItem(question="In which part of the scan is the lesion? Answer with its location, "
                                "e.g. upper left.", problem_type="open", answer=location,
                       difficulty=difficulty, image=image, meta=meta)
    meta["synonyms"] = list(POLARITY_SYNONYMS[polarity])
    return ToyItem(question="Is the lesion brighter or darker than the surrounding tissue? Answer bright or dark.",
                   problem_type="open", answer=polarity, difficulty=difficulty, image=image, meta=meta)
