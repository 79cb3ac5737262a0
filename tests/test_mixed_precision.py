"""``training.mixed_precision: bf16``: velocities computed in bfloat16 under autocast and returned in float32;
weights, optimizer state, log-probabilities and checkpoints stay float32. (The GRPO ratio of exactly 1 at the
first update under bf16 is in ``test_grpo.py``.)"""

import contextlib
import math

import pytest
import torch
import yaml
from test_grpo import grpo_config
from test_trainer import final_weights, run

from flowrl import precision
from flowrl.checkpoint import read_checkpoint
from flowrl.config import ConfigError, load_config
from flowrl.models import ShapesFlowModel
from flowrl.models.attention import attention
from flowrl.models.shapes_dit import PrecisionAwareGELU
from flowrl.policy import OLD, REFERENCE, make_policy
from flowrl.precision import autocast_dtype
from flowrl.trainer import Trainer


@contextlib.contextmanager
def no_attention_fast_path():
    """torch's fused attention fast path runs for frozen or eval-mode modules only (the copies, not the
    trained network), as GRPO's ``prepare`` says; off, every role runs the same kernels."""
    enabled = torch.backends.mha.get_fastpath_enabled()
    torch.backends.mha.set_fastpath_enabled(False)
    try:
        yield
    finally:
        torch.backends.mha.set_fastpath_enabled(enabled)


def inputs(policy, rows=4):
    generator = torch.Generator().manual_seed(0)
    x = torch.randn(rows, *policy.sample_shape, generator=generator)
    t = torch.rand(rows, generator=generator)
    return (
        x,
        t,
        policy.encode(["a red circle", "two blue squares", "a green triangle", "three circles"][:rows]),
    )


def test_bf16_velocities_are_bfloat16_products_returned_in_float32(tiny_model):
    float32 = make_policy(ShapesFlowModel(tiny_model))
    bf16 = make_policy(ShapesFlowModel(tiny_model), mixed_precision="bf16")
    x, t, cond = inputs(float32)
    with no_attention_fast_path(), torch.no_grad():  # one kernel path for every role
        exact, mixed = float32.velocity(x, t, cond), bf16.velocity(x, t, cond)
        # every role runs the same numerics: the copies hold the same weights before training
        for role in (OLD, REFERENCE):
            assert torch.equal(bf16.velocity_of(role)(x, t, cond), mixed)
    assert exact.dtype == mixed.dtype == torch.float32
    difference = float((mixed - exact).abs().max())
    assert 0 < difference < 0.05 * float(exact.abs().max())  # bfloat16's 8 bits of mantissa, not garbage


def test_bf16_gradients_reach_float32_weights(tiny_model):
    policy = make_policy(ShapesFlowModel(tiny_model), mixed_precision="bf16")
    x, t, cond = inputs(policy)
    policy.velocity(x, t, cond).square().mean().backward()
    parameters = policy.trainable_parameters()
    assert all(p.dtype == torch.float32 for p in parameters)
    assert all(p.grad is not None and p.grad.dtype == torch.float32 for p in parameters if p.requires_grad)
    assert sum(float(p.grad.abs().sum()) for p in parameters if p.grad is not None) > 0


@pytest.mark.parametrize("recipe", ["nft", "flowgrpo"])
def test_a_bf16_run_trains_and_keeps_float32_state(tmp_path, tiny_model_dir, recipe, one_thread):
    overrides = ["training.steps=2", "training.mixed_precision=bf16"]
    if recipe == "nft":
        run(tiny_model_dir, tmp_path / "run", *overrides)
    else:
        where = [f"model.name={tiny_model_dir}", f"logging.output_dir={tmp_path / 'run'}"]
        Trainer(grpo_config(recipe, *where, *overrides)).train()
    step, weights = final_weights(tmp_path / "run")
    assert step == 2
    assert all(value.dtype == torch.float32 for copy in weights.values() for value in copy.values())
    latest = (tmp_path / "run" / "checkpoints" / "latest").read_text().strip()
    _, payload = read_checkpoint(tmp_path / "run" / "checkpoints" / latest)
    moments = [
        value
        for state in payload["optimizer"]["state"].values()
        for value in state.values()
        if isinstance(value, torch.Tensor) and value.is_floating_point() and value.ndim > 0
    ]
    assert moments and all(value.dtype == torch.float32 for value in moments)


def test_an_unknown_precision_is_refused_in_one_line(tmp_path):
    with pytest.raises(ConfigError, match=r"training.mixed_precision='fp8'.*'auto', 'no', 'bf16'"):
        load_config("configs/shapes_nft.yaml", ["training.mixed_precision=fp8"])
    with pytest.raises(ValueError, match="mixed_precision='fp8' is not allowed"):
        autocast_dtype("fp8")


@pytest.mark.parametrize(
    ("device", "pays", "has_bf16", "expected"),
    [
        ("cpu", True, True, "bf16"),
        ("cpu", True, False, "no"),
        ("cpu", False, True, "no"),
        ("cuda", True, True, "no"),
    ],
)
def test_auto_is_bf16_only_for_a_backend_that_pays_on_a_cpu_with_bfloat16_matmul(
    monkeypatch, device, pays, has_bf16, expected
):
    monkeypatch.setattr(precision, "cpu_has_bfloat16_matmul", lambda: has_bf16)
    value, line = precision.resolve_mixed_precision("auto", torch.device(device), pays)
    assert value == expected and line.startswith(
        f"mixed precision: {'bf16' if expected == 'bf16' else 'float32'}"
    )
    assert "\n" not in line
    for explicit in ("no", "bf16"):  # an explicit value is kept as it is, silently
        assert precision.resolve_mixed_precision(explicit, torch.device(device), pays) == (explicit, "")


