"""Scores of generated images: every reward's sub-scores, the total, and the verifier's per-object verdict.

A run's ``rewards`` section is built only from registered (or plugin)
reward names unless the app trusts run code: a dotted path
``package.module:Name`` anywhere in it is code the reward registry would
import and call with the run's settings, and a setting that makes a reward
read a file or connect to an address (``remote``'s ``url``, a checkpoint
path: :func:`rewards.outside_settings`) would let the run choose what the
app reads or whom it sends requests to.

:func:`scores_cards` renders them as HTML, one card per image; each score
carries its exact value in ``data-value`` (the text shows three decimals),
so a browser test can read back precisely what the reward computed.
"""

from __future__ import annotations

import functools
import html
import json
import re
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import torch

from rewards import MultiReward, available_rewards, outside_settings
from rewards.shapes_verifier import DetectedObject, detect_objects, entry_checks, of_class

#: Check values as the verdict shows them.
MARKS = {1.0: "✓", 0.0: "✗"}
#: A dotted path to code, ``package.module:Name``, as the reward registry imports it.
DOTTED_PATH = re.compile(r"[A-Za-z_][\w.]*:[A-Za-z_][\w.]*")


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


def _strings(value: Any) -> Iterator[str]:
    """Every string among ``value``'s nested mappings and lists, mapping values included."""
    if isinstance(value, str):
        yield value
    elif isinstance(value, Mapping):
        for item in value.values():
            yield from _strings(item)
    elif isinstance(value, list):
        for item in value:
            yield from _strings(item)


def _run_code(name: str, spec: Any) -> str | None:
    """The code a ``rewards`` entry names: its reward when that is no registered or plugin reward, or a
    dotted path among its settings (a reward that builds another by name); None when it names none."""
    reward = spec.get("reward", name) if isinstance(spec, Mapping) else name
    if not isinstance(reward, str) or reward not in available_rewards():
        return repr(reward)
    settings = spec.get("settings", {}) if isinstance(spec, Mapping) else {}
    return next((repr(text) for text in _strings(settings) if DOTTED_PATH.fullmatch(text)), None)


def _outside_setting(name: str, spec: Any) -> str | None:
    """The first setting of a registered ``rewards`` entry (or of a reward its settings build by name) that
    makes it read a file or connect to an address; None when it sets none."""
    reward = spec.get("reward", name) if isinstance(spec, Mapping) else name
    settings = spec.get("settings", {}) if isinstance(spec, Mapping) else {}
    if not isinstance(settings, Mapping):
        return None
    try:
        reaching = outside_settings(reward)
    except ValueError:  # it fails to load: building it fails with its own message
        reaching = ()
    found = next((key for key in reaching if settings.get(key) is not None), None)
    if found is not None:
        return f"{reward!r} with setting {found!r}"
    if isinstance(settings.get("reward"), str):  # a reward built by name from these settings
        return _outside_setting(settings["reward"], settings)
    return None


def check_run_code(spec: Any) -> None:
    """``ValueError`` naming the first entry of a run's ``rewards`` section that names code to import, or a
    file or address for a reward to read or connect to."""
    if not isinstance(spec, Mapping):
        raise ValueError(f"The run's config.yaml has rewards {spec!r}; expected a mapping of reward entries.")
    for name, entry in spec.items():
        code = _run_code(name, entry)
        if code is not None:
            raise ValueError(
                f"The run's config.yaml names {code} in reward entry {name!r}: not a registered reward but "
                "code the app would import and run. Start the app with --trust-run-code to allow it (only "
                "for runs you trust)."
            )
        outside = _outside_setting(name, entry)
        if outside is not None:
            raise ValueError(
                f"The run's config.yaml sets reward {outside} in entry {name!r}: a file or address of the run's "
                "choosing that the app would read or send requests to. Start the app with --trust-run-code to "
                "allow it (only for runs you trust)."
            )


def build_reward(spec: Mapping[str, Any], trust_run_code: bool = False) -> MultiReward:
    """The :class:`~rewards.MultiReward` of a run's ``rewards`` section (built once per spec); unless
    ``trust_run_code``, a spec naming code to import is refused (:func:`check_run_code`)."""
    if not trust_run_code:
        check_run_code(spec)
    return _reward(json.dumps(spec, sort_keys=True))


def _entry_name(entry: Mapping[str, Any], include: Sequence[Mapping[str, Any]]) -> str:
    """How the verdict names an ``include`` entry: ``2 red circles``, ``1 circle left of the square``."""
    count = int(entry.get("count", 1))
    words = [str(count), entry.get("color", ""), entry["class"] + ("s" if count != 1 else "")]
    if "position" in entry:
        relation, reference = entry["position"]
        words.append(f"{relation} the {include[reference]['class']}")
    return " ".join(word for word in words if word)


def _mark(value: float) -> str:
    return MARKS.get(value, f"{value:.2f}")


def _check_words(entry: Mapping[str, Any], objects: Sequence[DetectedObject]) -> dict[str, str]:
    """What each check of an entry judged: the count check counts the entry's class in any colour
    (``2 circles``), the colour check how many of those have the colour (``1/2 red``)."""
    found = of_class(objects, entry)
    words = {"count": f"{len(found)} {entry['class']}{'' if len(found) == 1 else 's'}"}
    if "color" in entry:
        words["color"] = f"{sum(obj.color == entry['color'] for obj in found)}/{len(found)} {entry['color']}"
    if "position" in entry:
        words["position"] = "position"
    return words


def verdict(image: torch.Tensor, record: Mapping[str, Any]) -> tuple[list[str], list[str]]:
    """``(per-object verdict lines, detected objects)`` of one ``[3, H, W]`` image, by the shapes verifier:
    ``1 red circle: 2 circles ✗, 1/2 red 0.50`` (asked for; what each check found, and its value)."""
    objects = detect_objects(image.detach().float().cpu().permute(1, 2, 0).numpy())
    include = record["include"]
    lines = []
    for entry, checks in zip(include, entry_checks(objects, record)):
        words = _check_words(entry, objects)
        found = ", ".join(f"{words[check]} {_mark(value)}" for check, value in checks.items())
        lines.append(f"{_entry_name(entry, include)}: {found}")
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
