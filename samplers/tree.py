"""Branching SDE rollouts (BranchGRPO): trees whose leaves share their ancestors' prefixes.

One root noise per prompt. At every split step each node of the frontier
makes ``branching`` children with independent SDE noise; at other steps each
node makes one child, by an SDE step (default) or, in Mix mode, by an ODE
step outside the SDE window. Split steps are always stochastic. With splits at
``k`` steps of ``S`` a tree has ``branching^k`` leaves and costs
``sum_i branching^(splits before step i)`` network evaluations, far below
``branching^k * S`` for independent rollouts (:func:`tree_nfe`).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

from samplers.conditioning import select_rows
from samplers.rollout import TreeRollout, VelocityFn
from samplers.sde import draw_noise, sde_step, stochastic_steps


def tree_nfe(num_steps: int, split_steps: Sequence[int], branching: int) -> int:
    """Network evaluations of one tree: ``sum_i branching^(number of split steps < i)``."""
    splits = sorted(set(split_steps))
    return sum(branching ** sum(split < step for split in splits) for step in range(num_steps))


@torch.no_grad()
def tree_sample(
    velocity: VelocityFn,
    noise: torch.Tensor,
    timesteps: torch.Tensor,
    cond: Any,
    split_steps: Sequence[int],
    branching: int = 2,
    noise_level: float = 0.7,
    split_noise_level: float | None = None,
    variant: str = "flow",
    sde_window: tuple[int, int] | None = None,
    generator: torch.Generator | None = None,
    split_noise_scale: float = 1.0,
    include_last: bool = False,
) -> TreeRollout:
    """Grow one tree per row of ``noise`` (and of ``cond``) down the time grid.

    ``split_noise_level`` is the SDE noise level at split steps (default
    ``noise_level``); ``split_noise_scale`` multiplies the noise drawn at split
    steps while the step's log-probability keeps the level's own scale (what
    BranchGRPO's code does with its x4 split noise; 1 = consistent).
    ``include_last`` makes the last step stochastic (and trainable) too, as
    BranchGRPO's code trains it. ``sde_window = (start, end)`` turns on Mix mode: ODE
    outside the window except at split steps. Noise is drawn per step for the
    whole frontier in node order, so with no split steps the tree is exactly
    :func:`samplers.sde.sde_sample` with the same generator.
    """
    num_steps = len(timesteps) - 1
    splits = sorted(set(split_steps))
    if branching < 1:
        raise ValueError(f"branching must be >= 1, got {branching}")
    if any(not 0 <= split < num_steps - 1 for split in splits):
        raise ValueError(
            f"split steps {splits} must lie in [0, {num_steps - 2}] (the last step is deterministic)"
        )
    split_level = noise_level if split_noise_level is None else split_noise_level
    stochastic = stochastic_steps(num_steps, noise_level, sde_window, include_last)
    num_trees, device = noise.shape[0], noise.device

    frontier = torch.arange(num_trees, device=device)
    frontier_x = noise.float()
    states, parents, depths, trees = (
        [frontier_x],
        [torch.full_like(frontier, -1)],
        [torch.zeros_like(frontier)],
        [frontier],
    )
    log_probs = [torch.zeros(num_trees, device=device)]
    edge_levels = [torch.zeros(num_trees, device=device)]
    trainable = [torch.zeros(num_trees, dtype=torch.bool, device=device)]
    frontier_tree = frontier
    next_id = num_trees
    evaluations = 0
    for index in range(num_steps):
        t, t_next = timesteps[index], timesteps[index + 1]
        size = frontier_x.shape[0]
        v = velocity(
            frontier_x.to(noise.dtype), t.to(device).expand(size), select_rows(cond, frontier_tree)
        ).float()
        evaluations += size
        children = branching if index in splits else 1
        x = frontier_x.repeat_interleave(children, dim=0)
        v = v.repeat_interleave(children, dim=0)
        if index in splits or stochastic[index]:
            level = split_level if index in splits else noise_level
            noise_draw = draw_noise(tuple(x.shape), generator, device)
            if index in splits and split_noise_scale != 1.0:
                noise_draw = noise_draw * split_noise_scale
            step = sde_step(v, x, t, t_next, level, variant, noise=noise_draw)
            new_x, new_log_probs = step.x_next, step.log_prob
            new_trainable = torch.ones(x.shape[0], dtype=torch.bool, device=device)
        else:
            level = 0.0
            new_x = x + (t_next - t).float() * v
            new_log_probs = torch.zeros(x.shape[0], device=device)
            new_trainable = torch.zeros(x.shape[0], dtype=torch.bool, device=device)
        new_ids = torch.arange(next_id, next_id + x.shape[0], device=device)
        parents.append(frontier.repeat_interleave(children))
        trees.append(frontier_tree.repeat_interleave(children))
        depths.append(torch.full_like(new_ids, index + 1))
        states.append(new_x)
        log_probs.append(new_log_probs)
        edge_levels.append(torch.full((x.shape[0],), float(level), device=device))
        trainable.append(new_trainable)
        frontier, frontier_x, frontier_tree = new_ids, new_x, trees[-1]
        next_id += x.shape[0]
    return TreeRollout(
        states=torch.cat(states),
        parent=torch.cat(parents),
        depth=torch.cat(depths),
        tree=torch.cat(trees),
        edge_log_probs=torch.cat(log_probs),
        edge_noise_levels=torch.cat(edge_levels),
        edge_trainable=torch.cat(trainable),
        timesteps=timesteps,
        leaf_nodes=frontier,
        nfe_per_tree=evaluations // num_trees,
    )
