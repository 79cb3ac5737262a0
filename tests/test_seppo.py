"""SePPO: the loss against a pair-by-pair re-derivation typed from the paper's equations (Diffusion-DPO's loss
on flow-matching errors, the anchor-based flipper's sign, the checkpoint pool and its reference selection),
the rendered winners, exact resume with the pool, and two real processes against one."""

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from run_helpers import trained
from test_trainer import TINY_RUN
from two_processes import assert_runs_match, train_in_two_processes

from flowrl.algorithms import SePPO
from flowrl.algorithms.base import TrainBatch
from flowrl.algorithms.seppo import flip_signs, reference_index
from flowrl.config import ConfigError, load_config
from flowrl.demonstrations import rendered_winners
from flowrl.models.shapes import ShapesFlowModel
from flowrl.policy import ROLLOUT, Policy
from flowrl.run_log import read_metrics
from flowrl.shapes.render import render_prompt
from flowrl.trainer import Trainer
from flowrl.worlds import get_world
from rewards.shapes_verifier import ShapesVerifier

TINY_SEPPO = [*TINY_RUN, "algorithm.pool_every=1", "algorithm.pool_size=2"]


class LinearPolicy:
    """Velocities ``v(x, t, c) = a x + t c``: ``a`` trainable for the trained role, a fixed number for the
    rollout copy (SePPO's reference checkpoint)."""

    def __init__(self, trained: float, reference: float) -> None:
        self.a = torch.tensor(trained, dtype=torch.float64, requires_grad=True)
        self.ref = reference

    @staticmethod
    def _v(a, x, t, cond):
        return a * x + t.reshape(-1, 1, 1, 1) * cond

    def velocity(self, x, t, cond):
        return self._v(self.a, x, t, cond)

    def velocity_of(self, role):
        assert role == ROLLOUT
        return lambda x, t, cond: self._v(self.ref, x, t, cond)


def reference_loss(policy, winners, losers, cond, t, eps, beta, flipper):
    """The SePPO objective written out pair by pair: Diffusion-DPO's implicit preference with the AAF's sign."""
    total, flips = 0.0, 0
    for i in range(winners.shape[0]):
        errors = {}
        for name, x in (("w", winners[i]), ("l", losers[i])):
            x_t = (1 - t[i]) * x + t[i] * eps[i]
            target = eps[i] - x
            errors[name, "theta"] = ((policy.a * x_t + t[i] * cond[i] - target) ** 2).mean()
            errors[name, "ref"] = ((policy.ref * x_t + t[i] * cond[i] - target) ** 2).mean()
        sign = 1.0
        if flipper and float(errors["w", "theta"].detach()) > float(errors["w", "ref"]):
            sign, flips = -1.0, flips + 1  # the reference fits the anchor better: its sample is a winner
        d_w = errors["w", "theta"] - errors["w", "ref"]
        d_l = errors["l", "theta"] - errors["l", "ref"]
        total = total - torch.log(torch.sigmoid(-beta * (d_w - sign * d_l)))
    return total / winners.shape[0], flips


def seppo_for(*overrides) -> SePPO:
    return SePPO(load_config("configs/shapes_seppo.yaml", [*TINY_SEPPO, *overrides]))


def pairs(seed, samples=6):
    g = torch.Generator().manual_seed(seed)
    winners, losers, cond = (
        torch.randn(samples, 3, 4, 4, generator=g, dtype=torch.float64) for _ in range(3)
    )
    eps = torch.randn(samples, 3, 4, 4, generator=g, dtype=torch.float64)
    t = torch.rand(samples, generator=g, dtype=torch.float64)
    return winners, losers, cond, t, eps


