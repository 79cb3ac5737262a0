"""TAGRPO: its objective re-derived from the paper's form on a tiny model, the anchors (group and memory
bank), the per-prompt noise, the first-pass ratios, the settings it refuses, and the loop: a 2-step run
whose bank survives a resume exactly, and two processes (one bank each) that train."""

import math
from dataclasses import asdict

import pytest
import torch
from run_helpers import trained
from test_grpo import TINY_GRPO_RUN, batch_of, flow_sde_log_prob
from test_trainer import TINY_RUN
from two_processes import train_in_two_processes

from flowrl.algorithms import TAGRPO, RolloutChunk
from flowrl.algorithms.tagrpo import pool_anchors, prompt_seed
from flowrl.config import ConfigError, load_config
from flowrl.models import ShapesFlowModel
from flowrl.policy import make_policy
from flowrl.run_log import read_metrics
from samplers import timesteps

PROMPTS = ["a red circle", "two blue squares"]


def tagrpo_config(*overrides):
    return load_config(
        "configs/shapes_tagrpo.yaml",
        [*TINY_GRPO_RUN, "training.group_size=4", "training.micro_batch_size=8", *overrides],
    )


def tagrpo_rows(algorithm, policy, config, rewards, seed=0):
    """One step's rollout of PROMPTS (each group_size times, from the group's shared noise) and its rows."""
    group = config.training.group_size
    records = [{"prompt": prompt} for prompt in PROMPTS for _ in range(group)]
    algorithm.before_rollout(policy, records, list(range(len(records))), 1)
    cond = policy.encode([record["prompt"] for record in records])
    noise = torch.randn(len(records), *policy.sample_shape, generator=torch.Generator().manual_seed(seed))
    with torch.no_grad():
        chunk = algorithm.rollout(
            policy.old_velocity,
            noise,
            timesteps(config.sampler.num_steps),
            cond,
            torch.Generator().manual_seed(seed + 1),
            1,
        )
    group_ids = torch.arange(len(records)) // group
    mean = torch.stack([rewards[group_ids == g].mean() for g in group_ids])
    advantages = (rewards - mean) / (rewards.std(unbiased=False) + 1e-4)
    return chunk, cond, algorithm.training_rows([chunk], advantages, rewards, 1)


