"""PRDP: the pair loss against a re-derivation typed from the paper's equations and its App. G loss, the
proximal clip's edges, the raw rewards, its settings, and two real processes against one."""

import pytest
import torch
from test_trainer import TINY_RUN
from two_processes import assert_runs_match, train_in_two_processes

from flowrl.advantages import RewardBatch
from flowrl.algorithms import PRDP
from flowrl.algorithms.prdp import prdp_pair_loss
from flowrl.config import ConfigError, load_config
from flowrl.policy import OLD
from flowrl.trainer import Trainer

#: the tiny run without its NFT key (a PRDP section has none), whole groups of 4 per micro-batch, and two
#: epochs (one update each) so that the proximal clip has a pass to act in
TINY_PRDP = [
    *(o for o in TINY_RUN if not o.startswith("algorithm.")),
    "training.micro_batch_size=4",
    "algorithm.epochs=2",
    "training.updates_per_step=2",
]


def reference_group_loss(log_p, log_p_old, log_p_ref, rewards, eps, beta, tie=0.0):
    """One prompt group, written out from the paper: rhat_t = log p_theta - log p_ref per step (Eq. 19), the
    step-wise clip around the old policy's rhat_t (Eq. 20), the mean over steps (App. G's reduction), the
    squared error of each ordered pair with r_i - r_j > tie (App. G's mask) against (r_i - r_j) / beta
    (Eq. 14), the larger of plain and clipped (Eq. 18), the mean over those pairs."""
    size, steps = log_p.shape
    rhat = [[log_p[i, t] - log_p_ref[i, t] for t in range(steps)] for i in range(size)]
    rhat_old = [[log_p_old[i, t] - log_p_ref[i, t] for t in range(steps)] for i in range(size)]
    clipped = [
        [torch.clamp(rhat[i][t], rhat_old[i][t] - eps, rhat_old[i][t] + eps) for t in range(steps)]
        for i in range(size)
    ]
    mean = [sum(rhat[i]) / steps for i in range(size)]
    mean_clipped = [sum(clipped[i]) / steps for i in range(size)]
    losses = []
    for i in range(size):
        for j in range(size):
            if rewards[i] - rewards[j] > tie:
                target = (rewards[i] - rewards[j]) / beta
                plain = (mean[i] - mean[j] - target) ** 2
                clip = (mean_clipped[i] - mean_clipped[j] - target) ** 2
                losses.append(torch.maximum(plain, clip))
    return sum(losses) / len(losses) if losses else torch.zeros(())


@pytest.mark.parametrize("tie", [0.0, 0.3])
def test_the_pair_loss_and_its_gradient_are_the_papers(tie):
    g = torch.Generator().manual_seed(0)
    groups, size, steps = 3, 4, 3
    log_p_ref = torch.randn(groups * size, steps, generator=g, dtype=torch.float64)
    log_p_old = log_p_ref + 1e-3 * torch.randn(groups * size, steps, generator=g, dtype=torch.float64)
    # the trained log-probs move by about the clip range, so some steps leave [old - eps, old + eps]
    log_p = (
        log_p_old + 2e-3 * torch.randn(groups * size, steps, generator=g, dtype=torch.float64)
    ).requires_grad_()
    rewards = torch.tensor([0.1, 0.5, 0.5, 0.9, 0.0, 0.0, 0.0, 0.0, 1.0, 0.2, 0.6, 0.2], dtype=torch.float64)
    eps, beta = 1e-3, 0.5
    per_group, stats = prdp_pair_loss(log_p - log_p_ref, log_p_old - log_p_ref, rewards, size, beta, eps, tie)
    expected = torch.stack(
        [
            reference_group_loss(
                log_p[k * size : (k + 1) * size],
                log_p_old[k * size : (k + 1) * size],
                log_p_ref[k * size : (k + 1) * size],
                rewards[k * size : (k + 1) * size],
                eps,
                beta,
                tie,
            )
            for k in range(groups)
        ]
    )
    torch.testing.assert_close(per_group.double(), expected)
    assert per_group[1] == 0  # a group of equal rewards has no pairs and adds nothing
    (gradient,) = torch.autograd.grad(per_group.sum(), log_p)
    (expected_gradient,) = torch.autograd.grad(expected.sum(), log_p)
    torch.testing.assert_close(gradient, expected_gradient)
    assert 0 < float(stats["prdp/clipped_steps"].mean()) < 1


