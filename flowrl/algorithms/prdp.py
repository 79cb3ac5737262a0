"""PRDP: Proximal Reward Difference Prediction (Deng et al., CVPR 2024), on the Flow-SDE.

The KL-regularised objective ``max E[r(x0)] - beta KL(pi_theta || pi_ref)`` over whole denoising
trajectories has the optimum ``pi* = pi_ref exp(r / beta) / Z``; for two trajectories ``a, b`` of the same
prompt ``Z`` cancels, and PRDP regresses the implicit reward difference on the true one. With the per-step
log-ratio of a stored transition ``x_j -> x_{j+1}`` (log-densities of the Flow-SDE step, mean over
dimensions) and its mean over the ``J`` stochastic steps (the reference code's mean, not the paper's sum)::

    rhat_j(x)  = log p_theta(x_{j+1} | x_j) - log p_ref(x_{j+1} | x_j)
    rhat(x)    = mean_j rhat_j(x)
    l(a, b)    = ( [rhat(a) - rhat(b)] - [r(a) - r(b)] / beta )²                     (RDP, Eq. 14)

The proximal version clips every step's ``rhat_j`` to ``[rhat_old_j - eps, rhat_old_j + eps]`` around the
old (sampling) policy's value, recomputes the pair loss with it and keeps the larger of the two
(PPO's pessimistic bound, Eqs. 18, 20-21)::

    l_prdp(a, b) = max( l(a, b), l_clip(a, b) )

averaged over the pairs of each prompt group with ``r(a) - r(b) > tie_threshold`` (the reference code's
mask: ties and the diagonal out, each pair once; a group without pairs adds 0) and over groups. Rollouts
by the old policy through the Flow-SDE, as Flow-GRPO's; each pass (``epochs`` per rollout batch) scores
every stochastic step of a micro-batch of whole groups at once, so the loss is exact at the current
weights; the old copy becomes the trained weights after every step. Rewards enter raw (no normalisation:
the within-prompt differences play that role).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, ClassVar

import torch

from flowrl.advantages import RewardBatch
from flowrl.algorithms.base import RolloutChunk, TrainBatch, TrainRows, weighted_mean, whole_groups
from flowrl.algorithms.grpo import FlatGRPO, GRPOAlgorithm, gaussian_mean_kl, sde_window
from flowrl.algorithms.prdp_config import PRDPConfig
from samplers import select_rows, stochastic_steps, transition_log_prob

if TYPE_CHECKING:
    from flowrl.policy import Policy
    from flowrl.train_config import TrainConfig


def prdp_pair_loss(
    log_ratio: torch.Tensor,
    old_log_ratio: torch.Tensor,
    rewards: torch.Tensor,
    group_size: int,
    beta: float,
    clip_range: float,
    tie_threshold: float = 0.0,
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """The PRDP loss of the module docstring per group ``[G]`` from ``[B, J]`` per-step log-ratios to the
    reference (``log_ratio`` with gradients, ``old_log_ratio`` the sampling policy's) and ``[B]`` rewards,
    ``B = G * group_size`` in group order; and per-group statistics."""
    old_log_ratio = old_log_ratio.detach()
    clipped = torch.maximum(torch.minimum(log_ratio, old_log_ratio + clip_range), old_log_ratio - clip_range)
    groups = log_ratio.shape[0] // group_size
    implicit = log_ratio.mean(dim=1).view(groups, group_size)
    implicit_clipped = clipped.mean(dim=1).view(groups, group_size)
    reward = rewards.float().view(groups, group_size)
    reward_difference = reward[:, :, None] - reward[:, None, :]
    target = reward_difference / beta
    loss_plain = (implicit[:, :, None] - implicit[:, None, :] - target) ** 2
    loss_clipped = (implicit_clipped[:, :, None] - implicit_clipped[:, None, :] - target) ** 2
    pair_loss = torch.maximum(loss_plain, loss_clipped)
    pairs = (reward_difference > tie_threshold).float()
    count = pairs.sum(dim=(1, 2))
    per_group = (pair_loss * pairs).sum(dim=(1, 2)) / count.clamp(min=1)
    with torch.no_grad():
        predicted = (implicit[:, :, None] - implicit[:, None, :]).abs()
        stats = {
            "prdp/predicted_difference": (predicted * pairs).sum(dim=(1, 2)) / count.clamp(min=1),
            "prdp/target_difference": (target.abs() * pairs).sum(dim=(1, 2)) / count.clamp(min=1),
            "prdp/clipped_pairs": ((loss_clipped > loss_plain).float() * pairs).sum(dim=(1, 2))
            / count.clamp(min=1),
            "prdp/clipped_steps": ((log_ratio - old_log_ratio).abs() > clip_range)
            .float()
            .mean(dim=1)
            .view(groups, group_size)
            .mean(dim=1),
            "prdp/pairs": count / (group_size * (group_size - 1) / 2),
        }
    return per_group, stats


class PRDP(FlatGRPO):
    """PRDP as a trainer algorithm: Flow-SDE rollouts, every stochastic step scored per pass, pairs in groups."""

    metric_keys: ClassVar[dict[str, str]] = {
        "grpo/kl_to_reference": GRPOAlgorithm.metric_keys["grpo/kl_to_reference"],
        "grpo/sde_window_start": GRPOAlgorithm.metric_keys["grpo/sde_window_start"],
        "prdp/predicted_difference": "|rhat(a) - rhat(b)| of the kept pairs: the implicit reward difference",
        "prdp/target_difference": "|r(a) - r(b)| / beta of the kept pairs: what it regresses on",
        "prdp/clipped_pairs": "share of kept pairs where the clipped loss is the larger (the proximal bound holds)",
        "prdp/clipped_steps": "share of steps whose log-ratio left [old - eps, old + eps]",
        "prdp/pairs": "kept pairs (rewards differing by more than tie_threshold) over all pairs of a group",
    }

    config: PRDPConfig

    def __init__(self, config: TrainConfig) -> None:
        super().__init__(config)
        self.passes = self.config.epochs
        self.group_size = config.training.group_size

    def num_rows(self, num_samples: int, step: int = 1) -> int:
        return whole_groups("prdp", num_samples, self.group_size) * self.group_size

    def advantages(self, rewards: RewardBatch) -> torch.Tensor:
        """The raw weighted total reward of every sample (PRDP regresses reward differences, unnormalised)."""
        return rewards.total.float()

    def training_rows(
        self, chunks: list[RolloutChunk], advantages: torch.Tensor, rewards: torch.Tensor, step: int
    ) -> TrainRows:
        return TrainRows(self.sample_rows(chunks), torch.arange(advantages.shape[0]), advantages)

    def loss(
        self, policy: Policy, batch: TrainBatch, pass_index: int, step: int
    ) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        """All stochastic steps of the micro-batch's rows in one call of the trained and one of the
        reference velocity (row-major: sample, then step)."""
        latents, grid = batch.data["latents"], batch.data["timesteps"]
        steps = torch.nonzero(
            stochastic_steps(grid.shape[1] - 1, self.config.noise_level, sde_window(self.train_config, step))
        ).flatten()
        rows, count = latents.shape[0], len(steps)
        index = steps.to(latents.device).repeat(rows)
        sample = torch.arange(rows, device=latents.device).repeat_interleave(count)
        cond = select_rows(batch.cond, sample.cpu())
        transition = (
            latents[sample, index],
            latents[sample, index + 1],
            grid[sample, index],
            grid[sample, index + 1],
        )
        level, variant = self.config.noise_level, self.config.sde_variant
        trained = transition_log_prob(
            self._velocity(policy.velocity, policy, cond), *transition, cond, level, variant
        )
        with torch.no_grad():
            reference = transition_log_prob(self._reference(policy), *transition, cond, level, variant)
        log_ratio = (trained.log_prob - reference.log_prob).view(rows, count)
        old_log_ratio = batch.data["log_probs"][:, steps.to(latents.device)] - reference.log_prob.view(
            rows, count
        )
        per_group, stats = prdp_pair_loss(
            log_ratio,
            old_log_ratio,
            batch.advantages,
            self.group_size,
            self.config.beta,
            self.config.clip_range,
            self.config.tie_threshold,
        )
        kl = torch.zeros(rows, device=latents.device)
        if self.config.kl_weight > 0:
            scale = trained.std_dev if self.config.kl_form == "reference" else trained.scale
            kl = gaussian_mean_kl(trained.mean, reference.mean, scale).view(rows, count).mean(dim=1)
        per_row = per_group.repeat_interleave(self.group_size) + self.config.kl_weight * kl
        row_stats = {key: value.repeat_interleave(self.group_size) for key, value in stats.items()}
        return weighted_mean(per_row, batch.weights), {**row_stats, "grpo/kl_to_reference": kl.detach()}