@pytest.mark.parametrize("clip_range", [0.2, 1e-4])
def test_the_loss_is_the_papers_objective_written_out(tiny_model, clip_range):
    """-J = -(J_GRPO + gamma J_align) + the KL: every ratio a Flow-SDE density written out independently
    (float64), J_align in the paper's form min(r A, clip(r) A) toward the group's best and worst
    trajectories, A± their group-normalised advantages (population std + 1e-4, clipped to 5)."""
    gamma = 0.7
    config = tagrpo_config(  # 2 updates per step: the old policy is its own copy (theta moves away from it)
        f"algorithm.clip_range={clip_range}",
        f"algorithm.align_weight={gamma}",
        "algorithm.kl_weight=0.1",
        "training.updates_per_step=2",
    )
    policy = make_policy(ShapesFlowModel(tiny_model))
    algorithm = TAGRPO(config)
    rewards = torch.tensor([0.2, 0.9, 0.1, 0.5, 1.0, 0.0, 0.4, 0.4])
    _, cond, rows = tagrpo_rows(algorithm, policy, config, rewards)
    with torch.no_grad():  # theta away from the sampling (old) policy so that the ratios differ from 1
        for parameter in policy.model.parameters():
            parameter.add_(0.01 * torch.randn_like(parameter))
    grid = timesteps(config.sampler.num_steps)
    draws = algorithm.draw(torch.Generator().manual_seed(5), rows.count, policy.sample_shape, grid, 1)
    pass_index = algorithm.passes - 1
    loss, stats = algorithm.loss(policy, batch_of(rows, cond, draws), pass_index=pass_index, step=1)

    a = config.algorithm.noise_level
    samples = torch.arange(8)
    j = draws["step"][pass_index]
    latents = rows.data["latents"]
    x, x_next, t, t_next = latents[samples, j], latents[samples, j + 1], grid[j], grid[j + 1]
    with torch.no_grad():
        v, v_old, v_ref = (
            policy.velocity(x, t, cond),
            policy.old_velocity(x, t, cond),
            policy.reference_velocity(x, t, cond),
        )
    log_prob, mean, _, std = flow_sde_log_prob(v, x, x_next, t, t_next, a)
    _, mean_ref, _, _ = flow_sde_log_prob(v_ref, x, x_next, t, t_next, a)
    ratio = torch.exp(log_prob - rows.data["log_probs"][samples, j].double())
    advantages = rows.advantages.double().clamp(-5, 5)
    grpo = torch.minimum(ratio * advantages, ratio.clamp(1 - clip_range, 1 + clip_range) * advantages)
    kl = ((mean - mean_ref) ** 2 / (2 * std**2)).mean(dim=(1, 2, 3))
    align = torch.zeros(8, dtype=torch.float64)
    for group in (0, 1):
        members = samples[4 * group : 4 * group + 4]
        r = rewards[members].double()
        normalised = ((r - r.mean()) / (r.std(unbiased=False) + 1e-4)).clamp(-5, 5)
        best, worst = members[int(r.argmax())], members[int(r.argmin())]
        for anchor, advantage in ((best, normalised.max()), (worst, normalised.min())):
            target = latents[anchor, j[members] + 1]
            new, _, _, _ = flow_sde_log_prob(v[members], x[members], target, t[members], t_next[members], a)
            old, _, _, _ = flow_sde_log_prob(
                v_old[members], x[members], target, t[members], t_next[members], a
            )
            r_anchor = torch.exp(new - old)
            clipped = r_anchor.clamp(1 - clip_range, 1 + clip_range)
            align[members] += torch.minimum(r_anchor * advantage, clipped * advantage)
    expected = (-grpo + 0.1 * kl).mean() - gamma * align.mean()
    assert float(loss.detach()) == pytest.approx(float(expected), rel=1e-4, abs=1e-6)
    torch.testing.assert_close(stats["tagrpo/align_loss"].double(), -align, rtol=1e-4, atol=1e-6)
    assert float(stats["tagrpo/ratio_best"].sub(1).abs().max()) > 1e-4  # cross ratios away from 1


def test_first_pass_ratios_toward_both_anchors_are_exactly_one(tiny_model):
    """With theta = the old policy every ratio, the cross-trajectory ones included, is exactly 1."""
    config = tagrpo_config()
    policy = make_policy(ShapesFlowModel(tiny_model))
    algorithm = TAGRPO(config)
    algorithm.prepare(policy)
    _, cond, rows = tagrpo_rows(
        algorithm, policy, config, torch.rand(8, generator=torch.Generator().manual_seed(2))
    )
    grid = timesteps(config.sampler.num_steps)
    draws = algorithm.draw(torch.Generator().manual_seed(5), rows.count, policy.sample_shape, grid, 1)
    for pass_index in range(algorithm.passes):
        _, stats = algorithm.loss(policy, batch_of(rows, cond, draws), pass_index, 1)
        for key in ("grpo/ratio", "tagrpo/ratio_best", "tagrpo/ratio_worst"):
            assert bool((stats[key] == 1).all()), key


def test_one_update_per_step_takes_the_old_velocity_from_theta_and_matches_the_old_copy(tiny_model):
    """With one update per step every pass runs before it, so the old policy's velocity is theta's own; the
    loss and its gradient equal those computed with the old copy's forward (more updates per step)."""
    policy = make_policy(ShapesFlowModel(tiny_model))
    grads = []
    for updates in (1, 2):
        config = tagrpo_config(f"training.updates_per_step={updates}", "algorithm.clip_range=0.2")
        algorithm = TAGRPO(config)
        algorithm.prepare(policy)
        rewards = torch.rand(8, generator=torch.Generator().manual_seed(2))
        _, cond, rows = tagrpo_rows(algorithm, policy, config, rewards)
        grid = timesteps(config.sampler.num_steps)
        draws = algorithm.draw(torch.Generator().manual_seed(5), rows.count, policy.sample_shape, grid, 1)
        policy.model.zero_grad()
        loss, _ = algorithm.loss(policy, batch_of(rows, cond, draws), 0, 1)
        loss.backward()
        grads.append([parameter.grad.clone() for parameter in policy.model.parameters()])
    for one, two in zip(*grads):
        torch.testing.assert_close(one, two, rtol=0, atol=0)


