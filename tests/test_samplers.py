"""Property tests of samplers/ on fields whose exact solution is known.

Longer than 400 lines on purpose: every sampler's property tests in one place, as the samplers' contract lists them.
"""

import math

import pytest
import torch

from samplers import (
    concat_rows,
    dpm_solver_2m,
    euler,
    guided_velocity,
    heun,
    meanflow_sample,
    sde_sample,
    sde_step,
    select_rows,
    sliding_window,
    stochastic_steps,
    timesteps,
    transition_log_prob,
    tree_nfe,
    tree_sample,
)

MU, S = 0.7, 0.3  # data distribution N(MU, S^2) in every dimension


def spread(t):
    """Std of the flow's marginal at t: S_t = sqrt((1 - t)^2 S^2 + t^2)."""
    return torch.sqrt((1 - t) ** 2 * S**2 + t**2)


def gaussian_velocity(x, t, cond=None):
    """Exact flow velocity for Gaussian data: v = -MU + (t - (1 - t) S^2) / S_t^2 (x - (1 - t) MU)."""
    t = t.to(torch.float64).reshape(-1, *([1] * (x.ndim - 1)))
    return (-MU + (t - (1 - t) * S**2) / spread(t) ** 2 * (x.double() - (1 - t) * MU)).to(x.dtype)


def exact_sample(noise):
    """The ODE maps x_1 to x_0 = MU + S x_1."""
    return MU + S * noise


def gaussian_average_velocity(x, r, t, cond=None):
    """Exact MeanFlow average velocity: (x_t - x_r) / (t - r), x_r = (1 - r) MU + S_r / S_t (x_t - (1 - t) MU)."""
    shape = (-1, *([1] * (x.ndim - 1)))
    r, t = r.double().reshape(shape), t.double().reshape(shape)
    x_r = (1 - r) * MU + spread(r) / spread(t) * (x.double() - (1 - t) * MU)
    return ((x.double() - x_r) / (t - r)).to(x.dtype)


@pytest.fixture
def noise():
    return torch.randn(64, 8, generator=torch.Generator().manual_seed(0), dtype=torch.float64)


def exact_state(noise, t):
    """The ODE trajectory through x_1 = noise: x_t = (1 - t) MU + S_t x_1."""
    return (1 - t) * MU + spread(torch.tensor(t, dtype=torch.float64)) * noise


@pytest.mark.parametrize("solver, order", [(euler, 1), (heun, 2), (dpm_solver_2m, 2)])
def test_global_error_shrinks_with_the_solver_order(solver, order, noise):
    # On [0.05, 0.95] the log-SNR is bounded, so every solver is in its asymptotic regime.
    errors = []
    for steps in (32, 64, 128):
        grid = timesteps(steps, t_max=0.95, t_min=0.05).double()
        errors.append(
            (solver(gaussian_velocity, exact_state(noise, 0.95), grid).x0 - exact_state(noise, 0.05))
            .abs()
            .max()
            .item()
        )
    ratios = [errors[0] / errors[1], errors[1] / errors[2]]
    expected = 2.0**order
    for ratio in ratios:
        assert 0.8 * expected < ratio < 1.25 * expected, (solver.__name__, errors, ratios)


def test_solvers_reach_the_data_from_pure_noise(noise):
    errors = {}
    for solver in (euler, heun, dpm_solver_2m):
        errors[solver.__name__] = [
            (solver(gaussian_velocity, noise, timesteps(steps).double()).x0 - exact_sample(noise))
            .abs()
            .max()
            .item()
            for steps in (32, 64, 128)
        ]
        assert errors[solver.__name__][0] > errors[solver.__name__][1] > errors[solver.__name__][2]
    for second_order in ("heun", "dpm_solver_2m"):
        assert errors[second_order][1] < errors["euler"][1] / 5, errors


def test_solvers_count_network_evaluations(noise):
    calls = []

    def counted(x, t, cond):
        calls.append(x.shape[0])
        return gaussian_velocity(x, t)

    for solver, per_step in ((euler, 1), (heun, 2), (dpm_solver_2m, 1)):
        calls.clear()
        rollout = solver(counted, noise, timesteps(7).double(), keep_latents=True)
        assert len(calls) == rollout.nfe == 7 * per_step
        assert rollout.latents.shape == (64, 8, 8) and torch.equal(rollout.latents[:, -1], rollout.x0)


