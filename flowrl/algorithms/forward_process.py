"""What the forward-process algorithms share (DiffusionNFT and its variants MeanFlowNFT and CRD, and RAFT):
clean ODE rollouts of which only ``x0`` is kept, and per sample ``train_timesteps`` training times ``t``
with fresh noise ``eps``, trained on ``x_t = (1 - t) x0 + t eps``."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import torch

from flowrl.algorithms.base import Algorithm, RolloutChunk, TrainBatch, TrainRows
from flowrl.config_schema import ConfigError
from samplers import ODE_SOLVERS, VelocityFn

if TYPE_CHECKING:
    from flowrl.train_config import TrainConfig

#: the floor of the adaptive x0-space weights ``sg(mean |x0_pred - x0|)``
ADAPTIVE_WEIGHT_MIN = 1e-5


def pixel_mean(x: torch.Tensor) -> torch.Tensor:
    return x.mean(dim=tuple(range(1, x.ndim)))


def training_times(
    generator: torch.Generator,
    num_samples: int,
    count: int,
    grid: torch.Tensor,
    mode: str,
    minimum: float = 0.0,
) -> torch.Tensor:
    """``[count, num_samples]`` training times: distinct rollout-grid times per sample, or ``U(minimum, 1)``.

    The grid mode draws, for every sample, ``count`` different times among the
    grid's non-zero times (``t_0 .. t_{S-1}``) that are at least ``minimum``.
    """
    if mode == "sampled":
        return minimum + (1 - minimum) * torch.rand(count, num_samples, generator=generator).clamp(min=1e-3)
    candidates = grid[:-1].float()
    candidates = candidates[candidates >= minimum - 1e-6]
    if len(candidates) < count:
        raise ConfigError(
            f"algorithm.train_timesteps={count} is more than the {len(candidates)} rollout-grid times at or "
            f"above algorithm.min_train_time={minimum:g}; lower either, or use algorithm.timesteps=sampled"
        )
    order = torch.rand(num_samples, len(candidates), generator=generator).argsort(dim=1)[:, :count]
    return candidates[order].T.contiguous()


def noised_samples(batch: TrainBatch, pass_index: int) -> tuple[torch.Tensor, ...]:
    """``(x0, t, eps, x_t)`` of a pass: the pass's drawn times and noise, ``x_t = (1 - t) x0 + t eps``."""
    x0 = batch.x0
    t = batch.draws["t"][pass_index].to(x0.device)
    noise = batch.draws["noise"][pass_index].to(x0.device, x0.dtype)
    column = t.reshape(-1, *([1] * (x0.ndim - 1))).to(x0.dtype)
    return x0, t, noise, (1 - column) * x0 + column * noise


class ForwardProcessAlgorithm(Algorithm):
    """What DiffusionNFT, its variants and RAFT share: clean ODE rollouts (only ``x0`` is kept) and, per
    sample, ``train_timesteps`` training times with fresh noise; rows are samples (``training_rows`` may
    keep some of them)."""

    def __init__(self, config: TrainConfig) -> None:
        super().__init__(config)
        self.solver = ODE_SOLVERS[config.sampler.solver]
        self.passes = self.config.train_timesteps

    def rollout(
        self,
        velocity: VelocityFn,
        noise: torch.Tensor,
        grid: torch.Tensor,
        cond: Any,
        generator: torch.Generator,
        step: int,
    ) -> RolloutChunk:
        """Clean samples from the (deterministic) ODE solver; only ``x0`` is kept."""
        return RolloutChunk(self.solver(velocity, noise, grid, cond).x0)

    def training_rows(
        self, chunks: list[RolloutChunk], advantages: torch.Tensor, rewards: torch.Tensor, step: int
    ) -> TrainRows:
        x0 = torch.cat([chunk.x0 for chunk in chunks])
        return TrainRows({"x0": x0}, torch.arange(x0.shape[0]), advantages)

    def draw(
        self,
        generator: torch.Generator,
        num_samples: int,
        sample_shape: tuple[int, ...],
        grid: torch.Tensor,
        step: int,
    ) -> dict[str, torch.Tensor]:
        count = self.config.train_timesteps
        times = training_times(
            generator, num_samples, count, grid, self.config.timesteps, self.config.min_train_time
        )
        noise = torch.randn(count, num_samples, *sample_shape, generator=generator)
        return {"t": times, "noise": noise}
