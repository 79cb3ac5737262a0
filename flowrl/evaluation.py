"""GenEval-style evaluation of a generator on a world's held-out prompts (:mod:`flowrl.worlds`).

The model is any ``ImageSampler``: ``(prompts, seeds, num_steps,
guidance_scale) -> media in [0, 1]``, images ``[B, 3, H, W]`` for the shapes
world and clips ``[B, T, 3, H, W]`` for the video world (``partial(generate,
shapes_model)`` or a policy's ``generate``); for the image-to-video world it is
also given the prompt records (``records=``), whose first frames it continues.

Per task, ``images_per_task`` samples are drawn from the task's test prompts
in turn, sample ``j`` of the whole evaluation with seed ``seed + j``. A task's
accuracy is the mean strict verifier score of its samples; ``<prefix>/overall``
is the mean of the task accuracies (GenEval's overall score; the prefix is
``geneval`` for images and ``videoeval`` for clips).

Beside the verifier's scores, ``drift/colour_tv`` measures what training
never rewards: how far the samples' colour statistics moved from the
pretraining data's. For the same prompts and seeds the renderer draws
ground truth; the distance is the total variation between the two sets'
per-channel 32-bin intensity histograms over all pixels (of all frames),
averaged over channels (0 = the same statistics, 1 = disjoint). A policy that
games the verifier with off-distribution samples shows it here first.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import torch
from tqdm.auto import tqdm

from flowrl.grid import save_grid
from flowrl.worlds import WORLDS, PromptRecord, World, get_world, world_of_model

if TYPE_CHECKING:
    from flowrl.policy import Policy
    from flowrl.train_config import TrainConfig

ImageSampler = Callable[[Sequence[str], Sequence[int], int, float], torch.Tensor]
HISTOGRAM_BINS = 32
#: samples drawn per call of the sampler during evaluation (one progress-bar tick; a multiple of every
#: backend's generate batch, so evaluation batches exactly as before)
EVAL_BATCH = 128


def colour_histograms(media: torch.Tensor) -> torch.Tensor:
    """``[3, bins]`` normalised per-channel intensity histograms of media ``[..., 3, H, W]`` in [0, 1]."""
    channels = media.float().clamp(0, 1).movedim(-3, 0).reshape(3, -1)
    counts = torch.stack([torch.histc(channel, HISTOGRAM_BINS, 0.0, 1.0) for channel in channels])
    return counts / counts.sum(dim=1, keepdim=True)


def colour_drift(
    media: torch.Tensor, items: Sequence[tuple[PromptRecord, int]], world: World = WORLDS["shapes"]
) -> float:
    """Total variation between the colour histograms of ``media`` and of the world's rendered ground truth
    for the same ``(record, seed)`` items, averaged over channels (module docstring)."""
    shape = tuple(media.shape[1:])
    rendered = np.stack([world.render(record, np.random.default_rng(seed), shape) for record, seed in items])
    truth = torch.from_numpy(rendered).movedim(-1, -3)
    return float(0.5 * (colour_histograms(media) - colour_histograms(truth)).abs().sum(dim=1).mean())


def evaluation_items(
    records: Sequence[PromptRecord],
    images_per_task: int,
    seed: int = 0,
    tasks: Sequence[str] = WORLDS["shapes"].tasks,
) -> list[tuple[PromptRecord, int]]:
    """``(record, seed)`` pairs: per task its prompts round-robin, seeds ``seed, seed + 1, ...`` over all items.

    A task with more prompts than ``images_per_task`` is evaluated on its first
    ``images_per_task`` prompts (in file order); one with fewer repeats them.
    """
    if images_per_task < 1:
        raise ValueError(f"images_per_task must be >= 1, got {images_per_task}")
    items: list[tuple[PromptRecord, int]] = []
    for task in tasks:
        task_records = [record for record in records if record["tag"] == task]
        if not task_records:
            raise ValueError(f"no evaluation prompt for task {task!r}; every task needs at least one")
        offset = seed + len(items)
        items.extend((task_records[i % len(task_records)], offset + i) for i in range(images_per_task))
    return items


def geneval_scores(
    tags: Sequence[str], strict: torch.Tensor, partial: torch.Tensor, world: World = WORLDS["shapes"]
) -> dict[str, float]:
    """``<prefix>/<task>`` accuracies, ``<prefix>/overall`` (their mean) and ``partial/overall``."""
    missing = sorted(set(world.tasks) - set(tags))
    if missing:
        raise ValueError(f"the overall score needs every task; no sample for {missing}")
    scores: dict[str, float] = {}
    for task in world.tasks:
        selected = [i for i, tag in enumerate(tags) if tag == task]
        scores[world.score_key(task)] = float(strict[selected].mean())
    scores[world.score_key("overall")] = float(
        sum(scores[world.score_key(task)] for task in world.tasks) / len(world.tasks)
    )
    scores["partial/overall"] = float(partial.mean())
    return scores


def evaluate(
    sample_images: ImageSampler,
    records: Sequence[PromptRecord],
    images_per_task: int = 64,
    num_steps: int = 20,
    guidance_scale: float = 1.0,
    seed: int = 0,
    world: World = WORLDS["shapes"],
    progress: str | None = None,
) -> tuple[dict[str, Any], torch.Tensor, list[tuple[PromptRecord, int]], dict[str, torch.Tensor]]:
    """``(scores, media, items, rewards)`` of the sampled media on ``records`` of ``world`` (module docstring).

    Samples are drawn :data:`EVAL_BATCH` at a time (each from its own seed, so the batching changes
    nothing), behind a progress bar labelled ``progress`` when one is given.
    """
    items = evaluation_items(records, images_per_task, seed, world.tasks)

    def sampled(batch: Sequence[tuple[PromptRecord, int]]) -> torch.Tensor:
        frames = {"records": [r for r, _ in batch]} if world.continues_first_frame else {}
        return sample_images(
            [r["prompt"] for r, _ in batch], [s for _, s in batch], num_steps, guidance_scale, **frames
        )

    batches = range(0, len(items), EVAL_BATCH)
    images = torch.cat(
        [
            sampled(items[begin : begin + EVAL_BATCH])
            for begin in tqdm(batches, desc=progress, unit="batch", disable=progress is None, leave=False)
        ]
    )
    expected = 5 if world.is_video else 4
    if images.ndim != expected:
        raise ValueError(
            f"the {world.name} world evaluates {'clips [B, T, 3, H, W]' if world.is_video else 'images [B, 3, H, W]'}; "
            f"the model made samples of shape {tuple(images.shape)}"
        )
    rewards = world.verifier()(
        images, [record["prompt"] for record, _ in items], [record for record, _ in items]
    )
    scores = geneval_scores(
        [record["tag"] for record, _ in items], rewards["strict"], rewards["partial"], world
    )
    scores["drift/colour_tv"] = colour_drift(images, items, world)
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
    world: World = WORLDS["shapes"],
) -> tuple[Path, Path]:
    """Write ``<name>.json`` and a captioned grid of the first samples of every task (``<name>.png``, or
    an animated ``<name>.gif`` for clips); return both paths."""
    output_dir = Path(output_dir)
    output_dir.mkdir(parents=True, exist_ok=True)
    json_path = output_dir / f"{name}.json"
    json_path.write_text(json.dumps(scores, indent=2, sort_keys=True) + "\n")
    per_task = len(items) // len(world.tasks)
    shown = [
        task * per_task + i
        for task in range(len(world.tasks))
        for i in range(min(grid_images_per_task, per_task))
    ]
    captions = [
        f"{'OK' if rewards['strict'][i] == 1 else 'x'} {rewards['partial'][i]:.2f} {items[i][0]['prompt']}"
        for i in shown
    ]
    grid_path = save_grid(output_dir / f"{name}.png", images[shown], captions, columns=grid_images_per_task)
    return json_path, grid_path


def evaluation_world(config: TrainConfig, policy: Policy) -> World:
    """The world whose held-out prompts judge the model: the config's (``evaluation.world`` or shipped
    ``data.prompts``), else the one the model draws (clips: ``video_shapes``, images: ``shapes``).
    A shapes model of the other kind is an error here, before anything is sampled."""
    if not policy.flow_model.renders_world:  # config validation keeps their evaluation off
        return get_world(config.evaluation_world or "shapes")
    makes_clips, continues = (
        policy.flow_model.is_video,
        getattr(policy.flow_model, "image_conditioned", False),
    )
    world = get_world(config.evaluation_world or world_of_model(makes_clips, continues).name)
    if world.continues_first_frame != continues:
        raise ValueError(
            f"model.name={config.model.name!r} {'continues' if continues else 'does not continue'} a given "
            f"first frame, but the evaluation world is {world.name!r} (evaluation.world / data.prompts="
            f"{config.data.prompts!r})"
        )
    if world.is_video != makes_clips:
        raise ValueError(
            f"model.name={config.model.name!r} makes {'clips' if makes_clips else 'images'}, but the "
            f"evaluation world is {world.name!r} (evaluation.world / data.prompts={config.data.prompts!r})"
        )
    return world


def eval_row(scores: dict[str, Any], world: World) -> dict[str, float]:
    """The evaluation scores that go into ``metrics.jsonl`` (the world's task scores and drift), keyed ``eval/...``."""
    return {f"eval/{k}": v for k, v in scores.items() if k.startswith((f"{world.score_prefix}/", "drift/"))}


def summary_table(base: dict[str, Any], tuned: dict[str, Any], world: World) -> str:
    """Per-task held-out scores: base at each guidance scale, tuned at each."""
    columns = [(f"base cfg {scale}", scores) for scale, scores in base.items()]
    columns += [(f"tuned cfg {scale}", scores) for scale, scores in tuned.items()]
    lines = [f"{'task':<16}" + "".join(f"{name:>14}" for name, _ in columns)]
    for task in (*world.tasks, "overall"):
        key = world.score_key(task)
        lines.append(
            f"{task:<16}" + "".join(f"{scores.get(key, float('nan')):>14.3f}" for _, scores in columns)
        )
    lines.append(
        f"{'colour drift':<16}"
        + "".join(f"{scores.get('drift/colour_tv', float('nan')):>14.3f}" for _, scores in columns)
    )
    return "\n".join(lines)
