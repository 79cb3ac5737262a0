"""BranchGRPO's ``std_scope: leaves`` against its definition, typed here (flowrl's variant of the depth-wise
advantages: every depth divided by the std of the tree's leaf rewards)."""

import math

import torch
from test_grpo import grpo_config, rollout_rows

from flowrl.algorithms.branch_grpo import BranchGRPO
from flowrl.models import ShapesFlowModel
from flowrl.policy import make_policy
from samplers import timesteps


def test_leaves_std_scope_divides_every_depth_by_the_std_of_the_tree_leaves(tiny_model):
    """``std_scope: leaves``: a node's advantage is its subtree mean minus its depth's mean, over the sample
    std of the tree's leaf rewards (typed here from the definition, on a 4-leaf tree split at steps 0 and 2)."""
    config = grpo_config("branchgrpo", "algorithm.std_scope=leaves", "algorithm.width_pruning=none")
    policy = make_policy(ShapesFlowModel(tiny_model))
    leaves = torch.tensor([1.0, 0.0, 0.5, 0.2])
    _, _, rows = rollout_rows(BranchGRPO(config), policy, config, ["a red circle"], rewards=leaves)
    mean = sum(leaves.tolist()) / 4
    std = math.sqrt(sum((value - mean) ** 2 for value in leaves.tolist()) / 3)
    halves = [(1.0 + 0.0) / 2 - mean, (0.5 + 0.2) / 2 - mean]  # depths 1, 2: the two subtrees' means
    grid = timesteps(config.sampler.num_steps)
    for depth, expected in [(1, halves), (2, halves), *[(d, (leaves - mean).tolist()) for d in (3, 4, 5)]]:
        at_depth = (rows.data["t_next"] - float(grid[depth])).abs() < 1e-6
        torch.testing.assert_close(rows.advantages[at_depth], torch.tensor(expected) / std)
