"""scripts/binding_check.py: the clause shares on rendered scenes, and the swap sensitivity of a model that
cannot see word order (exactly 0) against one that can."""

import sys
from pathlib import Path

import numpy as np
import torch

from flowrl.shapes.render import render_prompt

SCRIPTS = Path(__file__).resolve().parent.parent / "scripts"
sys.path.insert(0, str(SCRIPTS))
from binding_check import clause_shares, swap_sensitivity  # noqa: E402


def colour_attribution(circle: str, square: str) -> dict:
    """The record of "a <circle> circle and a <square> square"."""
    return {
        "prompt": f"a {circle} circle and a {square} square",
        "tag": "color_attr",
        "include": [
            {"class": "circle", "count": 1, "color": circle},
            {"class": "square", "count": 1, "color": square},
        ],
    }


RED_CIRCLE_BLUE_SQUARE = colour_attribution("red", "blue")
BLUE_CIRCLE_RED_SQUARE = colour_attribution("blue", "red")


def renders(record: dict, count: int) -> torch.Tensor:
    rng = np.random.default_rng(0)
    return torch.from_numpy(np.stack([render_prompt(record, rng) for _ in range(count)])).movedim(-1, -3)


def test_right_objects_with_the_binding_right_or_swapped():
    right = clause_shares(renders(RED_CIRCLE_BLUE_SQUARE, 6), [RED_CIRCLE_BLUE_SQUARE] * 6, "color_attr")
    assert right == {"images": 6, "objects_right": 1.0, "clause_right_given_objects": 1.0}
    swapped = clause_shares(renders(BLUE_CIRCLE_RED_SQUARE, 6), [RED_CIRCLE_BLUE_SQUARE] * 6, "color_attr")
    assert swapped == {"images": 6, "objects_right": 1.0, "clause_right_given_objects": 0.0}


def test_a_model_blind_to_word_order_has_zero_swap_sensitivity(tiny_model):
    seeing = swap_sensitivity(tiny_model, samples=4)
    assert all(ratio > 1e-3 for levels in seeing.values() for ratio in levels.values())
    with torch.no_grad():
        tiny_model.text_encoder.position_embedding.zero_()
    blind = swap_sensitivity(tiny_model, samples=4)
    assert all(ratio < 1e-5 for levels in blind.values() for ratio in levels.values())
