"""What samplers return: flat rollouts and branching trees."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch

#: ``v(x, t, cond)``: velocity at states ``x`` ``[B, ...]`` and times ``t`` ``[B]`` under conditioning ``cond``.
VelocityFn = Callable[[torch.Tensor, torch.Tensor, Any], torch.Tensor]
#: ``u(x, r, t, cond)``: MeanFlow average velocity from time ``t`` to ``r`` (``r <= t``), both ``[B]``.
AverageVelocityFn = Callable[[torch.Tensor, torch.Tensor, torch.Tensor, Any], torch.Tensor]


@dataclass
class Rollout:
    """A batch of trajectories from t = 1 to t = 0 on the grid ``timesteps`` (``S + 1`` times, ``S`` steps).

    ``x0``: final samples ``[B, ...]``. ``nfe``: network evaluations per sample
    (one batched call counts once). Where the sampler keeps them: ``latents``
    ``[B, S + 1, ...]`` every state (``latents[:, 0]`` is the noise, float32 for
    stochastic samplers), ``log_probs`` ``[B, S]`` the log-density of each
    transition averaged over dimensions (0 where the step is deterministic),
    ``trained_mask`` ``[S]`` which steps are stochastic and trainable.
    """

    x0: torch.Tensor
    timesteps: torch.Tensor
    nfe: int
    latents: torch.Tensor | None = None
    log_probs: torch.Tensor | None = None
    trained_mask: torch.Tensor | None = None


@dataclass
class TreeRollout:
    """Branching rollouts (BranchGRPO): one tree per prompt, nodes in creation order.

    Node ``n`` is the state ``states[n]`` at time ``timesteps[depth[n]]``;
    roots (depth 0) are the initial noises. Every other node has one parent
    and one incoming transition, described by the node itself:
    ``edge_log_probs[n]`` (log-density of ``parent -> n``, averaged over
    dimensions; 0 for roots and deterministic steps), ``edge_noise_levels[n]``
    (the SDE noise level it was drawn with, split or regular; 0 when
    deterministic, what re-scoring the edge needs), ``edge_trainable[n]``.
    ``tree[n]`` is the prompt (row of the conditioning) the node belongs to.
    Leaves are the final samples, ``leaf_nodes`` lists them tree by tree in
    branch order. ``nfe_per_tree`` counts network evaluations of one tree.
    """

    states: torch.Tensor
    parent: torch.Tensor
    depth: torch.Tensor
    tree: torch.Tensor
    edge_log_probs: torch.Tensor
    edge_noise_levels: torch.Tensor
    edge_trainable: torch.Tensor
    timesteps: torch.Tensor
    leaf_nodes: torch.Tensor
    nfe_per_tree: int

    @property
    def x0(self) -> torch.Tensor:
        """Final samples ``[num_leaves, ...]``."""
        return self.states[self.leaf_nodes]

    @property
    def is_leaf(self) -> torch.Tensor:
        """``[num_nodes]`` bool: True for the final samples."""
        flags = torch.zeros(self.parent.shape[0], dtype=torch.bool, device=self.parent.device)
        flags[self.leaf_nodes] = True
        return flags

    def ancestors(self, nodes: torch.Tensor) -> torch.Tensor:
        """``[len(nodes), max depth + 1]`` node ids from the root down to each node (nodes must share a depth)."""
        depth = int(self.depth[nodes[0]])
        if not bool((self.depth[nodes] == depth).all()):
            raise ValueError("ancestors() needs nodes of one depth")
        path = [nodes]
        for _ in range(depth):
            path.append(self.parent[path[-1]])
        return torch.stack(path[::-1], dim=1)

    def leaf_paths(self) -> torch.Tensor:
        """``[num_leaves, S + 1, ...]``: the states along each leaf's path, root first."""
        return self.states[self.ancestors(self.leaf_nodes)]
