"""MeanFlow: the identity v = u + (t - r) du/dt on a flow whose average velocity is known in closed form."""

import pytest
import torch

from flowrl.generate import generate
from flowrl.models.shapes_dit import ShapesDiT
from flowrl.pretrain import PretrainConfig, meanflow_loss, pretrain, sample_intervals
from samplers import induced_velocity, meanflow_sample

MU, SIGMA = 0.3, 0.5  # data x0 ~ N(MU, SIGMA^2) per coordinate; x_t = (1 - t) x0 + t eps


def mean(s):
    return (1 - s) * MU


def scale(s):
    return torch.sqrt((1 - s) ** 2 * SIGMA**2 + s**2)


def column(s, like):
    return s.reshape(-1, *([1] * (like.ndim - 1)))


def flow_map(x, t, r):
    """Where the ODE trajectory through ``x`` at time ``t`` is at time ``r`` (a linear map for Gaussian data)."""
    return column(mean(r), x) + column(scale(r) / scale(t), x) * (x - column(mean(t), x))


def average_velocity(x, r, t, cond=None):
    """``u(x, r, t) = (x - x_r) / (t - r)`` in closed form."""
    return (x - flow_map(x, t, r)) / column(t - r, x)


def velocity(x, t):
    """The instantaneous velocity ``dx/dt`` of the marginal flow."""
    d_scale = ((1 - t) * -(SIGMA**2) + t) / scale(t)
    return column(torch.full_like(t, -MU), x) + column(d_scale / scale(t), x) * (x - column(mean(t), x))


@pytest.mark.parametrize("method, tolerance", [("jvp", 1e-10), ("central", 1e-6)])
def test_the_induced_velocity_is_the_instantaneous_velocity(method, tolerance):
    g = torch.Generator().manual_seed(0)
    x = torch.randn(6, 2, 3, generator=g, dtype=torch.float64)
    t = torch.tensor([0.9, 0.8, 0.6, 0.5, 0.4, 0.3], dtype=torch.float64)
    r = t * torch.tensor([0.0, 0.3, 0.5, 0.7, 0.9, 0.2], dtype=torch.float64)
    induced, u = induced_velocity(average_velocity, x, r, t, None, velocity(x, t), method, step=1e-4)
    torch.testing.assert_close(induced, velocity(x, t), rtol=0, atol=tolerance)
    assert (u - velocity(x, t)).abs().max() > 1e-2  # u itself is not v when r < t: the identity does the work


def test_jvp_and_central_difference_agree_and_jvp_keeps_the_graph():
    weight = torch.tensor(1.3, dtype=torch.float64, requires_grad=True)

    def scaled(x, r, t, cond):
        return weight * average_velocity(x, r, t) + torch.sin(3 * column(t, x)) * x

    g = torch.Generator().manual_seed(1)
    x = torch.randn(4, 5, generator=g, dtype=torch.float64)
    t, r = torch.tensor([0.9, 0.7, 0.5, 0.3], dtype=torch.float64), torch.zeros(4, dtype=torch.float64)
    direction = torch.randn(4, 5, generator=g, dtype=torch.float64)
    exact, _ = induced_velocity(scaled, x, r, t, None, direction, "jvp")
    approx, _ = induced_velocity(scaled, x, r, t, None, direction, "central", step=1e-5)
    torch.testing.assert_close(approx, exact.detach(), rtol=1e-7, atol=1e-8)
    exact.sum().backward()
    assert weight.grad is not None and weight.grad != 0


def test_one_average_velocity_step_is_exact():
    noise = torch.randn(1000, 4, generator=torch.Generator().manual_seed(2), dtype=torch.float64)
    grid = torch.tensor([1.0, 0.0], dtype=torch.float64)
    x0 = meanflow_sample(average_velocity, noise, grid).x0
    torch.testing.assert_close(x0, MU + SIGMA * noise)


def test_a_meanflow_copy_of_a_flow_model_starts_as_the_flow_model(tiny_model):
    """u(x, r, t) = v(x, t) before training, so N average-velocity steps are N Euler steps (also with CFG)."""
    mean_flow = tiny_model.as_mean_flow()
    assert mean_flow.config.mean_flow and mean_flow.interval_mlp is not None
    prompts, seeds = ["a red circle", "two blue squares"], [3, 4]
    for guidance in (1.0, 3.0):
        euler = generate(tiny_model, prompts, seeds, num_steps=3, guidance_scale=guidance)
        average = generate(mean_flow, prompts, seeds, num_steps=3, guidance_scale=guidance)
        torch.testing.assert_close(average, euler, rtol=0, atol=1e-5)
    with pytest.raises(ValueError, match="not a MeanFlow model"):
        tiny_model(
            torch.zeros(1, 3, 32, 32), torch.ones(1), *tiny_model.encode_prompts(["a"]), r=torch.zeros(1)
        )


