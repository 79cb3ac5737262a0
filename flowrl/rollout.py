"""A step's rollouts on one process: the algorithm's sampler run by the rollout copy, micro-batch by
micro-batch of whole groups, each micro-batch decoded and handed to the reward scorer in the background
as soon as it is sampled."""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

import torch
from tqdm.auto import tqdm

from flowrl.algorithms import Algorithm, RolloutChunk
from flowrl.policy import ROLLOUT, Policy
from flowrl.train_config import TrainConfig
from flowrl.video_shapes.first_frame import first_frames
from rewards import AsyncScorer, SkippedBatch
from samplers import select_rows


@dataclass
class Rollout:
    """One process's rollouts of a step and their scores (None when a reward skipped its batch)."""

    chunks: list[RolloutChunk]
    #: decoded images or clips, per micro-batch
    media: list[torch.Tensor]
    #: the prompts' conditioning (encoded once, reused by training)
    cond: Any
    scores: dict[str, torch.Tensor] | None
    seconds: float
    #: seconds waited for the rewards after the last rollout
    reward_wait: float


def rollout_and_score(
    policy: Policy,
    algorithm: Algorithm,
    config: TrainConfig,
    grid: torch.Tensor,
    step: int,
    micro_batch: int,
    records: list[dict],
    seeds: list[int],
    scorer: AsyncScorer,
) -> Rollout:
    """Rollouts of ``records`` (with initial noise from the algorithm's :meth:`~Algorithm.noise_seeds`, by
    default ``seeds``) scored chunk by chunk; the SDE noise of each micro-batch is seeded by its first
    sample's seed."""
    images = first_frames(records, policy.sample_shape) if policy.image_conditioned else None
    cond = policy.encode([record["prompt"] for record in records], images)
    noise = policy.initial_noise(algorithm.noise_seeds(records, seeds), policy.device)
    velocity = policy.guided(ROLLOUT, config.sampler.guidance_scale, config.sampler.negative_prompt)
    chunks, media, futures = [], [], []
    start = time.perf_counter()
    with torch.no_grad():
        for begin in range(0, len(records), micro_batch):
            rows = torch.arange(begin, min(begin + micro_batch, len(records)))
            generator = torch.Generator().manual_seed(seeds[begin])
            chunk = algorithm.rollout(
                velocity, noise[rows.to(noise.device)], grid, select_rows(cond, rows), generator, step
            )
            chunks.append(chunk)
            media.append(policy.decode(chunk.x0))
            items = [records[i] for i in rows.tolist()]
            futures.append(scorer.submit(media[-1], [r["prompt"] for r in items], items))
    rollout_seconds = time.perf_counter() - start
    start = time.perf_counter()
    parts, skipped = [], False
    for future in futures:
        try:
            parts.append(future.result())
        except SkippedBatch as error:
            tqdm.write(f"step {step}: skipping the update: {error}")
            skipped = True
    scores = None if skipped else concat_scores(parts)
    return Rollout(chunks, media, cond, scores, rollout_seconds, time.perf_counter() - start)


def concat_scores(parts: list[dict[str, torch.Tensor]]) -> dict[str, torch.Tensor]:
    """Micro-batch scores joined per label; a label a micro-batch lacks (its reward failed and was
    zeroed before it ever answered) counts 0 there."""
    labels = list(dict.fromkeys(label for part in parts for label in part))
    return {
        label: torch.cat([part.get(label, torch.zeros(len(next(iter(part.values()))))) for part in parts])
        for label in labels
    }
