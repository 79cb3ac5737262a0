"""Flow-GRPO's ODE anchor (``ode_anchor_weight``): the loss it adds, at the steps it draws."""

import pytest
import torch
from test_grpo import batch_of, grpo_config, rollout_rows

from flowrl.algorithms.flow_grpo import FlowGRPO
from flowrl.models import ShapesFlowModel
from flowrl.policy import make_policy
from samplers import timesteps


def test_ode_anchor_adds_the_velocity_gap_at_a_drawn_ode_step(tiny_model):
    """``ode_anchor_weight``: the loss without it plus lambda ||v_theta - v_ref||² at one drawn step per
    sample, every drawn step outside the SDE window; without it nothing is drawn for it."""
    window = ["algorithm.sde_window_size=2", "algorithm.timestep_fraction=1.0", "algorithm.kl_weight=0.0"]
    config = grpo_config("flowgrpo", "training.group_size=4", *window, "algorithm.ode_anchor_weight=0.5")
    plain = FlowGRPO(grpo_config("flowgrpo", "training.group_size=4", *window))
    policy = make_policy(ShapesFlowModel(tiny_model))
    algorithm = FlowGRPO(config)
    chunk, cond, rows = rollout_rows(algorithm, policy, config, ["a red circle", "two blue squares"])
    with torch.no_grad():  # theta away from the frozen reference, so that the anchor is not 0
        for parameter in policy.model.parameters():
            parameter.add_(0.01 * torch.randn_like(parameter))
    grid = timesteps(config.sampler.num_steps)
    draws = algorithm.draw(torch.Generator().manual_seed(5), rows.count, policy.sample_shape, grid, 1)
    assert "anchor" not in plain.draw(
        torch.Generator().manual_seed(5), rows.count, policy.sample_shape, grid, 1
    )
    anchor_steps = draws["anchor"]
    assert anchor_steps.shape == (2, rows.count)  # one per pass (both window steps) and sample
    assert bool((anchor_steps >= 2).all()) and bool((anchor_steps < config.sampler.num_steps).all())
    assert len(anchor_steps.unique()) > 1
    batch = batch_of(rows, cond, draws)
    loss, stats = algorithm.loss(policy, batch, pass_index=1, step=1)
    without, _ = plain.loss(policy, batch, pass_index=1, step=1)
    samples = torch.arange(rows.count)
    k = anchor_steps[1]
    x_k, t_k = rows.data["latents"][samples, k], grid[k]
    with torch.no_grad():
        gap = (policy.velocity(x_k, t_k, cond) - policy.reference_velocity(x_k, t_k, cond)).double()
    expected_gap = (gap**2).mean(dim=(1, 2, 3))
    torch.testing.assert_close(stats["grpo/ode_anchor_mse"].double(), expected_gap, rtol=1e-4, atol=1e-9)
    assert float(expected_gap.min()) > 0
    expected = float(without.detach()) + 0.5 * float(expected_gap.mean())
    assert float(loss.detach()) == pytest.approx(expected, rel=1e-4, abs=1e-7)
