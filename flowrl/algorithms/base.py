"""What the trainer needs from an algorithm and from a policy backend.

The trainer owns the loop (prompts, rollouts, rewards, advantages, optimizer,
checkpoints); an algorithm owns how a batch becomes a loss and what state it
keeps. CRD, MeanFlowNFT, Flow-GRPO and BranchGRPO plug in here without
touching the loop.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Protocol

import torch


@dataclass
class TrainBatch:
    """The local share of one step's samples, as the algorithm's loss sees it.

    ``x0``: clean rollouts ``[B, ...]`` in model space; ``cond``: their
    conditioning rows; ``advantages``: ``[B]``; ``draws``: the algorithm's
    per-sample random draws (see :meth:`Algorithm.draw`), sliced to these rows.
    """

    x0: torch.Tensor
    cond: Any
    advantages: torch.Tensor
    draws: dict[str, torch.Tensor]


class Policy(Protocol):
    """A trainable velocity model with its old (sampling) and reference (frozen base) copies."""

    def encode(self, prompts: list[str]) -> Any: ...

    def velocity(self, x: torch.Tensor, t: torch.Tensor, cond: Any) -> torch.Tensor: ...

    def old_velocity(self, x: torch.Tensor, t: torch.Tensor, cond: Any) -> torch.Tensor: ...

    def reference_velocity(self, x: torch.Tensor, t: torch.Tensor, cond: Any) -> torch.Tensor: ...

    def update_old(self, decay: float) -> None: ...


class Algorithm(Protocol):
    """An RL algorithm as the trainer drives it."""

    #: loss passes per batch (e.g. DiffusionNFT's training timesteps); gradients accumulate over them
    passes: int

    def draw(
        self, generator: torch.Generator, num_samples: int, sample_shape: tuple[int, ...], grid: torch.Tensor
    ) -> dict[str, torch.Tensor]:
        """Random draws for all ``num_samples`` samples of a step, each ``[passes, num_samples, ...]``.

        Drawn for the global batch from one generator, so that the result does
        not depend on how samples are split over processes.
        """
        ...

    def loss(
        self, policy: Policy, batch: TrainBatch, pass_index: int
    ) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        """The scalar loss of one pass over ``batch`` and per-sample statistics to log."""
        ...

    def after_optimizer_step(self, policy: Policy, step: int) -> dict[str, float]:
        """State updates after optimizer step ``step`` (1-based), e.g. the old policy; returns values to log."""
        ...
