"""The shapes-world prompt grammar, covering GenEval's six tasks.

Every prompt is a record ``{"prompt": str, "tag": task, "include": [...]}`` whose
``include`` list follows GenEval's metadata format (``class``, ``count``, and
optionally ``color`` and ``position: [relation, index of the reference entry]``).

Tasks and phrases (each phrase also appears as "a photo of <phrase>"):
  single_object  "a circle"
  two_object     "a circle and a square"
  counting       "three circles"                  (counts 1-4)
  colors         "a red circle"
  position       "a circle left of a square"      (left of, right of, above, below)
  color_attr     "a red circle and a blue square"
"""

from __future__ import annotations

import itertools
import json
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from rewards.world_spec import PALETTE, RELATIONS, SHAPE_CLASSES

TASKS: tuple[str, ...] = ("single_object", "two_object", "counting", "colors", "position", "color_attr")
COLORS: tuple[str, ...] = tuple(PALETTE)
NUMBER_WORDS: dict[int, str] = {1: "one", 2: "two", 3: "three", 4: "four"}
TEMPLATES: tuple[str, ...] = ("{}", "a photo of {}")

#: Seed of the shipped train/test split (``flowrl/shapes/prompts/*.jsonl``).
SPLIT_SEED = 0
TEST_FRACTION = 0.25
PROMPT_DIR = Path(__file__).parent / "prompts"

PromptRecord = dict[str, Any]


def _plural(shape: str) -> str:
    return shape + "s"


def task_phrases(task: str) -> list[tuple[str, list[dict[str, Any]]]]:
    """Every ``(phrase, include)`` pair of a task, in a fixed order."""
    if task == "single_object":
        return [(f"a {shape}", [{"class": shape, "count": 1}]) for shape in SHAPE_CLASSES]
    if task == "two_object":
        return [
            (f"a {first} and a {second}", [{"class": first, "count": 1}, {"class": second, "count": 1}])
            for first, second in itertools.permutations(SHAPE_CLASSES, 2)
        ]
    if task == "counting":
        return [
            (
                f"{NUMBER_WORDS[count]} {shape if count == 1 else _plural(shape)}",
                [{"class": shape, "count": count}],
            )
            for shape in SHAPE_CLASSES
            for count in NUMBER_WORDS
        ]
    if task == "colors":
        return [
            (f"a {color} {shape}", [{"class": shape, "count": 1, "color": color}])
            for shape in SHAPE_CLASSES
            for color in COLORS
        ]
    if task == "position":
        # GenEval's layout: the reference object is entry 0, the placed object entry 1.
        return [
            (
                f"a {placed} {relation} a {reference}",
                [{"class": reference, "count": 1}, {"class": placed, "count": 1, "position": [relation, 0]}],
            )
            for placed, reference in itertools.permutations(SHAPE_CLASSES, 2)
            for relation in RELATIONS
        ]
    if task == "color_attr":
        return [
            (
                f"a {first_color} {first} and a {second_color} {second}",
                [
                    {"class": first, "count": 1, "color": first_color},
                    {"class": second, "count": 1, "color": second_color},
                ],
            )
            for first, second in itertools.permutations(SHAPE_CLASSES, 2)
            for first_color, second_color in itertools.permutations(COLORS, 2)
        ]
    raise ValueError(f"unknown task {task!r}; allowed: {TASKS}")


