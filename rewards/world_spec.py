"""The specification of the shapes and moving-shapes worlds: their vocabulary and physical rules.

The prompt grammars and renderers (``flowrl.shapes``, ``flowrl.video_shapes``)
and the verifiers (:mod:`rewards.shapes_verifier`,
:mod:`rewards.video_shapes_verifier`) must agree on these; they all import
them from here. A leaf: it imports nothing but the standard library, and
nothing of ``flowrl``.
"""

from __future__ import annotations

import math

SHAPE_CLASSES: tuple[str, ...] = ("circle", "square", "triangle")

#: Palette of the shapes world, RGB in [0, 1]. Chromaticities are far apart,
#: so the nearest-colour rule is unambiguous.
PALETTE: dict[str, tuple[float, float, float]] = {
    "red": (0.92, 0.12, 0.10),
    "green": (0.10, 0.80, 0.15),
    "blue": (0.15, 0.30, 0.95),
    "yellow": (0.95, 0.85, 0.10),
    "purple": (0.65, 0.15, 0.90),
    "cyan": (0.10, 0.85, 0.85),
}

RELATIONS: tuple[str, ...] = ("left of", "right of", "above", "below")

# --- the moving-shapes (video) world

DIRECTIONS: tuple[str, ...] = ("left", "right", "up", "down")
#: unit displacement per direction, (x right, y down)
DIRECTION_VECTORS: dict[str, tuple[float, float]] = {
    "left": (-1.0, 0.0),
    "right": (1.0, 0.0),
    "up": (0.0, -1.0),
    "down": (0.0, 1.0),
}
#: ground-truth speed of each speed word, pixels per frame on a 32-pixel frame (scaled with the frame)
SPEED_PIXELS: dict[str, float] = {"slowly": 1.0, "quickly": 2.25}
#: an object that "appears" is drawn from frame ``floor(APPEAR_FRACTION * T)`` on
APPEAR_FRACTION = 0.5
#: the fewest steady frames a velocity is fitted on (so clips need at least this many frames)
MIN_FIT_FRAMES = 3


def appear_frame(num_frames: int) -> int:
    """The first frame in which an object that appears is drawn: ``floor(APPEAR_FRACTION * T)``."""
    return math.floor(APPEAR_FRACTION * num_frames)
