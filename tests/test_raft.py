"""RAFT: the selection and the flow-matching loss against direct re-computations, its rows and random draws,
its settings, and two real processes against one."""

import pytest
import torch
from test_trainer import TINY_RUN
from two_processes import assert_runs_match, train_in_two_processes

from flowrl.advantages import RewardBatch
from flowrl.algorithms import RAFT, RolloutChunk
from flowrl.algorithms.base import weighted_mean
from flowrl.algorithms.raft import best_of_groups, flow_matching_loss
from flowrl.config import ConfigError, load_config
from flowrl.trainer import Trainer

TINY_RAFT = [*TINY_RUN, "algorithm.keep_per_group=2"]


def direct_best(rewards: list[float], group_size: int, keep: int) -> list[int]:
    """Per group: sort the members by (reward descending, index ascending), take ``keep``; all indices sorted."""
    chosen = []
    for start in range(0, len(rewards), group_size):
        members = list(range(start, start + group_size))
        members.sort(key=lambda i: (-rewards[i], i))
        chosen.extend(members[:keep])
    return sorted(chosen)


@pytest.mark.parametrize("keep", [1, 2, 3])
def test_the_kept_samples_are_the_best_of_each_group_earlier_first_among_ties(keep):
    g = torch.Generator().manual_seed(keep)
    rewards = torch.randint(0, 4, (24,), generator=g).float() / 4  # many ties
    expected = direct_best(rewards.tolist(), 6, keep)
    assert best_of_groups(rewards, 6, keep).tolist() == expected


def test_flow_matching_loss_equals_the_formula():
    g = torch.Generator().manual_seed(0)
    v_theta, x0, eps = (torch.randn(3, 3, 4, 4, generator=g, dtype=torch.float64) for _ in range(3))
    t = torch.rand(3, generator=g, dtype=torch.float64)
    expected = torch.stack([((v_theta[i] - (eps[i] - x0[i])) ** 2).mean() for i in range(3)])
    torch.testing.assert_close(flow_matching_loss(v_theta, x0, eps, t).double(), expected)
    # DiffusionNFT's weighting of a positive sample: the x0-space error x_t - t v - x0, squared, over its
    # own mean absolute value (x_t written out from x0 and eps)
    x_t = [(1 - t[i]) * x0[i] + t[i] * eps[i] for i in range(3)]
    errors = [x_t[i] - t[i] * v_theta[i] - x0[i] for i in range(3)]
    weighted = torch.stack([(e**2).mean() / e.abs().mean() for e in errors])
    torch.testing.assert_close(flow_matching_loss(v_theta, x0, eps, t, adaptive=True).double(), weighted)


def test_rows_are_the_kept_samples_with_their_conditioning_and_advantages(tmp_path):
    config = load_config("configs/shapes_raft.yaml", TINY_RAFT)
    algorithm = RAFT(config)
    assert algorithm.num_rows(8) == 4 and algorithm.passes == 2
    x0 = torch.arange(8.0).reshape(8, 1, 1, 1).expand(8, 3, 2, 2)
    chunks = [RolloutChunk(x0[:4]), RolloutChunk(x0[4:])]
    rewards = torch.tensor([0.1, 0.9, 0.5, 0.2, 0.0, 0.3, 0.3, 0.7])
    advantages = torch.arange(8.0)
    rows = algorithm.training_rows(chunks, advantages, rewards, step=1)
    assert rows.cond_index.tolist() == [1, 2, 5, 7]
    torch.testing.assert_close(rows.data["x0"], x0[[1, 2, 5, 7]])
    torch.testing.assert_close(rows.advantages, advantages[[1, 2, 5, 7]])
    algorithm.advantages(RewardBatch({"r": rewards}, {"r": 1.0}, rewards, torch.tensor([0] * 4 + [1] * 4)))
    assert algorithm.after_optimizer_step(1).log["raft/kept_reward"] == pytest.approx(
        (0.9 + 0.5 + 0.3 + 0.7) / 4
    )


def test_min_reward_fits_only_kept_samples_at_or_above_it_averaged_over_the_fitted():
    """``min_reward``: of the kept samples (rewards 0.9, 0.5 | 0.3, 0.7) those below 0.6 get weight 0 and
    the others ``1 / share`` (share = 2 of 4), so the weighted mean is the mean over the fitted ones."""
    config = load_config("configs/shapes_raft.yaml", [*TINY_RAFT, "algorithm.min_reward=0.6"])
    algorithm = RAFT(config)
    x0 = torch.arange(8.0).reshape(8, 1, 1, 1).expand(8, 3, 2, 2)
    rewards = torch.tensor([0.1, 0.9, 0.5, 0.2, 0.0, 0.3, 0.3, 0.7])
    algorithm.advantages(RewardBatch({"r": rewards}, {"r": 1.0}, rewards, torch.tensor([0] * 4 + [1] * 4)))
    rows = algorithm.training_rows([RolloutChunk(x0)], torch.zeros(8), rewards, step=1)
    assert rows.cond_index.tolist() == [1, 2, 5, 7]
    assert rows.weights.tolist() == [2.0, 0.0, 0.0, 2.0]
    losses = torch.tensor([1.0, 5.0, 7.0, 3.0])
    assert float(weighted_mean(losses, rows.weights)) == pytest.approx((1.0 + 3.0) / 2)
    assert rows.log["raft/fitted_share"] == pytest.approx(0.5)


