"""FPO: the loss against a re-derivation typed from the paper and the reference code (akanazawa/fpo,
playground/src/flow_policy/fpo.py), the clip's edges, the ratio at the first update, its settings, and two
real processes against one."""

import math

import pytest
import torch
from test_trainer import TINY_RUN
from two_processes import assert_runs_match, train_in_two_processes

from flowrl.algorithms import FPO
from flowrl.algorithms.base import TrainBatch
from flowrl.batches import check_batches
from flowrl.config import ConfigError, load_config
from flowrl.policy import OLD
from flowrl.trainer import Trainer

TINY_FPO = [*TINY_RUN, "training.updates_per_step=2", "algorithm.epochs=2"]


class LinearPolicy:
    """Velocities ``v(x, t, c) = a x + t c`` (the conditioning a per-row image): ``a`` trainable for the
    trained role, fixed numbers for the old and the reference copies."""

    def __init__(self, trained: float, old: float, reference: float) -> None:
        self.a = torch.tensor(trained, dtype=torch.float64, requires_grad=True)
        self.old, self.ref = old, reference

    @staticmethod
    def _v(a, x, t, cond):
        return a * x + t.reshape(-1, 1, 1, 1) * cond

    def velocity(self, x, t, cond):
        return self._v(self.a, x, t, cond)

    def old_velocity(self, x, t, cond):
        return self._v(self.old, x, t, cond)

    def reference_velocity(self, x, t, cond):
        return self._v(self.ref, x, t, cond)


def reference_loss(policy, x0, cond, t, eps, advantages, clip, mode, reference_weight):
    """The FPO objective written out sample by sample and draw by draw (N draws, B samples)."""
    draws, samples = t.shape
    total = 0.0
    for i in range(samples):
        old, new, pull = [], [], []
        for k in range(draws):
            x_t = (1 - t[k, i]) * x0[i] + t[k, i] * eps[k, i]
            target = eps[k, i] - x0[i]
            v_new = policy.a * x_t + t[k, i] * cond[i]
            v_old = policy.old * x_t + t[k, i] * cond[i]
            v_ref = policy.ref * x_t + t[k, i] * cond[i]
            new.append(((v_new - target) ** 2).mean())
            old.append(((v_old - target) ** 2).mean())
            pull.append(((v_new - v_ref) ** 2).mean())
        if mode == "sample":
            ratios = [torch.exp(sum(old) / draws - sum(new) / draws)]
        else:
            ratios = [torch.exp(torch.clamp(old[k] - new[k], -3.0, 3.0)) for k in range(draws)]
        a = advantages[i]
        terms = [-torch.minimum(r * a, torch.clamp(r, 1 - clip, 1 + clip) * a) for r in ratios]
        total = total + sum(terms) / len(terms) + reference_weight * sum(pull) / draws
    return total / samples


def fpo_for(**settings) -> FPO:
    overrides = [*TINY_FPO, *(f"algorithm.{key}={value}" for key, value in settings.items())]
    return FPO(load_config("configs/shapes_fpo.yaml", overrides))


@pytest.mark.parametrize("mode", ["sample", "draw"])
@pytest.mark.parametrize("reference_weight", [0.0, 0.3])
def test_the_loss_and_its_gradient_are_the_papers(mode, reference_weight):
    g = torch.Generator().manual_seed(1)
    draws, samples = 3, 5
    x0 = torch.randn(samples, 3, 4, 4, generator=g, dtype=torch.float64)
    cond = torch.randn(samples, 3, 4, 4, generator=g, dtype=torch.float64)
    eps = torch.randn(draws, samples, 3, 4, 4, generator=g, dtype=torch.float64)
    t = torch.rand(draws, samples, generator=g, dtype=torch.float64)
    advantages = torch.randn(samples, generator=g, dtype=torch.float64)
    # trained and old apart enough that some ratios leave [1 - e, 1 + e] on either side
    policy = LinearPolicy(0.3, 0.25, 0.1)
    algorithm = fpo_for(ratio=mode, clip_range=0.05, reference_weight=reference_weight)
    batch = TrainBatch({"x0": x0}, cond, advantages, {"t": t, "noise": eps})
    loss, stats = algorithm.loss(policy, batch, 0, step=1)
    (gradient,) = torch.autograd.grad(loss, policy.a)
    expected = reference_loss(policy, x0, cond, t, eps, advantages, 0.05, mode, reference_weight)
    (expected_gradient,) = torch.autograd.grad(expected, policy.a)
    torch.testing.assert_close(loss.double(), expected.double())
    torch.testing.assert_close(gradient, expected_gradient)
    assert 0 < float(stats["fpo/clip_fraction"].mean()) < 1  # both sides of the clip are exercised