def test_the_meanflow_loss_at_r_equal_t_is_flow_matching(tiny_model):
    model = tiny_model.as_mean_flow()
    with torch.no_grad():  # a trained interval embedding, so that r matters
        for parameter in model.interval_mlp.parameters():
            parameter.normal_(0, 0.1)
    g = torch.Generator().manual_seed(0)
    x0, noise = torch.randn(3, 3, 32, 32, generator=g), torch.randn(3, 3, 32, 32, generator=g)
    t = torch.tensor([0.8, 0.5, 0.3])
    cond = model.encode_prompts(["a red circle"] * 3)
    x_t = (1 - t[:, None, None, None]) * x0 + t[:, None, None, None] * noise
    flow_matching = (model(x_t, t, *cond, r=t) - (noise - x0)).pow(2).mean()
    torch.testing.assert_close(meanflow_loss(model, x0, noise, t, t, cond), flow_matching)
    assert meanflow_loss(model, x0, noise, t, torch.zeros(3), cond).item() != pytest.approx(
        flow_matching.item()
    )


def test_meanflow_pretraining_starts_from_a_flow_model_and_saves_a_meanflow_model(tiny_model_dir, tmp_path):
    config = PretrainConfig(
        steps=2, batch_size=4, warmup_steps=1, objective="meanflow", init_from=str(tiny_model_dir)
    )
    model = pretrain(config, tmp_path / "meanflow")
    loaded = ShapesDiT.from_pretrained(tmp_path / "meanflow")
    assert loaded.config.mean_flow and model.config.mean_flow
    assert any(parameter.abs().sum() > 0 for parameter in loaded.interval_mlp[-1].parameters())
    t, r = sample_intervals(2000, PretrainConfig(meanflow_equal_share=0.5, meanflow_zero_share=0.25))
    assert (r <= t).all()
    assert (r == t).float().mean() == pytest.approx(0.5, abs=0.05)
    assert (r == 0).float().mean() == pytest.approx(0.25, abs=0.05)


@pytest.mark.parametrize("derivative", ["jvp", "central"])
def test_with_r_equal_t_meanflow_nft_is_diffusion_nft(tiny_model, derivative):
    from flowrl.algorithms.base import TrainBatch
    from flowrl.algorithms.meanflow_nft import MeanFlowNFT
    from flowrl.algorithms.nft import DiffusionNFT
    from flowrl.config import load_config
    from flowrl.models import ShapesFlowModel
    from flowrl.policy import make_policy

    model = tiny_model.as_mean_flow()
    with torch.no_grad():
        for parameter in model.interval_mlp.parameters():
            parameter.normal_(0, 0.1)
    policy = make_policy(ShapesFlowModel(model))
    with torch.no_grad():  # theta away from old and reference, so that every term counts
        for parameter in policy.model.parameters():
            parameter.add_(0.01 * torch.randn_like(parameter))
    config = load_config(
        None,
        [
            "algorithm.name=meanflow_nft",
            f"algorithm.meanflow_derivative={derivative}",
            "algorithm.reference_weight=0.1",
        ],
    )
    g = torch.Generator().manual_seed(0)
    t = torch.tensor([[0.9, 0.6, 0.3]])
    batch = TrainBatch(
        {"x0": torch.rand(3, 3, 32, 32, generator=g) * 2 - 1},
        policy.encode(["a red circle", "two blue squares", "a green triangle"]),
        torch.tensor([1.5, -0.5, 0.2]),
        {"t": t, "r": t.clone(), "noise": torch.randn(1, 3, 3, 32, 32, generator=g)},
    )
    mean_flow_loss, _ = MeanFlowNFT(config).loss(policy, batch, 0, 1)
    nft_loss, _ = DiffusionNFT(config).loss(policy, batch, 0, 1)
    torch.testing.assert_close(mean_flow_loss, nft_loss, rtol=1e-5, atol=1e-7)
    # ... and with r < t the induced velocity differs from u, so the loss does too
    batch.draws["r"] = torch.zeros_like(t)
    assert MeanFlowNFT(config).loss(policy, batch, 0, 1)[0].item() != pytest.approx(nft_loss.item())


def test_meanflow_nft_trains_the_intervals_of_the_few_step_sampler():
    from flowrl.algorithms.meanflow_nft import interval_starts

    grid = torch.tensor([1.0, 0.75, 0.5, 0.25, 0.0])
    t = torch.tensor([[1.0, 0.5], [0.25, 0.75]])
    torch.testing.assert_close(
        interval_starts(t, grid, "grid", torch.Generator()), torch.tensor([[0.75, 0.25], [0.0, 0.5]])
    )
    torch.testing.assert_close(interval_starts(t, grid, "equal", torch.Generator()), t)
    uniform = interval_starts(t, grid, "uniform", torch.Generator().manual_seed(0))
    assert (uniform <= t).all() and (uniform >= 0).all()


