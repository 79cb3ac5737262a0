"""Learning-rate schedules shared by RL training and shapes pretraining."""

from __future__ import annotations

import math

LR_SCHEDULES = ("constant", "cosine")


def learning_rate_factor(
    index: int, warmup_steps: int, total_steps: int, schedule: str = "cosine", min_ratio: float = 0.1
) -> float:
    """Share of the peak learning rate at optimizer step ``index`` (0-based).

    Warm-up: ``(index + 1) / warmup_steps`` for ``index < warmup_steps``. After it, ``1`` ("constant") or
    ``m + (1 - m) (1 + cos(pi p)) / 2`` ("cosine", ``m = min_ratio``) with ``p`` the share of the
    ``total_steps - warmup_steps`` post-warm-up steps done (held at 1 past the end).
    """
    if schedule not in LR_SCHEDULES:
        raise ValueError(f"unknown learning-rate schedule {schedule!r}; allowed: {LR_SCHEDULES}")
    if index < warmup_steps:
        return (index + 1) / warmup_steps
    if schedule == "constant":
        return 1.0
    progress = min(1.0, (index - warmup_steps) / max(1, total_steps - warmup_steps))
    return min_ratio + (1 - min_ratio) * 0.5 * (1 + math.cos(math.pi * progress))
