"""BranchGRPO (Li et al., 2025): tree-branched rollouts on the loss of :mod:`flowrl.algorithms.grpo`.

One tree per prompt (:func:`samplers.tree_sample`), ``K =
branching ** len(split_steps)`` leaves sharing prefixes. Leaves get the
reward; an internal node the mean of its leaves, or the fusion of its
children's rewards weighted by ``softmax`` of their (per-dimension) edge
log-probabilities. A node's advantage is its reward centred on the nodes of
its depth in its tree, ``(R - mean_d) / (std_d + 1e-4)`` (0 where a depth has
one node), with ``std_d`` over the same nodes (``std_scope: group``) or over
that depth in all the process's trees (``batch``, the default, as Flow-GRPO's
batch std: two siblings whose rewards barely differ do not get advantages of
+-1); every edge into it at a stochastic step is a training transition. Pruning drops transitions
from the loss only, never from the rollout: depth pruning keeps edges whose
step lies in a window of depths (fixed or sliding), width pruning keeps, per
tree and depth, the quarter of nodes with the highest and the quarter with
the lowest advantage. In Mix mode (an SDE window) only window steps are trained.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import torch

from flowrl.advantages import group_advantages
from flowrl.algorithms.base import RolloutChunk, TrainBatch, TrainRows
from flowrl.algorithms.grpo import GRPOAlgorithm, sde_window
from flowrl.algorithms.grpo_config import BranchGRPOConfig
from samplers import TreeRollout, VelocityFn, select_rows, sliding_window, stochastic_steps, tree_sample

if TYPE_CHECKING:
    from flowrl.config import TrainConfig
    from flowrl.policy import Policy

DEPTH_STD_EPS = 1e-4


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


class BranchGRPO(GRPOAlgorithm):
    """BranchGRPO: tree rollouts, depth-wise advantages, rows are the trained edges (module docstring)."""

    config: BranchGRPOConfig

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
        self, policy: Policy, batch: TrainBatch, pass_index: int, step: int
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
