"""The procedurally rendered worlds with exact verifiers: shapes images, moving-shapes videos, and their
image-to-video variant (the renderer draws frame 0, the model continues it).

A world names its tasks, its shipped train/test prompts, a renderer of
ground-truth media for a prompt record (the pretraining data, and the
reference of the evaluation's drift measure), its verifier reward, and the
key prefix of its held-out scores (``geneval/<task>`` for images, the
GenEval protocol; ``videoeval/<task>`` for clips, ``i2veval/<task>`` for
continued clips).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

from flowrl.shapes import grammar as shapes_grammar
from flowrl.shapes.render import render_prompt
from flowrl.video_shapes import first_frame
from flowrl.video_shapes import grammar as video_grammar
from flowrl.video_shapes.render import render_clip
from rewards.shapes_verifier import ShapesVerifier
from rewards.video_shapes_verifier import VideoShapesVerifier

PromptRecord = dict[str, Any]


@dataclass(frozen=True)
class World:
    """A world's prompts, ground-truth renderer, verifier and score names (module docstring)."""

    name: str
    tasks: tuple[str, ...]
    #: ``split ("train" | "test") -> prompt records``
    prompts: Callable[[str], list[PromptRecord]]
    #: ``(record, rng, sample_shape) -> ground truth [H, W, 3]`` (images) or ``[T, H, W, 3]`` (clips) in
    #: [0, 1], of the frame count and size of a model sample's ``(3, H, W)`` or ``(T, 3, H, W)``
    render: Callable[[PromptRecord, np.random.Generator, tuple[int, ...]], np.ndarray]
    verifier: Callable[[], Any]
    score_prefix: str
    #: ``data.prompts`` value naming the shipped training prompts
    train_prompts_name: str
    is_video: bool
    #: the model is given each clip's first frame (:mod:`flowrl.video_shapes.first_frame`)
    continues_first_frame: bool = False

    def score_key(self, task: str) -> str:
        """The held-out score key of a task (or ``overall``)."""
        return f"{self.score_prefix}/{task}"


WORLDS: dict[str, World] = {
    "shapes": World(
        name="shapes",
        tasks=shapes_grammar.TASKS,
        prompts=shapes_grammar.shipped_prompts,
        render=lambda record, rng, shape: render_prompt(record, rng, shape[-1]),
        verifier=ShapesVerifier,
        score_prefix="geneval",
        train_prompts_name="shapes-train",
        is_video=False,
    ),
    "video_shapes": World(
        name="video_shapes",
        tasks=video_grammar.TASKS,
        prompts=video_grammar.shipped_prompts,
        render=lambda record, rng, shape: render_clip(record, rng, shape[0], shape[-1]),
        verifier=VideoShapesVerifier,
        score_prefix="videoeval",
        train_prompts_name="video-shapes-train",
        is_video=True,
    ),
    "video_shapes_i2v": World(
        name="video_shapes_i2v",
        tasks=video_grammar.TASKS,
        prompts=first_frame.shipped_prompts,
        render=lambda record, rng, shape: first_frame.continued_clip(record, shape[0], shape[-1]),
        verifier=VideoShapesVerifier,
        score_prefix="i2veval",
        train_prompts_name="video-shapes-i2v-train",
        is_video=True,
        continues_first_frame=True,
    ),
}

#: ``data.prompts`` names of the shipped training prompts
SHIPPED_TRAIN_PROMPTS: dict[str, World] = {world.train_prompts_name: world for world in WORLDS.values()}


def world_of_model(is_video: bool, image_conditioned: bool = False) -> World:
    """The world a shapes model draws: images, clips, or clips continued from a given first frame."""
    if image_conditioned:
        return WORLDS["video_shapes_i2v"]
    return WORLDS["video_shapes" if is_video else "shapes"]


def get_world(name: str) -> World:
    """The world called ``name``; an unknown name is an error listing the allowed ones."""
    if name not in WORLDS:
        raise ValueError(f"unknown world {name!r}; allowed: {sorted(WORLDS)}")
    return WORLDS[name]