def test_anchors_are_the_pools_first_best_and_worst_with_pool_advantages():
    rewards = torch.tensor([0.5, 1.0, 0.0, 1.0, 0.0])
    best, worst, plus, minus = pool_anchors(rewards, advantage_clip=5.0)
    std = float(rewards.std(unbiased=False))
    assert (best, worst) == (1, 2)
    assert plus == pytest.approx((1.0 - 0.5) / (std + 1e-4)) and minus == pytest.approx(-0.5 / (std + 1e-4))
    assert pool_anchors(torch.tensor([0.0, 0.0, 0.0, 9.0]), advantage_clip=1.5)[2:] == (
        1.5,
        pytest.approx(-0.57735, rel=1e-3),
    )


def test_the_memory_bank_supplies_better_anchors_keeps_the_newest_and_survives_its_state():
    """Bank of 3 per prompt: the groups' best and worst enter it, first in first out; a banked trajectory
    better than the whole group becomes the anchor (and its advantage is over group + bank)."""
    config = tagrpo_config("algorithm.memory_bank_size=3", "algorithm.prompt_noise=true")
    algorithm = TAGRPO(config)
    shape = (config.sampler.num_steps + 1, 3, 2, 2)

    def step(rewards, marks):
        algorithm.before_rollout(None, [{"prompt": "a red circle"}] * 4, [0] * 4, 1)
        latents = torch.stack([torch.full(shape, float(mark)) for mark in marks])
        chunk = RolloutChunk(
            latents[:, -1],
            {
                "latents": latents,
                "log_probs": torch.zeros(4, shape[0] - 1),
                "timesteps": torch.zeros(4, shape[0]),
            },
        )
        return algorithm.training_rows([chunk], torch.zeros(4), torch.tensor(rewards), 1)

    first = step([0.2, 0.9, 0.1, 0.5], [1, 2, 3, 4])
    assert first.data["anchor_latents"][:, 0, 0, 0, 0, 0].tolist() == [2.0] * 4  # best of the group: mark 2
    assert first.data["anchor_latents"][:, 1, 0, 0, 0, 0].tolist() == [3.0] * 4  # worst: mark 3
    assert first.log["tagrpo/bank_anchor_share"] == 0.0
    assert [reward for _, reward in algorithm.bank["a red circle"]] == pytest.approx([0.9, 0.1])
    second = step([0.4, 0.5, 0.3, 0.6], [5, 6, 7, 8])  # the banked 0.9 and 0.1 beat the group's 0.6 and 0.3
    assert second.data["anchor_latents"][0, :, 0, 0, 0, 0].tolist() == [2.0, 3.0]
    pool = torch.tensor([0.4, 0.5, 0.3, 0.6, 0.9, 0.1])
    expected = (pool - pool.mean()) / (pool.std(unbiased=False) + 1e-4)
    torch.testing.assert_close(second.data["anchor_advantages"][0], torch.stack([expected[4], expected[5]]))
    assert second.log["tagrpo/bank_anchor_share"] == 1.0
    assert [reward for _, reward in algorithm.bank["a red circle"]] == pytest.approx(
        [0.1, 0.6, 0.3]
    )  # newest
    restored = TAGRPO(config)
    restored.load_state_dict(algorithm.state_dict())
    assert [reward for _, reward in restored.bank["a red circle"]] == pytest.approx([0.1, 0.6, 0.3])
    for (mine, _), (theirs, _) in zip(algorithm.bank["a red circle"], restored.bank["a red circle"]):
        assert torch.equal(mine, theirs)


