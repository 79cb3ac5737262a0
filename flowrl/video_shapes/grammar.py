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

import numpy as np

from flowrl.shapes.grammar import COLORS, PromptRecord, load_prompts, write_prompts
from rewards.shapes_verifier import SHAPE_CLASSES
from rewards.video_shapes_verifier import DIRECTIONS, SPEED_PIXELS

TASKS: tuple[str, ...] = ("motion", "color_motion", "speed", "two_motion", "appear")
SPEEDS: tuple[str, ...] = tuple(SPEED_PIXELS)
TEMPLATES: tuple[str, ...] = ("{}", "a video of {}")

#: Seed of the shipped train/test split (``flowrl/video_shapes/prompts/*.jsonl``).
SPLIT_SEED = 0
TEST_FRACTION = 0.25
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


def _record(template: str, phrase: str, task: str, include: list[dict[str, Any]]) -> PromptRecord:
    return {"prompt": template.format(phrase), "tag": task, "include": include}


def all_prompts() -> list[PromptRecord]:
    """Every prompt of the grammar, task by task."""
    return [
        _record(template, phrase, task, include)
        for task in TASKS
        for phrase, include in task_phrases(task)
        for template in TEMPLATES
    ]


def vocabulary() -> list[str]:
    """Every word the grammar can produce, sorted."""
    return sorted({word for record in all_prompts() for word in record["prompt"].split()})


def split_prompts(
    seed: int = SPLIT_SEED, test_fraction: float = TEST_FRACTION
) -> tuple[list[PromptRecord], list[PromptRecord]]:
    """Disjoint ``(train, test)`` prompt lists, split by phrase within each task (every template of a
    phrase on the same side; at least one test phrase per task, never all)."""
    rng = np.random.default_rng(seed)
    train: list[PromptRecord] = []
    test: list[PromptRecord] = []
    for task in TASKS:
        phrases = task_phrases(task)
        order = rng.permutation(len(phrases))
        held_out = set(order[: min(len(phrases) - 1, max(1, round(test_fraction * len(phrases))))].tolist())
        for index, (phrase, include) in enumerate(phrases):
            side = test if index in held_out else train
            side.extend(_record(template, phrase, task, include) for template in TEMPLATES)
    return train, test


def shipped_prompts(split: str) -> list[PromptRecord]:
    """The shipped ``train`` or ``test`` prompts."""
    if split not in ("train", "test"):
        raise ValueError(f"unknown prompt split {split!r}; allowed: 'train', 'test'")
    return load_prompts(PROMPT_DIR / f"{split}.jsonl")


def sample_prompt(rng: np.random.Generator) -> PromptRecord:
    """A random prompt of the whole grammar: task uniform, then phrase and template uniform."""
    task = TASKS[rng.integers(len(TASKS))]
    phrases = task_phrases(task)
    phrase, include = phrases[rng.integers(len(phrases))]
    return _record(TEMPLATES[rng.integers(len(TEMPLATES))], phrase, task, include)


def main() -> None:
    """Write the shipped split: ``python -m flowrl.video_shapes.grammar``."""
    train, test = split_prompts()
    write_prompts(PROMPT_DIR / "train.jsonl", train)
    write_prompts(PROMPT_DIR / "test.jsonl", test)
    print(f"wrote {len(train)} train and {len(test)} test prompts to {PROMPT_DIR}")


if __name__ == "__main__":
    main()