def test_raft_settings_are_checked():
    with pytest.raises(ConfigError, match=r"keep_per_group=4 .* below training.group_size=4"):
        load_config("configs/shapes_raft.yaml", [*TINY_RAFT, "algorithm.keep_per_group=4"])
    with pytest.raises(ConfigError, match=r"train_timesteps=5 is more than the 4 steps"):
        load_config("configs/shapes_raft.yaml", [*TINY_RAFT, "algorithm.train_timesteps=5"])
    with pytest.raises(ConfigError, match=r"unknown config key algorithm.beta"):
        load_config("configs/shapes_raft.yaml", [*TINY_RAFT, "algorithm.beta=1.0"])


def test_raft_trains_on_policy_and_two_processes_match_one(tmp_path, tiny_model_dir):
    overrides = [*TINY_RAFT, "training.steps=2", "training.threads=1", f"model.name={tiny_model_dir}"]
    config = load_config("configs/shapes_raft.yaml", [*overrides, f"logging.output_dir={tmp_path / 'one'}"])
    trainer = Trainer(config)
    trainer.train()
    # On-policy: after the step the rollout copy holds the trained weights.
    trained = dict(trainer.policy.copies.unwrapped.named_parameters())
    for name, value in trainer.policy.copies.copies["rollout"].named_parameters():
        torch.testing.assert_close(value, trained[name])
    train_in_two_processes("configs/shapes_raft.yaml", [*overrides, f"logging.output_dir={tmp_path / 'two'}"])
    # The kept rows draw their own sample's times and noise whichever process holds them.
    assert_runs_match(
        tmp_path / "one",
        tmp_path / "two",
        ("reward/mean", "raft/kept_reward", "loss", "grad_norm", "raft/flow_matching_loss"),
    )


@pytest.mark.parametrize("guidance", [1.0, 3.0])
def test_the_pull_is_toward_the_base_cfg_mixed_at_reference_guidance(tiny_model, guidance):
    """``reference_guidance = w``: the pull's reference is ``v_u + w (v_c - v_u)`` of the frozen base (``w = 1``:
    the plain conditional base), re-computed here from the base's two velocities."""
    from flowrl.algorithms.base import TrainBatch
    from flowrl.models import ShapesFlowModel
    from flowrl.policy import ROLLOUT, make_policy

    policy = make_policy(ShapesFlowModel(tiny_model), (ROLLOUT,))
    with torch.no_grad():  # move theta off the base so that the pull is not zero
        for parameter in policy.model.parameters():
            parameter.add_(0.02 * torch.randn_like(parameter))
    g = torch.Generator().manual_seed(0)
    batch = TrainBatch(
        {"x0": torch.rand(4, 3, 32, 32, generator=g) * 2 - 1},
        policy.encode(["a red circle", "a red circle", "two blue squares", "two blue squares"]),
        torch.zeros(4),
        {"t": torch.full((1, 4), 0.6), "noise": torch.randn(1, 4, 3, 32, 32, generator=g)},
    )
    config = load_config(
        None,
        [
            "algorithm.name=raft",
            "algorithm.reference_weight=1.0",
            f"algorithm.reference_guidance={guidance}",
            "training.group_size=2",
            "training.micro_batch_size=4",
        ],
    )
    _, stats = RAFT(config).loss(policy, batch, 0, 1)
    x0, t, noise = batch.data["x0"], batch.draws["t"][0], batch.draws["noise"][0]
    x_t = (1 - 0.6) * x0 + 0.6 * noise
    with torch.no_grad():
        v_theta = policy.velocity(x_t, t, batch.cond)
        v_c = policy.reference_velocity(x_t, t, batch.cond)
        v_u = policy.reference_velocity(x_t, t, policy.encode([""] * 4))
        expected = ((v_theta - (v_u + guidance * (v_c - v_u))) ** 2).mean(dim=(1, 2, 3))
    torch.testing.assert_close(stats["raft/reference_mse"], expected, rtol=1e-4, atol=1e-6)
