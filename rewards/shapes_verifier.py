"""The shapes-world verifier: an exact, GenEval-style judge of generated shape scenes.

The shapes world draws solid shapes in a small palette on a black background.
The verifier reads an image back into objects and checks them against the
prompt's GenEval-style metadata::

    {"tag": "counting", "include": [{"class": "circle", "count": 2, "color": "red"}]}
    {"tag": "position", "include": [{"class": "square", "count": 1},
                                    {"class": "circle", "count": 1, "position": ["left of", 0]}]}

Detection (per image):
  1. a pixel is foreground when its brightest channel exceeds ``FOREGROUND_LEVEL``;
  2. its colour is the palette entry nearest to its chromaticity ``c / max(c)``
     (brightness-invariant, so anti-aliased edges keep their colour), or none
     when farther than ``MAX_COLOR_DISTANCE``;
  3. connected pixels of one colour form a component; components smaller than
     ``MIN_OBJECT_AREA`` pixels are ignored;
  4. the shape class follows from two scale-free features of the object's
     soft coverage (brightness over its peak, so anti-aliased rims count by
     their coverage): the fill ratio (square 1, circle pi/4, triangle 1/2) and
     the share of the area in the upper half (upright triangle 1/4, others 1/2);
     see :func:`soft_shape_features`.

Scoring (per image). The grammar never names one class twice in a prompt,
so each ``include`` entry is judged on the objects of its class:
  - count check: ``n`` objects of the class found, ``count`` asked:
    1 if ``n == count`` else ``max(0, 1 - |n - count| / count)``;
  - colour check (entries with a colour): the share of those objects that
    have the colour (0 when none was found), so a red circle beside a blue
    one does not pass "a red circle";
  - position check (entries with a position): 1 if some object of the entry
    lies on the named side of some object of the referenced entry by more
    than ``POSITION_MARGIN`` pixels (centroids), else 0.
  ``strict`` = 1 when every check is 1, else 0; ``partial`` = mean of the checks.
  Counts are exact (stricter than GenEval, which accepts "at least" outside
  the counting task). Classes the prompt does not mention are ignored, as in
  GenEval.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
from scipy import ndimage

from rewards.base import RewardError
from rewards.world_spec import PALETTE, RELATIONS, SHAPE_CLASSES

FOREGROUND_LEVEL = 0.4
MAX_COLOR_DISTANCE = 0.45
MIN_OBJECT_AREA = 10
POSITION_MARGIN = 2.0
SQUARE_MIN_FILL = 0.89
TRIANGLE_MAX_TOP_SHARE = 0.4

_COLOR_NAMES = tuple(PALETTE)
_CHROMA = np.array([np.array(rgb) / max(rgb) for rgb in PALETTE.values()], dtype=np.float32)


@dataclass(frozen=True)
class DetectedObject:
    """One object read off an image: its class, colour, area and centroid (x right, y down)."""

    shape: str
    color: str
    area: int
    center_x: float
    center_y: float


def color_map(image: np.ndarray) -> np.ndarray:
    """Per-pixel palette index of an ``[H, W, 3]`` image in [0, 1]; -1 for background or off-palette."""
    image = np.clip(np.nan_to_num(image.astype(np.float32), nan=0.0), 0.0, 1.0)
    brightness = image.max(axis=-1)
    chroma = image / np.maximum(brightness, 1e-6)[..., None]
    distances = np.linalg.norm(chroma[:, :, None, :] - _CHROMA[None, None], axis=-1)
    nearest = distances.argmin(axis=-1)
    valid = (brightness > FOREGROUND_LEVEL) & (distances.min(axis=-1) <= MAX_COLOR_DISTANCE)
    return np.where(valid, nearest, -1)


def soft_shape_features(coverage: np.ndarray) -> tuple[float, float]:
    """``(fill, top_share)`` of one object's coverage map (values in [0, 1], object alone, 1-pixel margin).

    With row profile ``p_y = max_x C`` and column profile ``q_x = max_y C``, the
    soft height and width are ``h = sum p_y`` and ``w = sum q_x`` (exact for
    anti-aliased edges), ``fill = sum C / (w h)`` (square 1, circle pi/4,
    triangle 1/2) and ``top_share`` is the share of ``sum C`` lying in the
    upper ``h / 2`` of the soft height (upright triangle 1/4, circle and square 1/2).
    """
    rows_profile = coverage.max(axis=1)
    height = rows_profile.sum()
    width = coverage.max(axis=0).sum()
    total = coverage.sum()
    fill = total / max(height * width, 1e-6)
    rows_before = np.cumsum(rows_profile) - rows_profile
    in_top_half = np.clip(height / 2 - rows_before, 0.0, rows_profile) / np.maximum(rows_profile, 1e-6)
    top_share = float((coverage.sum(axis=1) * in_top_half).sum() / max(total, 1e-6))
    return float(fill), top_share


def classify_shape(fill: float, top_share: float) -> str:
    """Shape class from the soft features of :func:`soft_shape_features`."""
    if top_share < TRIANGLE_MAX_TOP_SHARE:
        return "triangle"
    return "square" if fill >= SQUARE_MIN_FILL else "circle"


def detect_objects(image: np.ndarray) -> list[DetectedObject]:
    """All objects of an ``[H, W, 3]`` image in [0, 1] (values outside are clamped, NaN is background)."""
    image = np.clip(np.nan_to_num(image.astype(np.float32), nan=0.0), 0.0, 1.0)
    brightness = image.max(axis=-1)
    labels_by_color = color_map(image)
    structure = np.ones((3, 3), dtype=bool)
    objects: list[DetectedObject] = []
    for color_index, color in enumerate(_COLOR_NAMES):
        components, _ = ndimage.label(labels_by_color == color_index, structure=structure)
        for component, box in enumerate(ndimage.find_objects(components), start=1):
            mask = components[box] == component
            area = int(mask.sum())
            if area < MIN_OBJECT_AREA:
                continue
            # The object's own coverage, with a 1-pixel margin for its anti-aliased rim;
            # other objects and bright off-palette pixels are excluded.
            top, left = max(box[0].start - 1, 0), max(box[1].start - 1, 0)
            window = (slice(top, box[0].stop + 1), slice(left, box[1].stop + 1))
            rim = (labels_by_color[window] == -1) & (brightness[window] <= FOREGROUND_LEVEL)
            own = (components[window] == component) | rim
            peak = brightness[box][mask].max()
            coverage = np.where(own, np.clip(brightness[window] / peak, 0.0, 1.0), 0.0)
            rows, cols = np.nonzero(mask)
            objects.append(
                DetectedObject(
                    classify_shape(*soft_shape_features(coverage)),
                    color,
                    area,
                    float(cols.mean() + box[1].start),
                    float(rows.mean() + box[0].start),
                )
            )
    return objects


def of_class(objects: Sequence[DetectedObject], entry: Mapping[str, Any]) -> list[DetectedObject]:
    """Objects of the entry's class in any colour: those its count and colour checks judge."""
    return [obj for obj in objects if obj.shape == entry["class"]]


