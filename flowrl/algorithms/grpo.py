"""Flow-GRPO (Liu et al., 2025) and tree-branched BranchGRPO (Li et al., 2025): reverse-process policy gradients.

Rollouts by the sampling policy ``theta_old`` (a copy of ``theta`` taken after
every training step, so the rollout is on-policy) through the Flow-SDE of
:mod:`samplers.sde`, keeping each transition ``x_j -> x_{j+1}`` and its
log-density ``log p_old``. For a trained transition with advantage ``A``::

    rho  = exp(log p_theta(x_{j+1} | x_j) - log p_old(x_{j+1} | x_j))
    L    = max(-A rho, -A clip(rho, 1 - eps, 1 + eps))
           + beta_KL ||mu_theta - mu_ref||^2 / (2 s^2)

with ``mu`` the Gaussian mean of the step under theta and under the frozen
reference, ``s`` its scale (the closed-form KL of two Gaussians of one
scale, averaged over dimensions) and ``A`` clipped to ``[-c, c]``.

**Flow-GRPO** is the flat case: ``K`` independent SDE rollouts per prompt,
group advantages on the final reward, every stochastic step of a sample
sharing its advantage; per iteration a random ``timestep_fraction`` of each
sample's stochastic steps is trained (one pass each). An SDE window
(``sde_window_*``, fixed or sliding as in MixGRPO) makes only those steps
stochastic and trained, the others ODE.

**BranchGRPO**: one tree per prompt (:func:`samplers.tree_sample`), ``K =
branching ** len(split_steps)`` leaves sharing prefixes. Leaves get the
reward; an internal node the mean of its leaves, or the fusion of its
children's rewards weighted by ``softmax`` of their (per-dimension) edge
log-probabilities. A node's advantage is its reward centred on the nodes of
its depth in its tree, ``(R - mean_d) / (std_d + 1e-4)`` (0 where a depth has
one node), with ``std_d`` over the same nodes (``std_scope: group``) or over
that depth in all the process's trees (``batch``, the default, as Flow-GRPO's
batch std: two siblings whose rewards barely differ do not get advantages of
+-1); every edge into it at a stochastic step is a training transition. Pruning drops transitions from the loss only, never
from the rollout: depth pruning keeps edges whose step lies in a window of
depths (fixed or sliding), width pruning keeps, per tree and depth, the
quarter of nodes with the highest and the quarter with the lowest advantage.
In Mix mode (an SDE window) only window steps are trained.
"""

from __future__ import annotations

from typing import Any

import torch

from flowrl.algorithms.base import Policy, RolloutChunk, TrainBatch, TrainRows, weighted_mean
from flowrl.config import TrainConfig
from rewards.advantages import group_advantages
from samplers import (
    SDEStep,
    TreeRollout,
    VelocityFn,
    broadcast_rows,
    concat_rows,
    guided_velocity,
    sde_sample,
    select_rows,
    sliding_window,
    stochastic_steps,
    transition_log_prob,
    tree_sample,
)

DEPTH_STD_EPS = 1e-4


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
    algorithm = config.algorithm
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


