"""GenEval-style evaluation of a text-to-image model on the shapes world's held-out prompts.

The model is any ``ImageSampler``: ``(prompts, seeds, num_steps,
guidance_scale) -> images [B, 3, H, W] in [0, 1]`` (``partial(generate,
shapes_model)`` or a policy's ``generate``).

Per task, ``images_per_task`` images are drawn from the task's test prompts in
turn, image ``j`` of the whole evaluation with seed ``seed + j``. A task's
accuracy is the mean strict verifier score of its images; ``geneval/overall``
is the mean of the six task accuracies (GenEval's overall score).

Beside the verifier's scores, ``drift/colour_tv`` measures what training
never rewards: how far the images' colour statistics moved from the
pretraining data's. For the same prompts and seeds the renderer draws
ground-truth scenes; the distance is the total variation between the two
sets' per-channel 32-bin intensity histograms, averaged over channels
(0 = the same statistics, 1 = disjoint). A policy that games the verifier
with off-distribution images shows it here first.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch

from flowrl.grid import save_grid
from flowrl.shapes.grammar import TASKS, PromptRecord
from flowrl.shapes.render import render_prompt
from rewards.shapes_verifier import ShapesVerifier

ImageSampler = Callable[[Sequence[str], Sequence[int], int, float], torch.Tensor]
HISTOGRAM_BINS = 32


def colour_histograms(images: torch.Tensor) -> torch.Tensor:
    """``[3, bins]`` normalised per-channel intensity histograms of ``[B, 3, H, W]`` images in [0, 1]."""
    channels = images.float().clamp(0, 1).transpose(0, 1).reshape(3, -1)
    counts = torch.stack([torch.histc(channel, HISTOGRAM_BINS, 0.0, 1.0) for channel in channels])
    return counts / counts.sum(dim=1, keepdim=True)


def colour_drift(images: torch.Tensor, items: Sequence[tuple[PromptRecord, int]]) -> float:
    """Total variation between the colour histograms of ``images`` and of rendered ground truth for the
    same ``(record, seed)`` items, averaged over channels (module docstring)."""
    rendered = np.stack([render_prompt(record, np.random.default_rng(seed)) for record, seed in items])
    truth = torch.from_numpy(rendered).permute(0, 3, 1, 2)
    return float(0.5 * (colour_histograms(images) - colour_histograms(truth)).abs().sum(dim=1).mean())


def evaluation_items(
    records: Sequence[PromptRecord], images_per_task: int, seed: int = 0
) -> list[tuple[PromptRecord, int]]:
    """``(record, seed)`` pairs: per task its prompts round-robin, seeds ``seed, seed + 1, ...`` over all items.

    A task with more prompts than ``images_per_task`` is evaluated on its first
    ``images_per_task`` prompts (in file order); one with fewer repeats them.
    """
    if images_per_task < 1:
        raise ValueError(f"images_per_task must be >= 1, got {images_per_task}")
    items: list[tuple[PromptRecord, int]] = []
    for task in TASKS:
        task_records = [record for record in records if record["tag"] == task]
        if not task_records:
            raise ValueError(f"no evaluation prompt for task {task!r}; every task needs at least one")
        offset = seed + len(items)
        items.extend((task_records[i % len(task_records)], offset + i) for i in range(images_per_task))
    return items


def geneval_scores(tags: Sequence[str], strict: torch.Tensor, partial: torch.Tensor) -> dict[str, float]:
    """``geneval/<task>`` accuracies, ``geneval/overall`` (their mean) and ``partial/overall``."""
    missing = sorted(set(TASKS) - set(tags))
    if missing:
        raise ValueError(f"GenEval's overall score needs every task; no image for {missing}")
    scores: dict[str, float] = {}
    for task in TASKS:
        selected = [i for i, tag in enumerate(tags) if tag == task]
        scores[f"geneval/{task}"] = float(strict[selected].mean())
    scores["geneval/overall"] = float(sum(scores[f"geneval/{task}"] for task in TASKS) / len(TASKS))
    scores["partial/overall"] = float(partial.mean())
    return scores


def evaluate(
    sample_images: ImageSampler,
    records: Sequence[PromptRecord],
    images_per_task: int = 64,
    num_steps: int = 20,
    guidance_scale: float = 1.0,
    seed: int = 0,
) -> tuple[dict[str, Any], torch.Tensor, list[tuple[PromptRecord, int]], dict[str, torch.Tensor]]:
    """``(scores, images, items, rewards)`` of the sampled images on ``records`` (see module docstring)."""
    items = evaluation_items(records, images_per_task, seed)
    images = sample_images(
        [record["prompt"] for record, _ in items], [s for _, s in items], num_steps, guidance_scale
    )
    rewards = ShapesVerifier()(
        images, [record["prompt"] for record, _ in items], [record for record, _ in items]
    )
    scores = geneval_scores([record["tag"] for record, _ in items], rewards["strict"], rewards["partial"])
    scores["drift/colour_tv"] = colour_drift(images, items)
    scores.update(
        {"num_images": len(items), "num_steps": num_steps, "guidance_scale": guidance_scale, "seed": seed}
    )
    return scores, images, items, rewards


def write_evaluation(
    output_dir: str | Path,
    name: str,
    scores: dict[str, Any],
    images: torch.Tensor,
    items: Sequence[tuple[PromptRecord, int]],
    rewards: dict[str, torch.Tensor],
    grid_images_per_task: int = 8,
) -> tuple[Path, Path]:
    """Write ``<name>.json`` and a captioned ``<name>.png`` (the first images of every task); return both paths."""
    output_dir = Path(output_dir)
    output_dir.mkdir(parents=True, exist_ok=True)
    json_path = output_dir / f"{name}.json"
    json_path.write_text(json.dumps(scores, indent=2, sort_keys=True) + "\n")
    per_task = len(items) // len(TASKS)
    shown = [
        task * per_task + i for task in range(len(TASKS)) for i in range(min(grid_images_per_task, per_task))
    ]
    captions = [
        f"{'OK' if rewards['strict'][i] == 1 else 'x'} {rewards['partial'][i]:.2f} {items[i][0]['prompt']}"
        for i in shown
    ]
    grid_path = save_grid(output_dir / f"{name}.png", images[shown], captions, columns=grid_images_per_task)
    return json_path, grid_path
