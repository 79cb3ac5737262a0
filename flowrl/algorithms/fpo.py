"""FPO: Flow Policy Optimization (McAllister, Ge, Yi et al., 2025), PPO with a ratio from the flow-matching loss.

Rollouts by the old policy with any solver, CFG-free; only the clean samples ``x0`` and their group
advantages ``A`` are kept (no log-probabilities, so no SDE). For each sample, ``N`` Monte-Carlo draws
``(t_k, eps_k)``, made once per step and shared by every epoch, give ``x_k = (1 - t_k) x0 + t_k eps_k`` and
the conditional flow-matching loss of a velocity ``v``::

    l_v(k) = || v(x_k, t_k, c) - (eps_k - x0) ||²                    (mean over pixels)

Its difference between the old and the trained policy estimates the change of the ELBO, which stands in
for the log-likelihood ratio::

    rho   = exp( mean_k l_old(k) - mean_k l_theta(k) )              ratio: sample (the reference's default)
    rho_k = exp( clip(l_old(k) - l_theta(k), -3, 3) )               ratio: draw

and PPO's clipped surrogate is maximised (``e = clip_range``; the mean runs over samples, and over draws
with ``ratio: draw``)::

    L = - mean[ min( rho A, clip(rho, 1 - e, 1 + e) A ) ]  +  lambda mean_k || v_theta - v_ref ||²

(``lambda = reference_weight``, 0 in the paper). ``l_old`` is computed by the old copy, which sampled the
rollouts and becomes the trained weights after every step (on-policy), so ``rho = 1`` at the first update
of a step and ``grad L = A grad mean_k l_theta`` there: an advantage-weighted flow-matching step (towards
the samples with ``A > 0``, away from the others), which the clip stops once the ratio leaves
``[1 - e, 1 + e]`` on the side the advantage favours. ``epochs`` passes
run over the batch with the same draws (PPO's epochs).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, ClassVar

import torch

from flowrl.algorithms.base import StepEnd, TrainBatch, weighted_mean
from flowrl.algorithms.forward_process import ForwardProcessAlgorithm, pixel_mean
from flowrl.algorithms.fpo_config import FPOConfig
from flowrl.policy import OLD
from samplers import select_rows

if TYPE_CHECKING:
    from flowrl.policy import Policy
    from flowrl.train_config import TrainConfig

#: the bound on each draw's log-ratio before ``exp`` with ``ratio: draw`` (the reference's)
DRAW_LOG_RATIO_CLIP = 3.0


def cfm_losses(velocity: torch.Tensor, x0: torch.Tensor, noise: torch.Tensor) -> torch.Tensor:
    """``||v - (eps - x0)||²`` per draw and sample, mean over pixels: ``[N, B]`` from ``[N, B, ...]``."""
    error = velocity.float() - (noise.float() - x0.float().unsqueeze(0))
    return error.pow(2).mean(dim=tuple(range(2, error.ndim)))


def fpo_ratio(old_losses: torch.Tensor, losses: torch.Tensor, mode: str) -> torch.Tensor:
    """The ratio of the module docstring from ``[N, B]`` losses: ``[1, B]`` (``sample``) or ``[N, B]``."""
    if mode == "sample":
        return torch.exp(old_losses.mean(dim=0, keepdim=True) - losses.mean(dim=0, keepdim=True))
    return torch.exp((old_losses - losses).clamp(-DRAW_LOG_RATIO_CLIP, DRAW_LOG_RATIO_CLIP))


def clipped_surrogate(ratio: torch.Tensor, advantages: torch.Tensor, clip_range: float) -> torch.Tensor:
    """``-min(rho A, clip(rho, 1 - e, 1 + e) A)`` averaged over the ratio's draws: ``[B]``."""
    unclipped = ratio * advantages
    clipped = ratio.clamp(1 - clip_range, 1 + clip_range) * advantages
    return -torch.minimum(unclipped, clipped).mean(dim=0)


class FPO(ForwardProcessAlgorithm):
    """FPO as a trainer algorithm: clean ODE rollouts, ``N`` draws per sample, ``epochs`` PPO passes."""

    metric_keys: ClassVar[dict[str, str]] = {
        "fpo/ratio": "the FPO ratio rho = exp(l_old - l_theta), mean over rows (and draws with ratio: draw)",
        "fpo/ratio_deviation": "|rho - 1|, mean over rows: how far the trained policy has moved this step",
        "fpo/clip_fraction": "share of ratios outside [1 - clip_range, 1 + clip_range]",
        "fpo/cfm_loss": "the trained policy's flow-matching loss l_theta, mean over draws and rows",
        "fpo/reference_mse": "||v_theta - v_ref||^2 to the frozen base (0 when reference_weight is 0)",
    }

    config: FPOConfig

    def __init__(self, config: TrainConfig) -> None:
        super().__init__(config)
        self.passes = self.config.epochs

    def loss(
        self, policy: Policy, batch: TrainBatch, pass_index: int, step: int
    ) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        """Every draw of every row in one forward of the trained (and one of the old) velocity."""
        x0 = batch.x0
        draws, rows = batch.draws["t"].shape
        t = batch.draws["t"].to(x0.device)
        noise = batch.draws["noise"].to(x0.device, x0.dtype)
        column = t.reshape(draws, rows, *([1] * (x0.ndim - 1))).to(x0.dtype)
        x_t = ((1 - column) * x0.unsqueeze(0) + column * noise).flatten(0, 1)
        times, cond = t.flatten(), select_rows(batch.cond, torch.arange(rows).repeat(draws))
        v_theta = policy.velocity(x_t, times, cond)
        with torch.no_grad():
            old_losses = cfm_losses(
                policy.old_velocity(x_t, times, cond).unflatten(0, (draws, rows)), x0, noise
            )
        losses = cfm_losses(v_theta.unflatten(0, (draws, rows)), x0, noise)
        ratio = fpo_ratio(old_losses, losses, self.config.ratio)
        surrogate = clipped_surrogate(ratio, batch.advantages.float().unsqueeze(0), self.config.clip_range)
        reference = torch.zeros_like(surrogate)
        if self.config.reference_weight > 0:
            with torch.no_grad():
                v_ref = policy.reference_velocity(x_t, times, cond)
            reference = pixel_mean((v_theta.float() - v_ref.float()) ** 2).unflatten(0, (draws, rows)).mean(0)
        stats = {
            "fpo/ratio": ratio.detach().mean(dim=0),
            "fpo/ratio_deviation": (ratio.detach() - 1).abs().mean(dim=0),
            "fpo/clip_fraction": ((ratio.detach() - 1).abs() > self.config.clip_range).float().mean(dim=0),
            "fpo/cfm_loss": losses.detach().mean(dim=0),
            "fpo/reference_mse": reference.detach(),
        }
        return weighted_mean(surrogate + self.config.reference_weight * reference, batch.weights), stats

    def after_optimizer_step(self, step: int) -> StepEnd:
        """The old copy becomes the trained weights (on-policy: it samples the next rollouts)."""
        return StepEnd({OLD: 0.0})
