"""BranchGRPO (Li et al., 2025): tree-branched rollouts on the loss of :mod:`flowrl.algorithms.grpo`.

One tree per prompt (:func:`samplers.tree_sample`), ``K = branching ** len(split_steps)`` leaves sharing
prefixes. Leaves get the reward; an internal node the mean of its leaves, or the fusion of its
children's rewards weighted by ``softmax`` of their (per-dimension) edge log-probabilities. A node's
advantage is its reward normalised over the nodes of its depth::

    A = (R - mean_d) / (std_d + 1e-8),   std_d the sample std (n - 1);  A = 0 where std_d < 1e-6 or n = 1

per tree (``std_scope: group``, as BranchGRPO's code), or with ``std_d`` pooled over that depth of every
tree of the *global* batch (``batch``: computed once by the advantages hook from the gathered leaf
rewards, so one process and two train alike), or, flowrl's variant ``leaves``, by the std of the tree's
leaf rewards at every depth: a node's advantage is then its subtree's mean deviation in the leaves' units,
so a shallow split whose halves differ by chance gets a small advantage (the per-depth std of two nodes
makes it ±0.71 whatever their difference) and the leaves' advantages are Flow-GRPO's group advantages.
``depth_std: population`` is flowrl's earlier form,
``(R - mean_d) / (std_pop + 1e-4)``. Every edge into a node at a stochastic step is a training
transition (the last step too, as in the reference). Pruning drops transitions from the loss only,
never from the rollout, in the reference's modes: depth pruning removes listed depths (sliding one depth
shallower every ``depth_pruning_interval`` iterations down to a stop depth); width pruning keeps, of the
transitions after the last split, the best half of each branch (``best_half``) or the best and worst
quarter pooled over the process's trees (``best_and_worst``). flowrl's variants: a window of depths
(``depth_window_*``) and per-tree, per-depth quartiles (``width_pruning: quartiles``). In Mix mode (an
SDE window) only window steps are trained.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import torch

from flowrl.advantages import RewardBatch, reward_advantages
from flowrl.algorithms.base import RolloutChunk, TrainBatch, TrainRows
from flowrl.algorithms.grpo import GRPOAlgorithm, sde_window
from flowrl.algorithms.grpo_config import BranchGRPOConfig
from samplers import TreeRollout, VelocityFn, select_rows, sliding_window, stochastic_steps, tree_sample

if TYPE_CHECKING:
    from flowrl.policy import Policy
    from flowrl.train_config import TrainConfig

#: the reference's depth-wise normalisation: std + 1e-8, and zero advantages below a std of 1e-6
SAMPLE_STD_EPS, ZERO_STD = 1e-8, 1e-6
#: flowrl's earlier form: population std + 1e-4
POPULATION_STD_EPS = 1e-4


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


def normalise(centered: torch.Tensor, std: torch.Tensor, form: str) -> torch.Tensor:
    """``centered / (std + eps)`` by the form's rule (module docstring); float64 in, float32 out."""
    if form == "population":
        return (centered / (std + POPULATION_STD_EPS)).float()
    return torch.where(std < ZERO_STD, torch.zeros_like(centered), centered / (std + SAMPLE_STD_EPS)).float()


def depth_advantages(
    tree: TreeRollout, rewards: torch.Tensor, depth_std: torch.Tensor | None = None, form: str = "sample"
) -> torch.Tensor:
    """``[num_nodes]``: each node's reward centred on the nodes of its depth in its tree, divided by the
    std of the same nodes (sample or population, ``form``) or by ``depth_std[d]`` when given (pooled over
    the global batch, :func:`global_depth_std`)."""
    groups = tree.tree * (int(tree.depth.max()) + 1) + tree.depth
    values = rewards.double()
    centered = values - group_means(values, groups)
    if depth_std is not None:
        return normalise(centered, depth_std.double()[tree.depth], form)
    _, inverse = torch.unique(groups, return_inverse=True)
    counts = torch.zeros(int(inverse.max()) + 1, dtype=torch.float64).index_add_(
        0, inverse, torch.ones_like(values)
    )
    squares = torch.zeros_like(counts).index_add_(0, inverse, centered**2)
    divisor = counts if form == "population" else (counts - 1).clamp(min=1)
    std = torch.where(counts > 1, (squares / divisor).sqrt(), torch.zeros_like(counts))[inverse]
    return normalise(centered, std, form)


def group_means(values: torch.Tensor, groups: torch.Tensor) -> torch.Tensor:
    """Per-element mean of its group."""
    _, inverse = torch.unique(groups, return_inverse=True)
    sums = torch.zeros(int(inverse.max()) + 1, dtype=values.dtype, device=values.device)
    counts = torch.zeros_like(sums).index_add_(0, inverse, torch.ones_like(values))
    return (sums.index_add_(0, inverse, values) / counts)[inverse]


def depth_widths(num_steps: int, split_steps: list[int], branching: int) -> list[int]:
    """Nodes per tree at each depth ``0 .. num_steps`` (a split at step ``s`` widens depth ``s + 1``)."""
    return [branching ** sum(split < depth for split in split_steps) for depth in range(num_steps + 1)]


