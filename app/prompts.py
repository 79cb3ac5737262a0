"""Prompts for the app: free text checked against the model's vocabulary and the shapes grammar, held-out lists.

The verifier judges an image against GenEval-style metadata, which only a
sentence of the shapes grammar has, so free text is accepted when it is one
of the grammar's sentences (case and spacing aside) and refused otherwise
with a message that says what is wrong: an empty prompt, words the model
does not know, or known words in a sentence the grammar does not make.
"""

from __future__ import annotations

import functools

from flowrl.models import ShapesDiT
from flowrl.shapes.grammar import TASKS, PromptRecord, all_prompts, shipped_prompts

#: Examples of the grammar's sentences, one per task, for error messages.
EXAMPLES = (
    "a circle",
    "a circle and a square",
    "three circles",
    "a red circle",
    "a circle left of a square",
    "a red circle and a blue square",
)


def normalise(prompt: str) -> str:
    """Lower case, single spaces, no surrounding blanks (how the tokenizer reads a prompt)."""
    return " ".join(prompt.lower().split())


@functools.cache
def _grammar() -> dict[str, PromptRecord]:
    return {record["prompt"]: record for record in all_prompts()}


@functools.cache
def held_out_prompts() -> dict[str, list[str]]:
    """The shipped held-out (test) prompts, grouped by task in :data:`TASKS` order."""
    records = shipped_prompts("test")
    return {task: [record["prompt"] for record in records if record["tag"] == task] for task in TASKS}


#: the longest prompt the app reads (the grammar's longest is under 80 characters)
MAX_PROMPT_CHARS = 300


def parse_prompt(prompt: str, models: tuple[ShapesDiT, ...] = ()) -> PromptRecord:
    """The grammar's record (``prompt``, ``tag``, ``include``) of a free-text prompt; ``ValueError`` if none.

    Words are checked against the vocabulary of every model in ``models``
    (those that will generate from the prompt) before the grammar.
    """
    if not isinstance(prompt, str):
        raise ValueError("The prompt must be text.")
    if len(prompt) > MAX_PROMPT_CHARS:
        raise ValueError(
            f"The prompt is {len(prompt):,} characters; the shapes grammar's are far shorter (at most "
            f"{MAX_PROMPT_CHARS})."
        )
    text = normalise(prompt)
    if not text:
        raise ValueError("Enter a prompt, or pick one of the held-out prompts.")
    for model in models:
        unknown = model.tokenizer.unknown_words(text)
        if unknown:
            raise ValueError(
                f"The model does not know the word(s) {', '.join(repr(w) for w in unknown)}. "
                f"Its vocabulary: {', '.join(model.tokenizer.vocabulary)}."
            )
    record = _grammar().get(text)
    if record is None:
        raise ValueError(
            f"{prompt.strip()!r} is not a sentence of the shapes grammar, so the verifier cannot judge it. "
            f"Sentences look like {', '.join(repr(e) for e in EXAMPLES)}, optionally after 'a photo of'."
        )
    return record
