"""DiffusionNFT: negative-aware fine-tuning on the forward process (Zheng et al., 2025).

Rollouts by the old policy ``v_old`` with any solver, CFG-free; only the clean
samples ``x0`` and their group advantages ``A`` are kept. For a time ``t`` and
fresh noise ``eps``, ``x_t = (1 - t) x0 + t eps`` and, with ``v_theta`` the
trainable velocity and ``beta > 0``::

    r    = clip(A, -c, c) / (2 c) + 1/2                      optimality probability in [0, 1]
    v+   = beta v_theta + (1 - beta) v_old                   implicit positive policy
    v-   = (1 + beta) v_old - beta v_theta                   implicit negative policy
    x0±  = x_t - t v±                                        their clean-sample predictions
    w±   = sg(mean |x0± - x0|)  (clipped below at 1e-5)      adaptive x0-space weights
    L    = c * mean[ r ||x0+ - x0||² / w+ + (1 - r) ||x0- - x0||² / w- ] / beta
           + lambda * mean ||v_theta - v_ref||²               small pull towards the reference

(``||.||²`` is the mean over pixels). Without adaptive weighting ``w± = 1``.
High-reward samples pull ``v_theta`` towards them, low-reward samples push it
away through the negative policy. After each optimizer step the old policy
moves towards the trained one: ``theta_old <- eta theta_old + (1 - eta) theta``
with ``eta = min(rate * n, max)`` after ``n`` optimizer updates ("soft", the
reference's schedule, optionally a plain copy for the first ``old_flat_steps``
updates as its decay_type 2), a copy every ``k`` steps ("hard"), or no update
for the first ``d`` updates and then soft ("delayed").
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, ClassVar

import torch

from flowrl.algorithms.base import StepEnd, TrainBatch, weighted_mean
from flowrl.algorithms.forward_process import (
    ADAPTIVE_WEIGHT_MIN,
    ForwardProcessAlgorithm,
    noised_samples,
    pixel_mean,
)
from flowrl.algorithms.nft_config import NFTConfig
from flowrl.policy import OLD

if TYPE_CHECKING:
    from flowrl.policy import Policy


def optimality_probability(advantages: torch.Tensor, clip: float) -> torch.Tensor:
    """``r = clip(A, -c, c) / (2 c) + 1/2``: advantage 0 -> 1/2, ``+c`` or more -> 1, ``-c`` or less -> 0."""
    return advantages.clamp(-clip, clip) / (2 * clip) + 0.5


@dataclass
class NFTTerms:
    """The loss and its parts, per sample ``[B]`` (before the batch mean)."""

    loss: torch.Tensor
    positive: torch.Tensor
    negative: torch.Tensor
    reference: torch.Tensor


def nft_loss(
    v_theta: torch.Tensor,
    v_old: torch.Tensor,
    v_ref: torch.Tensor | None,
    x_t: torch.Tensor,
    x0: torch.Tensor,
    t: torch.Tensor,
    advantages: torch.Tensor,
    beta: float,
    advantage_clip: float,
    reference_weight: float,
    adaptive_weighting: bool = True,
) -> NFTTerms:
    """The DiffusionNFT loss of the module docstring, per sample; ``t`` is ``[B]``."""
    v_old, x0 = v_old.detach().float(), x0.float()
    v_theta, x_t = v_theta.float(), x_t.float()
    t = t.float().reshape(-1, *([1] * (x0.ndim - 1)))
    r = optimality_probability(advantages.float(), advantage_clip)
    x0_positive = x_t - t * (beta * v_theta + (1 - beta) * v_old)
    x0_negative = x_t - t * ((1 + beta) * v_old - beta * v_theta)
    if adaptive_weighting:
        with torch.no_grad():
            weight_positive = pixel_mean((x0_positive - x0).abs()).clamp(min=ADAPTIVE_WEIGHT_MIN)
            weight_negative = pixel_mean((x0_negative - x0).abs()).clamp(min=ADAPTIVE_WEIGHT_MIN)
    else:
        weight_positive = weight_negative = torch.ones_like(r)
    positive = pixel_mean((x0_positive - x0) ** 2) / weight_positive
    negative = pixel_mean((x0_negative - x0) ** 2) / weight_negative
    policy = advantage_clip * (r * positive + (1 - r) * negative) / beta
    reference = (
        pixel_mean((v_theta - v_ref.detach().float()) ** 2) if v_ref is not None else torch.zeros_like(r)
    )
    return NFTTerms(policy + reference_weight * reference, positive, negative, reference)


def old_policy_decay(config: NFTConfig, step: int, updates_per_step: int = 1) -> float | None:
    """``eta`` of ``theta_old <- eta theta_old + (1 - eta) theta`` after training step ``step`` (1-based).

    ``n`` counts optimizer updates so far (``step * updates_per_step``, the reference's ``global_step``)
    or, with ``old_decay_counter: steps``, training steps. ``None`` means no update this step.
    "soft": 0 (a copy) while ``n < old_flat_steps``, then ``min(start + rate * (n - flat), max)`` — the
    reference's ``return_decay`` (decay_type 1: flat 0, rate 0.001, max 0.5; decay_type 2: flat 75,
    rate 0.0075, max 0.999); "hard": 0 (a copy) every ``old_update_every`` steps; "delayed" (flowrl's
    variant): no update while ``n <= old_delay_steps``, then soft counted from there.
    """
    if config.old_update == "hard":
        return 0.0 if step % config.old_update_every == 0 else None
    count = step * updates_per_step if config.old_decay_counter == "updates" else step
    if config.old_update == "delayed":
        return delayed_decay(
            count, config.old_delay_steps, config.old_decay_start, config.old_decay_rate, config.old_decay_max
        )
    if count < config.old_flat_steps:
        return 0.0
    flat = config.old_flat_steps
    return min(config.old_decay_start + config.old_decay_rate * (count - flat), config.old_decay_max)


def delayed_decay(step: int, delay: int, start: float, rate: float, maximum: float) -> float | None:
    """``None`` (no update) for ``step <= delay``, then ``min(start + rate * (step - delay), maximum)``."""
    if step <= delay:
        return None
    return min(start + rate * (step - delay), maximum)


class DiffusionNFT(ForwardProcessAlgorithm):
    """DiffusionNFT as a trainer algorithm: clean ODE rollouts in, the NFT loss out; rows are samples."""

    metric_keys: ClassVar[dict[str, str]] = {
        "nft/positive_loss": "the implicit positive policy's x0-space error ||x0+ - x0||^2 / w+, mean over rows",
        "nft/negative_loss": "the implicit negative policy's x0-space error ||x0- - x0||^2 / w-, mean over rows",
        "nft/reference_mse": "||v_theta - v_ref||^2 to the frozen base (0 when reference_weight is 0)",
        "nft/old_deviation": "||v_theta - v_old||^2: how far the trained velocity has moved from the old policy's",
        "nft/optimality_probability": "r = clip(A, -c, c) / (2c) + 1/2, mean over rows (1/2 when advantages are balanced)",
        "nft/old_decay": "eta of the old policy's update this step (-1: no update)",
    }

    config: NFTConfig

    def loss(
        self, policy: Policy, batch: TrainBatch, pass_index: int, step: int
    ) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        x0, t, noise, x_t = noised_samples(batch, pass_index)
        v_theta = policy.velocity(x_t, t, batch.cond)
        with torch.no_grad():
            v_old = policy.old_velocity(x_t, t, batch.cond)
            v_ref = (
                policy.reference_velocity(x_t, t, batch.cond) if self.config.reference_weight > 0 else None
            )
        terms = nft_loss(
            v_theta,
            v_old,
            v_ref,
            x_t,
            x0,
            t,
            batch.advantages,
            self.config.beta,
            self.config.advantage_clip,
            self.config.reference_weight,
            self.config.adaptive_weighting,
        )
        stats = {
            "nft/positive_loss": terms.positive.detach(),
            "nft/negative_loss": terms.negative.detach(),
            "nft/reference_mse": terms.reference.detach(),
            "nft/old_deviation": pixel_mean((v_theta.detach().float() - v_old.float()) ** 2),
            "nft/optimality_probability": optimality_probability(
                batch.advantages, self.config.advantage_clip
            ),
        }
        return weighted_mean(terms.loss, batch.weights), stats

    def after_optimizer_step(self, step: int) -> StepEnd:
        decay = old_policy_decay(self.config, step, self.train_config.training.updates_per_step)
        return StepEnd(
            {} if decay is None else {OLD: decay}, {"nft/old_decay": -1.0 if decay is None else decay}
        )
