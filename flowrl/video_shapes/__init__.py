"""The moving-shapes video world: prompt grammar and clip renderer (the verifier lives in ``rewards``)."""

from flowrl.video_shapes.grammar import TASKS, sample_prompt, shipped_prompts, split_prompts, vocabulary
from flowrl.video_shapes.render import (
    NUM_FRAMES,
    MovingObject,
    appear_frame,
    draw_clip,
    render_clip,
    sample_motion_layout,
)

__all__ = [
    "NUM_FRAMES",
    "TASKS",
    "MovingObject",
    "appear_frame",
    "draw_clip",
    "render_clip",
    "sample_motion_layout",
    "sample_prompt",
    "shipped_prompts",
    "split_prompts",
    "vocabulary",
]