def test_at_the_sampling_policy_the_clip_is_idle_and_the_gradient_is_reinforce_with_a_mean_baseline():
    """theta = theta_old: the clipped and plain losses coincide, and over all ordered pairs with r_i > r_j the
    gradient on rhat_i is (2 / pairs) sum_j sign-matched (rhat_i - rhat_j - (r_i - r_j) / beta)."""
    log_ratio = torch.zeros(4, 2, dtype=torch.float64, requires_grad=True)
    rewards = torch.tensor([0.0, 1.0, 0.5, 0.25], dtype=torch.float64)
    beta = 0.1
    per_group, stats = prdp_pair_loss(log_ratio, log_ratio.detach(), rewards, 4, beta, 1e-4)
    assert float(stats["prdp/clipped_pairs"]) == 0 and float(stats["prdp/clipped_steps"]) == 0
    (gradient,) = torch.autograd.grad(per_group.sum(), log_ratio)
    # at rhat = 0 the loss is mean over the 6 pairs of ((r_i - r_j) / beta)^2, its gradient on mean_t rhat_i is
    # -(2 / 6) sum_j (r_i - r_j) / beta = -(2 / 6) * 4 (r_i - mean r) / beta, spread evenly over the 2 steps
    expected = -(2 / 6) * 4 * (rewards - rewards.mean()) / beta / 2
    torch.testing.assert_close(gradient, expected[:, None].expand(4, 2))


def test_the_clipped_loss_is_taken_when_it_is_the_larger():
    """A step pushed past old + eps toward the target: the clipped rhat stays further from it, so its loss is
    the larger and the gradient through that step stops (the other step still carries it)."""
    old = torch.zeros(2, 2, dtype=torch.float64)
    log_ratio = torch.tensor([[0.5, 0.0], [0.0, 0.0]], dtype=torch.float64, requires_grad=True)
    rewards = torch.tensor([1.0, 0.0], dtype=torch.float64)
    per_group, stats = prdp_pair_loss(log_ratio, old, rewards, 2, 1.0, 0.1)
    assert float(stats["prdp/clipped_pairs"]) == 1.0
    (gradient,) = torch.autograd.grad(per_group.sum(), log_ratio)
    assert gradient[0, 0] == 0 and gradient[0, 1] != 0


def test_rewards_enter_raw_and_settings_are_checked():
    algorithm = PRDP(load_config("configs/shapes_prdp.yaml", TINY_PRDP))
    rewards = torch.tensor([0.2, 0.9, 0.4, 0.4])
    batch = RewardBatch({"r": rewards}, {"r": 1.0}, rewards, torch.tensor([0, 0, 0, 0]))
    assert torch.equal(algorithm.advantages(batch), rewards)
    assert algorithm.passes == 2 and algorithm.after_optimizer_step(1).copy_decays == {OLD: 0.0}
    with pytest.raises(
        ConfigError, match=r"micro_batch_size=2 is not allowed for prdp; it must be a multiple"
    ):
        load_config("configs/shapes_prdp.yaml", [*TINY_PRDP, "training.micro_batch_size=2"])
    with pytest.raises(ConfigError, match=r"algorithm.beta=0"):
        load_config("configs/shapes_prdp.yaml", [*TINY_PRDP, "algorithm.beta=0"])
    with pytest.raises(ConfigError, match=r"unknown config key algorithm.timestep_fraction"):
        load_config("configs/shapes_prdp.yaml", [*TINY_PRDP, "algorithm.timestep_fraction=0.5"])


def test_prdp_trains_on_policy_and_two_processes_match_one(tmp_path, tiny_model_dir):
    overrides = [*TINY_PRDP, "training.steps=2", "training.threads=1", f"model.name={tiny_model_dir}"]
    config = load_config("configs/shapes_prdp.yaml", [*overrides, f"logging.output_dir={tmp_path / 'one'}"])
    trainer = Trainer(config)
    first_pass_moves = []
    loss = trainer.algorithm.loss

    def recording_loss(policy, batch, pass_index, step):
        value, stats = loss(policy, batch, pass_index, step)
        if pass_index == 0:  # the sampling weights re-score their own transitions: no step off the old value
            first_pass_moves.append(float(stats["prdp/clipped_steps"].max()))
        return value, stats

    trainer.algorithm.loss = recording_loss
    trainer.train()
    assert first_pass_moves and max(first_pass_moves) == 0
    trained = dict(trainer.policy.copies.unwrapped.named_parameters())
    for name, value in trainer.policy.copies.copies[OLD].named_parameters():
        torch.testing.assert_close(value, trained[name])
    train_in_two_processes("configs/shapes_prdp.yaml", [*overrides, f"logging.output_dir={tmp_path / 'two'}"])
    assert_runs_match(
        tmp_path / "one",
        tmp_path / "two",
        (
            "reward/mean",
            "loss",
            "grad_norm",
            "prdp/predicted_difference",
            "prdp/target_difference",
        ),
    )