@pytest.mark.parametrize("flipper", [True, False])
def test_the_loss_and_its_gradient_are_the_papers(flipper):
    winners, losers, cond, t, eps = pairs(1)
    policy = LinearPolicy(0.3, 0.2)  # apart enough that the anchor favours either model on some pairs
    algorithm = seppo_for(f"algorithm.flipper={str(flipper).lower()}", "algorithm.beta=3.0")
    batch = TrainBatch(
        {"x0": losers, "winner": winners}, cond, torch.zeros(6), {"t": t[None], "noise": eps[None]}
    )
    loss, stats = algorithm.loss(policy, batch, 0, step=1)
    (gradient,) = torch.autograd.grad(loss, policy.a)
    expected, flips = reference_loss(policy, winners, losers, cond, t, eps, 3.0, flipper)
    (expected_gradient,) = torch.autograd.grad(expected, policy.a)
    torch.testing.assert_close(loss.double(), expected.double(), rtol=1e-5, atol=1e-6)  # float32 errors
    torch.testing.assert_close(gradient.double(), expected_gradient, rtol=1e-5, atol=1e-6)
    assert float(stats["seppo/flip_rate"].sum()) == flips
    assert (0 < flips < 6) if flipper else flips == 0


def test_with_the_reference_equal_to_theta_no_pair_flips_and_the_step_is_towards_the_winner():
    """theta = ref (the first step, or the latest checkpoint just pooled): every D is 0, sign = +1, and
    grad L = beta/2 mean_i grad (e_theta(x^w_i) - e_theta(x^ref_i))."""
    winners, losers, cond, t, eps = pairs(2)
    policy = LinearPolicy(0.4, 0.4)
    batch = TrainBatch(
        {"x0": losers, "winner": winners}, cond, torch.zeros(6), {"t": t[None], "noise": eps[None]}
    )
    loss, stats = seppo_for("algorithm.beta=5.0").loss(policy, batch, 0, 1)
    assert float(stats["seppo/flip_rate"].sum()) == 0
    torch.testing.assert_close(
        loss.double(), torch.tensor(np.log(2.0), dtype=torch.float64)
    )  # -log sigmoid(0)
    column = t.reshape(-1, 1, 1, 1)

    def errors(x):
        return ((policy.a * ((1 - column) * x + column * eps) + column * cond - (eps - x)) ** 2).mean(
            dim=(1, 2, 3)
        )

    (expected,) = torch.autograd.grad((2.5 * (errors(winners) - errors(losers))).mean(), policy.a)
    torch.testing.assert_close(
        torch.autograd.grad(loss, policy.a)[0].double(), expected, rtol=1e-5, atol=1e-6
    )


def test_the_flipper_ignores_the_last_bits_of_two_forwards_of_the_same_weights():
    reference = torch.tensor([0.2, 0.2, 0.2])
    trained = torch.tensor([0.2 * (1 + 1e-7), 0.2 * (1 - 1e-7), 0.2 * 1.01])
    assert flip_signs(trained, reference).tolist() == [1.0, 1.0, -1.0]


def test_the_reference_is_drawn_from_the_pool_as_the_paper_says():
    generator = torch.Generator().manual_seed(0)
    assert reference_index("initial", 5, generator) == 0
    assert reference_index("latest", 5, generator) == 4
    counts = np.bincount([reference_index("random", 5, generator) for _ in range(5000)], minlength=5)
    assert counts.min() > 850 and counts.max() < 1150  # U(0, k - 1): 1,000 each, sd about 28


class SnapshotPolicy:
    """Snapshots that say which step they were taken at."""

    step = 0

    def snapshot(self):
        return {"w": torch.tensor(float(self.step))}


def test_the_pool_keeps_the_base_and_the_latest_checkpoints():
    algorithm = seppo_for("algorithm.pool_every=2", "algorithm.pool_size=3")
    algorithm.policy = policy = SnapshotPolicy()
    algorithm.pool = [(0, policy.snapshot())]
    sizes = []
    for step in range(1, 11):
        policy.step = step
        sizes.append(algorithm.after_optimizer_step(step).log["seppo/pool_size"])
    assert sizes == [1, 2, 2, 3, 3, 3, 3, 3, 3, 3]
    assert [step for step, _ in algorithm.pool] == [0, 8, 10]
    assert [float(weights["w"]) for _, weights in algorithm.pool] == [0.0, 8.0, 10.0]
    assert algorithm.after_optimizer_step(11).copy_decays == {}  # the rollout copy loads, it does not move
    with pytest.raises(ValueError, match=r"the checkpoint holds no SePPO pool \(algorithm.pt\)"):
        algorithm.load_state_dict({})