def _of_entry(objects: Sequence[DetectedObject], entry: Mapping[str, Any]) -> list[DetectedObject]:
    """Objects of the entry's class and, when the entry names one, its colour."""
    return [
        obj
        for obj in objects
        if obj.shape == entry["class"] and ("color" not in entry or obj.color == entry["color"])
    ]


def _relation_holds(obj: DetectedObject, reference: DetectedObject, relation: str) -> bool:
    if relation == "left of":
        return reference.center_x - obj.center_x > POSITION_MARGIN
    if relation == "right of":
        return obj.center_x - reference.center_x > POSITION_MARGIN
    if relation == "above":
        return reference.center_y - obj.center_y > POSITION_MARGIN
    if relation == "below":
        return obj.center_y - reference.center_y > POSITION_MARGIN
    raise ValueError(f"unknown relation {relation!r}; allowed: {RELATIONS}")


def entry_checks(objects: Sequence[DetectedObject], metadata: Mapping[str, Any]) -> list[dict[str, float]]:
    """Per ``include`` entry, its checks ``{"count": c, "color": c, "position": c}`` (see module docstring).

    ``color`` and ``position`` appear only for entries that name them; this is
    the per-object verdict behind :func:`score_objects`.
    """
    include = metadata["include"]
    verdicts: list[dict[str, float]] = []
    for entry in include:
        candidates = of_class(objects, entry)
        wanted = int(entry.get("count", 1))
        found = len(candidates)
        checks = {"count": 1.0 if found == wanted else max(0.0, 1.0 - abs(found - wanted) / wanted)}
        if "color" in entry:
            checks["color"] = sum(obj.color == entry["color"] for obj in candidates) / max(found, 1)
        if "position" in entry:
            relation, reference_index = entry["position"]
            holds = any(
                _relation_holds(candidate, reference, relation)
                for candidate in _of_entry(objects, entry)
                for reference in _of_entry(objects, include[reference_index])
            )
            checks["position"] = 1.0 if holds else 0.0
        verdicts.append(checks)
    return verdicts


