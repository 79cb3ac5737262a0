"""CRD: the loss against a direct re-computation, group centering, the guided KL anchor, the two schedules."""

import math

import pytest
import torch

from flowrl.algorithms.crd import CRD, crd_loss, group_centred, velocity_error
from flowrl.algorithms.forward_process import pixel_mean
from flowrl.algorithms.nft import optimality_probability
from flowrl.config import ConfigError, load_config
from flowrl.models import ShapesFlowModel
from flowrl.policy import OLD, REFERENCE, ROLLOUT, make_policy

GROUP = 3


def direct_crd_loss(v_theta, v_old, v_anchor, noise, x0, advantages, beta, c, strength, form):
    """The CRD formula of the reference code (Flow-Factory ``trainers/crd.py``) written out sample by sample
    and group by group, in float64: velocity-space errors against ``noise - x0`` with their own detached
    mean absolute error as weight, the policy term times ``c / beta``; centred per prompt group."""
    ratios, probabilities = [], []
    for i in range(x0.shape[0]):
        errors = []
        for v in (v_theta[i], v_old[i]):
            difference = v - (noise[i] - x0[i])
            errors.append((difference**2).mean() / max(difference.abs().mean().item(), 1e-5))
        ratios.append(-(errors[0] - errors[1]))
        probabilities.append(min(max(advantages[i].item(), -c), c) / (2 * c) + 0.5)
    losses = []
    for i in range(x0.shape[0]):
        group = range(i - i % GROUP, i - i % GROUP + GROUP)
        logit = beta * (ratios[i] - sum(ratios[j] for j in group) / GROUP)
        target = probabilities[i] - sum(probabilities[j] for j in group) / GROUP
        if form == "squared":
            matching = (logit - target) ** 2
        else:
            q = 1 / (1 + math.exp(-target))
            matching = -(q * torch.log(torch.sigmoid(logit)) + (1 - q) * torch.log(torch.sigmoid(-logit)))
        losses.append(c / beta * matching + strength[i] * ((v_theta[i] - v_anchor[i]) ** 2).mean())
    return torch.stack(losses)


def random_batch(rows=6, seed=0):
    g = torch.Generator().manual_seed(seed)
    shape = (rows, 3, 4, 4)
    v_theta, v_old, v_anchor, x0, eps = (
        torch.randn(shape, generator=g, dtype=torch.float64) for _ in range(5)
    )
    advantages = torch.randn(rows, generator=g, dtype=torch.float64) * 2
    return v_theta, v_old, v_anchor, eps, x0, advantages


