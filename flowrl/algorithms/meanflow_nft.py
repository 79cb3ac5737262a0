"""MeanFlowNFT: DiffusionNFT for few-step MeanFlow generators.

A MeanFlow policy predicts the average velocity ``u(x, r, t)`` and samples in
a few steps ``x_r = x_t - (t - r) u``; DiffusionNFT needs an instantaneous
velocity. The MeanFlow identity gives one, induced by ``u``::

    V(x_t, r, t) = u(x_t, r, t) + (t - r) sg(d/dt u(x_t, r, t)),   d/dt = d_x . (eps - x0) + d_t

and the DiffusionNFT loss (:func:`flowrl.algorithms.nft.nft_loss`) is applied
to ``V_theta`` and ``V_old`` at ``x_t = (1 - t) x0 + t eps``. The derivative
term is under stop-gradient (``sg``), as in MeanFlow's own loss: its tangent
``eps - x0`` is the regression target, and a gradient through it makes the
loss non-stationary at the exact MeanFlow solution (tested on Gaussian data,
where ``u`` has a closed form). ``d/dt`` is, as in the reference code
(Harahan/MeanFlowNFT), a no-grad central difference with step ``h =
meanflow_step`` (5e-3) taken once on the old model and shared:
``V_theta = u_theta + (t - r) du_old/dt``, so ``V_theta - V_old = u_theta -
u_old`` and the loss is stationary at ``theta = old`` whatever the advantages.
``meanflow_derivative: jvp`` takes an exact JVP of ``u_theta`` instead; then
``V_theta`` carries theta's own derivative, which drifts the model in a
direction the advantage's sign does not decide (on the sanity ladder's tiny
model, one seed: brightness +0.064 with the reward, +0.001 with it flipped).
The reference term compares average
velocities, ``lambda ||u_theta - u_ref||²``. At ``r = t`` everything is
DiffusionNFT's.

``(t, r)`` (``meanflow_interval``): MeanFlow's own pairs (``pairs``, the
default: ``t, r`` the larger and smaller of two ``U(0, 1)`` draws, with
shares ``meanflow_equal_share`` at ``r = t`` and ``meanflow_zero_share`` at
``r = 0``); or ``t`` as DiffusionNFT draws it (rollout grid or sampled) and
``r`` the next time of the rollout grid (``grid``, the intervals the
few-step sampler takes), ``t`` itself (``equal``) or ``U(0, t)``
(``uniform``).

Why the shares matter, for a sample-predicting model ``u = (x_t - h) / t``
(``h`` its endpoint estimate): the x0-space error of the induced velocity is
``x_t - t V - x0 = (r / t)(h - x0) + (t - r) dh/dt``, so only rows with ``r``
near ``t`` regress ``h`` onto the rewarded sample; an ``r = 0`` row sees the
sample only through the tangent of ``dh/dt``. Trained on the sampler's
intervals alone (``grid``) the shapes MeanFlow model lost held-out score;
``pairs`` keeps it roughly, without lifting it (README, MeanFlowNFT). Rollouts: the average-velocity sampler
on the rollout grid (``sampler.num_steps``, typically 4), CFG-free.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, ClassVar

import torch

from flowrl.algorithms.base import RolloutChunk, TrainBatch, weighted_mean
from flowrl.algorithms.forward_process import noised_samples, pixel_mean
from flowrl.algorithms.meanflow_nft_config import MeanFlowNFTConfig
from flowrl.algorithms.nft import DiffusionNFT, nft_loss, optimality_probability
from samplers import VelocityFn, induced_velocity, interval_pairs, meanflow_sample

if TYPE_CHECKING:
    from flowrl.policy import Policy
    from flowrl.train_config import TrainConfig


def interval_starts(
    t: torch.Tensor, grid: torch.Tensor, mode: str, generator: torch.Generator
) -> torch.Tensor:
    """``r`` for training times ``t`` (any shape): the next grid time, ``t`` itself, or ``U(0, t)``."""
    if mode == "equal":
        return t.clone()
    if mode == "uniform":
        return t * torch.rand(t.shape, generator=generator)
    grid = grid.float()
    # the first grid time strictly below t (t is a grid time in "grid" timestep mode)
    below = (grid[None, :] < t.reshape(-1, 1) - 1e-7).float()
    index = below.argmax(dim=1)
    return grid[index].reshape(t.shape)


class MeanFlowNFT(DiffusionNFT):
    """MeanFlowNFT as a trainer algorithm (module docstring); rows are samples, as DiffusionNFT's."""

    metric_keys: ClassVar[dict[str, str]] = {
        **DiffusionNFT.metric_keys,
        "meanflow/interval": "t - r of the trained intervals (0: the instantaneous velocity), mean over rows",
    }

    config: MeanFlowNFTConfig

    def __init__(self, config: TrainConfig) -> None:
        super().__init__(config)
        self.derivative = self.config.meanflow_derivative
        self.interval = self.config.meanflow_interval

    def rollout(
        self,
        velocity: VelocityFn,
        noise: torch.Tensor,
        grid: torch.Tensor,
        cond: Any,
        generator: torch.Generator,
        step: int,
    ) -> RolloutChunk:
        """Average-velocity steps over the rollout grid: ``x_r = x_t - (t - r) u(x_t, r, t)``."""
        return RolloutChunk(meanflow_sample(lambda x, r, t, c: velocity(x, t, c, r=r), noise, grid, cond).x0)

    def draw(
        self,
        generator: torch.Generator,
        num_samples: int,
        sample_shape: tuple[int, ...],
        grid: torch.Tensor,
        step: int,
    ) -> dict[str, torch.Tensor]:
        draws = super().draw(generator, num_samples, sample_shape, grid, step)
        if self.interval == "pairs":
            shape = draws["t"].shape
            draws["t"], draws["r"] = interval_pairs(
                torch.rand(shape, generator=generator),
                torch.rand(shape, generator=generator),
                torch.rand(shape, generator=generator),
                self.config.meanflow_equal_share,
                self.config.meanflow_zero_share,
            )
        else:
            draws["r"] = interval_starts(draws["t"], grid, self.interval, generator)
        return draws

    def loss(
        self, policy: Policy, batch: TrainBatch, pass_index: int, step: int
    ) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        x0, t, noise, x_t = noised_samples(batch, pass_index)
        r = batch.draws["r"][pass_index].to(x0.device)
        direction = noise - x0

        def average(network):
            return lambda x, r_, t_, c: network(x, t_, c, r=r_)

        # at r = t the derivative term (t - r) du/dt vanishes: V = u, no extra passes (``meanflow_interval: equal``)
        derivative = "none" if bool((t == r).all()) else self.derivative
        with torch.no_grad():
            if derivative == "none":
                v_old = u_old = policy.old_velocity(x_t, t, batch.cond, r=r)
            elif derivative == "jvp":
                v_old, _ = induced_velocity(average(policy.old_velocity), x_t, r, t, batch.cond, direction)
            else:
                v_old, u_old = induced_velocity(
                    average(policy.old_velocity),
                    x_t,
                    r,
                    t,
                    batch.cond,
                    direction,
                    "central",
                    self.config.meanflow_step,
                )
            u_ref = (
                policy.reference_velocity(x_t, t, batch.cond, r=r)
                if self.config.reference_weight > 0
                else None
            )
        if derivative == "jvp":
            v_theta, u_theta = induced_velocity(average(policy.velocity), x_t, r, t, batch.cond, direction)
        else:
            u_theta = policy.velocity(x_t, t, batch.cond, r=r)
            v_theta = u_theta + (v_old - u_old)  # shares the old model's (t - r) du/dt
        terms = nft_loss(
            v_theta,
            v_old,
            None,
            x_t,
            x0,
            t,
            batch.advantages,
            self.config.beta,
            self.config.advantage_clip,
            0.0,
            self.config.adaptive_weighting,
        )
        loss = terms.loss
        reference = torch.zeros_like(loss)
        if u_ref is not None:
            reference = pixel_mean((u_theta.float() - u_ref.float()) ** 2)
            loss = loss + self.config.reference_weight * reference
        stats = {
            "nft/positive_loss": terms.positive.detach(),
            "nft/negative_loss": terms.negative.detach(),
            "nft/reference_mse": reference.detach(),
            "nft/old_deviation": pixel_mean((v_theta.detach().float() - v_old.float()) ** 2),
            "nft/optimality_probability": optimality_probability(
                batch.advantages, self.config.advantage_clip
            ),
            "meanflow/interval": (t - r).float(),
        }
        return weighted_mean(loss, batch.weights), stats