def test_cfg_off_is_one_forward_and_on_is_one_batched_forward(noise):
    calls = []

    def counted(x, t, cond):
        calls.append(x.shape[0])
        return gaussian_velocity(x, t) * cond[:, None]

    cond, uncond = torch.full((64,), 2.0, dtype=torch.float64), torch.ones(64, dtype=torch.float64)
    euler(guided_velocity(counted, 1.0, uncond), noise, timesteps(5).double(), cond)
    assert calls == [64] * 5
    calls.clear()
    x, t = noise, torch.full((64,), 0.5, dtype=torch.float64)
    guided = guided_velocity(counted, 3.0, uncond)(x, t, cond)
    assert calls == [128]
    v = gaussian_velocity(x, t)
    torch.testing.assert_close(guided, v + 3.0 * (2 * v - v))


@pytest.mark.parametrize("variant", ["flow", "cps"])
def test_sde_step_tends_to_the_euler_step_as_the_noise_vanishes(variant):
    generator = torch.Generator().manual_seed(0)
    x, v = torch.randn(4, 8, generator=generator), torch.randn(4, 8, generator=generator)
    t, t_next = 0.6, 0.5
    euler_step = x + (t_next - t) * v
    gaps = [
        (sde_step(v, x, t, t_next, level, variant).mean - euler_step).abs().max().item()
        for level in (1e-1, 1e-2, 1e-3)
    ]
    # Flow-SDE's mean differs from Euler by O(a^2); CPS's by O(a^2) as well (sqrt(t^2 - s^2) ~ t - s^2 / 2t).
    assert gaps[0] > 10 * gaps[1] > 100 * gaps[2] and gaps[2] < 1e-5, gaps


def test_sde_with_zero_noise_level_runs_the_ode(noise):
    schedule = timesteps(10)
    sde = sde_sample(gaussian_velocity, noise.float(), schedule, noise_level=0.0)
    ode = euler(gaussian_velocity, noise.float(), schedule, keep_latents=True)
    torch.testing.assert_close(sde.latents, ode.latents, rtol=0, atol=0)
    assert not sde.trained_mask.any() and torch.equal(sde.log_probs, torch.zeros_like(sde.log_probs))


