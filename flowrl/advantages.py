"""Advantages from a step's rewards: group normalisation (GRPO-style) and GDPO's per-reward normalisation.

RL work, so it lives here and not in ``rewards/`` (which only scores media and
weighs the scores into a total). Samples of one prompt form a group
(``group_ids``, one id per sample). :meth:`flowrl.algorithms.Algorithm.advantages`
calls :func:`reward_advantages` once per step on the gathered global batch.

``group_advantages``: ``A = (R - mean_group R) / (std R + eps)``, with the
std over the whole batch (default) or within each group.

``gdpo_advantages`` (GDPO): each reward is normalised within its group first,
``A_k = (r_k - mean_g r_k) / max(std_g r_k, 1e-6)``, then ``S = sum_k w_k A_k``
is normalised over the batch: ``(S - mean S) / (std S + eps)``. Unlike summing
raw rewards first, distinct reward combinations keep distinct advantages.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

import torch

STD_SCOPES = ("batch", "group")
AGGREGATIONS = ("sum", "gdpo")


@dataclass
class RewardBatch:
    """A step's rewards over the global batch: the one score per reward entry that enters the aggregate
    (``components``), their ``weights``, the weighted ``total`` and each sample's prompt group."""

    components: dict[str, torch.Tensor]
    weights: dict[str, float]
    total: torch.Tensor
    group_ids: torch.Tensor

    def zero_std_groups(self) -> torch.Tensor:
        """``[groups]`` True where every sample of a group got the same total (no learning signal)."""
        group_size = int((self.group_ids == self.group_ids[0]).sum())
        return zero_std_groups(self.total, group_size)


def zero_std_groups(total: torch.Tensor, group_size: int) -> torch.Tensor:
    """``[groups]`` True where the totals of a group (``group_size`` consecutive samples) are all equal."""
    return total.view(-1, group_size).std(dim=1) == 0


def _group_stats(values: torch.Tensor, group_ids: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-sample mean and (population) std of its group."""
    _, inverse = torch.unique(group_ids.to(values.device), return_inverse=True)
    groups = int(inverse.max()) + 1
    zeros = torch.zeros(groups, dtype=values.dtype, device=values.device)
    counts = zeros.clone().index_add_(0, inverse, torch.ones_like(values))
    means = zeros.clone().index_add_(0, inverse, values) / counts
    centered = values - means[inverse]
    variances = zeros.clone().index_add_(0, inverse, centered**2) / counts
    return means[inverse], variances.sqrt()[inverse]


def group_advantages(
    rewards: torch.Tensor, group_ids: torch.Tensor, std_scope: str = "batch", eps: float = 1e-4
) -> torch.Tensor:
    """``(R - mean_group R) / (std R + eps)``; ``std_scope`` is ``"batch"`` or ``"group"``."""
    if std_scope not in STD_SCOPES:
        raise ValueError(f"unknown std_scope {std_scope!r}; allowed: {STD_SCOPES}")
    rewards = rewards.double()
    mean, group_std = _group_stats(rewards, group_ids)
    std = group_std if std_scope == "group" else rewards.std(unbiased=False)
    return ((rewards - mean) / (std + eps)).float()


def gdpo_advantages(
    rewards: Mapping[str, torch.Tensor],
    reward_weights: Mapping[str, float],
    group_ids: torch.Tensor,
    eps: float = 1e-4,
) -> torch.Tensor:
    """GDPO: per-reward group normalisation, weighted sum, then batch normalisation (module docstring)."""
    total = torch.zeros_like(next(iter(rewards.values())), dtype=torch.float64)
    for name, weight in reward_weights.items():
        values = rewards[name].double()
        mean, std = _group_stats(values, group_ids)
        total += weight * (values - mean) / std.clamp(min=1e-6)
    return ((total - total.mean()) / (total.std(unbiased=False) + eps)).float()


def reward_advantages(
    rewards: RewardBatch, aggregation: str = "sum", std_scope: str = "batch", eps: float = 1e-4
) -> torch.Tensor:
    """``sum``: group advantages of the weighted total; ``gdpo``: each reward normalised per group first."""
    if aggregation not in AGGREGATIONS:
        raise ValueError(f"unknown aggregation {aggregation!r}; allowed: {AGGREGATIONS}")
    if aggregation == "sum":
        return group_advantages(rewards.total, rewards.group_ids, std_scope, eps)
    return gdpo_advantages(rewards.components, rewards.weights, rewards.group_ids, eps)
