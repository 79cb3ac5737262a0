"""Parity with the reference implementations: each formula re-derived here independently,
typed from the papers or the reference code's description (never imported), and checked against flowrl
on random tensors. The references: Flow-GRPO (yifan123/flow_grpo: ``train_sd3.py``,
``sd3_sde_with_logprob.py``), DiffusionNFT (NVlabs/DiffusionNFT ``train_nft_sd3.py``), BranchGRPO
(Fredreic1849/BranchGRPO ``train_branchgrpo_flux.py``), MeanFlow (Geng et al., 2025)."""

import math

import pytest
import torch

from flowrl.algorithms.base import TrainBatch
from flowrl.algorithms.flow_grpo import FlowGRPO
from flowrl.algorithms.meanflow_nft import MeanFlowNFT
from flowrl.config import load_config
from samplers import interval_pairs, sde_step, timesteps

# --- Flow-GRPO ---------------------------------------------------------------------------------------


def test_cps_scores_a_step_as_the_reference_code():
    """``log_prob = -mean((x' - mu)^2)`` with the CPS mean, no ``1 / (2 s^2)`` and no normaliser."""
    g = torch.Generator().manual_seed(0)
    x, v = torch.randn(5, 3, 4, 4, generator=g), torch.randn(5, 3, 4, 4, generator=g)
    x_next = torch.randn(5, 3, 4, 4, generator=g)
    sigma, sigma_prev, noise_level = 0.7, 0.6, 0.8
    std_dev_t = sigma_prev * math.sin(noise_level * math.pi / 2)
    pred_original_sample = x.double() - sigma * v.double()
    noise_estimate = x.double() + (1 - sigma) * v.double()
    prev_sample_mean = pred_original_sample * (1 - sigma_prev) + noise_estimate * math.sqrt(
        sigma_prev**2 - std_dev_t**2
    )
    expected = -((x_next.double() - prev_sample_mean) ** 2).mean(dim=(1, 2, 3))
    step = sde_step(v, x, sigma, sigma_prev, noise_level, "cps", x_next=x_next)
    torch.testing.assert_close(step.log_prob.double(), expected, rtol=1e-6, atol=1e-6)
    torch.testing.assert_close(step.std_dev.double(), torch.tensor(std_dev_t, dtype=torch.float64))


def test_the_kl_scale_is_the_reference_std_dev_t_without_sqrt_dt():
    """Flow-SDE ``std_dev_t = a sqrt(sigma / (1 - sigma))`` (``sigma_max = sigmas[1]`` in the denominator at
    sigma = 1); the exact KL's scale is ``std_dev_t sqrt(|dt|)``, so the two KLs differ by ``1 / |dt|``."""
    g = torch.Generator().manual_seed(1)
    x, v = torch.randn(3, 8, generator=g), torch.randn(3, 8, generator=g)
    for sigma, sigma_next in ((1.0, 0.9), (0.55, 0.45), (0.2, 0.1)):
        step = sde_step(v, x, sigma, sigma_next, 0.7)
        denominator = 1 - (sigma_next if sigma == 1.0 else sigma)
        std_dev_t = 0.7 * math.sqrt(sigma / denominator)
        assert float(step.std_dev) == pytest.approx(std_dev_t, rel=1e-6)
        assert float(step.scale) == pytest.approx(std_dev_t * math.sqrt(sigma - sigma_next), rel=1e-6)


def test_flow_grpo_trains_the_first_steps_in_order_by_default():
    """``train_timesteps = range(int(num_steps * timestep_fraction))`` for every sample (reference);
    ``trained_steps: random`` draws a distinct subset per sample."""
    grid = timesteps(10)
    flat = ["algorithm.sde_window_size=0", "algorithm.timestep_fraction=0.25"]  # the recipe trains a window
    first = FlowGRPO(load_config("configs/shapes_flowgrpo.yaml", flat))
    draws = first.draw(torch.Generator().manual_seed(0), 6, (3, 32, 32), grid, 1)["step"]
    assert first.passes == int(10 * 0.25) and draws.tolist() == [[0] * 6, [1] * 6]
    full = FlowGRPO(load_config("configs/shapes_flowgrpo.yaml", [*flat, "algorithm.timestep_fraction=1.0"]))
    assert full.passes == 9  # int(10 * 1.0) capped at the 9 stochastic steps (the reference runs 0.99)
    random = FlowGRPO(load_config("configs/shapes_flowgrpo.yaml", [*flat, "algorithm.trained_steps=random"]))
    drawn = random.draw(torch.Generator().manual_seed(0), 64, (3, 32, 32), grid, 1)["step"]
    assert drawn.shape == (2, 64) and len(set(drawn.flatten().tolist())) > 2
    assert bool((drawn[0] != drawn[1]).all())


# --- MeanFlowNFT -------------------------------------------------------------------------------------

