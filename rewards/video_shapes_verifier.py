"""The moving-shapes video verifier: an exact judge of object identity, colour, motion, speed and appearance.

The moving-shapes world animates the shapes world: each object of a clip moves
in a straight line at a constant speed, or appears partway through and stays.
The verifier reads every frame back into objects with the image verifier's
detection (:func:`rewards.shapes_verifier.detect_objects`) and checks the
objects' tracks against the prompt's metadata, whose ``include`` entries
extend the shapes world's with motion::

    {"tag": "speed", "include": [{"class": "circle", "count": 1, "motion": "left", "speed": "quickly"}]}
    {"tag": "appear", "include": [{"class": "circle", "count": 1, "motion": "up"},
                                  {"class": "square", "count": 1, "color": "red", "appears": True}]}

Tracks. The grammar names each class once per prompt and every entry has
``count`` 1, so an entry's track is, frame by frame, the objects of its class.
An entry is expected in every frame, or, when it ``appears``, from the appear
frame ``a = floor(APPEAR_FRACTION * T)`` on. Its *steady frames* are the
expected frames with exactly one object of its class; a least-squares line
through the centroids of its steady frames (against the frame index) gives its
velocity ``(vx, vy)`` in pixels per frame (x right, y down), when it has at
least ``MIN_FIT_FRAMES`` steady frames.

Thresholds are in pixels of a ``REFERENCE_FRAME_SIZE``-pixel frame and scale
with the frame (by ``min(H, W) / REFERENCE_FRAME_SIZE``), as the renderer does.

Checks (per entry, each 0 or 1 unless stated):
  - presence: the share of the expected frames that are steady (in [0, 1]);
  - colour (entries with a colour): the share of the track's objects, over all
    frames, that have the colour (in [0, 1]; 0 when none was found);
  - motion (entries with a direction): 1 when the velocity exists, its
    component along the direction is at least ``MIN_SPEED`` and its component
    across the direction is at most ``MAX_CROSS_RATIO`` times the one along,
    so a static, reversed, perpendicular or diagonal track fails;
  - speed (entries with a speed word): 1 when the velocity exists and its norm
    lies on the word's side of the midpoint of the two ``SPEED_PIXELS``;
  - appears (entries with ``appears: true``): 1 when no object of the class is
    seen in frames ``k < a - 1`` and one is seen in every frame ``k > a``; the
    boundary frames ``a - 1`` and ``a`` are not judged (clips of fewer than four
    frames judge nothing on the side that is left empty). An appearing object
    is not required to be still.
  ``strict`` = 1 when every check is 1, else 0; ``partial`` = mean of the checks.
  Classes the prompt does not mention are ignored, as in the image verifier.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import torch

from rewards.shapes_verifier import DetectedObject, detect_objects
from rewards.world_spec import (
    DIRECTION_VECTORS,
    DIRECTIONS,
    MIN_FIT_FRAMES,
    SPEED_PIXELS,
    appear_frame,
)

#: the frame size (pixels) that ``SPEED_PIXELS`` and ``MIN_SPEED`` refer to
REFERENCE_FRAME_SIZE = 32
#: the least speed along the named direction that counts as moving, pixels per frame at the reference size
MIN_SPEED = 0.4
#: the most speed across the named direction, as a share of the speed along it (about 27 degrees)
MAX_CROSS_RATIO = 0.5
#: the speed that separates "slowly" from "quickly", pixels per frame at the reference size
SPEED_MIDPOINT = (SPEED_PIXELS["slowly"] + SPEED_PIXELS["quickly"]) / 2

FrameObjects = Sequence[Sequence[DetectedObject]]
Velocity = tuple[float, float]


def expected_frames(entry: Mapping[str, Any], num_frames: int) -> range:
    """Frames in which the entry's object should be seen: all, or from the appear frame on."""
    return range(appear_frame(num_frames) if entry.get("appears") else 0, num_frames)


def class_track(frames: FrameObjects, shape: str) -> list[list[DetectedObject]]:
    """Per frame, the objects of the class."""
    return [[obj for obj in objects if obj.shape == shape] for objects in frames]


def fit_velocity(track: Sequence[Sequence[DetectedObject]], frames: range) -> Velocity | None:
    """Least-squares velocity (pixels per frame) of the centroids over the steady frames of ``frames``.

    Steady frames hold exactly one object of the track; None with fewer than ``MIN_FIT_FRAMES``.
    """
    steady = [(k, track[k][0]) for k in frames if len(track[k]) == 1]
    if len(steady) < MIN_FIT_FRAMES:
        return None
    times = np.array([k for k, _ in steady], dtype=np.float64)
    points = np.array([(obj.center_x, obj.center_y) for _, obj in steady], dtype=np.float64)
    times -= times.mean()
    velocity = times @ (points - points.mean(axis=0)) / (times @ times)
    return float(velocity[0]), float(velocity[1])