def test_auto_is_resolved_at_start_said_once_recorded_and_a_resume_that_resolves_otherwise_is_refused(
    tmp_path, tiny_model_dir, monkeypatch, capsys
):
    monkeypatch.setattr(precision, "cpu_has_bfloat16_matmul", lambda: True)
    run(tiny_model_dir, tmp_path / "run", "training.steps=2", "training.mixed_precision=auto")
    printed = capsys.readouterr().out
    assert printed.count("mixed precision: bf16 (auto: this CPU has bfloat16 matrix instructions") == 1
    assert (
        yaml.safe_load((tmp_path / "run" / "config.yaml").read_text())["training"]["mixed_precision"]
        == "bf16"
    )
    monkeypatch.setattr(precision, "cpu_has_bfloat16_matmul", lambda: False)
    with pytest.raises(ConfigError, match=r"training.mixed_precision: 'bf16' -> 'no'"):
        run(
            tiny_model_dir,
            tmp_path / "run",
            "training.steps=3",
            "training.mixed_precision=auto",
            "resume=latest",
        )


def test_under_cpu_autocast_attention_runs_in_float32():
    """torch's bfloat16 flash-attention backward on the CPU is ~10x its float32 one (flowrl.models.shapes_dit)."""
    generator = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(2, 4, 16, 8, generator=generator) for _ in range(3))
    exact = torch.nn.functional.scaled_dot_product_attention(q, k, v)
    with torch.autocast("cpu", torch.bfloat16):
        low = [part.to(torch.bfloat16) for part in (q, k, v)]
        attended = attention(*low)
    assert attended.dtype == torch.bfloat16
    reference = torch.nn.functional.scaled_dot_product_attention(*(part.float() for part in low))
    assert torch.equal(attended, reference.to(torch.bfloat16))
    assert torch.equal(attention(q, k, v), exact)  # float32 outside autocast: the plain call


def test_the_mlp_gelu_is_the_tanh_form_in_float32_and_the_exact_form_in_bfloat16():
    """Typed from the definitions: tanh form ``0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3)))``, exact form
    ``x (1 + erf(x / sqrt 2)) / 2``; they differ by less than bfloat16's resolution of the input."""
    x = torch.linspace(-6, 6, 2001, dtype=torch.float64)
    tanh_form = 0.5 * x * (1 + torch.tanh(math.sqrt(2 / math.pi) * (x + 0.044715 * x**3)))
    exact_form = x * (1 + torch.erf(x / math.sqrt(2))) / 2
    gelu = PrecisionAwareGELU()
    torch.testing.assert_close(gelu(x.float()).double(), tanh_form, atol=1e-6, rtol=1e-6)
    low = x.to(torch.bfloat16)
    assert torch.equal(gelu(low), torch.nn.functional.gelu(low))  # torch's exact GELU, not the tanh form
    assert not torch.equal(gelu(low), torch.nn.functional.gelu(low, approximate="tanh"))
    torch.testing.assert_close(torch.nn.functional.gelu(x), exact_form)
    assert float((tanh_form - exact_form).abs().max()) < 5e-4 < float((low.double() - x).abs().max())


def test_under_cpu_autocast_the_text_encoder_runs_in_float32(tiny_model):
    ids = torch.randint(1, 10, (2, 6))
    mask = torch.ones(2, 6, dtype=torch.bool)
    exact = tiny_model.text_encoder(ids, mask)
    with torch.autocast("cpu", torch.bfloat16):
        mixed = tiny_model.text_encoder(ids, mask)
    for a, b in zip(exact, mixed):
        assert b.dtype == torch.float32 and torch.equal(a, b)


def test_frozen_copies_run_on_bfloat16_compute_copies_that_follow_their_float32_masters(tiny_model):
    """A frozen copy's linear layers are held in bfloat16 (no cast per call); the float32 copy moves, is
    saved and refreshes the compute copy, so the old model still equals the trained one after a copy."""
    policy = make_policy(ShapesFlowModel(tiny_model), mixed_precision="bf16")
    copies = policy.copies
    text = set(copies.compute[OLD].text_encoder.modules())
    linear = [m for m in copies.compute[OLD].modules() if isinstance(m, torch.nn.Linear) and m not in text]
    assert {m.weight.dtype for m in linear} == {torch.bfloat16}
    assert {p.dtype for p in copies.copies[OLD].parameters()} == {torch.float32}
    assert copies.compute[OLD].text_encoder.token_embedding.weight.dtype == torch.float32
    with torch.no_grad():
        for parameter in policy.trainable_parameters():
            parameter.add_(0.01)
    policy.move_copies({OLD: 0.0})
    x, t, cond = inputs(policy)
    with no_attention_fast_path(), torch.no_grad():
        trained, old, reference = (
            policy.velocity_of(role)(x, t, cond) for role in ("trained", OLD, REFERENCE)
        )
    assert torch.equal(old, trained) and not torch.equal(reference, trained)
    state = policy.state_dict()
    assert all(value.dtype == torch.float32 for value in state[OLD].values())
