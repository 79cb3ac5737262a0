"""What the trainer needs from an algorithm and from a policy backend.

The trainer owns the loop (prompts, rewards, advantages, optimizer,
checkpoints); an algorithm owns what rollout it needs, how the scored rollout
becomes training rows, how a batch of rows becomes a loss, and what state it
keeps. DiffusionNFT, Flow-GRPO and BranchGRPO (and CRD, MeanFlowNFT) plug in
here without touching the loop.

Rows: forward-process algorithms train on samples (one row per image);
Flow-GRPO on samples too (a pass per trained SDE step); BranchGRPO on tree
edges. The loop only sees rows: it splits them into micro-batches, runs
``loss`` on each for every pass, and weights each micro-batch by its share of
the rows of its optimizer update.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Protocol

import torch

from samplers import VelocityFn


@dataclass
class RolloutChunk:
    """One rollout micro-batch: the final samples ``x0`` ``[n, ...]`` (one per image, in the order of
    the step's sample list) to score, and whatever the algorithm keeps for training (``data``)."""

    x0: torch.Tensor
    data: Any = None


@dataclass
class TrainRows:
    """A process's training rows for one step: per-row tensors (``data``, first dimension = rows),
    the conditioning row of each (``cond_index``, into the process's samples) and its advantage."""

    data: dict[str, torch.Tensor]
    cond_index: torch.Tensor
    advantages: torch.Tensor
    weights: torch.Tensor | None = None
    log: dict[str, float] = field(default_factory=dict)

    @property
    def count(self) -> int:
        return int(self.cond_index.shape[0])


@dataclass
class TrainBatch:
    """A micro-batch of training rows as the algorithm's loss sees it.

    ``data``: the algorithm's per-row tensors (``x0`` for forward-process
    algorithms, latents and log-probs for GRPO); ``cond``: the rows'
    conditioning; ``advantages``: ``[B]``; ``draws``: the algorithm's per-row
    random draws (see :meth:`Algorithm.draw`), ``[passes, B, ...]``;
    ``weights``: ``[B]`` per-row loss weights (None = all 1).
    """

    data: dict[str, torch.Tensor]
    cond: Any
    advantages: torch.Tensor
    draws: dict[str, torch.Tensor]
    weights: torch.Tensor | None = None

    @property
    def x0(self) -> torch.Tensor:
        return self.data["x0"]


class Policy(Protocol):
    """A trainable velocity model with its old, sampler (the old one unless separate) and reference
    (frozen base) copies. A MeanFlow policy returns the average velocity over ``[r, t]`` when given ``r``."""

    def encode(self, prompts: list[str]) -> Any: ...

    def velocity(
        self, x: torch.Tensor, t: torch.Tensor, cond: Any, r: torch.Tensor | None = None
    ) -> torch.Tensor: ...

    def old_velocity(
        self, x: torch.Tensor, t: torch.Tensor, cond: Any, r: torch.Tensor | None = None
    ) -> torch.Tensor: ...

    def reference_velocity(
        self, x: torch.Tensor, t: torch.Tensor, cond: Any, r: torch.Tensor | None = None
    ) -> torch.Tensor: ...

    def sampler_velocity(
        self, x: torch.Tensor, t: torch.Tensor, cond: Any, r: torch.Tensor | None = None
    ) -> torch.Tensor: ...

    def update_old(self, decay: float) -> None: ...

    def update_sampler(self, decay: float) -> None: ...


class Algorithm(Protocol):
    """An RL algorithm as the trainer drives it."""

    #: loss passes per batch (e.g. DiffusionNFT's training timesteps); gradients accumulate over them
    passes: int
    #: roll out with a separate ``sampler`` copy of the policy (its own schedule) instead of ``old``
    separate_sampler: bool

    def num_rows(self, num_samples: int, step: int = 1) -> int:
        """Training rows made from ``num_samples`` samples (whole groups), known before any rollout."""
        ...

    def rollout(
        self,
        velocity: VelocityFn,
        noise: torch.Tensor,
        grid: torch.Tensor,
        cond: Any,
        generator: torch.Generator,
        step: int,
    ) -> RolloutChunk:
        """Roll out one micro-batch of whole groups from ``noise`` (one per sample) with the sampling
        ``velocity`` (the old policy, guided as the sampler config says); ``generator`` draws SDE noise."""
        ...

    def training_rows(
        self, chunks: list[RolloutChunk], advantages: torch.Tensor, rewards: torch.Tensor, step: int
    ) -> TrainRows:
        """The process's rows from its scored chunks; ``advantages`` and ``rewards`` are ``[samples]``
        (group advantages over the global batch, and the total rewards)."""
        ...

    def draw(
        self,
        generator: torch.Generator,
        num_samples: int,
        sample_shape: tuple[int, ...],
        grid: torch.Tensor,
        step: int,
    ) -> dict[str, torch.Tensor]:
        """Random draws for all ``num_samples`` samples of a step, each ``[passes, num_samples, ...]``.

        Drawn for the global batch from one generator, so that the result does
        not depend on how samples are split over processes. Only algorithms
        whose rows are samples draw anything.
        """
        ...

    def loss(
        self, policy: Policy, batch: TrainBatch, pass_index: int
    ) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        """The scalar loss (mean over rows, ``weights`` applied) of one pass over ``batch`` and
        per-row statistics to log."""
        ...

    def after_optimizer_step(self, policy: Policy, step: int) -> dict[str, float]:
        """State updates after training step ``step`` (1-based), e.g. the old policy; returns values to log."""
        ...


def weighted_mean(values: torch.Tensor, weights: torch.Tensor | None) -> torch.Tensor:
    """``sum_i w_i values_i / B`` (a plain mean when ``weights`` is None): dropped rows count as zeros."""
    return values.mean() if weights is None else (values * weights.to(values)).mean()
