"""The RL run's optimizer and its learning-rate schedule, built from the run's training settings."""

from __future__ import annotations

from collections.abc import Iterable
from functools import partial

import torch

from flowrl.learning_rate import learning_rate_factor
from flowrl.train_config import TrainingConfig


def optimizer_and_schedule(
    parameters: Iterable[torch.nn.Parameter], training: TrainingConfig
) -> tuple[torch.optim.AdamW, torch.optim.lr_scheduler.LambdaLR]:
    """AdamW with ``betas = (0.9, adam_beta2)`` and its per-update schedule: the peak rate times
    :func:`~flowrl.learning_rate.learning_rate_factor` over ``steps x updates_per_step`` optimizer updates."""
    optimizer = torch.optim.AdamW(
        parameters,
        lr=training.learning_rate,
        betas=(0.9, training.adam_beta2),
        weight_decay=training.weight_decay,
    )
    factor = partial(
        learning_rate_factor,
        warmup_steps=training.warmup_steps,
        total_steps=training.steps * training.updates_per_step,
        schedule=training.lr_schedule,
        min_ratio=training.min_learning_rate_ratio,
    )
    return optimizer, torch.optim.lr_scheduler.LambdaLR(optimizer, factor)