DATA_STD = 0.5


def marginal_variance(t: torch.Tensor) -> torch.Tensor:
    """``Var x_t`` for ``x_t = (1 - t) x0 + t eps``, ``x0 ~ N(0, s^2)``: ``(1 - t)^2 s^2 + t^2``."""
    return (1 - t) ** 2 * DATA_STD**2 + t**2


def exact_average_velocity(x: torch.Tensor, r: torch.Tensor, t: torch.Tensor) -> torch.Tensor:
    """The MeanFlow solution for Gaussian data: the flow of the linear field ``v = x Var'(t) / 2 Var(t)``
    maps ``x_t`` to ``x_r = x_t sqrt(Var(r) / Var(t))``, so ``u = (x_t - x_r) / (t - r)`` (``v`` at r = t)."""
    t_, r_ = t.view(-1, 1), r.view(-1, 1)
    ratio = torch.sqrt(marginal_variance(r_) / marginal_variance(t_))
    instantaneous = (t_ - (1 - t_) * DATA_STD**2) / marginal_variance(t_)
    gap = t_ - r_
    safe_gap = torch.where(gap.abs() < 1e-6, torch.ones_like(gap), gap)
    return torch.where(gap.abs() < 1e-6, instantaneous * x, x * (1 - ratio) / safe_gap)


class ScaledMeanFlow:
    """A policy whose average velocity is ``theta * u*``: at ``theta = 1`` the exact MeanFlow solution."""

    def __init__(self) -> None:
        self.theta = torch.nn.Parameter(torch.tensor(1.0))

    def velocity(self, x, t, cond, r=None):
        return self.theta * exact_average_velocity(x, r, t)

    def old_velocity(self, x, t, cond, r=None):
        return exact_average_velocity(x, r, t)

    reference_velocity = old_velocity


def test_the_induced_velocity_of_the_exact_solution_is_the_flow_velocity():
    """The MeanFlow identity on the closed form: ``u + (t - r) du/dt = v(x_t, t)``."""
    from samplers import induced_velocity

    g = torch.Generator().manual_seed(0)
    x, t = torch.randn(64, 4, generator=g), 0.1 + 0.8 * torch.rand(64, generator=g)
    r = t * torch.rand(64, generator=g)
    v = exact_average_velocity(x, t, t)
    # along the flow the state moves with v itself
    induced, _ = induced_velocity(lambda x_, r_, t_, c: exact_average_velocity(x_, r_, t_), x, r, t, None, v)
    torch.testing.assert_close(induced, v, rtol=1e-4, atol=1e-5)


def meanflow_gradient(stop_gradient: bool, samples: int = 40_000, dims: int = 8) -> float:
    """``d L / d theta`` at ``theta = 1`` of MeanFlowNFT's all-positive loss (pure flow matching on V)."""
    config = load_config(
        None,
        [
            "algorithm.name=meanflow_nft",
            "algorithm.reference_weight=0.0",
            "algorithm.adaptive_weighting=false",
            "algorithm.train_timesteps=1",
        ],
    )
    g = torch.Generator().manual_seed(3)
    x0 = DATA_STD * torch.randn(samples, dims, generator=g)
    first, second = (
        0.05 + 0.9 * torch.rand(samples, generator=g),
        0.05 + 0.9 * torch.rand(samples, generator=g),
    )
    t, r = interval_pairs(first, second, torch.rand(samples, generator=g), 0.25, 0.25)
    noise = torch.randn(samples, dims, generator=g)
    batch = TrainBatch(
        {"x0": x0}, None, torch.full((samples,), 5.0), {"t": t[None], "r": r[None], "noise": noise[None]}
    )
    policy = ScaledMeanFlow()
    if stop_gradient:
        loss, _ = MeanFlowNFT(config).loss(policy, batch, 0, 1)
    else:  # the earlier form: V_theta = u + (t - r) du/dt with the gradient through the JVP's tangent
        column = t.view(-1, 1)
        x_t = (1 - column) * x0 + column * noise
        u, derivative = torch.func.jvp(
            lambda x_, t_: policy.velocity(x_, t_, None, r=r), (x_t, t), (noise - x0, torch.ones_like(t))
        )
        induced = u + (t - r).view(-1, 1) * derivative
        x0_positive = x_t - column * induced
        loss = 5.0 * ((x0_positive - x0) ** 2).mean(dim=1).mean()
    (gradient,) = torch.autograd.grad(loss, policy.theta)
    return float(gradient)


def test_meanflow_nft_is_stationary_at_the_exact_meanflow_solution():
    """With the derivative under stop-gradient the expected gradient at the solution is zero (the induced
    velocity equals E[eps - x0 | x_t]); with the gradient through the tangent it is not."""
    stopped, through = meanflow_gradient(True), meanflow_gradient(False)
    assert abs(stopped) < 0.01, stopped
    assert abs(through) > 10 * abs(stopped) and abs(through) > 0.05, (stopped, through)