@pytest.mark.parametrize("form", ["squared", "logistic"])
@pytest.mark.parametrize("beta", [1.0, 0.3])
def test_crd_loss_equals_the_formula(form, beta):
    v_theta, v_old, v_anchor, eps, x0, advantages = random_batch()
    strength = torch.linspace(0.1, 0.6, 6, dtype=torch.float64)
    terms = crd_loss(
        v_theta, v_old, v_anchor, eps, x0, advantages, GROUP, beta, 5.0, form, anchor_strength=strength
    )
    expected = direct_crd_loss(v_theta, v_old, v_anchor, eps, x0, advantages, beta, 5.0, strength, form)
    torch.testing.assert_close(terms.loss.double(), expected, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("form", ["squared", "logistic"])
def test_a_per_prompt_constant_added_to_the_rewards_does_not_change_the_loss(form):
    v_theta, v_old, v_anchor, eps, x0, advantages = random_batch()
    advantages = advantages.clamp(-2, 2)  # inside the clip range, where r is affine in the reward
    shifted = advantages + torch.tensor([1.5, -2.0]).repeat_interleave(GROUP).double()
    a = crd_loss(v_theta, v_old, v_anchor, eps, x0, advantages, GROUP, 1.0, 5.0, form, anchor_strength=None)
    b = crd_loss(v_theta, v_old, v_anchor, eps, x0, shifted, GROUP, 1.0, 5.0, form, anchor_strength=None)
    torch.testing.assert_close(a.loss, b.loss)
    # ... while a constant for one sample only does change it.
    nudged = advantages.clone()
    nudged[0] += 1.0
    c = crd_loss(v_theta, v_old, v_anchor, eps, x0, nudged, GROUP, 1.0, 5.0, form, anchor_strength=None)
    assert not torch.allclose(a.loss, c.loss)


def test_the_squared_gradient_through_the_group_means_vanishes():
    """Centred residuals sum to zero in a group, so the group mean of l needs no gradient: the loss's
    gradient equals the one with the mean detached (which is why micro-batches only need whole groups)."""
    v_theta, v_old, v_anchor, eps, x0, advantages = random_batch()
    full = v_theta.clone().requires_grad_(True)
    crd_loss(full, v_old, v_anchor, eps, x0, advantages, GROUP, 1.0, 5.0).loss.sum().backward()

    detached = v_theta.clone().requires_grad_(True)
    live = -(velocity_error(detached, eps - x0, True) - velocity_error(v_old, eps - x0, True))
    centred = live - live.detach().view(-1, GROUP).mean(1).repeat_interleave(GROUP)
    target = group_centred(optimality_probability(advantages, 5.0), GROUP)
    anchor = pixel_mean((detached - v_anchor) ** 2)
    (5.0 * (centred - target) ** 2 + anchor).sum().backward()
    torch.testing.assert_close(full.grad, detached.grad, rtol=1e-5, atol=1e-6)


def test_the_uncentred_log_ratio_adds_a_restoring_force_on_the_group_mean():
    """``center_log_ratio=False``: ``(c / beta)(beta l_i - r_c,i)²`` per sample (written out here), whose group
    sum is the centred loss's plus ``n (beta mean l)²`` (so a common shift of the log-ratio now costs)."""
    v_theta, v_old, v_anchor, eps, x0, advantages = random_batch()
    beta, c = 0.7, 5.0
    terms = crd_loss(
        v_theta,
        v_old,
        v_anchor,
        eps,
        x0,
        advantages,
        GROUP,
        beta,
        c,
        anchor_strength=torch.zeros(6),
        center_log_ratio=False,
    )
    ratios = []
    for i in range(6):
        e = [
            ((v[i] - (eps[i] - x0[i])) ** 2).mean() / (v[i] - (eps[i] - x0[i])).abs().mean()
            for v in (v_theta, v_old)
        ]
        ratios.append(float(e[1] - e[0]))
    probabilities = [min(max(float(a), -c), c) / (2 * c) + 0.5 for a in advantages]
    expected = []
    for i in range(6):
        group = range(i - i % GROUP, i - i % GROUP + GROUP)
        target = probabilities[i] - sum(probabilities[j] for j in group) / GROUP
        expected.append(c / beta * (beta * ratios[i] - target) ** 2)
    torch.testing.assert_close(
        terms.loss.double(), torch.tensor(expected, dtype=torch.float64), rtol=1e-5, atol=1e-7
    )
    centred = crd_loss(
        v_theta, v_old, v_anchor, eps, x0, advantages, GROUP, beta, c, anchor_strength=torch.zeros(6)
    )
    for start in (0, GROUP):
        part = slice(start, start + GROUP)
        mean_ratio = sum(ratios[part]) / GROUP
        gap = float(terms.loss[part].sum() - centred.loss[part].sum())
        assert gap == pytest.approx(c / beta * GROUP * (beta * mean_ratio) ** 2, rel=1e-5)


def test_the_loss_refuses_split_groups():
    v_theta, v_old, v_anchor, eps, x0, advantages = random_batch(rows=4)
    with pytest.raises(ValueError, match="whole groups"):
        crd_loss(v_theta, v_old, v_anchor, eps, x0, advantages, GROUP, 1.0, 5.0)


def test_the_kl_anchor_is_the_cfg_guided_reference(tiny_model):
    """Changing the anchor's guidance scale changes the loss; with w = 1 it is the plain reference."""
    from flowrl.algorithms.base import TrainBatch

    policy = make_policy(ShapesFlowModel(tiny_model), (OLD, ROLLOUT))
    with torch.no_grad():  # move theta off the base so that the anchor term is not zero
        for parameter in policy.model.parameters():
            parameter.add_(0.02 * torch.randn_like(parameter))
    prompts = [
        "a red circle",
        "a red circle",
        "a red circle",
        "two blue squares",
        "two blue squares",
        "two blue squares",
    ]
    g = torch.Generator().manual_seed(0)
    batch = TrainBatch(
        {"x0": torch.rand(6, 3, 32, 32, generator=g) * 2 - 1},
        policy.encode(prompts),
        torch.tensor([1.0, -1.0, 0.0, 2.0, 0.5, -2.5]),
        {"t": torch.full((1, 6), 0.6), "noise": torch.randn(1, 6, 3, 32, 32, generator=g)},
    )
    losses = {}
    for guidance in (1.0, 4.5):
        config = load_config(
            None,
            [
                "algorithm.name=crd",
                f"algorithm.anchor_guidance={guidance}",
                "training.group_size=3",
                "training.micro_batch_size=6",
                "algorithm.anchor_weight=1.0",
            ],
        )
        algorithm = CRD(config)
        loss, stats = algorithm.loss(policy, batch, 0, 1)
        losses[guidance] = (loss.item(), stats["crd/anchor_mse"])
    assert losses[1.0][0] != pytest.approx(losses[4.5][0])
    x0, t, noise = batch.x0, batch.draws["t"][0], batch.draws["noise"][0]
    x_t = (1 - 0.6) * x0 + 0.6 * noise
    with torch.no_grad():
        v_theta = policy.velocity(x_t, t, batch.cond)
        plain = ((v_theta - policy.reference_velocity(x_t, t, batch.cond)) ** 2).mean(dim=(1, 2, 3))
        unconditional = policy.encode([""] * 6)
        v_c = policy.reference_velocity(x_t, t, batch.cond)
        v_u = policy.reference_velocity(x_t, t, unconditional)
        guided = ((v_theta - (v_u + 4.5 * (v_c - v_u))) ** 2).mean(dim=(1, 2, 3))
    torch.testing.assert_close(losses[1.0][1], plain, rtol=1e-4, atol=1e-6)
    torch.testing.assert_close(losses[4.5][1], guided, rtol=1e-4, atol=1e-6)


def test_the_anchor_strength_adapts_to_reward_and_follows_its_schedule():
    config = load_config(
        None,
        [
            "algorithm.name=crd",
            "algorithm.anchor_weight=0.2",
            "algorithm.anchor_floor=0.1",
            "algorithm.anchor_schedule_end=0.5",
            "algorithm.anchor_schedule_steps=10",
            "algorithm.anchor_adaptive=optimality",
            "training.micro_batch_size=8",
        ],
    )
    algorithm = CRD(config)
    advantages = torch.tensor([-5.0, 0.0, 5.0])
    torch.testing.assert_close(algorithm.anchor_strength(advantages, 0), 0.2 * torch.tensor([0.1, 0.55, 1.0]))
    # past the schedule: factor 0.5
    torch.testing.assert_close(
        algorithm.anchor_strength(advantages, 20), 0.1 * torch.tensor([0.1, 0.55, 1.0])
    )


def test_the_rollout_copy_is_held_then_moves_and_old_follows_its_own_schedule(tiny_model):
    config = load_config(
        None,
        [
            "algorithm.name=crd",
            "algorithm.rollout_delay_steps=2",
            "algorithm.rollout_first_phase=hold",
            "algorithm.rollout_decay_rate=0.25",
            "algorithm.old_update=soft",
            "algorithm.old_decay_rate=0.1",
            "training.micro_batch_size=8",
        ],
    )
    algorithm = CRD(config)
    policy = make_policy(ShapesFlowModel(tiny_model), (OLD, ROLLOUT))
    base = {k: v.clone() for k, v in policy.copies.copies[REFERENCE].state_dict().items()}
    with torch.no_grad():
        for parameter in policy.model.parameters():
            parameter.add_(1.0)
    logs = []
    for step in (1, 2, 3):
        step_end = algorithm.after_optimizer_step(step)
        policy.move_copies(step_end.copy_decays)
        logs.append(step_end.log)
    assert [log["crd/rollout_decay"] for log in logs] == [-1.0, -1.0, 0.25]
    assert [log["crd/old_decay"] for log in logs] == pytest.approx([0.1, 0.2, 0.3])
    name = "final_modulation.weight"
    sampler, old, trained = (
        dict(m.named_parameters())[name]
        for m in (policy.copies.copies[ROLLOUT], policy.copies.copies[OLD], policy.model)
    )
    # sampler: base until step 2, then 0.25 base + 0.75 theta; old: three soft steps towards theta
    torch.testing.assert_close(sampler, 0.25 * base[name] + 0.75 * trained)
    expected_old = base[name]
    for decay in (0.1, 0.2, 0.3):
        expected_old = decay * expected_old + (1 - decay) * trained
    torch.testing.assert_close(old, expected_old)
    assert "rollout" in policy.state_dict()


def test_crd_settings_are_checked(tmp_path):
    with pytest.raises(ConfigError, match="micro_batch_size=12 is not allowed for crd"):
        load_config(None, ["algorithm.name=crd", "training.micro_batch_size=12"])
    with pytest.raises(ConfigError, match="crd_loss='hinge'"):
        load_config(None, ["algorithm.name=crd", "algorithm.crd_loss=hinge", "training.micro_batch_size=8"])
    config = load_config(None, ["algorithm.name=crd", "training.micro_batch_size=8", "training.group_size=8"])
    with pytest.raises(ConfigError, match="whole prompt groups"):
        CRD(config).num_rows(12)


def test_the_anchor_strength_follows_the_reward_level_of_the_global_batch():
    """``k = lambda (floor + (1 - floor) level)``, ``level = clip((mean R - low) / (high - low), 0, 1)``: small
    while rewards are low, larger as they rise; the group-normalised advantages cannot do this (their
    optimality probabilities average 1/2 at any reward level)."""
    from flowrl.advantages import RewardBatch

    config = load_config(
        None,
        [
            "algorithm.name=crd",
            "algorithm.anchor_weight=0.2",
            "algorithm.anchor_floor=0.1",
            "algorithm.anchor_reward_range=[0.2, 0.8]",
            "algorithm.anchor_adaptive=reward_level",
            "training.micro_batch_size=8",
        ],
    )
    algorithm = CRD(config)
    groups = torch.arange(8) // 4
    strengths = []
    for level in (0.17, 0.5, 0.8):
        total = level + 0.1 * torch.tensor([1.0, -1.0, 0.5, -0.5, 1.0, -1.0, 0.5, -0.5])
        advantages = algorithm.advantages(RewardBatch({"r": total}, {"r": 1.0}, total, groups))
        mean_r = float((advantages.clamp(-5, 5) / 10 + 0.5).mean())
        assert mean_r == pytest.approx(0.5, abs=1e-6)  # the optimality probability does not see the level
        strengths.append(float(algorithm.anchor_strength(advantages, 1)[0]))
    expected = [0.2 * (0.1 + 0.9 * min(max((m - 0.2) / 0.6, 0.0), 1.0)) for m in (0.17, 0.5, 0.8)]
    assert strengths == pytest.approx(expected, rel=1e-5)
    with pytest.raises(ConfigError, match="anchor_reward_range"):
        load_config(
            None,
            ["algorithm.name=crd", "algorithm.anchor_reward_range=[1, 0]", "training.micro_batch_size=8"],
        )


def test_the_x0_space_errors_are_the_velocity_errors_times_t():
    """``crd_error_space: x0``: each model's error is ``x_t - t v - x0`` (written out from x0, eps and t), its
    adaptive weight its own mean absolute value; the rest of the loss as in velocity space."""
    v_theta, v_old, v_anchor, eps, x0, advantages = random_batch()
    t = torch.linspace(0.1, 0.9, 6, dtype=torch.float64)
    terms = crd_loss(v_theta, v_old, v_anchor, eps, x0, advantages, GROUP, 1.0, 5.0, x0_space_t=t)
    ratios = []
    for i in range(6):
        x_t = (1 - t[i]) * x0[i] + t[i] * eps[i]
        errors = [x_t - t[i] * v - x0[i] for v in (v_theta[i], v_old[i])]
        ratios.append(
            -(
                (errors[0] ** 2).mean() / errors[0].abs().mean()
                - (errors[1] ** 2).mean() / errors[1].abs().mean()
            )
        )
    torch.testing.assert_close(terms.log_ratio.double(), torch.stack(ratios), rtol=1e-5, atol=1e-6)