def motion_holds(velocity: Velocity | None, direction: str, scale: float) -> bool:
    """True when the velocity goes ``direction`` at ``MIN_SPEED`` or more, within ``MAX_CROSS_RATIO`` across."""
    if direction not in DIRECTION_VECTORS:
        raise ValueError(f"unknown motion {direction!r}; allowed: {DIRECTIONS}")
    if velocity is None:
        return False
    unit_x, unit_y = DIRECTION_VECTORS[direction]
    along = velocity[0] * unit_x + velocity[1] * unit_y
    across = abs(velocity[0] * unit_y - velocity[1] * unit_x)
    return along >= MIN_SPEED * scale and across <= MAX_CROSS_RATIO * along


def speed_holds(velocity: Velocity | None, speed: str, scale: float) -> bool:
    """True when the velocity's norm lies on the speed word's side of ``SPEED_MIDPOINT``."""
    if speed not in SPEED_PIXELS:
        raise ValueError(f"unknown speed {speed!r}; allowed: {tuple(SPEED_PIXELS)}")
    if velocity is None:
        return False
    fast = math.hypot(*velocity) > SPEED_MIDPOINT * scale
    return fast == (SPEED_PIXELS[speed] > SPEED_MIDPOINT)


def appears_holds(track: Sequence[Sequence[DetectedObject]]) -> bool:
    """True when the track is empty before frame ``a - 1`` and seen in every frame after ``a``."""
    first = appear_frame(len(track))
    absent_before = all(not track[k] for k in range(first - 1))
    seen_after = all(track[k] for k in range(first + 1, len(track)))
    return absent_before and seen_after


def entry_checks(frames: FrameObjects, metadata: Mapping[str, Any], scale: float) -> list[dict[str, float]]:
    """Per ``include`` entry, its checks (``presence``, and ``color``, ``motion``, ``speed``, ``appears``
    for entries that name them) on per-frame detections; see the module docstring."""
    verdicts: list[dict[str, float]] = []
    for entry in metadata["include"]:
        if int(entry.get("count", 1)) != 1:
            raise ValueError(f"video_shapes_verifier judges entries of count 1, got {dict(entry)!r}")
        track = class_track(frames, entry["class"])
        expected = expected_frames(entry, len(frames))
        checks = {"presence": sum(len(track[k]) == 1 for k in expected) / max(len(expected), 1)}
        if "color" in entry:
            seen = [obj for objects in track for obj in objects]
            checks["color"] = sum(obj.color == entry["color"] for obj in seen) / max(len(seen), 1)
        velocity = fit_velocity(track, expected)
        if "motion" in entry:
            checks["motion"] = float(motion_holds(velocity, entry["motion"], scale))
        if "speed" in entry:
            checks["speed"] = float(speed_holds(velocity, entry["speed"], scale))
        if entry.get("appears"):
            checks["appears"] = float(appears_holds(track))
        verdicts.append(checks)
    return verdicts


def score_frames(frames: FrameObjects, metadata: Mapping[str, Any], scale: float) -> tuple[float, float]:
    """``(strict, partial)`` of per-frame detections against the metadata (see module docstring)."""
    checks = [value for verdict in entry_checks(frames, metadata, scale) for value in verdict.values()]
    strict = 1.0 if all(check == 1.0 for check in checks) else 0.0
    return strict, float(np.mean(checks))


def verify_clip(clip: np.ndarray, metadata: Mapping[str, Any]) -> tuple[float, float]:
    """``(strict, partial)`` for one ``[T, H, W, 3]`` clip in [0, 1]."""
    scale = min(clip.shape[1], clip.shape[2]) / REFERENCE_FRAME_SIZE
    return score_frames([detect_objects(frame) for frame in clip], metadata, scale)


class VideoShapesVerifier:
    """Reward: the moving-shapes verifier.

    Call with videos ``[B, T, 3, H, W]`` in [0, 1] (``T >= MIN_FIT_FRAMES``), prompts and
    per-prompt metadata; returns ``{"partial": Tensor[B], "strict": Tensor[B]}``
    (see module docstring).
    """

    modality = "video"
    #: The sub-score a MultiReward aggregates by default.
    primary_score = "partial"
    score_keys = ("partial", "strict")  #: all it returns (checked before it is built)

    def __call__(
        self, videos: torch.Tensor, prompts: Sequence[str], metadata: Sequence[Mapping[str, Any]]
    ) -> dict[str, torch.Tensor]:
        if videos.ndim != 5 or videos.shape[2] != 3:
            raise ValueError(
                f"video_shapes_verifier expects videos [B, T, 3, H, W], got shape {tuple(videos.shape)}"
            )
        if videos.shape[1] < MIN_FIT_FRAMES:
            raise ValueError(
                f"video_shapes_verifier needs at least {MIN_FIT_FRAMES} frames (a motion fit), got {videos.shape[1]}"
            )
        if len(metadata) != videos.shape[0]:
            raise ValueError(
                f"video_shapes_verifier got {videos.shape[0]} videos but {len(metadata)} metadata entries"
            )
        pixels = videos.detach().float().cpu().permute(0, 1, 3, 4, 2).numpy()
        scores = [verify_clip(clip, meta) for clip, meta in zip(pixels, metadata)]
        strict, partial = zip(*scores) if scores else ((), ())
        return {
            "partial": torch.tensor(partial, dtype=torch.float32),
            "strict": torch.tensor(strict, dtype=torch.float32),
        }
