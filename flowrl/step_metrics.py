"""What every training step logs beside the algorithm's own rows and statistics: rewards (per label and
per task), the updates (loss, gradient norm, skips, learning rate, the algorithm's statistics), times and
peak memory. Every key is declared with its meaning in :data:`flowrl.metric_keys.STEP_METRICS`."""

from __future__ import annotations

import resource
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch
from accelerate import Accelerator

from flowrl.advantages import RewardBatch
from flowrl.rollout import Rollout


@dataclass
class Updates:
    """What a step's optimizer updates did: the loss of every backward unit, the algorithm's statistics,
    the gradient norm of every update taken, how many were skipped (non-finite), and their seconds."""

    losses: list[torch.Tensor] = field(default_factory=list)
    statistics: dict[str, list[torch.Tensor]] = field(default_factory=dict)
    grad_norms: list[float] = field(default_factory=list)
    skipped: int = 0
    optimizer_seconds: float = 0.0


def reward_metrics(
    step: int, rewards: RewardBatch, scores: dict[str, torch.Tensor], records: list[dict]
) -> dict[str, Any]:
    """The step's rewards over the global batch: the total, every label, the share of groups whose
    samples all scored alike (no signal), and per task."""
    return {
        "step": step,
        "reward/mean": float(rewards.total.mean()),
        **{f"reward/{key}": float(value.mean()) for key, value in scores.items()},
        "reward/zero_std_groups": float(rewards.zero_std_groups().float().mean()),
        **task_rewards(rewards.total, records),
    }


def update_metrics(
    updates: Updates, reduce: Callable[..., torch.Tensor], learning_rate: float
) -> dict[str, Any]:
    """Loss and the algorithm's statistics averaged over units and processes (``reduce`` is the
    accelerator's, a collective), the mean gradient norm of the updates taken, skips, learning rate."""
    norms = updates.grad_norms
    return {
        "loss": float(reduce(torch.stack(updates.losses).mean(), "mean")),
        "grad_norm": sum(norms) / len(norms) if norms else float("nan"),
        "skipped/updates": updates.skipped,
        "lr": learning_rate,
        **{
            key: float(reduce(torch.stack(values).mean(), "mean"))
            for key, values in updates.statistics.items()
        },
    }


def time_metrics(
    rollout: Rollout, updates: Updates, train_seconds: float, started: float, accelerator: Accelerator
) -> dict[str, Any]:
    """Seconds of the step's phases (``started``: the step's ``perf_counter``), peak memory, processes."""
    return {
        "time/rollout": rollout.seconds,
        "time/reward": rollout.reward_wait,
        "time/train": train_seconds,
        "time/loss_backward": train_seconds - updates.optimizer_seconds,
        "time/optimizer": updates.optimizer_seconds,
        "time/step": time.perf_counter() - started,
        "memory/peak_gb": peak_memory_gb(accelerator.device),
        "num_processes": accelerator.num_processes,
    }


def task_rewards(total: torch.Tensor, records: list[dict]) -> dict[str, float]:
    """``{"reward/task/<tag>": mean total reward}`` per task tag of the step's prompts (none when a prompt
    has no ``tag``, as in plain prompt files)."""
    tags = [record.get("tag") for record in records]
    if not tags or None in tags:
        return {}
    return {
        f"reward/task/{tag}": float(total[[i for i, t in enumerate(tags) if t == tag]].mean())
        for tag in sorted(set(tags))
    }


def peak_memory_gb(device: torch.device) -> float:
    """Peak accelerator memory (GiB) since the previous call on CUDA; elsewhere the process's peak resident set."""
    if device.type == "cuda":
        peak = torch.cuda.max_memory_allocated(device)
        torch.cuda.reset_peak_memory_stats(device)
        return peak / 2**30
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20  # kilobytes on Linux