def test_meanflow_nft_pairs_draw_meanflow_intervals_with_their_shares():
    from flowrl.algorithms.meanflow_nft import MeanFlowNFT
    from flowrl.config import ConfigError, load_config

    overrides = [
        "algorithm.name=meanflow_nft",
        "algorithm.meanflow_interval=pairs",
        "algorithm.meanflow_equal_share=0.3",
        "algorithm.meanflow_zero_share=0.2",
        "algorithm.train_timesteps=2",
    ]
    algorithm = MeanFlowNFT(load_config("configs/shapes_nft.yaml", overrides))
    grid = torch.linspace(1, 0, 5)
    draws = algorithm.draw(torch.Generator().manual_seed(0), 4000, (3, 2, 2), grid, step=1)
    t, r = draws["t"], draws["r"]
    assert t.shape == r.shape == (2, 4000) and draws["noise"].shape == (2, 4000, 3, 2, 2)
    assert (r <= t).all() and (r >= 0).all() and (t <= 1).all()
    assert (r == t).float().mean() == pytest.approx(0.3, abs=0.03)
    assert (r == 0).float().mean() == pytest.approx(0.2, abs=0.03)
    assert t.mean() == pytest.approx(2 / 3, abs=0.02)  # the larger of two U(0, 1) draws, not grid times
    assert not torch.isin(t, grid).all()
    with pytest.raises(
        ConfigError, match="meanflow_equal_share=0.8 \\+ algorithm.meanflow_zero_share=0.3 = 1.1"
    ):
        load_config(
            "configs/shapes_nft.yaml",
            [*overrides[:2], "algorithm.meanflow_equal_share=0.8", "algorithm.meanflow_zero_share=0.3"],
        )


def test_meanflow_nft_runs_in_the_trainer_and_resumes_exactly(tiny_model, tmp_path):
    from flowrl.checkpoint import read_checkpoint
    from flowrl.config import load_config
    from flowrl.run_log import read_metrics
    from flowrl.trainer import Trainer

    tiny_model.as_mean_flow().save_pretrained(tmp_path / "meanflow_model")
    common = [
        f"model.name={tmp_path / 'meanflow_model'}",
        "algorithm.name=meanflow_nft",
        "sampler.num_steps=4",
        "algorithm.train_timesteps=2",
        "training.prompts_per_step=2",
        "training.group_size=4",
        "training.micro_batch_size=4",
        "training.updates_per_step=1",
        "training.learning_rate=0.001",
        "evaluation.images_per_task=1",
        "evaluation.num_steps=2",
        "evaluation.base_guidance_scales=[1.0]",
        "logging.sample_every=0",
        "logging.checkpoint_every=1",
        "logging.progress=false",
    ]

    def run(name, steps, *extra):
        config = load_config(
            "configs/shapes_nft.yaml",
            [*common, f"training.steps={steps}", f"logging.output_dir={tmp_path / name}", *extra],
        )
        return Trainer(config).train()

    summary = run("straight", 2)
    assert 0.0 <= summary["tuned"]["1"]["geneval/overall"] <= 1.0
    run("split", 1)
    run("split", 2, "resume=latest")
    _, a = read_checkpoint(tmp_path / "straight" / "checkpoints" / "step_000002")
    _, b = read_checkpoint(tmp_path / "split" / "checkpoints" / "step_000002")
    for name, value in a["policy"]["model"].items():
        torch.testing.assert_close(b["policy"]["model"][name], value, rtol=0, atol=1e-7)
    rows = read_metrics(tmp_path / "straight" / "metrics.jsonl")
    assert all(row["meanflow/interval"] > 0 for row in rows if "meanflow/interval" in row)


def test_the_adaptive_meanflow_weight_is_a_robust_loss(tiny_model):
    model = tiny_model.as_mean_flow()
    g = torch.Generator().manual_seed(3)
    x0, noise = torch.randn(4, 3, 32, 32, generator=g), torch.randn(4, 3, 32, 32, generator=g)
    t, r = torch.tensor([0.9, 0.7, 0.5, 0.3]), torch.tensor([0.0, 0.2, 0.5, 0.1])
    cond = model.encode_prompts(["a red circle"] * 4)
    rows = [tuple(part[i : i + 1] for part in cond) for i in range(4)]
    plain = [
        meanflow_loss(model, x0[i : i + 1], noise[i : i + 1], t[i : i + 1], r[i : i + 1], rows[i])
        for i in range(4)
    ]
    expected = torch.stack([value / (value + 1e-3) for value in plain]).mean()
    torch.testing.assert_close(
        meanflow_loss(model, x0, noise, t, r, cond, adaptive_p=1.0), expected, rtol=1e-4, atol=1e-6
    )


def test_the_shipped_meanflow_model_loads_and_samples_in_two_steps():
    from flowrl.models import load_shapes_model

    model = load_shapes_model("shapes-meanflow")
    assert model.config.mean_flow
    images = generate(model, ["a red circle", "two blue squares"], [0, 1], num_steps=2)
    assert images.shape == (2, 3, 32, 32) and torch.isfinite(images).all()
    assert images.std() > 0.05  # not a blank canvas