def test_winners_are_renders_of_the_prompts_scenes_that_the_verifier_passes(tiny_model):
    world = get_world("shapes")
    records = world.prompts("train")[:12]
    seeds = list(range(100, 112))
    policy = Policy.for_inference(ShapesFlowModel(tiny_model))
    winners = rendered_winners(world, policy, records, seeds, (3, 32, 32))
    expected = np.stack([render_prompt(r, np.random.default_rng(s), 32) for r, s in zip(records, seeds)])
    torch.testing.assert_close(winners, torch.from_numpy(expected).permute(0, 3, 1, 2) * 2 - 1)
    scores = ShapesVerifier()(policy.decode(winners), [r["prompt"] for r in records], records)
    assert scores["strict"].min() == 1.0
    with pytest.raises(ValueError, match=r"prompt 'a cat' has no scene metadata \('include'\)"):
        rendered_winners(world, policy, [{"prompt": "a cat"}], [0], (3, 32, 32))


def test_seppo_settings_are_checked():
    with pytest.raises(ConfigError, match=r"algorithm.reference='best' is not allowed"):
        load_config("configs/shapes_seppo.yaml", [*TINY_SEPPO, "algorithm.reference=best"])
    with pytest.raises(ConfigError, match=r"algorithm.beta=0"):
        load_config("configs/shapes_seppo.yaml", [*TINY_SEPPO, "algorithm.beta=0"])
    with pytest.raises(ConfigError, match=r"algorithm.pool_size=0"):
        load_config("configs/shapes_seppo.yaml", [*TINY_SEPPO, "algorithm.pool_size=0"])


def test_seppo_resumes_exactly_with_its_pool_and_two_processes_match_one(tmp_path, tiny_model_dir):
    overrides = [
        *TINY_SEPPO,
        "training.threads=1",
        f"model.name={tiny_model_dir}",
        "logging.checkpoint_every=1",
    ]
    overrides.append("algorithm.reference=latest")  # step 3 samples with step 2: a lost pool would show

    def run(name, steps, *extra):
        return trained("configs/shapes_seppo.yaml", overrides, tmp_path / name, steps, *extra)

    straight = run("straight", 3)
    rows = [row for row in read_metrics(tmp_path / "straight" / "metrics.jsonl") if row["step"] > 0]
    assert [row["seppo/pool_size"] for row in rows] == [2, 2, 2]  # the base and the latest checkpoint
    assert rows[0]["seppo/reference_step"] == 0 and rows[0]["seppo/flip_rate"] == 0  # theta = base at step 1
    run("cut", 2)
    resumed = run("cut", 3, "resume=latest")
    assert [step for step, _ in resumed.algorithm.pool] == [0, 3]
    for (step, weights), (step_straight, weights_straight) in zip(
        resumed.algorithm.pool, straight.algorithm.pool
    ):
        assert step == step_straight
        for key, value in weights.items():
            assert torch.equal(value, weights_straight[key]), key
    for key, value in resumed.policy.snapshot().items():
        assert torch.equal(value, straight.policy.snapshot()[key]), key
    train_in_two_processes(
        "configs/shapes_seppo.yaml",
        [*overrides, "training.steps=2", f"logging.output_dir={tmp_path / 'two'}"],
    )
    run("one", 2)
    assert_runs_match(
        tmp_path / "one", tmp_path / "two", ("loss", "grad_norm", "seppo/winner_margin", "seppo/flip_rate")
    )


