"""Scores of generated images: every reward's sub-scores, the total, and the verifier's per-object verdict.

:func:`scores_cards` renders them as HTML, one card per image; each score
carries its exact value in ``data-value`` (the text shows three decimals),
so a browser test can read back precisely what the reward computed.
"""

from __future__ import annotations

import functools
import html
import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import torch

from rewards import MultiReward
from rewards.shapes_verifier import detect_objects, entry_checks

#: Check values as the verdict shows them.
MARKS = {1.0: "✓", 0.0: "✗"}


@dataclass
class ImageScores:
    """What the app shows under one image."""

    seed: int
    scores: dict[str, float]  #: every sub-score, labelled as :class:`~rewards.MultiReward` labels them
    total: float  #: the weighted sum the run optimises
    verdict: list[str]  #: one line per object the prompt asks for
    detected: list[str]  #: every object the verifier read off the image


@functools.lru_cache(maxsize=8)
def _reward(spec_json: str) -> MultiReward:
    return MultiReward(json.loads(spec_json))


def build_reward(spec: Mapping[str, Any]) -> MultiReward:
    """The :class:`~rewards.MultiReward` of a run's ``rewards`` section (built once per spec)."""
    return _reward(json.dumps(spec, sort_keys=True))


def _entry_name(entry: Mapping[str, Any], include: Sequence[Mapping[str, Any]]) -> str:
    """How the verdict names an ``include`` entry: ``2 red circles``, ``1 circle left of the square``."""
    count = int(entry.get("count", 1))
    words = [str(count), entry.get("color", ""), entry["class"] + ("s" if count > 1 else "")]
    if "position" in entry:
        relation, reference = entry["position"]
        words.append(f"{relation} the {include[reference]['class']}")
    return " ".join(word for word in words if word)


def _mark(value: float) -> str:
    return MARKS.get(value, f"{value:.2f}")


def verdict(image: torch.Tensor, record: Mapping[str, Any]) -> tuple[list[str], list[str]]:
    """``(per-object verdict lines, detected objects)`` of one ``[3, H, W]`` image, by the shapes verifier."""
    objects = detect_objects(image.detach().float().cpu().permute(1, 2, 0).numpy())
    include = record["include"]
    lines = [
        f"{_entry_name(entry, include)}: "
        + " ".join(f"{check} {_mark(value)}" for check, value in checks.items())
        for entry, checks in zip(include, entry_checks(objects, record))
    ]
    return lines, [f"{obj.color} {obj.shape} ({obj.center_x:.0f}, {obj.center_y:.0f})" for obj in objects]


def score_images(
    reward: MultiReward, images: torch.Tensor, record: Mapping[str, Any], seeds: Sequence[int]
) -> list[ImageScores]:
    """The scores of images generated for one prompt record, one :class:`ImageScores` per image."""
    prompts, metadata = [record["prompt"]] * len(seeds), [record] * len(seeds)
    scores = reward(images, prompts, metadata)
    totals = reward.total(scores)
    rows = []
    for index, seed in enumerate(seeds):
        lines, detected = verdict(images[index], record)
        rows.append(
            ImageScores(
                int(seed),
                {label: float(values[index]) for label, values in scores.items()},
                float(totals[index]),
                lines,
                detected,
            )
        )
    return rows


#: Style of the score cards (``gr.HTML(css_template=...)``): one column per image, as in the gallery above.
CARDS_CSS = """
.flowrl-scores { display: grid; grid-template-columns: repeat(4, minmax(0, 1fr)); gap: 8px; font-size: 12px; }
.flowrl-scores .card { border: 1px solid var(--border-color-primary); border-radius: 6px; padding: 6px; }
.flowrl-scores .head { font-size: 13px; margin-bottom: 4px; }
.flowrl-scores .name { color: var(--body-text-color-subdued); overflow-wrap: anywhere; }
.flowrl-scores ul { margin: 4px 0; padding-left: 14px; }
.flowrl-scores .found { color: var(--body-text-color-subdued); font-size: 11px; }
"""


def _score(label: str, value: float) -> str:
    return f'<span class="score" data-label="{html.escape(label)}" data-value="{value!r}">{value:.3f}</span>'


def _by_reward(scores: Mapping[str, float]) -> dict[str, list[tuple[str, str]]]:
    """Score labels grouped by reward: ``{"shapes_verifier": [("partial", "shapes_verifier/partial"), ...]}``."""
    groups: dict[str, list[tuple[str, str]]] = {}
    for label in scores:
        reward, _, key = label.partition("/")
        groups.setdefault(reward, []).append((key or "score", label))
    return groups


def scores_cards(side: str, rows: Sequence[ImageScores]) -> str:
    """HTML cards of one side's scores (``data-side``), one per image in gallery order (``data-image``)."""
    cards = []
    for index, row in enumerate(rows, start=1):
        scores = "".join(
            f'<div><span class="name">{html.escape(reward)}</span><br>'
            + " ".join(f"{html.escape(key)} {_score(label, row.scores[label])}" for key, label in keys)
            + "</div>"
            for reward, keys in _by_reward(row.scores).items()
        )
        checks = "".join(f"<li>{html.escape(line)}</li>" for line in row.verdict)
        found = html.escape(", ".join(row.detected) or "nothing")
        cards.append(
            f'<div class="card" data-image="{index}"><div class="head">seed {row.seed}: reward '
            f"<b>{_score('reward', row.total)}</b></div>{scores}"
            f'<ul class="verdict">{checks}</ul><div class="found">found: {found}</div></div>'
        )
    return f'<div class="flowrl-scores" data-side="{html.escape(side)}">{"".join(cards)}</div>'
