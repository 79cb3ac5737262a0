"""RAFT: reward-ranked fine-tuning (Dong et al., 2023), the baseline every RL algorithm here should beat.

Each step the current model draws ``K`` samples per prompt with the ODE
solver; of each group only the ``k`` samples with the highest total reward
are kept (no negatives, no advantages) and the model is fine-tuned on them
with the plain flow-matching loss. For a kept sample ``x0``, a time ``t`` and
fresh noise ``eps``::

    x_t = (1 - t) x0 + t eps
    L   = mean over kept samples of || v_theta(x_t, t, c) - (eps - x0) ||²  +  lambda || v_theta - v_ref ||²
    v_ref = v_u + w (v_c - v_u)   (the frozen base, CFG-mixed at w = reference_guidance; w = 1: v_c)

(means over pixels; with ``min_reward`` set, kept samples below it get weight 0 and the mean is taken
over the global batch's fitted samples, ``w_i = 1[R_i >= min_reward] / share``; ``lambda = reference_weight``, the pull toward the frozen base that DiffusionNFT has
too: fitting its own samples drifts a model away from its data, and without the pull the shapes model loses
its colours within 60 steps). The rollout copy is the trained model itself after every step (on-policy
sampling, RAFT's iterate "sample, rank, fine-tune"). Rejection sampling plus
supervised fine-tuning is the simplest use of the same rollouts: what it
reaches is what sharpening alone gives.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, ClassVar

import torch

from flowrl.advantages import RewardBatch
from flowrl.algorithms.base import RolloutChunk, StepEnd, TrainBatch, TrainRows, weighted_mean, whole_groups
from flowrl.algorithms.forward_process import (
    ADAPTIVE_WEIGHT_MIN,
    ForwardProcessAlgorithm,
    noised_samples,
    pixel_mean,
)
from flowrl.algorithms.raft_config import RAFTConfig
from flowrl.policy import REFERENCE, ROLLOUT

if TYPE_CHECKING:
    from flowrl.policy import Policy
    from flowrl.train_config import TrainConfig


def best_of_groups(rewards: torch.Tensor, group_size: int, keep: int) -> torch.Tensor:
    """Indices (ascending) of the ``keep`` highest rewards of every consecutive group of ``group_size``;
    among equal rewards the earlier sample wins."""
    grouped = rewards.reshape(-1, group_size)
    order = grouped.argsort(dim=1, descending=True, stable=True)[:, :keep]
    offsets = torch.arange(grouped.shape[0], device=rewards.device).unsqueeze(1) * group_size
    return (order + offsets).flatten().sort().values


def flow_matching_loss(
    v_theta: torch.Tensor, x0: torch.Tensor, noise: torch.Tensor, t: torch.Tensor, adaptive: bool = False
) -> torch.Tensor:
    """``||v_theta - (eps - x0)||²`` per sample (mean over pixels); ``adaptive``: DiffusionNFT's weighting of
    its positive term instead, the x0-space error ``x_t - t v_theta - x0 = -t (v_theta - (eps - x0))``
    squared and divided by its own detached mean absolute value."""
    error = v_theta.float() - (noise.float() - x0.float())
    if not adaptive:
        return pixel_mean(error**2)
    error = t.float().reshape(-1, *([1] * (error.ndim - 1))) * error
    with torch.no_grad():
        weight = pixel_mean(error.abs()).clamp(min=ADAPTIVE_WEIGHT_MIN)
    return pixel_mean(error**2) / weight


class RAFT(ForwardProcessAlgorithm):
    """RAFT as a trainer algorithm: ODE rollouts, the best samples of each group, the flow-matching loss."""

    metric_keys: ClassVar[dict[str, str]] = {
        "raft/fitted_share": "share of the kept samples at or above min_reward, the ones fitted (with min_reward set)",
        "raft/flow_matching_loss": "the flow-matching loss on the kept samples",
        "raft/reference_mse": "||v_theta - v_ref||^2 to the frozen base",
        "raft/kept_reward": "mean total reward of the kept samples",
    }

    config: RAFTConfig
    copies = (ROLLOUT,)

    def __init__(self, config: TrainConfig) -> None:
        super().__init__(config)
        self.group_size = config.training.group_size
        self.negative_prompt = config.sampler.negative_prompt
        #: the mean total reward of the kept samples of the step, set by :meth:`advantages`
        self.kept_reward = float("nan")
        #: the share of the global batch's kept samples at or above ``min_reward``, set by :meth:`advantages`
        self.fitted_share = 1.0

    def num_rows(self, num_samples: int, step: int = 1) -> int:
        return whole_groups("raft", num_samples, self.group_size) * self.config.keep_per_group

    def advantages(self, rewards: RewardBatch) -> torch.Tensor:
        """The default group advantages (logged only: RAFT's loss has none); also the mean total reward of
        the samples the step keeps, over the global batch."""
        kept_rewards = rewards.total.float()[
            best_of_groups(rewards.total.float(), self.group_size, self.config.keep_per_group)
        ]
        self.kept_reward = float(kept_rewards.mean())
        if self.config.min_reward is not None:
            self.fitted_share = float((kept_rewards >= self.config.min_reward).float().mean())
        return super().advantages(rewards)

    def training_rows(
        self, chunks: list[RolloutChunk], advantages: torch.Tensor, rewards: torch.Tensor, step: int
    ) -> TrainRows:
        """One row per kept sample; its conditioning and random draws (:meth:`draw`, for every sample) are
        those of the sample."""
        x0 = torch.cat([chunk.x0 for chunk in chunks])
        kept = best_of_groups(rewards.cpu(), self.group_size, self.config.keep_per_group)
        weights, log = None, {}
        if self.config.min_reward is not None:
            fitted = (rewards.cpu()[kept] >= self.config.min_reward).float()
            weights = fitted / self.fitted_share if self.fitted_share > 0 else fitted
            log = {"raft/fitted_share": self.fitted_share}
        return TrainRows(
            {"x0": x0[kept.to(x0.device)]}, kept, advantages[kept.to(advantages.device)], weights, log
        )

    def loss(
        self, policy: Policy, batch: TrainBatch, pass_index: int, step: int
    ) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        x0, t, noise, x_t = noised_samples(batch, pass_index)
        v_theta = policy.velocity(x_t, t, batch.cond)
        fit = flow_matching_loss(v_theta, x0, noise, t, self.config.adaptive_weighting)
        pull = torch.zeros_like(fit)
        if self.config.reference_weight > 0:
            with torch.no_grad():
                reference = policy.guided(REFERENCE, self.config.reference_guidance, self.negative_prompt)
                v_ref = reference(x_t, t, batch.cond)
            pull = pixel_mean((v_theta.float() - v_ref.float()) ** 2)
        losses = fit + self.config.reference_weight * pull
        stats = {"raft/flow_matching_loss": fit.detach(), "raft/reference_mse": pull.detach()}
        return weighted_mean(losses, batch.weights), stats

    def after_optimizer_step(self, step: int) -> StepEnd:
        """The rollout copy becomes the trained model (on-policy sampling next step)."""
        return StepEnd({ROLLOUT: 0.0}, {"raft/kept_reward": self.kept_reward})