def global_depth_std(leaf_rewards: torch.Tensor, widths: list[int], form: str = "sample") -> torch.Tensor:
    """``[depths]``: the std of the (mean-of-leaves) node rewards of each depth over every tree of the batch.

    ``leaf_rewards`` is ``[trees, K]`` in leaf order; a node's leaves are a contiguous block of ``K / width``
    (children are made next to each other), so a depth's node rewards are the block means.
    """
    trees, leaves = leaf_rewards.shape
    stds = []
    for width in widths:
        nodes = leaf_rewards.double().reshape(trees, width, leaves // width).mean(dim=2).flatten()
        stds.append(nodes.std(unbiased=form == "sample") if nodes.numel() > 1 else nodes.new_zeros(()))
    return torch.stack(stds)


def pruned_depths(config: BranchGRPOConfig, step: int) -> set[int]:
    """The reference's depth pruning at iteration ``step``: the listed depths, moved ``step // interval``
    depths shallower (sliding) until the shallowest reaches the stop depth (default: the last split)."""
    depths = sorted(config.depth_pruning)
    if not depths or not config.depth_pruning_slide:
        return set(depths)
    stop = config.depth_pruning_stop_depth
    stop = max(config.split_steps) if stop is None else stop
    shift = min(step // config.depth_pruning_interval, max(0, depths[0] - stop))
    return {depth - shift for depth in depths}


def trained_edges(
    tree: TreeRollout,
    advantages: torch.Tensor,
    depth_window: tuple[int, int] | None,
    sde_window_steps: tuple[int, int] | None,
    pruned: set[int],
    width_pruning: str,
    last_split: int,
) -> torch.Tensor:
    """``[num_nodes]`` bool: nodes whose incoming edge is trained after the per-tree pruning (module
    docstring; ``best_and_worst`` pools over trees and is applied by the caller).

    An edge into a node of depth ``d`` is the transition of step ``d - 1``; ``depth_window`` and
    ``sde_window_steps`` are ``[start, end)`` ranges of steps, ``pruned`` a set of depths.
    """
    keep = tree.edge_trainable.clone()
    step = tree.depth - 1
    for window in (depth_window, sde_window_steps):
        if window is not None:
            keep &= (step >= window[0]) & (step < window[1])
    if pruned:
        keep &= ~torch.isin(tree.depth, torch.tensor(sorted(pruned), device=tree.depth.device))
    if width_pruning == "quartiles":
        groups = tree.tree * (int(tree.depth.max()) + 1) + tree.depth
        for group in torch.unique(groups[keep]):
            members = torch.nonzero(keep & (groups == group)).flatten()
            quarter = max(1, len(members) // 4)
            if 2 * quarter >= len(members):
                continue
            order = members[advantages[members].argsort()]
            keep[order[quarter:-quarter]] = False
    elif width_pruning == "best_half":
        chains = tree.ancestors(tree.leaf_nodes)  # after the last split each leaf's path is its own chain
        for leaf in range(chains.shape[0]):
            members = chains[leaf][(tree.depth[chains[leaf]] - 1 > last_split) & keep[chains[leaf]]]
            if len(members) == 0:
                continue
            count = max(1, int(len(members) * 0.5))
            order = members[advantages[members].argsort(descending=True, stable=True)]
            keep[order[count:]] = False
    return keep


def chain_of_nodes(tree: TreeRollout) -> torch.Tensor:
    """``[num_nodes]``: the index of a leaf below each node (after the last split a node has exactly one,
    so this numbers the chains depth-first; nodes above a split get their last leaf, unused)."""
    chain = torch.zeros_like(tree.depth)
    paths = tree.ancestors(tree.leaf_nodes)
    chain[paths] = torch.arange(paths.shape[0], device=chain.device).unsqueeze(1).expand_as(paths)
    return chain


def best_and_worst(post_split: torch.Tensor, advantages: torch.Tensor) -> torch.Tensor:
    """The reference's width pruning mode 2 over pooled transitions: of ``n`` keep ``max(2, int(n / 2))``,
    half with the highest advantages and the rest with the lowest; returns the kept positions. Ties keep
    the order of ``post_split`` (the reference's: tree by tree, chain by chain, depth by depth)."""
    count = max(2, int(len(post_split) * 0.5))
    if count >= len(post_split):
        return post_split
    order = post_split[advantages[post_split].argsort(descending=True, stable=True)]
    best = count // 2
    return torch.cat([order[:best], order[len(order) - (count - best) :]])


class BranchGRPO(GRPOAlgorithm):
    """BranchGRPO: tree rollouts, depth-wise advantages, rows are the trained edges (module docstring)."""

    config: BranchGRPOConfig

    def __init__(self, config: TrainConfig) -> None:
        super().__init__(config)
        self.group_size = config.training.group_size
        self.num_steps = config.sampler.num_steps
        self.last_split = max(self.config.split_steps)
        self.widths = depth_widths(self.num_steps, self.config.split_steps, self.config.branching)
        #: the step's depth stds pooled over the global batch (``std_scope: batch``), set by :meth:`advantages`
        self.depth_std: torch.Tensor | None = None

    def depth_window(self, step: int) -> tuple[int, int] | None:
        size = self.config.depth_window_size
        if not size:
            return None
        if self.config.depth_window_slide:
            return sliding_window(step - 1, size, self.num_steps)
        return self.config.depth_window_start, self.config.depth_window_start + size

    def stochastic(self, step: int) -> torch.Tensor:
        window = sde_window(self.train_config, step)
        return stochastic_steps(self.num_steps, self.config.noise_level, window, self.config.train_last_step)

    def num_rows(self, num_samples: int, step: int = 1) -> int:
        """Trained edges of ``num_samples / K`` trees at iteration ``step`` (the tree shape is fixed)."""
        trees = num_samples // self.group_size
        splits = self.config.split_steps
        stochastic = self.stochastic(step)
        windows = (self.depth_window(step), sde_window(self.train_config, step))
        pruned = pruned_depths(self.config, step)
        rows, post_split_steps = 0, 0
        for index in range(self.num_steps):
            width = self.widths[index + 1]
            if not (index in splits or stochastic[index]) or index + 1 in pruned:
                continue
            if any(w is not None and not w[0] <= index < w[1] for w in windows):
                continue
            if index > self.last_split and self.config.width_pruning in ("best_half", "best_and_worst"):
                post_split_steps += 1
                continue
            if self.config.width_pruning == "quartiles":
                quarter = max(1, width // 4)
                width = width if 2 * quarter >= width else 2 * quarter
            rows += width
        leaves = trees * self.group_size
        if post_split_steps and self.config.width_pruning == "best_half":
            rows_after = leaves * max(1, int(post_split_steps * 0.5))
        elif post_split_steps:
            total = leaves * post_split_steps
            rows_after = min(total, max(2, int(total * 0.5)))
        else:
            rows_after = 0
        return trees * rows + rows_after

    def advantages(self, rewards: RewardBatch) -> torch.Tensor:
        """The default per-sample advantages (logged, not trained on: the rows are tree edges); with
        ``std_scope: batch`` also the depth stds pooled over every tree of the global batch (``group`` and
        ``leaves`` log the group advantages)."""
        if self.config.std_scope == "batch":
            leaves = rewards.total.reshape(-1, self.group_size)
            self.depth_std = global_depth_std(leaves, self.widths, self.config.depth_std)
            return super().advantages(rewards)
        return reward_advantages(rewards, self.train_config.reward_aggregation, "group")

    def tree_depth_std(self, leaf_rewards: torch.Tensor) -> torch.Tensor | None:
        """The divisor of each depth's advantages for one tree: ``None`` (the std of the depth's own nodes,
        ``std_scope: group``), the depth stds pooled over the global batch (``batch``) or, at every depth,
        the std of the tree's leaf rewards (``leaves``)."""
        if self.config.std_scope == "batch":
            return self.depth_std
        if self.config.std_scope == "leaves":
            leaf_std = leaf_rewards.double().std(unbiased=self.config.depth_std == "sample")
            return leaf_std.expand(len(self.widths))
        return None

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
            self.config.split_noise_scale,
            self.config.train_last_step,
        )
        return RolloutChunk(tree.x0, tree)

    def training_rows(
        self, chunks: list[RolloutChunk], advantages: torch.Tensor, rewards: torch.Tensor, step: int
    ) -> TrainRows:
        trees: list[TreeRollout] = [chunk.data for chunk in chunks]
        offsets = [0]
        for tree in trees:
            offsets.append(offsets[-1] + tree.leaf_nodes.shape[0])
        pruned = pruned_depths(self.config, step)
        parts: dict[str, list[torch.Tensor]] = {}
        for tree, offset in zip(trees, offsets):
            values = node_rewards(
                tree, rewards[offset : offset + tree.leaf_nodes.shape[0]], self.config.node_reward
            )
            leaf_rewards = rewards[offset : offset + tree.leaf_nodes.shape[0]]
            node_advantages = depth_advantages(
                tree, values, self.tree_depth_std(leaf_rewards), self.config.depth_std
            )
            keep = trained_edges(
                tree,
                node_advantages,
                self.depth_window(step),
                sde_window(self.train_config, step),
                pruned,
                self.config.width_pruning,
                self.last_split,
            )
            nodes = torch.nonzero(keep).flatten()
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
                "post_split": depth - 1 > self.last_split,
                "chain_order": (offset + chain_of_nodes(tree)[nodes]) * (self.num_steps + 1) + depth,
            }
            for key, value in columns.items():
                parts.setdefault(key, []).append(value)
        data = {key: torch.cat(values) for key, values in parts.items()}
        post_split, chain_order = data.pop("post_split"), data.pop("chain_order")
        if self.config.width_pruning == "best_and_worst":  # the post-split edges in depth-first order
            after = torch.nonzero(post_split).flatten()
            after = after[chain_order[after].argsort(stable=True)]
            kept = torch.cat([torch.nonzero(~post_split).flatten(), best_and_worst(after, data["advantage"])])
            kept = kept.sort().values  # rows in node order, whichever were kept
            data = {key: value[kept] for key, value in data.items()}
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