def winner_error(policy, winners, cond):
    """The trained model's flow-matching error on fixed noisy winners (one time and noise each, seed 0)."""
    g = torch.Generator().manual_seed(0)
    t = torch.rand(winners.shape[0], generator=g).clamp(0.1, 0.9)
    eps = torch.randn(winners.shape, generator=g)
    column = t.reshape(-1, 1, 1, 1)
    with torch.no_grad():
        v = policy.velocity((1 - column) * winners + column * eps, t, cond)
    return float(((v - (eps - winners)) ** 2).mean())


@pytest.mark.parametrize("flipped", [False, True])
def test_a_tiny_model_moves_towards_the_winners_and_away_when_the_preference_is_flipped(
    flipped, tiny_model_dir, tmp_path, one_thread, monkeypatch
):
    """SePPO's rung of the sanity ladder: it uses no reward, so its target is the winners themselves. The
    error of the trained model on renders it never saw must fall; with the preference inverted inside the
    library (the sigmoid's argument negated), it must rise."""
    import flowrl.algorithms.seppo as seppo

    if flipped:
        correct = seppo.seppo_losses

        def inverted(errors, reference_errors, beta, flipper):
            losses, sign, margin = correct(errors, reference_errors, beta, flipper)
            return -F.logsigmoid(beta * margin), sign, margin

        monkeypatch.setattr(seppo, "seppo_losses", inverted)
    config = load_config(
        "configs/shapes_seppo.yaml",
        [
            *TINY_SEPPO,
            "training.steps=24",
            "training.learning_rate=0.003",
            "algorithm.beta=100.0",
            "algorithm.pool_every=8",
            f"model.name={tiny_model_dir}",
            f"logging.output_dir={tmp_path / 'run'}",
            "evaluation.base_guidance_scales=[]",
        ],
    )
    trainer = Trainer(config)
    world = get_world("shapes")
    records = world.prompts("test")[:16]
    winners = rendered_winners(world, trainer.policy, records, list(range(16)), (3, 32, 32))
    cond = trainer.policy.encode([record["prompt"] for record in records])
    before = winner_error(trainer.policy, winners, cond)
    trainer.train()
    change = winner_error(trainer.policy, winners, cond) - before
    assert (change > 0.2) if flipped else (change < -0.2), (
        f"error on held-out winners {before:.3f} {change:+.3f}"
    )


@pytest.mark.parametrize("kind", ["sd3", "flux"])
def test_a_seppo_step_on_a_tiny_diffusers_pipeline_moves_only_the_trained_lora(kind, tmp_path):
    """Winners rendered at the pipeline's 32x32 and encoded by its VAE; the step's reference (the base,
    the pool's only entry at step 1) is the rollout adapter; the trained adapter moves and joins the pool."""
    from test_diffusers_backends import base_weights, overrides_for

    from flowrl.testing import save_tiny_pipeline

    save_tiny_pipeline(kind, tmp_path / "pipeline")
    overrides = overrides_for(
        kind, tmp_path / "pipeline", "shapes-train", tmp_path / "run", "algorithm.name=seppo"
    )
    trainer = Trainer(load_config(None, [*overrides, "algorithm.pool_every=1"]))
    policy = trainer.policy
    x = policy.initial_noise([0, 1], policy.device)
    assert policy.flow_model.encode_media(policy.decode(x)).shape == x.shape
    before, adapters_before = base_weights(policy.flow_model.transformer), policy.state_dict()
    trainer.train()
    assert all(
        torch.equal(value, base_weights(policy.flow_model.transformer)[k]) for k, value in before.items()
    )
    after = policy.state_dict()
    assert any(not torch.equal(adapters_before["default"][k], v) for k, v in after["default"].items())
    for key, value in adapters_before["default"].items():  # the rollout adapter holds the pool's base
        assert torch.equal(after["rollout"][key], value)
    assert [step for step, _ in trainer.algorithm.pool] == [0, 1]
    assert np.isfinite(read_metrics(tmp_path / "run" / "metrics.jsonl")[-1]["loss"])