def test_the_ratio_is_one_and_the_step_is_advantage_weighted_flow_matching_at_the_first_update():
    """theta = theta_old: rho = 1 exactly, and grad L = mean_i A_i grad mean_k l_theta(k, i)."""
    g = torch.Generator().manual_seed(2)
    x0, cond = (torch.randn(4, 3, 4, 4, generator=g, dtype=torch.float64) for _ in range(2))
    eps = torch.randn(2, 4, 3, 4, 4, generator=g, dtype=torch.float64)
    t = torch.rand(2, 4, generator=g, dtype=torch.float64)
    advantages = torch.tensor([1.0, -0.5, 2.0, -2.5], dtype=torch.float64)
    policy = LinearPolicy(0.4, 0.4, 0.0)
    loss, stats = fpo_for(reference_weight=0.0).loss(
        policy, TrainBatch({"x0": x0}, cond, advantages, {"t": t, "noise": eps}), 0, 1
    )
    assert torch.equal(stats["fpo/ratio"], torch.ones(4, dtype=stats["fpo/ratio"].dtype))
    x_t = (1 - t[..., None, None, None]) * x0 + t[..., None, None, None] * eps
    cfm = ((policy.a * x_t + t[..., None, None, None] * cond - (eps - x0)) ** 2).mean(dim=(2, 3, 4)).mean(0)
    (expected,) = torch.autograd.grad((advantages * cfm).mean(), policy.a)
    torch.testing.assert_close(torch.autograd.grad(loss, policy.a)[0], expected)


@pytest.mark.parametrize(
    ("log_ratio", "advantage", "flows"),
    [
        (0.2, 1.0, False),  # rho > 1 + e with A > 0: clipped, no gradient
        (-0.2, -1.0, False),  # rho < 1 - e with A < 0: clipped, no gradient
        (-0.2, 1.0, True),  # rho < 1 - e with A > 0: the unclipped term is the minimum, it flows
        (0.2, -1.0, True),  # rho > 1 + e with A < 0: likewise
        (0.01, 1.0, True),  # inside the trust region
    ],
)
def test_the_clip_stops_the_gradient_only_on_the_side_the_advantage_favours(log_ratio, advantage, flows):
    from flowrl.algorithms.fpo import clipped_surrogate

    log = torch.tensor([[log_ratio]], requires_grad=True)
    clipped_surrogate(torch.exp(log), torch.tensor([[advantage]]), 0.05).sum().backward()
    assert (log.grad.abs().item() > 0) == flows
    if flows:
        assert log.grad.item() == pytest.approx(-advantage * math.exp(log_ratio))


def test_a_draws_log_ratio_is_clipped_to_three_before_exp():
    from flowrl.algorithms.fpo import fpo_ratio

    old, new = torch.tensor([[10.0], [0.5]]), torch.tensor([[1.0], [0.25]])
    torch.testing.assert_close(fpo_ratio(old, new, "draw"), torch.exp(torch.tensor([[3.0], [0.25]])))
    torch.testing.assert_close(fpo_ratio(old, new, "sample"), torch.exp(torch.tensor([[(10.5 - 1.25) / 2]])))


def test_fpo_settings_are_checked():
    with pytest.raises(ConfigError, match=r"algorithm.ratio='mean' is not allowed"):
        load_config("configs/shapes_fpo.yaml", [*TINY_FPO, "algorithm.ratio=mean"])
    with pytest.raises(ConfigError, match=r"algorithm.clip_range=0"):
        load_config("configs/shapes_fpo.yaml", [*TINY_FPO, "algorithm.clip_range=0"])
    with pytest.raises(ConfigError, match=r"algorithm.epochs=0"):
        load_config("configs/shapes_fpo.yaml", [*TINY_FPO, "algorithm.epochs=0"])
    with pytest.raises(
        ConfigError,
        match=r"updates_per_step=3 does not divide the 8 backward passes of a step \(2 loss passes",
    ):
        check_batches(load_config("configs/shapes_fpo.yaml", [*TINY_FPO, "training.updates_per_step=3"]), 1)


def test_draws_are_shared_by_the_epochs_and_the_old_copy_follows_theta(tmp_path, tiny_model_dir):
    algorithm = fpo_for(train_timesteps=3, epochs=4)
    assert algorithm.passes == 4
    draws = algorithm.draw(torch.Generator().manual_seed(0), 6, (3, 4, 4), torch.linspace(1, 0, 5), 1)
    assert draws["t"].shape == (3, 6) and draws["noise"].shape == (3, 6, 3, 4, 4)
    assert algorithm.after_optimizer_step(1).copy_decays == {OLD: 0.0}


def test_fpo_trains_on_policy_and_two_processes_match_one(tmp_path, tiny_model_dir):
    overrides = [*TINY_FPO, "training.steps=2", "training.threads=1", f"model.name={tiny_model_dir}"]
    config = load_config("configs/shapes_fpo.yaml", [*overrides, f"logging.output_dir={tmp_path / 'one'}"])
    trainer = Trainer(config)
    trainer.train()
    trained = dict(trainer.policy.copies.unwrapped.named_parameters())
    for name, value in trainer.policy.copies.copies[OLD].named_parameters():
        torch.testing.assert_close(value, trained[name])
    train_in_two_processes("configs/shapes_fpo.yaml", [*overrides, f"logging.output_dir={tmp_path / 'two'}"])
    assert_runs_match(
        tmp_path / "one", tmp_path / "two", ("reward/mean", "loss", "grad_norm", "fpo/ratio", "fpo/cfm_loss")
    )
