"""What Flow-GRPO and BranchGRPO share: reverse-process policy gradients on Flow-SDE transitions.

Rollouts by the behaviour policy ``theta_old`` (a copy of ``theta`` taken after
every training step, so the rollout is on-policy) through the Flow-SDE of
:mod:`samplers.sde`, keeping each transition ``x_j -> x_{j+1}`` and its
log-density ``log p_old``. For a trained transition with advantage ``A``::

    rho  = exp(log p_theta(x_{j+1} | x_j) - log p_old(x_{j+1} | x_j))
    L    = max(-A rho, -A clip(rho, 1 - eps, 1 + eps))
           + beta_KL ||mu_theta - mu_ref||^2 / (2 std_dev_t^2)

with ``mu`` the Gaussian mean of the step under theta and under the frozen
reference, averaged over dimensions, and ``A`` clipped to ``[-c, c]``. The
KL's scale is Flow-GRPO's code's ``std_dev_t`` (``a sqrt(t / (1 - t))`` for the
Flow-SDE, without the step's ``sqrt(|dt|)``; ``kl_form: reference``, the
default, so the paper's beta values port unchanged); ``kl_form: exact`` uses
the step's actual scale ``std_dev_t sqrt(|dt|)``, the closed-form KL of the two
step Gaussians, ``1 / |dt|`` times larger. An SDE
window (``sde_window_*``, fixed or sliding as in MixGRPO) makes only those
steps stochastic and trained, the others ODE. The flat case is
:mod:`flowrl.algorithms.flow_grpo`, the tree case :mod:`flowrl.algorithms.branch_grpo`.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, ClassVar

import torch

from flowrl.algorithms.base import Algorithm, RolloutChunk, StepEnd, TrainBatch, weighted_mean
from flowrl.algorithms.grpo_config import FlatGRPOConfig, GRPOConfig
from flowrl.policy import OLD, REFERENCE
from samplers import (
    SDEStep,
    VelocityFn,
    broadcast_rows,
    concat_rows,
    sde_sample,
    sliding_window,
    transition_log_prob,
)

if TYPE_CHECKING:
    from flowrl.policy import Policy
    from flowrl.train_config import TrainConfig


def grpo_clip_loss(
    log_prob: torch.Tensor, old_log_prob: torch.Tensor, advantages: torch.Tensor, clip_range: float
) -> tuple[torch.Tensor, torch.Tensor]:
    """Per transition ``max(-A rho, -A clip(rho, 1 - eps, 1 + eps))`` and the ratio ``rho``."""
    ratio = torch.exp(log_prob - old_log_prob)
    unclipped = -advantages * ratio
    clipped = -advantages * ratio.clamp(1 - clip_range, 1 + clip_range)
    return torch.maximum(unclipped, clipped), ratio


def gaussian_mean_kl(mean: torch.Tensor, reference_mean: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    """``KL(N(mean, s^2) || N(reference_mean, s^2)) = (mean - reference_mean)^2 / (2 s^2)``, averaged over dims."""
    kl = (mean - reference_mean) ** 2 / (2 * scale**2)
    return kl.mean(dim=tuple(range(1, kl.ndim)))


def sde_window(config: TrainConfig, step: int) -> tuple[int, int] | None:
    """The stochastic steps ``[start, end)`` of iteration ``step`` (1-based); None = all but the last."""
    algorithm: GRPOConfig = config.algorithm
    if not algorithm.sde_window_size:
        return None
    if algorithm.sde_window_slide:
        return sliding_window(
            step - 1,
            algorithm.sde_window_size,
            config.sampler.num_steps,
            algorithm.sde_window_stride,
            algorithm.sde_window_every,
        )
    return algorithm.sde_window_start, algorithm.sde_window_start + algorithm.sde_window_size


class GRPOAlgorithm(Algorithm):
    """What both GRPO variants share: on-policy rollouts, the clipped loss of one transition, the copy."""

    metric_keys: ClassVar[dict[str, str]] = {
        "grpo/ratio": "the importance ratio pi_theta / pi_old of the trained transitions, mean",
        "grpo/clip_fraction": "share of transitions whose ratio was clipped (|rho - 1| > clip_range)",
        "grpo/approx_kl": "(log rho)^2 / 2: an estimate of KL(pi_old || pi_theta)",
        "grpo/kl_to_reference": "the KL term to the frozen reference on the step means (before kl_weight)",
        "grpo/policy_loss": "the clipped surrogate -min(rho A, clip(rho) A), mean",
        "grpo/sde_window_start": "first stochastic step of the SDE window this step (-1: no window)",
    }

    config: GRPOConfig

    def __init__(self, config: TrainConfig) -> None:
        super().__init__(config)
        self.guidance_scale = config.sampler.guidance_scale
        self.negative_prompt = config.sampler.negative_prompt

    def prepare(self, policy: Policy) -> None:
        """Exact ratios need the rollout copy and the trained model to run the same kernels. torch's fused
        attention "fast path" (nn.TransformerEncoder, nn.MultiheadAttention) runs only for frozen or no-grad
        eval-mode calls, i.e. for the rollout copy alone: it is switched off (process-wide) for GRPO runs."""
        torch.backends.mha.set_fastpath_enabled(False)

    def _velocity(self, velocity: VelocityFn, policy: Policy, cond: Any) -> VelocityFn:
        """``velocity``, or with ``train_guidance`` its CFG mix ``v_u + w (v_c - v_u)`` with the
        unconditional branch detached; both branches in one batched call, as the sampler makes them,
        so the first inner step re-scores the rollout exactly."""
        if not (self.config.train_guidance and self.guidance_scale != 1.0):
            return velocity
        unconditional = policy.unconditional(self.negative_prompt)

        def guided(x: torch.Tensor, t: torch.Tensor, rows: Any) -> torch.Tensor:
            both = concat_rows(rows, broadcast_rows(unconditional, x.shape[0]))
            v_cond, v_uncond = velocity(torch.cat([x, x]), torch.cat([t, t]), both).chunk(2)
            v_uncond = v_uncond.detach()
            return v_uncond + self.guidance_scale * (v_cond - v_uncond)

        return guided

    def _reference(self, policy: Policy) -> VelocityFn:
        guidance = self.guidance_scale if self.config.train_guidance else 1.0
        return policy.guided(REFERENCE, guidance, self.negative_prompt)

    def transition_loss(
        self,
        policy: Policy,
        batch: TrainBatch,
        x: torch.Tensor,
        x_next: torch.Tensor,
        t: torch.Tensor,
        t_next: torch.Tensor,
        noise_level: torch.Tensor,
        old_log_prob: torch.Tensor,
        velocity: VelocityFn | None = None,
    ) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        """The clipped ratio loss plus the KL to the reference for a batch of stored transitions; ``velocity``
        (default: the trained policy's, guided as trained) gives the trained velocity at ``x``."""
        variant = self.config.sde_variant
        step: SDEStep = transition_log_prob(
            velocity or self._velocity(policy.velocity, policy, batch.cond),
            x,
            x_next,
            t,
            t_next,
            batch.cond,
            noise_level,
            variant,
        )
        advantages = batch.advantages.clamp(-self.config.advantage_clip, self.config.advantage_clip)
        policy_loss, ratio = grpo_clip_loss(step.log_prob, old_log_prob, advantages, self.config.clip_range)
        loss = policy_loss
        kl = torch.zeros_like(ratio)
        if self.config.kl_weight > 0:
            with torch.no_grad():
                reference = transition_log_prob(
                    self._reference(policy), x, x_next, t, t_next, batch.cond, noise_level, variant
                )
            scale = step.std_dev if self.config.kl_form == "reference" else step.scale
            kl = gaussian_mean_kl(step.mean, reference.mean, scale)
            loss = loss + self.config.kl_weight * kl
        log_ratio = (step.log_prob - old_log_prob).detach()
        stats = {
            "grpo/ratio": ratio.detach(),
            "grpo/clip_fraction": ((ratio.detach() - 1).abs() > self.config.clip_range).float(),
            "grpo/approx_kl": 0.5 * log_ratio**2,
            "grpo/kl_to_reference": kl.detach(),
            "grpo/policy_loss": policy_loss.detach(),
        }
        return weighted_mean(loss, batch.weights), stats

    def after_optimizer_step(self, step: int) -> StepEnd:
        """The old (behaviour) policy becomes a copy of the trained one: the next rollout is on-policy."""
        window = sde_window(self.train_config, step)
        return StepEnd({OLD: 0.0}, {"grpo/sde_window_start": -1.0 if window is None else float(window[0])})


class FlatGRPO(GRPOAlgorithm):
    """What the GRPO variants with groups of independent samples share (Flow-GRPO, PRDP): every sample's own
    Flow-SDE rollout, from its group's shared noise with ``same_group_noise``; rows are samples."""

    config: FlatGRPOConfig

    def rollout(
        self,
        velocity: VelocityFn,
        noise: torch.Tensor,
        grid: torch.Tensor,
        cond: Any,
        generator: torch.Generator,
        step: int,
    ) -> RolloutChunk:
        """Flow-SDE rollouts of iteration ``step`` (its SDE window) keeping every latent ``[B, S + 1, ...]``,
        log-probability ``[B, S]`` and the grid per sample ``[B, S + 1]``; with ``same_group_noise`` every
        sample of a group starts from its first sample's noise."""
        if self.config.same_group_noise:
            size = self.train_config.training.group_size
            noise = noise[::size].repeat_interleave(size, dim=0)
        rollout = sde_sample(
            velocity,
            noise,
            grid,
            cond,
            self.config.noise_level,
            self.config.sde_variant,
            sde_window(self.train_config, step),
            generator,
        )
        data = {
            "latents": rollout.latents,
            "log_probs": rollout.log_probs,
            "timesteps": grid.to(noise.device).expand(noise.shape[0], -1),
        }
        return RolloutChunk(rollout.x0, data)

    @staticmethod
    def sample_rows(chunks: list[RolloutChunk]) -> dict[str, torch.Tensor]:
        """The chunks' per-sample data, concatenated: one row per sample."""
        return {key: torch.cat([chunk.data[key] for chunk in chunks]) for key in chunks[0].data}
