"""Render shapes-world scenes: the pretraining data and the verifier's ground truth.

A scene is a list of objects, each a shape of one palette colour with a
square bounding box of side ``size`` pixels, drawn on a black canvas at
``SUPERSAMPLE`` times the resolution and box-filtered down (anti-aliased
edges). Layouts keep every pair of objects at least ``GAP`` pixels apart
(bounding boxes), so objects never touch, and place related objects
strictly on the named side of their reference.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
from PIL import Image, ImageDraw

from rewards.world_spec import PALETTE, SHAPE_CLASSES

IMAGE_SIZE = 32
SUPERSAMPLE = 4
MIN_SIZE = 7.5
MAX_SIZE = 10.0
GAP = 2.0
MAX_LAYOUT_TRIES = 200
MAX_OBJECT_TRIES = 100

COLORS = tuple(PALETTE)


@dataclass(frozen=True)
class SceneObject:
    """A shape to draw: class, colour name, bounding-box centre (x right, y down) and side, in pixels."""

    shape: str
    color: str
    center_x: float
    center_y: float
    size: float


def _objects_to_place(
    include: Sequence[Mapping[str, Any]], rng: np.random.Generator
) -> list[tuple[int, str, str]]:
    """``(entry index, shape, colour)`` per object; an entry without a colour gets one random colour."""
    objects = []
    for index, entry in enumerate(include):
        if entry["class"] not in SHAPE_CLASSES:
            raise ValueError(f"unknown shape class {entry['class']!r}; allowed: {SHAPE_CLASSES}")
        color = entry.get("color") or COLORS[rng.integers(len(COLORS))]
        if color not in PALETTE:
            raise ValueError(f"unknown colour {color!r}; allowed: {COLORS}")
        objects.extend((index, entry["class"], color) for _ in range(int(entry.get("count", 1))))
    return objects


def _relation_satisfied(placed: SceneObject, reference: SceneObject, relation: str) -> bool:
    """True when ``placed`` lies wholly on the ``relation`` side of ``reference`` (boxes do not overlap on that axis)."""
    separation = (placed.size + reference.size) / 2 + GAP
    if relation == "left of":
        return reference.center_x - placed.center_x >= separation
    if relation == "right of":
        return placed.center_x - reference.center_x >= separation
    if relation == "above":
        return reference.center_y - placed.center_y >= separation
    if relation == "below":
        return placed.center_y - reference.center_y >= separation
    raise ValueError(f"unknown relation {relation!r}")


def sample_layout(
    include: Sequence[Mapping[str, Any]], rng: np.random.Generator, image_size: int = IMAGE_SIZE
) -> list[SceneObject]:
    """Random non-touching placement of every object an ``include`` list asks for."""
    wanted = _objects_to_place(include, rng)
    for _ in range(MAX_LAYOUT_TRIES):
        placed: list[SceneObject] = []
        entry_of: list[int] = []
        for entry_index, shape, color in wanted:
            for _ in range(MAX_OBJECT_TRIES):
                size = float(rng.uniform(MIN_SIZE, MAX_SIZE))
                low, high = size / 2 + 1, image_size - size / 2 - 1
                candidate = SceneObject(
                    shape, color, float(rng.uniform(low, high)), float(rng.uniform(low, high)), size
                )
                if all(
                    max(abs(candidate.center_x - other.center_x), abs(candidate.center_y - other.center_y))
                    >= (candidate.size + other.size) / 2 + GAP
                    for other in placed
                ):
                    placed.append(candidate)
                    entry_of.append(entry_index)
                    break
            else:
                break
        if len(placed) < len(wanted):
            continue
        if all(
            _relation_satisfied(obj, ref, include[entry_of[i]]["position"][0])
            for i, obj in enumerate(placed)
            if "position" in include[entry_of[i]]
            for ref, ref_entry in zip(placed, entry_of)
            if ref_entry == include[entry_of[i]]["position"][1]
        ):
            return placed
    raise RuntimeError(f"no layout found for {include!r} in {MAX_LAYOUT_TRIES} tries")


def draw_scene(objects: Sequence[SceneObject], image_size: int = IMAGE_SIZE) -> np.ndarray:
    """An ``[H, W, 3]`` float32 image in [0, 1] of the objects on black, anti-aliased by supersampling."""
    scale = SUPERSAMPLE
    canvas = Image.new("RGB", (image_size * scale, image_size * scale))
    draw = ImageDraw.Draw(canvas)
    for obj in objects:
        fill = tuple(int(round(255 * channel)) for channel in PALETTE[obj.color])
        half = obj.size / 2
        left, top = (obj.center_x - half) * scale, (obj.center_y - half) * scale
        right, bottom = (obj.center_x + half) * scale, (obj.center_y + half) * scale
        if obj.shape == "circle":
            draw.ellipse((left, top, right, bottom), fill=fill)
        elif obj.shape == "square":
            draw.rectangle((left, top, right, bottom), fill=fill)
        elif obj.shape == "triangle":
            draw.polygon(((obj.center_x * scale, top), (right, bottom), (left, bottom)), fill=fill)
        else:
            raise ValueError(f"unknown shape class {obj.shape!r}; allowed: {SHAPE_CLASSES}")
    small = canvas.resize((image_size, image_size), Image.Resampling.BOX)
    return np.asarray(small, dtype=np.float32) / 255.0


def render_prompt(
    record: Mapping[str, Any], rng: np.random.Generator, image_size: int = IMAGE_SIZE
) -> np.ndarray:
    """A ground-truth image for a prompt record (its ``include`` metadata), ``[H, W, 3]`` in [0, 1]."""
    return draw_scene(sample_layout(record["include"], rng, image_size), image_size)
