"""Render moving-shapes clips: the video pretraining data and the video verifier's ground truth.

A clip is ``T`` frames of the shapes world (:func:`flowrl.shapes.render.draw_scene`,
anti-aliased, so sub-pixel motion is smooth). A moving object starts at a
random place and moves in a straight line at its speed (``SPEED_PIXELS``,
pixels per frame on a 32-pixel frame, scaled with the frame size); an object
that appears is still, and drawn from frame ``floor(APPEAR_FRACTION * T)`` on.
Layouts keep every trajectory inside the frame and every pair of objects
visible together at least ``GAP`` pixels apart (bounding boxes) in every frame.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from flowrl.shapes.render import COLORS, GAP, SceneObject, draw_scene
from rewards.world_spec import (
    DIRECTION_VECTORS,
    MIN_FIT_FRAMES,
    PALETTE,
    SHAPE_CLASSES,
    SPEED_PIXELS,
    appear_frame,
)

NUM_FRAMES = 8
IMAGE_SIZE = 32
MIN_SIZE = 7.0
MAX_SIZE = 9.0
MAX_LAYOUT_TRIES = 500


@dataclass(frozen=True)
class MovingObject:
    """A shape on a straight track: centre at frame ``k`` is ``start + k * velocity`` (pixels, x right, y down),
    drawn from frame ``first_frame`` on."""

    shape: str
    color: str
    start_x: float
    start_y: float
    velocity_x: float
    velocity_y: float
    size: float
    first_frame: int = 0

    def at(self, frame: int) -> SceneObject | None:
        """The object as drawn in ``frame`` (None before it appears)."""
        if frame < self.first_frame:
            return None
        return SceneObject(
            self.shape,
            self.color,
            self.start_x + frame * self.velocity_x,
            self.start_y + frame * self.velocity_y,
            self.size,
        )


def _draw_object(
    entry: Mapping[str, Any], rng: np.random.Generator, num_frames: int, image_size: int
) -> MovingObject:
    """One random object for an ``include`` entry: size, colour (when unnamed), speed (when unnamed), start."""
    if entry["class"] not in SHAPE_CLASSES:
        raise ValueError(f"unknown shape class {entry['class']!r}; allowed: {SHAPE_CLASSES}")
    color = entry.get("color") or COLORS[rng.integers(len(COLORS))]
    if color not in PALETTE:
        raise ValueError(f"unknown colour {color!r}; allowed: {COLORS}")
    scale = image_size / IMAGE_SIZE
    size = float(rng.uniform(MIN_SIZE, MAX_SIZE)) * scale
    velocity = (0.0, 0.0)
    if "motion" in entry:
        if entry["motion"] not in DIRECTION_VECTORS:
            raise ValueError(f"unknown motion {entry['motion']!r}; allowed: {tuple(DIRECTION_VECTORS)}")
        speed_word = entry.get("speed") or tuple(SPEED_PIXELS)[rng.integers(len(SPEED_PIXELS))]
        if speed_word not in SPEED_PIXELS:
            raise ValueError(f"unknown speed {speed_word!r}; allowed: {tuple(SPEED_PIXELS)}")
        unit = DIRECTION_VECTORS[entry["motion"]]
        velocity = (unit[0] * SPEED_PIXELS[speed_word] * scale, unit[1] * SPEED_PIXELS[speed_word] * scale)
    low, high = size / 2 + 1, image_size - size / 2 - 1
    travel = [component * (num_frames - 1) for component in velocity]
    if max(abs(moved) for moved in travel) > high - low:
        raise ValueError(
            f"a {entry['class']} moving {speed_word} travels {max(abs(m) for m in travel):.1f} pixels in "
            f"num_frames={num_frames} frames, more than a {image_size}-pixel frame allows ({high - low:.1f}); "
            "use fewer frames or a larger frame"
        )
    start = [float(rng.uniform(low - min(0.0, moved), high - max(0.0, moved))) for moved in travel]
    first = appear_frame(num_frames) if entry.get("appears") else 0
    return MovingObject(entry["class"], color, start[0], start[1], velocity[0], velocity[1], size, first)


def _apart_in_every_frame(first: MovingObject, second: MovingObject, num_frames: int) -> bool:
    for frame in range(max(first.first_frame, second.first_frame), num_frames):
        a, b = first.at(frame), second.at(frame)
        if max(abs(a.center_x - b.center_x), abs(a.center_y - b.center_y)) < (a.size + b.size) / 2 + GAP:
            return False
    return True


def sample_motion_layout(
    include: Sequence[Mapping[str, Any]],
    rng: np.random.Generator,
    num_frames: int = NUM_FRAMES,
    image_size: int = IMAGE_SIZE,
) -> list[MovingObject]:
    """Random tracks, one per ``include`` entry, inside the frame and never touching (module docstring)."""
    if num_frames < MIN_FIT_FRAMES:
        raise ValueError(
            f"a clip needs at least {MIN_FIT_FRAMES} frames (the verifier fits motion to 3), got num_frames={num_frames}"
        )
    for _ in range(MAX_LAYOUT_TRIES):
        objects = [_draw_object(entry, rng, num_frames, image_size) for entry in include]
        if all(
            _apart_in_every_frame(objects[i], objects[j], num_frames)
            for i in range(len(objects))
            for j in range(i + 1, len(objects))
        ):
            return objects
    raise RuntimeError(f"no motion layout found for {list(include)!r} in {MAX_LAYOUT_TRIES} tries")


def draw_clip(
    objects: Sequence[MovingObject], num_frames: int = NUM_FRAMES, image_size: int = IMAGE_SIZE
) -> np.ndarray:
    """A ``[T, H, W, 3]`` float32 clip in [0, 1] of the objects' tracks on black."""
    return np.stack(
        [
            draw_scene([drawn for obj in objects if (drawn := obj.at(frame)) is not None], image_size)
            for frame in range(num_frames)
        ]
    )


def render_clip(
    record: Mapping[str, Any],
    rng: np.random.Generator,
    num_frames: int = NUM_FRAMES,
    image_size: int = IMAGE_SIZE,
) -> np.ndarray:
    """A ground-truth clip ``[T, H, W, 3]`` in [0, 1] for a prompt record (its ``include`` metadata)."""
    return draw_clip(
        sample_motion_layout(record["include"], rng, num_frames, image_size), num_frames, image_size
    )
