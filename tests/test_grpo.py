"""Flow-GRPO and BranchGRPO: ratios, the loss against the formula, tree rewards, advantages and pruning."""

import math

import pytest
import torch
from test_trainer import TINY_RUN

from flowrl.advantages import RewardBatch, group_advantages
from flowrl.algorithms.base import TrainBatch
from flowrl.algorithms.branch_grpo import BranchGRPO, depth_advantages, node_rewards, trained_edges
from flowrl.algorithms.flow_grpo import FlowGRPO
from flowrl.algorithms.grpo import gaussian_mean_kl, grpo_clip_loss
from flowrl.config import load_config
from flowrl.models import ShapesFlowModel
from flowrl.policy import make_policy
from flowrl.run_log import read_metrics
from flowrl.trainer import Trainer
from samplers import TreeRollout, guided_velocity, select_rows, timesteps

#: the tiny run without DiffusionNFT's keys (a GRPO algorithm section has no train_timesteps)
TINY_GRPO_RUN = [override for override in TINY_RUN if not override.startswith("algorithm.")]

#: trees small enough for the tiny runs: 5 steps, splits at 0 and 2 (Mix: 0 and 1) -> 4 leaves; flat Flow-GRPO
#: as the reference runs it (every step stochastic, noise per sample), not the shapes recipe's window
TINY_TREE = {
    "flowgrpo": [
        "algorithm.sde_window_size=0",
        "algorithm.same_group_noise=false",
        "algorithm.timestep_fraction=0.25",
    ],
    # the reference's settings (the recipe departs from them: its header), which these tests check
    "branchgrpo": "sampler.num_steps=5 algorithm.split_steps=[0,2] training.micro_batch_size=4 "
    "algorithm.sde_variant=dance algorithm.noise_level=0.3 algorithm.split_noise_scale=4.0 algorithm.clip_range=0.001 "
    "algorithm.kl_weight=0.0 algorithm.train_last_step=true algorithm.width_pruning=best_and_worst".split(),
    "branchgrpo_mix": [
        "sampler.num_steps=5",
        "algorithm.split_steps=[0,1]",
        "algorithm.sde_window_size=2",
        "training.micro_batch_size=4",
    ],
}


def grpo_config(name, *overrides):
    return load_config(f"configs/shapes_{name}.yaml", [*TINY_GRPO_RUN, *TINY_TREE[name], *overrides])


