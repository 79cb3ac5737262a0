"""The shapes world: prompt grammar, scene renderer and word tokenizer (the verifier lives in ``rewards``)."""

from flowrl.shapes.grammar import (
    TASKS,
    load_prompts,
    sample_prompt,
    shipped_prompts,
    split_prompts,
    vocabulary,
)
from flowrl.shapes.render import draw_scene, render_prompt, sample_layout
from flowrl.shapes.tokenizer import ShapesTokenizer

__all__ = [
    "TASKS",
    "ShapesTokenizer",
    "draw_scene",
    "load_prompts",
    "render_prompt",
    "sample_layout",
    "sample_prompt",
    "shipped_prompts",
    "split_prompts",
    "vocabulary",
]