# --- DiffusionNFT --------------------------------------------------------------------------------------


def reference_return_decay(global_step: int, flat: int, uprate: float, uphold: float) -> float:
    """DiffusionNFT's ``return_decay``: 0 while ``step < flat``, then ``min((step - flat) * uprate, uphold)``."""
    if global_step < flat:
        return 0.0
    return min((global_step - flat) * uprate, uphold)


@pytest.mark.parametrize(
    "decay_type, overrides",
    [
        (1, []),
        (
            2,
            [
                "algorithm.old_flat_steps=75",
                "algorithm.old_decay_rate=0.0075",
                "algorithm.old_decay_max=0.999",
            ],
        ),
    ],
)
def test_the_old_policy_schedule_is_the_reference_over_optimizer_updates(decay_type, overrides):
    """The reference applies ``return_decay(global_step)`` once per iteration, ``global_step`` counting
    optimizer updates: with 4 updates per step it ramps 4x faster than a per-iteration counter."""
    from flowrl.algorithms.nft import DiffusionNFT
    from flowrl.policy import OLD

    flat, rate, hold = (0, 0.001, 0.5) if decay_type == 1 else (75, 0.0075, 0.999)
    config = load_config("configs/shapes_nft.yaml", overrides)
    updates = config.training.updates_per_step
    assert updates == 4
    algorithm = DiffusionNFT(config)
    for step in (1, 10, 18, 19, 30, 60, 120, 500):
        decays = algorithm.after_optimizer_step(step).copy_decays
        assert decays[OLD] == pytest.approx(
            reference_return_decay(step * updates, flat, rate, hold), abs=1e-12
        )
    per_step = DiffusionNFT(
        load_config("configs/shapes_nft.yaml", [*overrides, "algorithm.old_decay_counter=steps"])
    )
    assert per_step.after_optimizer_step(120).copy_decays[OLD] == pytest.approx(
        reference_return_decay(120, flat, rate, hold)
    )


# --- diffusers time grid --------------------------------------------------------------------------------


@pytest.mark.parametrize("kind", ["sd3", "flux", "wan"])
def test_the_default_grid_is_the_stock_schedulers_sigmas(tmp_path, kind):
    """SD3 at S = 10 (shift 3): ``[1, .960, ..., .278, .0089, 0]``, not ``shift(linspace(1, 0, 11))``; FLUX:
    ``linspace(1, 1/S, S)`` shifted by its resolution-dependent ``mu``; Wan: its UniPC scheduler's sigmas.
    The stock pipelines' images at these grids are compared in test_diffusers_backends / test_wan."""
    import copy

    import numpy as np

    from flowrl.models import backend_class
    from flowrl.testing import save_tiny_pipeline

    directory = save_tiny_pipeline(kind, tmp_path / kind)
    model = backend_class(kind).from_pretrained(str(directory), height=32, width=32)
    scheduler = copy.deepcopy(model.pipeline.scheduler)
    if kind == "flux":  # the pipeline's own call: sigmas and mu for the packed token count
        config = scheduler.config
        tokens = model.sample_shape[0]
        mu = config.base_shift + (config.max_shift - config.base_shift) * (
            tokens - config.base_image_seq_len
        ) / (config.max_image_seq_len - config.base_image_seq_len)
        scheduler.set_timesteps(sigmas=list(np.linspace(1.0, 0.1, 10)), mu=mu)
    else:
        scheduler.set_timesteps(10)
    grid = model.time_grid(10)
    torch.testing.assert_close(grid, torch.as_tensor(scheduler.sigmas).float())
    if kind == "sd3":
        assert [round(float(t), 3) for t in (grid[0], grid[1], grid[-3], grid[-2], grid[-1])] == [
            1.0,
            0.960,
            0.278,
            0.009,
            0.0,
        ]
        assert not torch.allclose(grid, timesteps(10, shift=3.0))


# --- BranchGRPO ----------------------------------------------------------------------------------------


def reference_depth_advantages(tree, rewards: torch.Tensor) -> torch.Tensor:
    """BranchGRPO's ``compute_hierarchical_advantages_by_depth``, per tree and depth: 0 for a lone node; the
    torch default (unbiased) std; 0 below 1e-6, else ``(r - mean) / (std + 1e-8)``."""
    out = torch.zeros_like(rewards)
    for tree_id in tree.tree.unique().tolist():
        for depth in tree.depth.unique().tolist():
            nodes = torch.nonzero((tree.tree == tree_id) & (tree.depth == depth)).flatten()
            if len(nodes) <= 1:
                continue
            values = rewards[nodes]
            std = values.std()
            if std < 1e-6:
                continue
            out[nodes] = (values - values.mean()) / (std + 1e-8)
    return out


