"""CRD: centered reward distillation on the forward process (Zhu et al., 2026).

KL-regularised reward maximisation has the optimum ``pi* ∝ pi_ref exp(R / beta)``,
so ``R = beta log(pi* / pi_ref) + beta log Z(c)``; within a prompt group the
normaliser ``log Z(c)`` is shared and **centering** removes it. The implicit
log-ratio of a sample is estimated, as in the reference code (X-GenGroup/Flow-Factory,
``trainers/crd.py``), by how much better ``theta`` predicts the flow-matching velocity
``v* = eps - x0`` than the old model does, at a fresh ``x_t = (1 - t) x0 + t eps``::

    e_m   = ||v_m - v*||² / w_m,   w_m = sg(mean |v_m - v*|)    adaptive weighting (w = 1 when off), m = theta, old
    l     = -(e_theta - e_old)                                 implicit log-ratio of theta against old
    r     = clip(A, -c, c) / (2 c) + 1/2                       optimality probability, as DiffusionNFT
    l_c, r_c = l - mean_group l,  r - mean_group r              centred within each prompt group
    squared:   L = (c / beta) (beta l_c - r_c)²
    logistic:  L = (c / beta) BCE(beta l_c, sigmoid(r_c))       (the reference's soft target)

**Uncentred log-ratio** (``center_log_ratio: false``, flowrl's variant): ``l`` in place of ``l_c``. Since
``sum_i (beta l_i - r_c,i)² = sum_i (beta l_c,i - r_c,i)² + n (beta mean l)²``, it is the centred matching
plus a restoring force on the group's mean log-ratio, which the centred loss leaves free: a change of
theta that moves every sample's likelihood alike (all colours at once) is otherwise held back by the
anchor alone. It reads ``log Z(c)`` to first order as ``mean r / beta`` (``E_old[l] = 0`` for a small
step). Measured on the shapes world it does not help: with the old model frozen both forms ran away,
and with the old model's decay capped at 0.95 the centred form held where this one ran away
(docs/results.md).

(``c / beta`` is the reference's scale of the policy term, as in DiffusionNFT's loss;
``crd_error_space: x0`` takes the errors in x0 space instead, ``t (v - v*) = -(x_t - t v - x0)``,
flowrl's earlier form: for a sample-predicting model the velocity error is the x0 error over ``t``;
the reference centres over every process's micro-batch, flowrl per prompt group, as
the paper derives it)
plus the **KL anchor** to the CFG-guided base model,
``k_i ||v_theta - v_ref^w||²`` with ``v_ref^w = v_ref(∅) + w (v_ref(c) - v_ref(∅))``
at the anchor's guidance ``w`` (the semantics the base model is used with),
and a **reward-adaptive strength** (the paper: small where rewards are low, for fast
early learning under a large nominal KL; larger where they are high, against late
exploitation of reward loopholes)::

    k_i = lambda s(step) (floor + (1 - floor) r_i)

per sample, with ``r_i`` its optimality probability (``anchor_adaptive: optimality``,
the default and the reference code's form: ``lambda`` 0.1, floor 1e-3) and a linear
schedule ``s``. ``reward_level`` replaces ``r_i`` by the batch's reward level
``clip((mean R - low) / (high - low), 0, 1)`` (``mean R`` the raw total reward of the
step's global batch, computed once by the advantages hook): flowrl's reading of the
paper's text, which depends on the reward's raw scale (the sanity ladder's brightness
at 0.5 held that CRD still, its negation at -0.5 let it run); ``none`` is constant.
The loss is the mean over samples.

For the squared form the gradient through the group means vanishes exactly
(centred residuals sum to zero in a group), so each micro-batch needs whole
groups for the means' values only: micro-batches must hold whole groups.

**Decoupled rollout copy.** Rollouts come from a separate ``rollout`` copy that
follows ``theta`` for the first ``rollout_delay_steps`` optimizer updates and then
moves slowly (``theta_s <- eta theta_s + (1 - eta) theta``, ``eta = min(rate (n - delay),
max)``); the ``old`` model of the log-ratio follows ``theta`` on its own
(DiffusionNFT's) schedule. Both count optimizer updates ``n`` (``old_decay_counter``),
as the reference does. The defaults (75, 0.0075, 0.999) are the reference's
``sampling_model_decay`` (DiffusionNFT's decay_type 2), whose first phase *copies*
theta (``rollout_first_phase: copy``); ``hold`` keeps the base instead (flowrl's
earlier variant, whose training reward cannot move during the delay).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, ClassVar

import torch
import torch.nn.functional as F

from flowrl.advantages import RewardBatch
from flowrl.algorithms.base import StepEnd, TrainBatch, weighted_mean, whole_groups
from flowrl.algorithms.crd_config import CRDConfig
from flowrl.algorithms.forward_process import ADAPTIVE_WEIGHT_MIN, noised_samples, pixel_mean
from flowrl.algorithms.nft import DiffusionNFT, delayed_decay, old_policy_decay, optimality_probability
from flowrl.policy import OLD, REFERENCE, ROLLOUT

if TYPE_CHECKING:
    from flowrl.policy import Policy
    from flowrl.train_config import TrainConfig


def velocity_error(
    v: torch.Tensor, target: torch.Tensor, adaptive: bool, scale: torch.Tensor | None = None
) -> torch.Tensor:
    """``e = ||s (v - v*)||² / w`` per sample (``w = sg(mean |s (v - v*)|)``, at least 1e-5, or 1); ``s = 1``
    (velocity space) or ``s = t`` per sample (x0 space: ``t (v - v*) = -(x_t - t v - x0)``)."""
    error = v - target
    if scale is not None:
        error = scale.reshape(-1, *([1] * (error.ndim - 1))) * error
    squared = pixel_mean(error**2)
    if not adaptive:
        return squared
    with torch.no_grad():
        weight = pixel_mean(error.abs()).clamp(min=ADAPTIVE_WEIGHT_MIN)
    return squared / weight


def group_centred(values: torch.Tensor, group_size: int) -> torch.Tensor:
    """``values - mean`` over consecutive groups of ``group_size`` rows."""
    grouped = values.view(-1, group_size)
    return (grouped - grouped.mean(dim=1, keepdim=True)).reshape(-1)


@dataclass
class CRDTerms:
    """The loss and its parts, per sample ``[B]``."""

    loss: torch.Tensor
    matching: torch.Tensor
    anchor: torch.Tensor
    log_ratio: torch.Tensor
    anchor_strength: torch.Tensor


def crd_loss(
    v_theta: torch.Tensor,
    v_old: torch.Tensor,
    v_anchor: torch.Tensor,
    noise: torch.Tensor,
    x0: torch.Tensor,
    advantages: torch.Tensor,
    group_size: int,
    beta: float,
    advantage_clip: float,
    form: str = "squared",
    adaptive_weighting: bool = True,
    anchor_strength: torch.Tensor | None = None,
    x0_space_t: torch.Tensor | None = None,
    center_log_ratio: bool = True,
) -> CRDTerms:
    """The CRD loss of the module docstring, per sample; rows are whole groups of ``group_size``; with
    ``x0_space_t`` (the rows' times) the errors are taken in x0 space (``crd_error_space: x0``); with
    ``center_log_ratio=False`` the log-ratio is matched uncentred (``l`` for ``l_c``)."""
    if x0.shape[0] % group_size:
        raise ValueError(f"CRD needs whole groups: {x0.shape[0]} rows are not groups of {group_size}")
    target = noise.float() - x0.float()
    scale = None if x0_space_t is None else x0_space_t.float()
    e_theta = velocity_error(v_theta.float(), target, adaptive_weighting, scale)
    with torch.no_grad():
        e_old = velocity_error(v_old.detach().float(), target, adaptive_weighting, scale)
    log_ratio = -(e_theta - e_old)
    r = optimality_probability(advantages.float(), advantage_clip)
    logits = beta * (group_centred(log_ratio, group_size) if center_log_ratio else log_ratio)
    if form == "squared":
        matching = (logits - group_centred(r, group_size)) ** 2
    elif form == "logistic":
        soft_target = torch.sigmoid(group_centred(r, group_size))
        matching = F.binary_cross_entropy_with_logits(logits, soft_target, reduction="none")
    else:
        raise ValueError(f"unknown CRD loss form {form!r}; allowed: squared, logistic")
    matching = matching * (advantage_clip / beta)
    strength = torch.ones_like(r) if anchor_strength is None else anchor_strength.float()
    anchor = pixel_mean((v_theta.float() - v_anchor.detach().float()) ** 2)
    return CRDTerms(matching + strength * anchor, matching, anchor, log_ratio.detach(), strength)


class CRD(DiffusionNFT):
    """CRD as a trainer algorithm: DiffusionNFT's rollouts, rows and draws; the CRD loss; two schedules."""

    metric_keys: ClassVar[dict[str, str]] = {
        "crd/matching_loss": "(c / beta) times the matching of beta l_c to r_c, mean over rows",
        "crd/anchor_mse": "||v_theta - v_anchor||^2 to the CFG-guided base velocity",
        "crd/anchor_strength": "the anchor's weight per row (anchor_weight x schedule x adaptive factor), mean",
        "crd/reward_level": "the step's mean raw reward mapped by anchor_reward_range to [0, 1]",
        "crd/log_ratio_std": "standard deviation of the implicit log-ratio l over the rows",
        "crd/optimality_probability": "r = clip(A, -c, c) / (2c) + 1/2, mean over rows",
        "crd/old_decay": "eta of the old policy's update this step (-1: no update)",
        "crd/rollout_decay": "eta of the rollout copy's update this step (-1: no update)",
    }

    config: CRDConfig
    copies = (OLD, ROLLOUT)

    def __init__(self, config: TrainConfig) -> None:
        super().__init__(config)
        self.negative_prompt = config.sampler.negative_prompt
        self.group_size = config.training.group_size
        #: the step's reward level in [0, 1], set by :meth:`advantages` before the step's losses
        self.reward_level = 0.0

    def num_rows(self, num_samples: int, step: int = 1) -> int:
        whole_groups("crd", num_samples, self.group_size)
        return num_samples

    def advantages(self, rewards: RewardBatch) -> torch.Tensor:
        """The default group advantages; also the step's reward level for the anchor (module docstring)."""
        low, high = self.config.anchor_reward_range
        self.reward_level = float(((rewards.total.float().mean() - low) / (high - low)).clamp(0.0, 1.0))
        return super().advantages(rewards)

    def anchor_strength(self, advantages: torch.Tensor, step: int) -> torch.Tensor:
        """``lambda s(step) (floor + (1 - floor) a)`` per sample, ``a`` the reward level (or ``r_i``, or 1)."""
        config = self.config
        if config.anchor_schedule_steps:
            progress = min(step / config.anchor_schedule_steps, 1.0)
            factor = 1.0 + (config.anchor_schedule_end - 1.0) * progress
        else:
            factor = 1.0
        strength = torch.full_like(advantages, config.anchor_weight * factor, dtype=torch.float32)
        if config.anchor_adaptive == "optimality":
            adaptive = optimality_probability(advantages.float(), config.advantage_clip)
        elif config.anchor_adaptive == "reward_level":
            adaptive = torch.full_like(strength, self.reward_level)
        else:
            return strength
        return strength * (config.anchor_floor + (1 - config.anchor_floor) * adaptive)

    def loss(
        self, policy: Policy, batch: TrainBatch, pass_index: int, step: int
    ) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        x0, t, noise, x_t = noised_samples(batch, pass_index)
        v_theta = policy.velocity(x_t, t, batch.cond)
        with torch.no_grad():
            v_old = policy.old_velocity(x_t, t, batch.cond)
            anchor_velocity = policy.guided(REFERENCE, self.config.anchor_guidance, self.negative_prompt)
            v_anchor = anchor_velocity(x_t, t, batch.cond)
        terms = crd_loss(
            v_theta,
            v_old,
            v_anchor,
            noise,
            x0,
            batch.advantages,
            self.group_size,
            self.config.crd_beta,
            self.config.advantage_clip,
            self.config.crd_loss,
            self.config.adaptive_weighting,
            self.anchor_strength(batch.advantages, step),
            t if self.config.crd_error_space == "x0" else None,
            self.config.center_log_ratio,
        )
        stats = {
            "crd/matching_loss": terms.matching.detach(),
            "crd/anchor_mse": terms.anchor.detach(),
            "crd/anchor_strength": terms.anchor_strength,
            "crd/reward_level": torch.full((1,), self.reward_level),
            "crd/log_ratio_std": terms.log_ratio.std().reshape(1),
            "crd/optimality_probability": optimality_probability(
                batch.advantages, self.config.advantage_clip
            ),
        }
        return weighted_mean(terms.loss, batch.weights), stats

    def after_optimizer_step(self, step: int) -> StepEnd:
        config = self.config
        updates_per_step = self.train_config.training.updates_per_step
        old_decay = old_policy_decay(config, step, updates_per_step)
        count = step * updates_per_step if config.old_decay_counter == "updates" else step
        if config.rollout_first_phase == "copy" and count <= config.rollout_delay_steps:
            rollout_decay: float | None = 0.0
        else:
            rollout_decay = delayed_decay(
                count,
                config.rollout_delay_steps,
                config.rollout_decay_start,
                config.rollout_decay_rate,
                config.rollout_decay_max,
            )
        decays = {
            role: decay for role, decay in ((OLD, old_decay), (ROLLOUT, rollout_decay)) if decay is not None
        }
        log = {
            "crd/old_decay": -1.0 if old_decay is None else old_decay,
            "crd/rollout_decay": -1.0 if rollout_decay is None else rollout_decay,
        }
        return StepEnd(decays, log)