#: the most ``include`` entries one record may have (the grammar's prompts have at most 2)
MAX_INCLUDE = 16
#: the largest ``count`` an entry may ask for (the grammar's at most 4)
MAX_COUNT = 64


def check_metadata(metadata: Any, index: int) -> None:
    """A :class:`RewardError` saying what is wrong with record ``index``'s metadata (never echoing it): a
    mapping with an ``include`` list of at most :data:`MAX_INCLUDE` entries, each with a known ``class``, a
    ``count`` in [1, :data:`MAX_COUNT`], a palette ``color`` and a ``position`` ``[relation, earlier entry]``."""
    where = f"shapes_verifier: metadata[{index}]"
    include = metadata.get("include") if isinstance(metadata, Mapping) else None
    if not isinstance(include, list) or not 1 <= len(include) <= MAX_INCLUDE:
        raise RewardError(f"{where} needs an 'include' list of 1 to {MAX_INCLUDE} entries")
    for number, entry in enumerate(include):
        place = f"{where}.include[{number}]"
        if not isinstance(entry, Mapping) or entry.get("class") not in SHAPE_CLASSES:
            raise RewardError(f"{place} needs a 'class' in {list(SHAPE_CLASSES)}")
        count = entry.get("count", 1)
        if not isinstance(count, int) or isinstance(count, bool) or not 1 <= count <= MAX_COUNT:
            raise RewardError(f"{place}: 'count' must be an integer in [1, {MAX_COUNT}]")
        if "color" in entry and entry["color"] not in PALETTE:
            raise RewardError(f"{place}: 'color' must be one of {list(PALETTE)}")
        if "position" in entry:
            position = entry["position"]
            if (
                not isinstance(position, list)
                or len(position) != 2
                or position[0] not in RELATIONS
                or not isinstance(position[1], int)
                or isinstance(position[1], bool)
                or not 0 <= position[1] < number
            ):
                raise RewardError(
                    f"{place}: 'position' must be [relation, index of an earlier entry], relation in "
                    f"{list(RELATIONS)}"
                )


def score_objects(objects: Sequence[DetectedObject], metadata: Mapping[str, Any]) -> tuple[float, float]:
    """``(strict, partial)`` scores of detected objects against GenEval-style metadata (see module docstring)."""
    checks = [value for verdict in entry_checks(objects, metadata) for value in verdict.values()]
    strict = 1.0 if all(check == 1.0 for check in checks) else 0.0
    return strict, float(np.mean(checks))


def verify_image(image: np.ndarray, metadata: Mapping[str, Any]) -> tuple[float, float]:
    """``(strict, partial)`` for one ``[H, W, 3]`` image in [0, 1]."""
    return score_objects(detect_objects(image), metadata)


class ShapesVerifier:
    """Reward: GenEval-style verifier of the shapes world.

    Call with images ``[B, 3, H, W]`` in [0, 1], prompts and per-prompt metadata;
    returns ``{"partial": Tensor[B], "strict": Tensor[B]}`` (see module docstring).
    """

    modality = "image"
    #: The sub-score a MultiReward aggregates by default, and all it returns (checked before it is built).
    primary_score = "partial"
    score_keys = ("partial", "strict")

    def __call__(
        self, images: torch.Tensor, prompts: Sequence[str], metadata: Sequence[Mapping[str, Any]]
    ) -> dict[str, torch.Tensor]:
        if images.ndim != 4 or images.shape[1] != 3:
            raise ValueError(f"shapes_verifier expects images [B, 3, H, W], got shape {tuple(images.shape)}")
        if len(metadata) != images.shape[0]:
            raise ValueError(
                f"shapes_verifier got {images.shape[0]} images but {len(metadata)} metadata entries"
            )
        for index, meta in enumerate(metadata):
            check_metadata(meta, index)
        pixels = images.detach().float().cpu().permute(0, 2, 3, 1).numpy()
        scores = [verify_image(image, meta) for image, meta in zip(pixels, metadata)]
        strict, partial = zip(*scores) if scores else ((), ())
        return {
            "partial": torch.tensor(partial, dtype=torch.float32),
            "strict": torch.tensor(strict, dtype=torch.float32),
        }