@dataclass(frozen=True)
class PhraseGrammar:
    """A world's prompt grammar: tasks, each a fixed list of ``(phrase, include)`` pairs, each phrase said
    under every template; its shipped train/test split lives in ``prompt_dir``."""

    tasks: tuple[str, ...]
    task_phrases: Callable[[str], list[tuple[str, list[dict[str, Any]]]]]
    templates: tuple[str, ...]
    prompt_dir: Path

    def task_prompts(self, task: str) -> list[PromptRecord]:
        """Every prompt record of a task: each phrase under each template."""
        return [
            {"prompt": template.format(phrase), "tag": task, "include": include}
            for phrase, include in self.task_phrases(task)
            for template in self.templates
        ]

    def all_prompts(self) -> list[PromptRecord]:
        """Every prompt of the grammar, task by task."""
        return [record for task in self.tasks for record in self.task_prompts(task)]

    def vocabulary(self) -> list[str]:
        """Every word the grammar can produce, sorted."""
        return sorted({word for record in self.all_prompts() for word in record["prompt"].split()})

    def split_prompts(
        self, seed: int = SPLIT_SEED, test_fraction: float = TEST_FRACTION
    ) -> tuple[list[PromptRecord], list[PromptRecord]]:
        """Disjoint ``(train, test)`` prompt lists, split by phrase.

        Per task, a seeded shuffle of the phrases puts ``test_fraction`` of them
        (at least one, never all) in the test set; every template of a phrase goes
        to the same side, so no test phrase is seen in training under another wording.
        """
        rng = np.random.default_rng(seed)
        train: list[PromptRecord] = []
        test: list[PromptRecord] = []
        for task in self.tasks:
            phrases = self.task_phrases(task)
            order = rng.permutation(len(phrases))
            n_test = min(len(phrases) - 1, max(1, round(test_fraction * len(phrases))))
            held_out = set(order[:n_test].tolist())
            for index, (phrase, include) in enumerate(phrases):
                side = test if index in held_out else train
                side.extend(
                    {"prompt": template.format(phrase), "tag": task, "include": include}
                    for template in self.templates
                )
        return train, test

    def shipped_prompts(self, split: str) -> list[PromptRecord]:
        """The shipped ``train`` or ``test`` prompts."""
        if split not in ("train", "test"):
            raise ValueError(f"unknown prompt split {split!r}; allowed: 'train', 'test'")
        return load_prompts(self.prompt_dir / f"{split}.jsonl")

    def sample_prompt(self, rng: np.random.Generator) -> PromptRecord:
        """A random prompt of the whole grammar: task uniform, then phrase and template uniform."""
        task = self.tasks[rng.integers(len(self.tasks))]
        phrases = self.task_phrases(task)
        phrase, include = phrases[rng.integers(len(phrases))]
        template = self.templates[rng.integers(len(self.templates))]
        return {"prompt": template.format(phrase), "tag": task, "include": include}

    def write_split(self) -> tuple[int, int]:
        """Write :meth:`split_prompts` as the shipped ``train.jsonl`` and ``test.jsonl``; return their sizes."""
        train, test = self.split_prompts()
        write_prompts(self.prompt_dir / "train.jsonl", train)
        write_prompts(self.prompt_dir / "test.jsonl", test)
        return len(train), len(test)


def write_prompts(path: Path, records: Iterable[PromptRecord]) -> None:
    """Write prompt records as JSON lines."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "w", encoding="utf-8") as handle:
        for record in records:
            handle.write(json.dumps(record, sort_keys=True) + "\n")


def load_prompts(path: str | Path) -> list[PromptRecord]:
    """Read prompt records from a JSON-lines file; each needs ``prompt``, ``tag`` and ``include``."""
    records = []
    with open(path, encoding="utf-8") as handle:
        for line_number, line in enumerate(handle, start=1):
            if not line.strip():
                continue
            record = json.loads(line)
            missing = {"prompt", "tag", "include"} - set(record)
            if missing:
                raise ValueError(f"{path}:{line_number}: prompt record lacks {sorted(missing)}")
            records.append(record)
    return records


GRAMMAR = PhraseGrammar(TASKS, task_phrases, TEMPLATES, PROMPT_DIR)
task_prompts = GRAMMAR.task_prompts
all_prompts = GRAMMAR.all_prompts
vocabulary = GRAMMAR.vocabulary
split_prompts = GRAMMAR.split_prompts
shipped_prompts = GRAMMAR.shipped_prompts
sample_prompt = GRAMMAR.sample_prompt
