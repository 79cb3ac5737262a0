"""Flow-GRPO (Liu et al., 2025): the flat case of :mod:`flowrl.algorithms.grpo`.

``K`` independent SDE rollouts per prompt, group advantages on the final
reward, every stochastic step of a sample sharing its advantage; per
iteration ``int(timestep_fraction * num_steps)`` of each sample's stochastic
steps are trained (one pass each): the first ones in order, as the reference
code does (``trained_steps: first``), or a random subset per sample
(``random``, flowrl's earlier default). Rows are samples.

With ``ode_anchor_weight`` (lambda, flowrl's addition) each pass also holds one deterministic step ``k`` of
the sample's rollout, drawn uniformly among the steps outside the SDE window, to the frozen reference::

    L += lambda ||v_theta(x_k, t_k) - v_ref(x_k, t_k)||²        (mean over pixels)

An SDE window trains only its few high-noise steps, yet the network they train is the one that takes the
ODE steps too; the KL holds only the window's step means, and nothing else holds the low-noise steps that
decide colours and edges.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, ClassVar

import torch

from flowrl.advantages import RewardBatch, zero_std_groups
from flowrl.algorithms.base import RolloutChunk, TrainBatch, TrainRows, weighted_mean
from flowrl.algorithms.forward_process import pixel_mean
from flowrl.algorithms.grpo import FlatGRPO, GRPOAlgorithm, sde_window
from flowrl.algorithms.grpo_config import FlowGRPOConfig
from samplers import stochastic_steps

if TYPE_CHECKING:
    from flowrl.policy import Policy
    from flowrl.train_config import TrainConfig


@dataclass
class PassTransitions:
    """A pass's stored transitions: the rows, each row's step ``j``, ``x_j``, ``x_{j+1}``, their times, the
    SDE noise level and ``log p_old(x_{j+1} | x_j)``."""

    rows: torch.Tensor
    index: torch.Tensor
    x: torch.Tensor
    x_next: torch.Tensor
    t: torch.Tensor
    t_next: torch.Tensor
    noise_level: torch.Tensor
    old_log_prob: torch.Tensor


class FlowGRPO(FlatGRPO):
    """Flat Flow-GRPO: rows are samples, one pass per trained SDE step (module docstring)."""

    metric_keys: ClassVar[dict[str, str]] = {
        **GRPOAlgorithm.metric_keys,
        "grpo/dropped_samples": "share of samples in groups of equal rewards, weighted 0 (drop_zero_std_groups)",
        "grpo/ode_anchor_mse": "||v_theta - v_ref||^2 at the drawn ODE step (before ode_anchor_weight; 0 without it)",
    }

    config: FlowGRPOConfig

    def __init__(self, config: TrainConfig) -> None:
        super().__init__(config)
        num_steps = config.sampler.num_steps
        # Flow-GRPO's code trains int(num_steps * timestep_fraction) steps (its 0.99 of 10 steps: 9); an SDE
        # window takes the fraction of its own size; never more than the stochastic steps
        stochastic = self.config.sde_window_size or num_steps - 1
        span = self.config.sde_window_size or num_steps
        self.passes = min(stochastic, max(1, int(self.config.timestep_fraction * span + 1e-9)))
        #: the share of the global batch's samples in groups whose rewards differ, set by :meth:`advantages`
        self.kept_share = 1.0

    def advantages(self, rewards: RewardBatch) -> torch.Tensor:
        """The default group advantages; also the share of samples that ``drop_zero_std_groups`` keeps."""
        self.kept_share = float(1 - rewards.zero_std_groups().float().mean())
        return super().advantages(rewards)

    def training_rows(
        self, chunks: list[RolloutChunk], advantages: torch.Tensor, rewards: torch.Tensor, step: int
    ) -> TrainRows:
        data = self.sample_rows(chunks)
        weights, log = None, {}
        if self.config.drop_zero_std_groups:  # the loss averages over the global batch's kept samples
            group_size = self.train_config.training.group_size
            keep = (~zero_std_groups(rewards, group_size)).float().repeat_interleave(group_size)
            weights = keep / self.kept_share if self.kept_share > 0 else keep
            log = {"grpo/dropped_samples": 1 - self.kept_share}
        return TrainRows(data, torch.arange(advantages.shape[0]), advantages, weights, log)

    def draw(
        self,
        generator: torch.Generator,
        num_samples: int,
        sample_shape: tuple[int, ...],
        grid: torch.Tensor,
        step: int,
    ) -> dict[str, torch.Tensor]:
        """``step``: ``[passes, num_samples]`` stochastic step indices per sample: the first ``passes`` in order
        for every sample (``trained_steps: first``, Flow-GRPO's code) or a random distinct subset per sample;
        with ``ode_anchor_weight``, ``anchor``: ``[passes, num_samples]`` deterministic steps drawn uniformly."""
        num_steps = len(grid) - 1
        window = sde_window(self.train_config, step)
        stochastic = stochastic_steps(num_steps, self.config.noise_level, window)
        candidates = torch.nonzero(stochastic).flatten()
        if self.config.trained_steps == "first":
            draws = {"step": candidates[: self.passes, None].expand(self.passes, num_samples).contiguous()}
        else:
            order = torch.rand(num_samples, len(candidates), generator=generator).argsort(dim=1)[
                :, : self.passes
            ]
            draws = {"step": candidates[order].T.contiguous()}
        if self.config.ode_anchor_weight > 0:  # ``anchor``: one ODE step per pass and sample, uniformly
            deterministic = torch.nonzero(~stochastic).flatten()
            pick = torch.randint(len(deterministic), (self.passes, num_samples), generator=generator)
            draws["anchor"] = deterministic[pick]
        return draws

    def pass_transitions(self, batch: TrainBatch, pass_index: int) -> PassTransitions:
        """The stored transitions ``x_j -> x_{j+1}`` a pass trains: per row its drawn step ``j``."""
        latents = batch.data["latents"]
        index = batch.draws["step"][pass_index].to(latents.device)
        rows = torch.arange(latents.shape[0], device=latents.device)
        grid = batch.data["timesteps"]
        return PassTransitions(
            rows,
            index,
            latents[rows, index],
            latents[rows, index + 1],
            grid[rows, index],
            grid[rows, index + 1],
            torch.full((latents.shape[0],), self.config.noise_level, device=latents.device),
            batch.data["log_probs"][rows, index],
        )

    def loss(
        self, policy: Policy, batch: TrainBatch, pass_index: int, step: int
    ) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        p = self.pass_transitions(batch, pass_index)
        loss, stats = self.transition_loss(
            policy, batch, p.x, p.x_next, p.t, p.t_next, p.noise_level, p.old_log_prob
        )
        return self.with_ode_anchor(policy, batch, pass_index, loss, stats)

    def with_ode_anchor(
        self,
        policy: Policy,
        batch: TrainBatch,
        pass_index: int,
        loss: torch.Tensor,
        stats: dict[str, torch.Tensor],
    ) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        """``loss`` plus, with ``ode_anchor_weight``, the pull of the pass's drawn ODE step to the reference."""
        latents, grid = batch.data["latents"], batch.data["timesteps"]
        rows = torch.arange(latents.shape[0], device=latents.device)
        anchor = torch.zeros_like(stats["grpo/ratio"])
        if self.config.ode_anchor_weight > 0:
            k = batch.draws["anchor"][pass_index].to(latents.device)
            x_k, t_k = latents[rows, k], grid[rows, k]
            v_theta = self._velocity(policy.velocity, policy, batch.cond)(x_k, t_k, batch.cond)
            with torch.no_grad():
                v_ref = self._reference(policy)(x_k, t_k, batch.cond)
            anchor = pixel_mean((v_theta.float() - v_ref.float()) ** 2)
            loss = loss + self.config.ode_anchor_weight * weighted_mean(anchor, batch.weights)
        return loss, {**stats, "grpo/ode_anchor_mse": anchor.detach()}