class _GRPOBase:
    """What both GRPO variants share: on-policy rollouts, the clipped loss of one transition, the copy."""

    separate_sampler = False

    def __init__(self, config: TrainConfig) -> None:
        self.train_config = config
        self.config = config.algorithm
        self.guidance_scale = config.sampler.guidance_scale
        self.negative_prompt = config.sampler.negative_prompt
        # Exact ratios need the sampling copy and the trained model to run the same kernels. torch's fused
        # attention "fast path" (nn.TransformerEncoder, nn.MultiheadAttention) runs only for frozen or
        # no-grad eval-mode calls, i.e. for the sampling copy alone: it is switched off for GRPO runs.
        torch.backends.mha.set_fastpath_enabled(False)

    def _velocity(self, velocity: VelocityFn, policy: Policy, cond: Any) -> VelocityFn:
        """``velocity``, or with ``train_guidance`` its CFG mix ``v_u + w (v_c - v_u)`` with the
        unconditional branch detached; both branches in one batched call, as the sampler makes them,
        so the first inner step re-scores the rollout exactly."""
        if not (self.config.train_guidance and self.guidance_scale != 1.0):
            return velocity
        unconditional = policy.encode([self.negative_prompt])

        def guided(x: torch.Tensor, t: torch.Tensor, rows: Any) -> torch.Tensor:
            both = concat_rows(rows, broadcast_rows(unconditional, x.shape[0]))
            v_cond, v_uncond = velocity(torch.cat([x, x]), torch.cat([t, t]), both).chunk(2)
            v_uncond = v_uncond.detach()
            return v_uncond + self.guidance_scale * (v_cond - v_uncond)

        return guided

    def _reference(self, policy: Policy) -> VelocityFn:
        if self.config.train_guidance and self.guidance_scale != 1.0:
            return guided_velocity(
                policy.reference_velocity, self.guidance_scale, policy.encode([self.negative_prompt])
            )
        return policy.reference_velocity

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
    ) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        """The clipped ratio loss plus the KL to the reference for a batch of stored transitions."""
        variant = self.config.sde_variant
        step: SDEStep = transition_log_prob(
            self._velocity(policy.velocity, policy, batch.cond),
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
            kl = gaussian_mean_kl(step.mean, reference.mean, step.scale)
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

    def draw(
        self,
        generator: torch.Generator,
        num_samples: int,
        sample_shape: tuple[int, ...],
        grid: torch.Tensor,
        step: int,
    ) -> dict[str, torch.Tensor]:
        """No per-sample draws (rows that are samples override this)."""
        return {}

    def after_optimizer_step(self, policy: Policy, step: int) -> dict[str, float]:
        """The sampling policy becomes a copy of the trained one: the next rollout is on-policy."""
        policy.update_old(0.0)
        window = sde_window(self.train_config, step)
        return {"grpo/sde_window_start": -1.0 if window is None else float(window[0])}


class FlowGRPO(_GRPOBase):
    """Flat Flow-GRPO: rows are samples, one pass per trained SDE step (module docstring)."""

    def __init__(self, config: TrainConfig) -> None:
        super().__init__(config)
        num_steps = config.sampler.num_steps
        stochastic = self.config.sde_window_size or num_steps - 1
        self.passes = max(1, round(self.config.timestep_fraction * stochastic))

    def num_rows(self, num_samples: int, step: int = 1) -> int:
        return num_samples

    def rollout(
        self,
        velocity: VelocityFn,
        noise: torch.Tensor,
        grid: torch.Tensor,
        cond: Any,
        generator: torch.Generator,
        step: int,
    ) -> RolloutChunk:
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

    def training_rows(
        self, chunks: list[RolloutChunk], advantages: torch.Tensor, rewards: torch.Tensor, step: int
    ) -> TrainRows:
        data = {key: torch.cat([chunk.data[key] for chunk in chunks]) for key in chunks[0].data}
        weights, log = None, {}
        if self.config.drop_zero_std_groups:
            grouped = rewards.view(-1, self.train_config.training.group_size)
            keep = (grouped.std(dim=1) > 0).float().repeat_interleave(grouped.shape[1])
            weights, log = keep, {"grpo/dropped_samples": float(1 - keep.mean())}
        return TrainRows(data, torch.arange(advantages.shape[0]), advantages, weights, log)

    def draw(
        self,
        generator: torch.Generator,
        num_samples: int,
        sample_shape: tuple[int, ...],
        grid: torch.Tensor,
        step: int,
    ) -> dict[str, torch.Tensor]:
        """``step``: ``[passes, num_samples]`` distinct stochastic step indices per sample."""
        num_steps = len(grid) - 1
        window = sde_window(self.train_config, step)
        candidates = torch.nonzero(stochastic_steps(num_steps, self.config.noise_level, window)).flatten()
        order = torch.rand(num_samples, len(candidates), generator=generator).argsort(dim=1)[:, : self.passes]
        return {"step": candidates[order].T.contiguous()}

    def loss(
        self, policy: Policy, batch: TrainBatch, pass_index: int
    ) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        latents, log_probs = batch.data["latents"], batch.data["log_probs"]
        index = batch.draws["step"][pass_index].to(latents.device)
        rows = torch.arange(latents.shape[0], device=latents.device)
        grid = batch.data["timesteps"]
        level = torch.full((latents.shape[0],), self.config.noise_level, device=latents.device)
        return self.transition_loss(
            policy,
            batch,
            latents[rows, index],
            latents[rows, index + 1],
            grid[rows, index],
            grid[rows, index + 1],
            level,
            log_probs[rows, index],
        )


def node_rewards(tree: TreeRollout, leaf_rewards: torch.Tensor, mode: str = "mean") -> torch.Tensor:
    """``[num_nodes]`` rewards: leaves their reward; internal nodes the mean of their leaves ("mean"),
    or ``sum_c softmax_c(log p(parent -> c)) R(c)`` over their children bottom-up ("fusion")."""
    num_nodes = tree.parent.shape[0]
    leaf_rewards = leaf_rewards.double().to(tree.parent.device)
    if mode == "mean":
        paths = tree.ancestors(tree.leaf_nodes)  # [leaves, depth + 1]: every node above each leaf
        sums = torch.zeros(num_nodes, dtype=torch.float64, device=paths.device)
        counts = torch.zeros_like(sums)
        sums.index_add_(0, paths.flatten(), leaf_rewards.repeat_interleave(paths.shape[1]))
        counts.index_add_(
            0, paths.flatten(), torch.ones(paths.numel(), dtype=torch.float64, device=paths.device)
        )
        return (sums / counts).float()
    if mode != "fusion":
        raise ValueError(f"node reward mode {mode!r} is not allowed; use 'mean' or 'fusion'")
    rewards = torch.zeros(num_nodes, dtype=torch.float64, device=tree.parent.device)
    rewards[tree.leaf_nodes] = leaf_rewards
    for depth in range(int(tree.depth.max()), 0, -1):
        children = torch.nonzero(tree.depth == depth).flatten()
        parents = tree.parent[children]
        log_probs = tree.edge_log_probs[children].double()
        highest = torch.full((num_nodes,), -torch.inf, dtype=torch.float64, device=children.device)
        highest = highest.scatter_reduce(0, parents, log_probs, reduce="amax")
        weights = torch.exp(log_probs - highest[parents])
        totals = torch.zeros_like(rewards).index_add_(0, parents, weights)
        rewards.index_add_(0, parents, weights / totals[parents] * rewards[children])
    return rewards.float()


def depth_advantages(
    tree: TreeRollout, rewards: torch.Tensor, depth_std: torch.Tensor | None = None
) -> torch.Tensor:
    """``[num_nodes]``: ``(R - mean_d) / (std_d + 1e-4)`` with the mean over the nodes of the node's
    depth in its tree; the std over the same nodes, or ``depth_std[d]`` when given (pooled over
    trees, see :func:`pooled_depth_std`)."""
    groups = tree.tree * (int(tree.depth.max()) + 1) + tree.depth
    if depth_std is None:
        return group_advantages(rewards, groups, std_scope="group", eps=DEPTH_STD_EPS)
    centered = rewards.double() - group_means(rewards.double(), groups)
    return (centered / (depth_std.double()[tree.depth] + DEPTH_STD_EPS)).float()


def group_means(values: torch.Tensor, groups: torch.Tensor) -> torch.Tensor:
    """Per-element mean of its group."""
    _, inverse = torch.unique(groups, return_inverse=True)
    sums = torch.zeros(int(inverse.max()) + 1, dtype=values.dtype, device=values.device)
    counts = torch.zeros_like(sums).index_add_(0, inverse, torch.ones_like(values))
    return (sums.index_add_(0, inverse, values) / counts)[inverse]


def pooled_depth_std(trees: list[TreeRollout], rewards: list[torch.Tensor]) -> torch.Tensor:
    """``[depths]``: the (population) std of the node rewards of each depth over all the trees."""
    depth = torch.cat([tree.depth for tree in trees])
    values = torch.cat(rewards).double()
    return torch.stack([values[depth == d].std(unbiased=False) for d in range(int(depth.max()) + 1)])


def trained_edges(
    tree: TreeRollout,
    advantages: torch.Tensor,
    depth_window: tuple[int, int] | None,
    sde_window_steps: tuple[int, int] | None,
    width_pruning: bool,
) -> torch.Tensor:
    """Ids of the nodes whose incoming edge is trained, after pruning (module docstring).

    An edge into a node of depth ``d`` is the transition of step ``d - 1``;
    ``depth_window`` and ``sde_window_steps`` are ``[start, end)`` ranges of steps.
    """
    keep = tree.edge_trainable.clone()
    step = tree.depth - 1
    for window in (depth_window, sde_window_steps):
        if window is not None:
            keep &= (step >= window[0]) & (step < window[1])
    if width_pruning:
        groups = tree.tree * (int(tree.depth.max()) + 1) + tree.depth
        for group in torch.unique(groups[keep]):
            members = torch.nonzero(keep & (groups == group)).flatten()
            quarter = max(1, len(members) // 4)
            if 2 * quarter >= len(members):
                continue
            order = members[advantages[members].argsort()]
            keep[order[quarter:-quarter]] = False
    return torch.nonzero(keep).flatten()


class BranchGRPO(_GRPOBase):
    """BranchGRPO: tree rollouts, depth-wise advantages, rows are the trained edges (module docstring)."""

    passes = 1

    def __init__(self, config: TrainConfig) -> None:
        super().__init__(config)
        self.group_size = config.training.group_size

    def depth_window(self, step: int) -> tuple[int, int] | None:
        size = self.config.depth_window_size
        if not size:
            return None
        if self.config.depth_window_slide:
            return sliding_window(step - 1, size, self.train_config.sampler.num_steps)
        return self.config.depth_window_start, self.config.depth_window_start + size

    def num_rows(self, num_samples: int, step: int = 1) -> int:
        """Trained edges of ``num_samples / K`` trees at iteration ``step`` (the tree shape is fixed)."""
        trees = num_samples // self.group_size
        num_steps = self.train_config.sampler.num_steps
        splits = sorted(self.config.split_steps)
        stochastic = stochastic_steps(num_steps, self.config.noise_level, sde_window(self.train_config, step))
        depth_window, mix_window = self.depth_window(step), sde_window(self.train_config, step)
        rows = 0
        for index in range(num_steps):
            width = self.config.branching ** sum(split <= index for split in splits)
            if not (index in splits or stochastic[index]):
                continue
            if any(w is not None and not w[0] <= index < w[1] for w in (depth_window, mix_window)):
                continue
            if self.config.width_pruning:
                quarter = max(1, width // 4)
                width = width if 2 * quarter >= width else 2 * quarter
            rows += width
        return trees * rows

    def rollout(
        self,
        velocity: VelocityFn,
        noise: torch.Tensor,
        grid: torch.Tensor,
        cond: Any,
        generator: torch.Generator,
        step: int,
    ) -> RolloutChunk:
        """One tree per group, grown from the group's first noise; the leaves are the group's samples."""
        roots = torch.arange(0, noise.shape[0], self.group_size, device=noise.device)
        tree = tree_sample(
            velocity,
            noise[roots],
            grid,
            select_rows(cond, roots),
            self.config.split_steps,
            self.config.branching,
            self.config.noise_level,
            self.config.split_noise_level,
            self.config.sde_variant,
            sde_window(self.train_config, step),
            generator,
        )
        return RolloutChunk(tree.x0, tree)

    def training_rows(
        self, chunks: list[RolloutChunk], advantages: torch.Tensor, rewards: torch.Tensor, step: int
    ) -> TrainRows:
        trees: list[TreeRollout] = [chunk.data for chunk in chunks]
        offsets = [0]
        for tree in trees:
            offsets.append(offsets[-1] + tree.leaf_nodes.shape[0])
        rewards_of_nodes = [
            node_rewards(tree, rewards[offset : offset + tree.leaf_nodes.shape[0]], self.config.node_reward)
            for tree, offset in zip(trees, offsets)
        ]
        depth_std = pooled_depth_std(trees, rewards_of_nodes) if self.config.std_scope == "batch" else None
        parts: dict[str, list[torch.Tensor]] = {}
        for tree, offset, values in zip(trees, offsets, rewards_of_nodes):
            node_advantages = depth_advantages(tree, values, depth_std)
            nodes = trained_edges(
                tree,
                node_advantages,
                self.depth_window(step),
                sde_window(self.train_config, step),
                self.config.width_pruning,
            )
            parents, depth = tree.parent[nodes], tree.depth[nodes]
            columns = {
                "x": tree.states[parents],
                "x_next": tree.states[nodes],
                "t": tree.timesteps.to(depth.device)[depth - 1],
                "t_next": tree.timesteps.to(depth.device)[depth],
                "noise_level": tree.edge_noise_levels[nodes],
                "log_prob": tree.edge_log_probs[nodes],
                "advantage": node_advantages[nodes],
                "cond_index": offset + tree.tree[nodes] * self.group_size,
            }
            for key, value in columns.items():
                parts.setdefault(key, []).append(value)
        data = {key: torch.cat(values) for key, values in parts.items()}
        return TrainRows(data, data.pop("cond_index"), data.pop("advantage"))

    def loss(
        self, policy: Policy, batch: TrainBatch, pass_index: int
    ) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        data = batch.data
        return self.transition_loss(
            policy,
            batch,
            data["x"],
            data["x_next"],
            data["t"],
            data["t_next"],
            data["noise_level"],
            data["log_prob"],
        )