@pytest.mark.parametrize("t, t_next", [(1.0, 0.9), (0.6, 0.55), (0.1, 0.05)])
def test_flow_sde_log_prob_is_the_gaussian_density(t, t_next):
    generator = torch.Generator().manual_seed(1)
    x, v = torch.randn(4, 3, 5, 5, generator=generator), torch.randn(4, 3, 5, 5, generator=generator)
    a, dt = 0.7, t_next - t
    std = a * math.sqrt(t / (1 - (t_next if t == 1.0 else t)))
    mean = x.double() * (1 + std**2 * dt / (2 * t)) + v.double() * (1 + std**2 * (1 - t) / (2 * t)) * dt
    step = sde_step(v, x, t, t_next, a)
    expected = torch.distributions.Normal(mean, std * math.sqrt(-dt)).log_prob(step.x_next.double())
    torch.testing.assert_close(step.log_prob.double(), expected.mean(dim=(1, 2, 3)), rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(step.mean.double(), mean, rtol=1e-5, atol=1e-5)


def test_cps_gaussian_log_prob_is_the_gaussian_density():
    generator = torch.Generator().manual_seed(2)
    x, v = torch.randn(4, 16, generator=generator), torch.randn(4, 16, generator=generator)
    t, t_next, a = 0.5, 0.4, 0.6
    scale = t_next * math.sin(a * math.pi / 2)
    mean = (1 - t_next) * (x.double() - t * v.double()) + math.sqrt(t_next**2 - scale**2) * (
        x.double() + (1 - t) * v.double()
    )
    step = sde_step(v, x, t, t_next, a, variant="cps_gaussian")
    expected = torch.distributions.Normal(mean, scale).log_prob(step.x_next.double()).mean(dim=1)
    torch.testing.assert_close(step.log_prob.double(), expected, rtol=1e-5, atol=1e-5)


def test_sde_step_rejects_bad_input():
    with pytest.raises(ValueError, match="unknown SDE variant"):
        sde_step(torch.zeros(1, 2), torch.zeros(1, 2), 0.5, 0.4, 0.7, variant="ddim")
    with pytest.raises(ValueError, match="zero noise scale"):
        sde_step(torch.zeros(1, 2), torch.zeros(1, 2), 0.5, 0.4, 0.0)


def test_flow_sde_keeps_the_ode_marginal_on_gaussian_data():
    noise = torch.randn(4000, 16, generator=torch.Generator().manual_seed(3), dtype=torch.float64)
    rollout = sde_sample(
        gaussian_velocity,
        noise,
        timesteps(60).double(),
        noise_level=0.7,
        generator=torch.Generator().manual_seed(4),
    )
    samples = rollout.x0
    assert abs(samples.mean().item() - MU) < 0.02
    assert abs(samples.std().item() - S) / S < 0.05
    # Not the ODE's own map: the noise really moved the samples.
    assert (samples - exact_sample(noise)).abs().mean() > 0.05
    for index in (10, 30, 50):
        t = rollout.timesteps[index]
        assert abs(rollout.latents[:, index].std().item() - spread(t).item()) < 0.03
        assert abs(rollout.latents[:, index].mean().item() - (1 - t.item()) * MU) < 0.03


def test_cps_preserves_the_interpolant_coefficients():
    # Point-mass data x0*: the exact velocity is (x - x0*) / t, and every CPS state must be
    # (1 - t) x0* + t z with z standard normal (coefficients preserved), ending exactly at x0*.
    target = torch.linspace(-1, 1, 16, dtype=torch.float64)

    def point_velocity(x, t, cond=None):
        return (x - target) / t.reshape(-1, 1)

    noise = torch.randn(4000, 16, generator=torch.Generator().manual_seed(5), dtype=torch.float64)
    rollout = sde_sample(
        point_velocity,
        noise,
        timesteps(10).double(),
        noise_level=0.7,
        variant="cps",
        generator=torch.Generator().manual_seed(6),
    )
    for index in range(1, 10):
        t = rollout.timesteps[index].item()
        z = (rollout.latents[:, index].double() - (1 - t) * target) / t
        assert abs(z.mean().item()) < 0.02 and abs(z.std().item() - 1) < 0.015, (index, z.mean(), z.std())
    torch.testing.assert_close(rollout.x0, target.expand(4000, 16), rtol=0, atol=1e-5)


def test_window_and_last_step_decide_what_is_stochastic(noise):
    assert stochastic_steps(10, 0.7).tolist() == [True] * 9 + [False]
    assert stochastic_steps(10, 0.7, window=(2, 5)).nonzero().flatten().tolist() == [2, 3, 4]
    assert stochastic_steps(10, 0.7, window=(7, 20)).nonzero().flatten().tolist() == [7, 8]
    with pytest.raises(ValueError, match="window"):
        stochastic_steps(10, 0.7, window=(5, 5))
    with pytest.raises(ValueError, match="window"):
        stochastic_steps(10, 0.7, window=(9, 12))  # starts at the last step: nothing would be trained
    schedule = timesteps(10)
    rollout = sde_sample(
        gaussian_velocity,
        noise.float(),
        schedule,
        sde_window=(2, 5),
        generator=torch.Generator().manual_seed(0),
    )
    ode = euler(gaussian_velocity, noise.float(), schedule, keep_latents=True)
    torch.testing.assert_close(rollout.latents[:, :3], ode.latents[:, :3], rtol=0, atol=0)
    assert (rollout.log_probs[:, [0, 1, 5, 6, 7, 8, 9]] == 0).all()
    assert (rollout.log_probs[:, 2:5] != 0).all()


def test_sliding_window_moves_and_wraps_inside_the_trainable_steps():
    windows = [sliding_window(iteration, 3, 10, stride=2, every=2) for iteration in range(12)]
    assert windows[:6] == [(0, 3), (0, 3), (2, 5), (2, 5), (4, 7), (4, 7)]
    assert all(0 <= start and end <= 9 for start, end in windows)  # never the last step
    assert windows[8] == (1, 4)  # 4 * 2 = 8 wraps modulo 10 - 3
    with pytest.raises(ValueError, match="window size"):
        sliding_window(0, 10, 10)


class TinyVelocity(torch.nn.Module):
    """A small network standing in for a model: v = MLP(x, t) modulated by the conditioning."""

    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.net = torch.nn.Sequential(torch.nn.Linear(9, 32), torch.nn.Tanh(), torch.nn.Linear(32, 8))

    def forward(self, x, t, cond):
        return self.net(torch.cat([x, t[:, None].to(x.dtype)], dim=1)) * cond[:, None]


@pytest.mark.parametrize("variant", ["flow", "cps", "cps_gaussian"])
def test_rescoring_own_transitions_gives_ratio_one(variant):
    model = TinyVelocity()
    noise = torch.randn(6, 8, generator=torch.Generator().manual_seed(5))
    cond = torch.linspace(0.5, 1.5, 6)
    rollout = sde_sample(
        model, noise, timesteps(8), cond, variant=variant, generator=torch.Generator().manual_seed(6)
    )
    for step in rollout.trained_mask.nonzero().flatten().tolist():
        t = rollout.timesteps[step].expand(6)
        t_next = rollout.timesteps[step + 1].expand(6)
        rescored = transition_log_prob(
            model, rollout.latents[:, step], rollout.latents[:, step + 1], t, t_next, cond, 0.7, variant
        )
        ratio = torch.exp(rescored.log_prob - rollout.log_probs[:, step])
        assert torch.equal(ratio, torch.ones_like(ratio))
        assert rescored.log_prob.requires_grad


def test_meanflow_is_exact_with_the_exact_average_velocity(noise):
    for steps in (1, 2, 4):
        rollout = meanflow_sample(
            gaussian_average_velocity, noise, timesteps(steps).double(), keep_latents=True
        )
        torch.testing.assert_close(rollout.x0, exact_sample(noise), rtol=1e-9, atol=1e-9)
        assert rollout.nfe == steps and rollout.latents.shape[1] == steps + 1


def test_tree_nfe_formula():
    # 20 steps, splits at 4 steps, two children each: 16 leaves per prompt.
    assert tree_nfe(20, [0, 4, 8, 12], 2) == 1 + 4 * 2 + 4 * 4 + 4 * 8 + 7 * 16
    assert tree_nfe(20, [], 2) == 20


@pytest.mark.parametrize("mix_window", [None, (2, 6)])
def test_tree_counts_and_shares_prefixes(mix_window):
    model = TinyVelocity()
    calls = []

    def counted(x, t, cond):
        calls.append(x.shape[0])
        return model(x, t, cond)

    prompts, splits = 3, [1, 4, 8, 12]
    noise = torch.randn(prompts, 8, generator=torch.Generator().manual_seed(7))
    cond = torch.tensor([0.5, 1.0, 1.5])
    tree = tree_sample(
        counted,
        noise,
        timesteps(20),
        cond,
        splits,
        branching=2,
        sde_window=mix_window,
        generator=torch.Generator().manual_seed(8),
    )
    assert sum(calls) == prompts * tree_nfe(20, splits, 2) == prompts * tree.nfe_per_tree
    assert tree.leaf_nodes.numel() == prompts * 16 and tree.x0.shape == (prompts * 16, 8)
    assert torch.equal(tree.tree[tree.leaf_nodes], torch.arange(prompts).repeat_interleave(16))
    paths = tree.leaf_paths()
    assert paths.shape == (prompts * 16, 21, 8)
    for prompt in range(prompts):
        leaves = paths[prompt * 16 : (prompt + 1) * 16]
        for depth in range(21):
            distinct = torch.unique(leaves[:, depth], dim=0).shape[0]
            assert distinct == 2 ** sum(split < depth for split in splits), (depth, distinct)
        # Leaves that split last at step 12 share everything up to depth 12 bit for bit.
        assert torch.equal(leaves[0, :13], leaves[1, :13]) and not torch.equal(leaves[0, 13], leaves[1, 13])
    # Every non-root node's trainable flag says whether its step was stochastic.
    steps = tree.depth[tree.parent >= 0] - 1
    stochastic = stochastic_steps(20, 0.7, mix_window)
    is_split = torch.tensor([s in splits for s in range(20)])
    assert torch.equal(tree.edge_trainable[tree.parent >= 0], (stochastic | is_split)[steps])


def test_tree_without_splits_is_the_flat_sde():
    model = TinyVelocity()
    noise = torch.randn(4, 8, generator=torch.Generator().manual_seed(9))
    cond = torch.linspace(0.5, 1.5, 4)
    schedule = timesteps(10)
    tree = tree_sample(model, noise, schedule, cond, [], generator=torch.Generator().manual_seed(10))
    flat = sde_sample(model, noise, schedule, cond, generator=torch.Generator().manual_seed(10))
    assert torch.equal(tree.leaf_paths(), flat.latents)
    leaf_edges = tree.ancestors(tree.leaf_nodes)[:, 1:]
    assert torch.equal(tree.edge_log_probs[leaf_edges], flat.log_probs)
    assert tree.nfe_per_tree == flat.nfe == 10


def test_tree_edges_rescore_to_ratio_one():
    model = TinyVelocity()
    noise = torch.randn(2, 8, generator=torch.Generator().manual_seed(11))
    cond = torch.tensor([0.8, 1.2])
    tree = tree_sample(
        model,
        noise,
        timesteps(6),
        cond,
        [1, 3],
        noise_level=0.5,
        split_noise_level=0.75,
        generator=torch.Generator().manual_seed(12),
    )
    children = tree.edge_trainable.nonzero().flatten()
    assert set(tree.edge_noise_levels[children].tolist()) == {0.5, 0.75}
    assert (tree.edge_noise_levels[tree.depth == 2] == 0.75).all()  # step 1 is a split
    for depth in tree.depth[children].unique().tolist():
        nodes = children[tree.depth[children] == depth]
        parents = tree.parent[nodes]
        # Re-score in the batch the sampler used: the whole frontier at that depth, in node order.
        frontier = (tree.depth == depth - 1).nonzero().flatten()
        assert torch.equal(torch.unique(parents), frontier)
        rescored = transition_log_prob(
            model,
            tree.states[parents],
            tree.states[nodes],
            tree.timesteps[depth - 1].expand(len(nodes)),
            tree.timesteps[depth].expand(len(nodes)),
            cond[tree.tree[nodes]],
            tree.edge_noise_levels[nodes],
        )
        torch.testing.assert_close(rescored.log_prob, tree.edge_log_probs[nodes], rtol=0, atol=1e-6)


def test_cfg_with_a_shared_unconditional_row_follows_the_growing_tree_frontier():
    model = TinyVelocity()
    calls = []

    def counted(x, t, cond):
        calls.append(x.shape[0])
        return model(x, t, cond)

    noise = torch.randn(2, 8, generator=torch.Generator().manual_seed(13))
    cond, uncond = torch.tensor([0.8, 1.2]), torch.tensor([0.1])  # one unconditional row for every node
    guided = guided_velocity(counted, 2.5, uncond)
    tree = tree_sample(guided, noise, timesteps(4), cond, [0, 1], generator=torch.Generator().manual_seed(14))
    assert calls == [2 * 2, 2 * 4, 2 * 8, 2 * 8]  # conditional and unconditional halves of the frontier
    x, t = torch.randn(3, 8), torch.full((3,), 0.5)
    rows = torch.tensor([0.8, 1.2, 0.8])
    expected = model(x, t, torch.full((3,), 0.1)) + 2.5 * (
        model(x, t, rows) - model(x, t, torch.full((3,), 0.1))
    )
    torch.testing.assert_close(guided(x, t, rows), expected)
    assert tree.x0.shape == (8, 8)
    with pytest.raises(ValueError, match="rows"):
        guided_velocity(model, 2.0, torch.ones(2))(x, t, rows)


def test_tree_rejects_splits_at_the_last_step():
    with pytest.raises(ValueError, match="split steps"):
        tree_sample(gaussian_velocity, torch.zeros(1, 2), timesteps(5), None, [4])


def test_samplers_are_dtype_agnostic(noise):
    rollout = sde_sample(gaussian_velocity, noise, timesteps(5), generator=torch.Generator().manual_seed(0))
    assert rollout.x0.dtype == torch.float64 and rollout.latents.dtype == torch.float32
    assert euler(gaussian_velocity, noise.float(), timesteps(5)).x0.dtype == torch.float32


def test_conditioning_rows_are_selected_and_stacked_in_any_nesting():
    cond = {"ids": torch.arange(4), "pair": (torch.arange(8).reshape(4, 2), "shared"), "none": None}
    picked = select_rows(cond, torch.tensor([2, 0]))
    assert picked["ids"].tolist() == [2, 0] and picked["pair"][0].tolist() == [[4, 5], [0, 1]]
    assert picked["pair"][1] == "shared" and picked["none"] is None
    stacked = concat_rows(cond, cond)
    assert stacked["ids"].tolist() == [0, 1, 2, 3, 0, 1, 2, 3] and stacked["pair"][0].shape == (8, 2)
    with pytest.raises(ValueError, match="keys"):
        concat_rows({"a": torch.zeros(1)}, {"b": torch.zeros(1)})
