"""DiffusionNFT: the loss against a direct re-computation, the optimality probability, old-policy schedules."""

import pytest
import torch

from flowrl.algorithms.forward_process import training_times
from flowrl.algorithms.nft import nft_loss, old_policy_decay, optimality_probability
from flowrl.algorithms.nft_config import NFTConfig
from samplers import timesteps


def test_optimality_probability_maps_clipped_advantages_to_unit_interval():
    advantages = torch.tensor([-10.0, -5.0, -2.5, 0.0, 2.5, 5.0, 10.0])
    torch.testing.assert_close(
        optimality_probability(advantages, 5.0), torch.tensor([0.0, 0.0, 0.25, 0.5, 0.75, 1.0, 1.0])
    )


def direct_nft_loss(v_theta, v_old, v_ref, x_t, x0, t, advantages, beta, c, lam):
    """The DiffusionNFT loss of flowrl.algorithms.nft's docstring written out sample by sample, in float64."""
    losses = []
    for i in range(x0.shape[0]):
        r = min(max(advantages[i].item(), -c), c) / (2 * c) + 0.5
        v_pos = beta * v_theta[i] + (1 - beta) * v_old[i]
        v_neg = (1 + beta) * v_old[i] - beta * v_theta[i]
        x_pos, x_neg = x_t[i] - t[i] * v_pos, x_t[i] - t[i] * v_neg
        w_pos = max((x_pos - x0[i]).abs().mean().item(), 1e-5)
        w_neg = max((x_neg - x0[i]).abs().mean().item(), 1e-5)
        policy = (
            c
            * (r * ((x_pos - x0[i]) ** 2).mean() / w_pos + (1 - r) * ((x_neg - x0[i]) ** 2).mean() / w_neg)
            / beta
        )
        losses.append(policy + lam * ((v_theta[i] - v_ref[i]) ** 2).mean())
    return torch.stack(losses)


@pytest.mark.parametrize("beta", [1.0, 0.1])
def test_nft_loss_equals_the_formula(beta):
    g = torch.Generator().manual_seed(0)
    shape = (5, 3, 4, 4)
    v_theta, v_old, v_ref, x0, eps = (torch.randn(shape, generator=g, dtype=torch.float64) for _ in range(5))
    t = torch.rand(5, generator=g, dtype=torch.float64)
    x_t = (1 - t[:, None, None, None]) * x0 + t[:, None, None, None] * eps
    advantages = torch.tensor([-7.0, -1.0, 0.0, 2.0, 6.0], dtype=torch.float64)
    terms = nft_loss(v_theta, v_old, v_ref, x_t, x0, t, advantages, beta, 5.0, 1e-2)
    expected = direct_nft_loss(v_theta, v_old, v_ref, x_t, x0, t, advantages, beta, 5.0, 1e-2)
    torch.testing.assert_close(terms.loss.double(), expected, rtol=1e-5, atol=1e-6)


def test_nft_gradient_pulls_towards_positive_and_away_from_negative_samples():
    # v_theta = v_old at the start: the gradient of the policy term is -(2c/beta)(2r - 1) t (x0 - x0_old)/w,
    # so a sample with r = 1 moves v_theta so that x_t - t v_theta approaches x0, r = 0 the other way.
    x0 = torch.ones(2, 1, 2, 2)
    x_t = torch.zeros(2, 1, 2, 2)
    t = torch.full((2,), 0.5)
    v_old = torch.zeros(2, 1, 2, 2)  # x0_old = x_t = 0, the target x0 = 1 is above it
    v_theta = v_old.clone().requires_grad_(True)
    terms = nft_loss(v_theta, v_old, None, x_t, x0, t, torch.tensor([5.0, -5.0]), 1.0, 5.0, 0.0)
    terms.loss.sum().backward()
    # Gradient descent on v_theta: a positive sample lowers v (raises x0_hat), a negative one raises it.
    assert (v_theta.grad[0] > 0).all() and (v_theta.grad[1] < 0).all()


def test_old_policy_schedules():
    soft = NFTConfig()
    assert [old_policy_decay(soft, s) for s in (1, 100, 499, 600)] == [0.001, 0.1, 0.499, 0.5]
    assert [old_policy_decay(soft, s, updates_per_step=4) for s in (1, 100)] == [0.004, 0.4]
    hard = NFTConfig(old_update="hard", old_update_every=3)
    assert [old_policy_decay(hard, s) for s in (1, 2, 3, 6)] == [None, None, 0.0, 0.0]
    delayed = NFTConfig(old_update="delayed", old_delay_steps=5)
    assert [old_policy_decay(delayed, s) for s in (5, 6, 1005)] == [None, 0.001, 0.5]


def test_training_times_are_distinct_grid_times_or_uniform():
    grid = timesteps(10)
    times = training_times(torch.Generator().manual_seed(0), 6, 4, grid, "grid")
    assert times.shape == (4, 6)
    for column in times.T:
        assert len(set(column.tolist())) == 4 and all(
            any(abs(v - g) < 1e-7 for g in grid[:-1].tolist()) for v in column
        )
    sampled = training_times(torch.Generator().manual_seed(0), 6, 4, grid, "sampled")
    assert sampled.shape == (4, 6) and ((sampled > 0) & (sampled < 1)).all()


def test_training_times_respect_the_minimum_time():
    from flowrl.config import ConfigError

    grid = timesteps(10)
    drawn = training_times(torch.Generator().manual_seed(0), 64, 3, grid, "grid", minimum=0.5)
    assert bool((drawn >= 0.5 - 1e-6).all()) and set(drawn.flatten().tolist()) <= set(grid[:6].tolist())
    assert all(len(set(column.tolist())) == 3 for column in drawn.T)  # distinct times per sample
    sampled = training_times(torch.Generator().manual_seed(0), 64, 3, grid, "sampled", minimum=0.5)
    assert bool((sampled >= 0.5).all()) and bool((sampled <= 1).all())
    with pytest.raises(ConfigError, match="train_timesteps=7 is more than the 6 rollout-grid times"):
        training_times(torch.Generator(), 4, 7, grid, "grid", minimum=0.5)
