"""DRAGON: Distributional RewArds for Generative OptimizatioN (Bai et al., 2025).

DRAGON optimises any reward, of single samples (the verifier, an aesthetic score) or of sets of them (a
distance of the generated distribution to an exemplar distribution, ``rewards/exemplar_fd.py``), from
online, on-policy generations: it scores them, builds a positive demonstration set ``D+`` and a negative set
``D-``, and trains on the contrast of the two. Here each prompt group of ``G`` on-policy ODE samples gives
its ``k = pairs_per_group`` highest-reward samples to ``D+`` and its ``k`` lowest to ``D-``, paired best
with worst (``i``-th best with ``i``-th worst; among equal rewards the earlier sample ranks higher)::

    order  = argsort(r_group, descending, stable)
    D+     = order[:k],  D- = order[G - k:][::-1]         pair j: (order[j], order[G - 1 - j])

A set-level reward reaches the pairs as each sample's contribution to the set's score (``exemplar_fd``:
``FD(S without i) - FD(S)``), so ranking by it moves the set toward the exemplars. A pair whose two rewards
are equal says nothing and gets weight 0 (the loss averages over the global batch's other pairs). The
contrast is Diffusion-DPO's on flow-matching errors (:mod:`flowrl.algorithms.preference`), with the frozen
base as the reference (``reference: rollout``: the policy that sampled the step)::

    L = -log sigmoid( -beta ( [e_theta(x+) - e_ref(x+)] - [e_theta(x-) - e_ref(x-)] ) )

The rollout copy becomes the trained weights after every step (on-policy generations).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, ClassVar

import torch

from flowrl.advantages import RewardBatch
from flowrl.algorithms.base import RolloutChunk, StepEnd, TrainBatch, TrainRows, weighted_mean, whole_groups
from flowrl.algorithms.dragon_config import DRAGONConfig
from flowrl.algorithms.forward_process import ForwardProcessAlgorithm, noised_samples
from flowrl.algorithms.preference import dpo_losses, pair_errors
from flowrl.policy import REFERENCE, ROLLOUT

if TYPE_CHECKING:
    from flowrl.policy import Policy
    from flowrl.train_config import TrainConfig


def preference_pairs(rewards: torch.Tensor, group_size: int, pairs: int) -> tuple[torch.Tensor, torch.Tensor]:
    """``(positives, negatives)``: indices into ``rewards`` of each group's ``pairs`` best and worst samples,
    paired best with worst (module docstring), group by group."""
    grouped = rewards.reshape(-1, group_size)
    order = grouped.argsort(dim=1, descending=True, stable=True)
    offsets = torch.arange(grouped.shape[0], device=rewards.device).unsqueeze(1) * group_size
    positives = order[:, :pairs] + offsets
    negatives = order[:, group_size - pairs :].flip(1) + offsets
    return positives.flatten(), negatives.flatten()


class DRAGON(ForwardProcessAlgorithm):
    """DRAGON as a trainer algorithm: on-policy ODE rollouts, D+ / D- per group, the DPO contrast."""

    metric_keys: ClassVar[dict[str, str]] = {
        "dragon/preference_accuracy": "share of pairs with D_w - D_l < 0 (theta prefers the positive more than ref)",
        "dragon/positive_margin": "D_w = e_theta(x+) - e_ref(x+) on the positive set",
        "dragon/negative_margin": "D_l = e_theta(x-) - e_ref(x-) on the negative set",
        "dragon/reward_gap": "mean total reward of D+ minus that of D-, over the global batch",
        "dragon/kept_pairs": "share of the global batch's pairs whose two rewards differ (the others weigh 0)",
    }

    config: DRAGONConfig
    copies = (ROLLOUT,)

    def __init__(self, config: TrainConfig) -> None:
        super().__init__(config)
        self.group_size = config.training.group_size
        self.kept_share, self.reward_gap = 1.0, float("nan")

    def num_rows(self, num_samples: int, step: int = 1) -> int:
        return whole_groups("dragon", num_samples, self.group_size) * self.config.pairs_per_group

    def advantages(self, rewards: RewardBatch) -> torch.Tensor:
        """The default group advantages (logged only); the global batch's kept share and reward gap."""
        total = rewards.total.float()
        positives, negatives = preference_pairs(total, self.group_size, self.config.pairs_per_group)
        self.kept_share = float((total[positives] != total[negatives]).float().mean())
        self.reward_gap = float(total[positives].mean() - total[negatives].mean())
        return super().advantages(rewards)

    def training_rows(
        self, chunks: list[RolloutChunk], advantages: torch.Tensor, rewards: torch.Tensor, step: int
    ) -> TrainRows:
        """One row per pair: the positive (``x0``, whose conditioning and draws the row takes) and its
        negative (``loser``); a tied pair weighs 0, the others ``1 / kept share``."""
        x0 = torch.cat([chunk.x0 for chunk in chunks])
        positives, negatives = preference_pairs(rewards.cpu(), self.group_size, self.config.pairs_per_group)
        kept = (rewards.cpu()[positives] != rewards.cpu()[negatives]).float()
        weights = kept / self.kept_share if self.kept_share > 0 else kept
        data = {"x0": x0[positives.to(x0.device)], "loser": x0[negatives.to(x0.device)]}
        log = {"dragon/kept_pairs": self.kept_share, "dragon/reward_gap": self.reward_gap}
        return TrainRows(data, positives, advantages[positives.to(advantages.device)], weights, log)

    def loss(
        self, policy: Policy, batch: TrainBatch, pass_index: int, step: int
    ) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        positive, t, noise, _ = noised_samples(batch, pass_index)
        reference = policy.velocity_of(REFERENCE if self.config.reference == "base" else ROLLOUT)
        errors, reference_errors = pair_errors(
            policy, reference, positive, batch.data["loser"], t, noise, batch.cond
        )
        losses, margin = dpo_losses(errors, reference_errors, self.config.beta)
        differences = (errors - reference_errors).detach()
        stats = {
            "dragon/preference_accuracy": (margin.detach() < 0).float(),
            "dragon/positive_margin": differences[0],
            "dragon/negative_margin": differences[1],
        }
        return weighted_mean(losses, batch.weights), stats

    def after_optimizer_step(self, step: int) -> StepEnd:
        """The rollout copy becomes the trained weights (on-policy generations next step)."""
        return StepEnd({ROLLOUT: 0.0})