def rollout_rows(algorithm, policy, config, prompts, seed=0, step=1, rewards=None, velocity=None):
    """One step's rollout of ``prompts`` (each ``group_size`` times, sampled by ``velocity``, default
    the old policy) and its training rows."""
    group = config.training.group_size
    records = [prompt for prompt in prompts for _ in range(group)]
    cond = policy.encode(records)
    noise = torch.randn(len(records), *policy.sample_shape, generator=torch.Generator().manual_seed(seed))
    grid = timesteps(config.sampler.num_steps)
    with torch.no_grad():
        chunk = algorithm.rollout(
            velocity or policy.old_velocity, noise, grid, cond, torch.Generator().manual_seed(seed + 1), step
        )
    if rewards is None:
        rewards = torch.rand(len(records), generator=torch.Generator().manual_seed(seed + 2))
    advantages = group_advantages(rewards, torch.arange(len(records)) // group)
    return chunk, cond, algorithm.training_rows([chunk], advantages, rewards, step)


def batch_of(rows, cond, draws=None, part=slice(None)):
    return TrainBatch(
        {key: value[part] for key, value in rows.data.items()},
        select_rows(cond, rows.cond_index[part]),
        rows.advantages[part],
        {key: value[:, part] for key, value in (draws or {}).items()},
        None if rows.weights is None else rows.weights[part],
    )


# --- the loss --------------------------------------------------------------------------------------


def test_clip_loss_is_the_pessimistic_clipped_objective():
    log_prob = torch.tensor([0.0, 0.5, -0.5, 0.5, -0.5])
    old = torch.zeros(5)
    advantages = torch.tensor([1.0, 1.0, 1.0, -1.0, -1.0])
    loss, ratio = grpo_clip_loss(log_prob, old, advantages, clip_range=0.2)
    expected_ratio = torch.exp(log_prob)
    torch.testing.assert_close(ratio, expected_ratio)
    # A > 0: min(rho, clip(rho)) A; A < 0: max(...) -> the pessimistic side in both cases
    expected = torch.tensor([-1.0, -1.2, -math.exp(-0.5), math.exp(0.5), 0.8])
    torch.testing.assert_close(loss, expected)


def flow_sde_log_prob(v, x, x_next, t, t_next, a):
    """Flow-SDE transition log-density written out independently (float64), averaged over dims."""
    v, x, x_next = v.double(), x.double(), x_next.double()
    t, t_next = t.double().view(-1, 1, 1, 1), t_next.double().view(-1, 1, 1, 1)
    dt = t_next - t
    sigma_ratio = torch.where(t == 1, t / (1 - t_next), t / (1 - t))
    std = a * torch.sqrt(sigma_ratio)
    mean = x * (1 + std**2 / (2 * t) * dt) + v * (1 + std**2 * (1 - t) / (2 * t)) * dt
    scale = std * torch.sqrt(-dt)
    density = -((x_next - mean) ** 2) / (2 * scale**2) - torch.log(scale) - 0.5 * math.log(2 * math.pi)
    return density.mean(dim=(1, 2, 3)), mean, scale, std


@pytest.mark.parametrize("kl_form", ["reference", "exact"])
def test_flow_grpo_loss_equals_a_direct_recomputation(tiny_model, kl_form):
    """The clipped ratio loss and the KL, written out independently: the reference's KL divides by
    ``2 std_dev_t²`` (Flow-GRPO's train_sd3.py, no sqrt(dt)); ``exact`` by the step's ``2 scale²``."""
    config = grpo_config(
        "flowgrpo", "training.group_size=4", "algorithm.kl_weight=0.1", f"algorithm.kl_form={kl_form}"
    )
    policy = make_policy(ShapesFlowModel(tiny_model))
    algorithm = FlowGRPO(config)
    chunk, cond, rows = rollout_rows(algorithm, policy, config, ["a red circle", "two blue squares"])
    with torch.no_grad():  # move theta away from the sampling policy so ratios differ from 1
        for parameter in policy.model.parameters():
            parameter.add_(0.01 * torch.randn_like(parameter))
    grid = timesteps(config.sampler.num_steps)
    draws = algorithm.draw(torch.Generator().manual_seed(5), rows.count, policy.sample_shape, grid, 1)
    loss, stats = algorithm.loss(policy, batch_of(rows, cond, draws), pass_index=0, step=1)

    index = draws["step"][0]
    samples = torch.arange(rows.count)
    x, x_next = rows.data["latents"][samples, index], rows.data["latents"][samples, index + 1]
    t, t_next = grid[index], grid[index + 1]
    with torch.no_grad():
        v = policy.velocity(x, t, cond)
        v_ref = policy.reference_velocity(x, t, cond)
    log_prob, mean, scale, std = flow_sde_log_prob(v, x, x_next, t, t_next, config.algorithm.noise_level)
    _, mean_ref, _, _ = flow_sde_log_prob(v_ref, x, x_next, t, t_next, config.algorithm.noise_level)
    old = rows.data["log_probs"][samples, index].double()
    ratio = torch.exp(log_prob - old)
    advantages = rows.advantages.double().clamp(-5, 5)
    eps = config.algorithm.clip_range
    policy_loss = torch.maximum(-advantages * ratio, -advantages * ratio.clamp(1 - eps, 1 + eps))
    kl_scale = std if kl_form == "reference" else scale
    kl = ((mean - mean_ref) ** 2 / (2 * kl_scale**2)).mean(dim=(1, 2, 3))
    expected = (policy_loss + 0.1 * kl).mean()
    assert float(loss.detach()) == pytest.approx(float(expected), rel=1e-4, abs=1e-6)
    torch.testing.assert_close(stats["grpo/ratio"].double(), ratio, rtol=1e-4, atol=1e-6)
    assert float(stats["grpo/ratio"].sub(1).abs().max()) > 1e-4  # the test exercises the clipped side


def test_gaussian_mean_kl_is_the_closed_form():
    mean, reference = torch.zeros(2, 3), torch.tensor([[1.0, 0.0, 0.0], [2.0, 2.0, 2.0]])
    kl = gaussian_mean_kl(mean, reference, torch.tensor(0.5))
    torch.testing.assert_close(kl, torch.tensor([1 / 3 * 2.0, 8.0]))


@pytest.mark.parametrize("precision", ["no", "bf16"])
@pytest.mark.parametrize("name", ["flowgrpo", "flowgrpo_cfg", "branchgrpo"])
def test_first_inner_step_ratios_are_exactly_one(tiny_model, name, precision):
    guided = name == "flowgrpo_cfg"  # CFG rollouts, trained with a detached unconditional branch
    extra = ["sampler.guidance_scale=2.5", "algorithm.train_guidance=true"] if guided else []
    config = grpo_config(name.removesuffix("_cfg"), *extra)
    policy = make_policy(ShapesFlowModel(tiny_model), mixed_precision=precision)
    algorithm = (BranchGRPO if name == "branchgrpo" else FlowGRPO)(config)
    algorithm.prepare(policy)  # the trainer's call once the policy exists: exact kernels for both copies
    group = config.training.group_size
    velocity = guided_velocity(policy.old_velocity, 2.5, policy.encode([""])) if guided else None
    chunk, cond, rows = rollout_rows(
        algorithm, policy, config, ["a red circle", "two blue squares"], velocity=velocity
    )
    grid = timesteps(config.sampler.num_steps)
    draws = algorithm.draw(torch.Generator().manual_seed(5), 2 * group, policy.sample_shape, grid, 1)
    for pass_index in range(algorithm.passes):
        _, stats = algorithm.loss(policy, batch_of(rows, cond, draws), pass_index, 1)
        if name == "branchgrpo":  # a tree's frontiers are not the rows' batch: equal up to the last bits
            ones = torch.ones_like(stats["grpo/ratio"])
            torch.testing.assert_close(stats["grpo/ratio"], ones, rtol=0, atol=1e-5)
        else:
            assert bool((stats["grpo/ratio"] == 1).all())
        assert float(stats["grpo/clip_fraction"].sum()) == 0


# --- advantages, trees and pruning --------------------------------------------------------------


def test_a_group_with_equal_rewards_has_zero_advantages(tiny_model):
    rewards = torch.tensor([0.5, 0.5, 0.5, 0.5, 0.0, 1.0, 0.0, 1.0])
    advantages = group_advantages(rewards, torch.arange(8) // 4)
    assert bool((advantages[:4] == 0).all()) and bool((advantages[4:] != 0).all())
    config = grpo_config("branchgrpo")
    policy = make_policy(ShapesFlowModel(tiny_model))
    _, _, rows = rollout_rows(
        BranchGRPO(config), policy, config, ["a red circle"], rewards=torch.full((4,), 0.7)
    )
    assert bool((rows.advantages == 0).all())


def hand_built_tree():
    """One tree, 3 steps, splits at steps 0 and 1 (branching 2): root 0 -> 1, 2 -> 3, 4 (of 1), 5, 6 (of 2)
    -> leaves 7, 8, 9, 10 (one child each at the last, deterministic step)."""
    parent = torch.tensor([-1, 0, 0, 1, 1, 2, 2, 3, 4, 5, 6])
    depth = torch.tensor([0, 1, 1, 2, 2, 2, 2, 3, 3, 3, 3])
    log_probs = torch.tensor([0.0, 0.0, math.log(3.0), 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0])
    trainable = torch.tensor([False, True, True, True, True, True, True, False, False, False, False])
    return TreeRollout(
        states=torch.zeros(11, 1),
        parent=parent,
        depth=depth,
        tree=torch.zeros(11, dtype=torch.long),
        edge_log_probs=log_probs,
        edge_noise_levels=trainable.float() * 0.7,
        edge_trainable=trainable,
        timesteps=torch.tensor([1.0, 0.6, 0.3, 0.0]),
        leaf_nodes=torch.tensor([7, 8, 9, 10]),
        nfe_per_tree=7,
    )


def test_node_rewards_and_depth_advantages_match_a_hand_built_tree():
    tree = hand_built_tree()
    leaf = torch.tensor([1.0, 0.0, 0.0, 0.0])
    mean = node_rewards(tree, leaf, "mean")
    torch.testing.assert_close(mean, torch.tensor([0.25, 0.5, 0.0, 1.0, 0.0, 0.0, 0.0, 1.0, 0.0, 0.0, 0.0]))
    # fusion: node 0's children 1, 2 have edge log-probs 0 and log 3 -> weights 1/4 and 3/4
    fusion = node_rewards(tree, leaf, "fusion")
    torch.testing.assert_close(fusion[[0, 1, 2]], torch.tensor([0.125, 0.5, 0.0]))
    advantages = depth_advantages(tree, mean, form="population")  # flowrl's earlier form
    eps = 1e-4
    # depth 1: rewards 0.5, 0 -> mean 0.25, std 0.25; depth 2 and 3: 1, 0, 0, 0 -> mean 0.25, std sqrt(3)/4
    torch.testing.assert_close(advantages[[1, 2]], torch.tensor([0.25, -0.25]) / (0.25 + eps))
    std = math.sqrt(3) / 4
    expected = torch.tensor([0.75, -0.25, -0.25, -0.25]) / (std + eps)
    torch.testing.assert_close(advantages[[3, 4, 5, 6]], expected)
    torch.testing.assert_close(advantages[[7, 8, 9, 10]], expected)
    assert float(advantages[0]) == 0  # a depth with one node
    # pooled std (std_scope=batch): the same centring, divided by a given per-depth std
    pooled = depth_advantages(tree, mean, torch.full((4,), 0.5), form="population")
    torch.testing.assert_close(pooled[[1, 2]], torch.tensor([0.25, -0.25]) / (0.5 + eps))


def test_pruning_drops_exactly_the_right_edges():
    tree = hand_built_tree()
    advantages = depth_advantages(
        tree, node_rewards(tree, torch.tensor([1.0, 0.0, 0.5, 0.2])), form="population"
    )

    def kept(depth_window, sde_window_steps, pruned, width):
        keep = trained_edges(tree, advantages, depth_window, sde_window_steps, pruned, width, last_split=1)
        return torch.nonzero(keep).flatten().tolist()

    assert kept(None, None, set(), "none") == [1, 2, 3, 4, 5, 6]
    assert kept((1, 2), None, set(), "none") == [3, 4, 5, 6]  # step 1 only
    assert kept(None, (0, 1), set(), "none") == [1, 2]  # Mix: window steps only
    assert kept(None, None, {2}, "none") == [1, 2]  # the reference's depth pruning removes depth 2
    # width: of depth 2's four nodes (advantages of 1, 0, 0.5, 0.2) keep the best and the worst
    assert kept(None, None, set(), "quartiles") == [1, 2, 3, 4]


def test_pruning_never_changes_the_rollout_and_rows_match_the_count(tiny_model):
    plain = grpo_config("branchgrpo", "algorithm.depth_window_size=0", "algorithm.width_pruning=none")
    pruned = grpo_config(
        "branchgrpo",
        "algorithm.depth_window_size=2",
        "algorithm.depth_window_start=1",
        "algorithm.depth_window_slide=false",
        "algorithm.width_pruning=quartiles",
    )
    policy = make_policy(ShapesFlowModel(tiny_model))
    chunk_a, _, rows_a = rollout_rows(BranchGRPO(plain), policy, plain, ["a red circle", "a blue square"])
    chunk_b, _, rows_b = rollout_rows(BranchGRPO(pruned), policy, pruned, ["a red circle", "a blue square"])
    assert torch.equal(chunk_a.x0, chunk_b.x0) and torch.equal(chunk_a.data.states, chunk_b.data.states)
    assert rows_a.count == BranchGRPO(plain).num_rows(8) and rows_b.count == BranchGRPO(pruned).num_rows(8)
    assert rows_a.count == 2 * (
        2 + 2 + 4 + 4 + 4
    )  # 2 trees; edges of steps 0..4 (the reference trains the last)
    assert rows_b.count == 2 * (2 + 2)  # steps 1 and 2; width pruning keeps 2 of the 4 at step 2
    grid = timesteps(plain.sampler.num_steps)
    assert {float(t) for t in rows_b.data["t"]} == {float(grid[1]), float(grid[2])}


def test_mix_mode_trains_only_window_steps(tiny_model):
    config = grpo_config("branchgrpo_mix")
    algorithm = BranchGRPO(config)
    policy = make_policy(ShapesFlowModel(tiny_model))
    _, _, rows = rollout_rows(algorithm, policy, config, ["a red circle"])
    grid = timesteps(config.sampler.num_steps)
    start = config.algorithm.sde_window_start
    window_times = {float(grid[i]) for i in range(start, start + config.algorithm.sde_window_size)}
    assert rows.count == algorithm.num_rows(config.training.group_size)
    assert {float(t) for t in rows.data["t"]} == window_times


# --- the loop -----------------------------------------------------------------------------------


@pytest.mark.parametrize("name", ["flowgrpo", "branchgrpo", "branchgrpo_mix"])
def test_grpo_recipes_train_through_the_loop(tmp_path, tiny_model_dir, name):
    config = load_config(
        f"configs/shapes_{name}.yaml",
        [
            *TINY_GRPO_RUN,
            *TINY_TREE[name],
            f"model.name={tiny_model_dir}",
            f"logging.output_dir={tmp_path}",
            "training.steps=2",
        ],
    )
    Trainer(config).train()
    rows = read_metrics(tmp_path / "metrics.jsonl")[1:]
    assert [row["step"] for row in rows] == [1, 2]
    # on-policy at the first inner step: ratio 1 up to the last bits of a differently composed batch (the
    # rows' micro-batches are not the rollout's frontiers; DanceGRPO's small std amplifies them)
    assert rows[0]["grpo/ratio"] == pytest.approx(1.0, abs=1e-6) and rows[0]["grpo/clip_fraction"] == 0.0
    assert all(math.isfinite(row["loss"]) and math.isfinite(row["grad_norm"]) for row in rows)


def test_same_group_noise_and_dropped_zero_std_groups(tiny_model):
    config = grpo_config(
        "flowgrpo",
        "algorithm.same_group_noise=true",
        "algorithm.drop_zero_std_groups=true",
        "training.micro_batch_size=4",
    )
    policy = make_policy(ShapesFlowModel(tiny_model))
    rewards = torch.tensor([0.5, 0.5, 0.5, 0.5, 0.0, 1.0, 0.0, 1.0])
    algorithm = FlowGRPO(config)
    algorithm.advantages(RewardBatch({"r": rewards}, {"r": 1.0}, rewards, torch.arange(8) // 4))
    chunk, cond, rows = rollout_rows(
        algorithm, policy, config, ["a red circle", "two blue squares"], rewards=rewards
    )
    starts = rows.data["latents"][:, 0]
    assert all(torch.equal(starts[i], starts[(i // 4) * 4]) for i in range(8))
    assert not torch.equal(starts[0], starts[4]) and not torch.equal(
        chunk.x0[0], chunk.x0[1]
    )  # SDE noise differs
    # the kept half carries the whole loss: it averages over the kept samples, as the reference
    assert rows.weights.tolist() == [0, 0, 0, 0, 2, 2, 2, 2] and rows.log == {"grpo/dropped_samples": 0.5}


@pytest.mark.parametrize("width", ["best_half", "best_and_worst"])
def test_the_reference_width_pruning_keeps_its_share_after_the_last_split(tiny_model, width):
    """Mode 1 keeps int(n / 2) of each branch's post-split transitions, mode 2 the best and worst quarter of
    them pooled over the trees; the edges up to the last split are all kept; rows match num_rows."""
    config = grpo_config("branchgrpo", f"algorithm.width_pruning={width}")
    policy = make_policy(ShapesFlowModel(tiny_model))
    algorithm = BranchGRPO(config)
    _, _, rows = rollout_rows(algorithm, policy, config, ["a red circle", "a blue square"])
    assert rows.count == algorithm.num_rows(8)
    grid = timesteps(config.sampler.num_steps)
    after = rows.data["t"] < float(grid[2]) - 1e-6  # steps 3 and 4 lie after the last split (step 2)
    assert int((~after).sum()) == 2 * (2 + 2 + 4)
    post_split = 2 * 4 * 2  # 2 trees x 4 chains x 2 steps
    assert int(after.sum()) == (8 * 1 if width == "best_half" else post_split // 2)
    if width == "best_and_worst":
        kept = rows.advantages[after].sort().values
        assert kept[0] <= kept[-1]


def test_branchgrpo_batch_std_is_global_so_two_processes_train_as_one(tmp_path, tiny_model_dir):
    """``std_scope: batch`` pools each depth's std over every tree of the gathered batch (the advantages
    hook), not over one process's trees: two real processes (gloo) give one process's losses and weights."""
    from test_trainer import final_weights
    from two_processes import train_in_two_processes

    overrides = [
        *TINY_GRPO_RUN,
        *TINY_TREE["branchgrpo"],
        "algorithm.std_scope=batch",
        "algorithm.width_pruning=none",  # mode 2 pools over each process's trees, as the reference does
        "training.steps=2",
        "training.threads=1",
        f"model.name={tiny_model_dir}",
    ]
    Trainer(
        load_config("configs/shapes_branchgrpo.yaml", [*overrides, f"logging.output_dir={tmp_path / 'one'}"])
    ).train()
    train_in_two_processes(
        "configs/shapes_branchgrpo.yaml", [*overrides, f"logging.output_dir={tmp_path / 'two'}"]
    )
    rows_one = [row for row in read_metrics(tmp_path / "one" / "metrics.jsonl") if row["step"] > 0]
    rows_two = [row for row in read_metrics(tmp_path / "two" / "metrics.jsonl") if row["step"] > 0]
    assert all(row["num_processes"] == 2 for row in rows_two)
    for row_one, row_two in zip(rows_one, rows_two, strict=True):
        for key in ("reward/mean", "loss", "grad_norm", "grpo/policy_loss"):
            assert row_one[key] == pytest.approx(row_two[key], rel=1e-4, abs=1e-6), (row_one["step"], key)
    _, weights_one = final_weights(tmp_path / "one")
    _, weights_two = final_weights(tmp_path / "two")
    for name, value in weights_one["model"].items():
        torch.testing.assert_close(weights_two["model"][name], value, rtol=1e-4, atol=1e-5)


def test_mode_2_breaks_ties_chain_by_chain_as_the_reference(tiny_model):
    """With every post-split advantage tied, the stable selection keeps edges in the reference's depth-first
    order: whole chains (both post-split steps of a chain together), not the shallower step of every chain."""
    config = grpo_config("branchgrpo", "algorithm.width_pruning=best_and_worst")
    policy = make_policy(ShapesFlowModel(tiny_model))
    algorithm = BranchGRPO(config)
    _, _, rows = rollout_rows(algorithm, policy, config, ["a red circle"], rewards=torch.full((4,), 0.5))
    grid = timesteps(config.sampler.num_steps)
    after = rows.data["t"] < float(grid[2]) - 1e-6
    kept_x, kept_next = rows.data["x"][after], rows.data["x_next"][after]
    # 4 chains x 2 post-split steps; best = the first 2 edges in depth-first order (chain 0's two steps),
    # worst = the last 2 (chain 3's): the kept edges form two whole chains, each step continuing another
    assert int(after.sum()) == 4
    continued = sum(torch.equal(kept_x[j], kept_next[i]) for i in range(4) for j in range(4))
    assert continued == 2