def test_prompt_noise_starts_every_rollout_of_a_prompt_from_the_same_noise():
    records = [{"prompt": "a red circle"}, {"prompt": "a red circle"}, {"prompt": "two blue squares"}]
    plain = TAGRPO(tagrpo_config())
    assert plain.noise_seeds(records, [7, 8, 9]) == [7, 8, 9]
    seeds = TAGRPO(tagrpo_config("algorithm.prompt_noise=true")).noise_seeds(records, [7, 8, 9])
    assert seeds[0] == seeds[1] == prompt_seed("a red circle", 0) != seeds[2]
    assert prompt_seed("a red circle", 1) != seeds[0]  # the run's seed enters


def test_tagrpo_settings_are_checked():
    with pytest.raises(ConfigError, match="same_group_noise=false is not allowed for tagrpo"):
        tagrpo_config("algorithm.same_group_noise=false")
    with pytest.raises(ConfigError, match="memory_bank_size=2 is not allowed with prompt_noise=false"):
        tagrpo_config("algorithm.memory_bank_size=2")
    with pytest.raises(ConfigError, match="align_weight"):
        tagrpo_config("algorithm.align_weight=-1")


def test_tagrpo_trains_resumes_its_bank_exactly_and_runs_in_two_processes(tmp_path, tiny_model_dir):
    overrides = [
        *[override for override in TINY_RUN if not override.startswith("algorithm.")],
        "training.group_size=4",
        "training.micro_batch_size=4",
        "training.threads=1",
        "algorithm.memory_bank_size=2",
        "algorithm.prompt_noise=true",
        "data.sampling=uniform",
        f"model.name={tiny_model_dir}",
        "logging.checkpoint_every=1",
    ]

    def run(name, steps, *extra):
        return trained("configs/shapes_tagrpo.yaml", overrides, tmp_path / name, steps, *extra)

    straight = run("straight", 3)
    rows = [row for row in read_metrics(tmp_path / "straight" / "metrics.jsonl") if row["step"] > 0]
    assert rows[0]["tagrpo/ratio_best"] == pytest.approx(1.0, abs=1e-6)
    assert all(math.isfinite(row["loss"]) and math.isfinite(row["tagrpo/align_loss"]) for row in rows)
    run("cut", 2)
    resumed = run("cut", 3, "resume=latest")
    assert sorted(resumed.algorithm.bank) == sorted(straight.algorithm.bank)
    for prompt, entries in straight.algorithm.bank.items():
        for (mine, reward), (theirs, their_reward) in zip(resumed.algorithm.bank[prompt], entries):
            assert torch.equal(mine, theirs) and reward == their_reward
    for key, value in resumed.policy.snapshot().items():
        assert torch.equal(value, straight.policy.snapshot()[key]), key
    train_in_two_processes(
        "configs/shapes_tagrpo.yaml",
        [*overrides, "training.steps=2", f"logging.output_dir={tmp_path / 'two'}"],
    )
    two = [row for row in read_metrics(tmp_path / "two" / "metrics.jsonl") if row["step"] > 0]
    assert [row["step"] for row in two] == [1, 2] and all(math.isfinite(row["loss"]) for row in two)


@pytest.mark.parametrize(
    ("tagrpo", "flow_grpo"),
    [
        ("shapes_tagrpo", "shapes_flowgrpo"),
        ("video_shapes_tagrpo", "video_shapes_flowgrpo"),
        ("video_shapes_i2v_tagrpo", "video_shapes_i2v_flowgrpo"),
    ],
)
def test_each_tagrpo_recipe_is_its_flow_grpo_recipe_plus_the_alignment(tagrpo, flow_grpo):
    """A recipe that names another algorithm starts its algorithm section fresh: every Flow-GRPO key must be
    restated, so that the comparison differs only by TAGRPO's own keys."""
    mine = asdict(load_config(f"configs/{tagrpo}.yaml").algorithm)
    theirs = asdict(load_config(f"configs/{flow_grpo}.yaml").algorithm)
    assert {key: mine[key] for key in theirs if key != "name"} == {
        k: v for k, v in theirs.items() if k != "name"
    }
    assert asdict(load_config(f"configs/{tagrpo}.yaml").training) == asdict(
        load_config(f"configs/{flow_grpo}.yaml").training
    )