def random_trees(num_trees=3, variant="dance", scale=4.0):
    from samplers import tree_sample

    g = torch.Generator().manual_seed(11)
    weights = torch.randn(6, 6, generator=g) * 0.3
    return tree_sample(
        lambda x, t, c: x @ weights + t[:, None],
        torch.randn(num_trees, 6, generator=g),
        timesteps(6),
        None,
        [0, 2, 3],
        2,
        0.3,
        None,
        variant,
        None,
        torch.Generator().manual_seed(12),
        scale,
        True,
    )


def test_branchgrpo_depth_advantages_are_the_references():
    from flowrl.algorithms.branch_grpo import depth_advantages, node_rewards

    tree = random_trees()
    leaves = torch.rand(tree.leaf_nodes.shape[0], generator=torch.Generator().manual_seed(13))
    leaves[:8] = 0.5  # one tree whose leaves all tie: its advantages are 0, not +-1/eps noise
    rewards = node_rewards(tree, leaves, "mean")
    torch.testing.assert_close(
        depth_advantages(tree, rewards), reference_depth_advantages(tree, rewards.float())
    )
    two_siblings = torch.tensor([0.6, 0.4])  # the example: +-0.707 (n - 1), not +-1 (population)
    assert float(((two_siblings - 0.5) / (two_siblings.std() + 1e-8))[0]) == pytest.approx(0.7071, abs=1e-4)


def test_the_dance_sde_is_danceGRPOs_step_and_splits_score_with_the_unscaled_std():
    """DanceGRPO / BranchGRPO ``flux_step_with_split``: ``std = eta sqrt(sigma - sigma_next)``, score
    ``-(x - x0^ (1 - sigma)) / sigma^2``, mean ``x + dsigma v - eta^2 / 2 score dsigma``; the split noise is
    x4 but the log-probability keeps ``std``."""
    g = torch.Generator().manual_seed(4)
    x, v, eps = (torch.randn(3, 5, generator=g) for _ in range(3))
    sigma, sigma_next, eta = 0.8, 0.6, 0.3
    dsigma = sigma_next - sigma
    pred_original_sample = x.double() - sigma * v.double()
    std_dev_t = eta * math.sqrt(sigma - sigma_next)
    score_estimate = -(x.double() - pred_original_sample * (1 - sigma)) / sigma**2
    prev_sample_mean = x.double() + dsigma * v.double() + (-0.5 * eta**2 * score_estimate) * dsigma
    sample = prev_sample_mean + 4.0 * eps.double() * std_dev_t
    log_prob = (
        -((sample - prev_sample_mean) ** 2) / (2 * std_dev_t**2)
        - math.log(std_dev_t)
        - 0.5 * math.log(2 * math.pi)
    ).mean(dim=1)
    step = sde_step(v, x, sigma, sigma_next, eta, "dance", noise=4.0 * eps)
    torch.testing.assert_close(step.mean.double(), prev_sample_mean, rtol=1e-6, atol=1e-6)
    torch.testing.assert_close(step.x_next.double(), sample, rtol=1e-6, atol=1e-6)
    torch.testing.assert_close(step.log_prob.double(), log_prob, rtol=1e-5, atol=1e-5)
    # in a tree: split transitions drew x4 noise and are scored with the unscaled std
    tree = random_trees(1, scale=4.0)
    plain = random_trees(1, scale=1.0)
    split_edges = tree.depth == 1
    assert bool((tree.edge_log_probs[split_edges] < plain.edge_log_probs[split_edges]).all())


def reference_active_pruning_depths(base_depths, step, interval, stop_depth):
    """BranchGRPO's sliding depth pruning: ``shift = step // interval`` capped at ``base[0] - stop``."""
    shift_now = max(0, int(step // interval))
    max_shift = max(0, base_depths[0] - stop_depth)
    return {d - min(shift_now, max_shift) for d in base_depths}


def test_branchgrpo_depth_pruning_slides_as_the_reference():
    from flowrl.algorithms.branch_grpo import pruned_depths

    config = load_config(
        "configs/shapes_branchgrpo.yaml",
        [
            "sampler.num_steps=20",
            "algorithm.split_steps=[0,3,6,9]",
            "training.group_size=16",
            "training.prompts_per_step=4",
            "training.micro_batch_size=16",
            "algorithm.depth_pruning=[15,16,17,18]",
            "algorithm.depth_pruning_slide=true",
            "algorithm.depth_pruning_interval=30",
            "algorithm.depth_pruning_stop_depth=9",
        ],
    ).algorithm
    for step in (1, 29, 30, 61, 150, 180, 181, 400):
        assert pruned_depths(config, step) == reference_active_pruning_depths([15, 16, 17, 18], step, 30, 9)
    assert min(pruned_depths(config, 10_000)) == 9
