"""The moving-shapes prompt grammar: object identity, colour, motion direction, speed and appearance.

Every prompt is a record ``{"prompt": str, "tag": task, "include": [...]}``
whose ``include`` entries extend the shapes world's GenEval-style metadata
with motion: ``class`` and ``count`` (always 1), optionally ``color``,
``motion`` (a direction), ``speed`` (a speed word) and ``appears: true``.

Tasks and phrases (each phrase also appears as "a video of <phrase>"):
  motion        "a circle moving left"
  color_motion  "a red circle moving left"
  speed         "a circle moving left quickly"                (slowly, quickly)
  two_motion    "a circle moving left and a square moving up"
  appear        "a circle moving left then a red square appears"

An object whose speed is not named moves at a random one of the two speeds;
an object that appears stays where it appears.
"""

from __future__ import annotations

import itertools
from pathlib import Path
from typing import Any

from flowrl.shapes.grammar import COLORS, PhraseGrammar
from rewards.world_spec import DIRECTIONS, SHAPE_CLASSES, SPEED_PIXELS

TASKS: tuple[str, ...] = ("motion", "color_motion", "speed", "two_motion", "appear")
SPEEDS: tuple[str, ...] = tuple(SPEED_PIXELS)
TEMPLATES: tuple[str, ...] = ("{}", "a video of {}")

#: the shipped train/test split (``grammar.split_prompts()``: seed 0, 25% of each task's phrases held out)
PROMPT_DIR = Path(__file__).parent / "prompts"


def _mover(shape: str, direction: str, **extra: Any) -> dict[str, Any]:
    return {"class": shape, "count": 1, "motion": direction, **extra}


def task_phrases(task: str) -> list[tuple[str, list[dict[str, Any]]]]:
    """Every ``(phrase, include)`` pair of a task, in a fixed order."""
    if task == "motion":
        return [
            (f"a {shape} moving {direction}", [_mover(shape, direction)])
            for shape in SHAPE_CLASSES
            for direction in DIRECTIONS
        ]
    if task == "color_motion":
        return [
            (f"a {color} {shape} moving {direction}", [_mover(shape, direction, color=color)])
            for shape in SHAPE_CLASSES
            for color in COLORS
            for direction in DIRECTIONS
        ]
    if task == "speed":
        return [
            (f"a {shape} moving {direction} {speed}", [_mover(shape, direction, speed=speed)])
            for shape in SHAPE_CLASSES
            for direction in DIRECTIONS
            for speed in SPEEDS
        ]
    if task == "two_motion":
        return [
            (
                f"a {first} moving {first_direction} and a {second} moving {second_direction}",
                [_mover(first, first_direction), _mover(second, second_direction)],
            )
            for first, second in itertools.permutations(SHAPE_CLASSES, 2)
            for first_direction, second_direction in itertools.product(DIRECTIONS, repeat=2)
        ]
    if task == "appear":
        return [
            (
                f"a {mover} moving {direction} then a {color} {newcomer} appears",
                [_mover(mover, direction), {"class": newcomer, "count": 1, "color": color, "appears": True}],
            )
            for mover, newcomer in itertools.permutations(SHAPE_CLASSES, 2)
            for direction in DIRECTIONS
            for color in COLORS
        ]
    raise ValueError(f"unknown task {task!r}; allowed: {TASKS}")


GRAMMAR = PhraseGrammar(TASKS, task_phrases, TEMPLATES, PROMPT_DIR)
all_prompts = GRAMMAR.all_prompts
vocabulary = GRAMMAR.vocabulary
split_prompts = GRAMMAR.split_prompts
shipped_prompts = GRAMMAR.shipped_prompts
sample_prompt = GRAMMAR.sample_prompt


def main() -> None:
    """Write the shipped split: ``python -m flowrl.video_shapes.grammar``."""
    train, test = GRAMMAR.write_split()
    print(f"wrote {train} train and {test} test prompts to {PROMPT_DIR}")


if __name__ == "__main__":
    main()
