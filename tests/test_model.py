import dataclasses

import pytest
import torch

from flowrl.generate import generate
from flowrl.models.noise import seeded_noise
from flowrl.models.shapes_dit import ShapesDiT
from samplers import euler, guided_velocity, timesteps
from tests.conftest import tiny_config


def test_forward_shape_and_dtype(tiny_model):
    ids, mask = tiny_model.encode_prompts(["a red circle", "", "three squares"])
    x = torch.randn(3, 3, 32, 32)
    v = tiny_model(x, torch.rand(3), ids, mask)
    assert v.shape == x.shape and v.dtype == torch.float32 and torch.isfinite(v).all()
    assert tiny_model(x, torch.tensor(0.5), ids, mask).shape == x.shape


def test_prompt_changes_the_velocity(tiny_model):
    x, t = torch.randn(1, 3, 32, 32), torch.tensor([0.7])
    v_red = tiny_model(x, t, *tiny_model.encode_prompts(["a red circle"]))
    v_blue = tiny_model(x, t, *tiny_model.encode_prompts(["a blue circle"]))
    v_empty = tiny_model(x, t, *tiny_model.encode_prompts([""]))
    assert not torch.allclose(v_red, v_blue) and not torch.allclose(v_red, v_empty)


def test_unknown_word_is_a_clear_error(tiny_model):
    with pytest.raises(ValueError, match=r"'dog'.*allowed words"):
        tiny_model.encode_prompts(["a red dog"])
    with pytest.raises(ValueError, match="at most 15"):
        tiny_model.encode_prompts([" ".join(["circle"] * 16)])


def test_save_and_load_round_trip(tiny_model, tmp_path):
    tiny_model.save_pretrained(tmp_path / "model")
    loaded = ShapesDiT.from_pretrained(tmp_path / "model").eval()
    x, t = torch.randn(2, 3, 32, 32), torch.rand(2)
    cond = tiny_model.encode_prompts(["a circle", "two squares"])
    assert torch.equal(loaded(x, t, *cond), tiny_model(x, t, *cond))
    with pytest.raises(FileNotFoundError, match="config.json"):
        ShapesDiT.from_pretrained(tmp_path / "missing")


class CountingVelocity:
    def __init__(self, model):
        self.model, self.calls, self.batch_sizes = model, 0, []

    def __call__(self, x, t, cond):
        self.calls += 1
        self.batch_sizes.append(x.shape[0])
        return self.model(x, t, *cond)


def test_cfg_off_does_one_forward_per_step(tiny_model):
    velocity = CountingVelocity(tiny_model)
    cond = tiny_model.encode_prompts(["a circle"] * 2)
    guided = guided_velocity(velocity, 1.0, tiny_model.encode_prompts([""] * 2))
    euler(guided, torch.randn(2, 3, 32, 32), timesteps(5), cond)
    assert velocity.calls == 5 and velocity.batch_sizes == [2] * 5


def test_cfg_combines_branches_in_one_batched_call(tiny_model):
    velocity = CountingVelocity(tiny_model)
    cond = tiny_model.encode_prompts(["a red circle"] * 2)
    uncond = tiny_model.encode_prompts([""] * 2)
    x, t = torch.randn(2, 3, 32, 32), torch.full((2,), 0.6)
    guided = guided_velocity(velocity, 4.0, uncond)(x, t, cond)
    assert velocity.calls == 1 and velocity.batch_sizes == [4]
    v_c, v_u = tiny_model(x, t, *cond), tiny_model(x, t, *uncond)
    torch.testing.assert_close(guided, v_u + 4.0 * (v_c - v_u), rtol=1e-5, atol=1e-5)


def test_sampling_is_deterministic_per_seed(tiny_model):
    first = generate(tiny_model, ["a circle", "two squares"], [3, 4], num_steps=4)
    again = generate(tiny_model, ["a circle", "two squares"], [3, 4], num_steps=4)
    assert torch.equal(first, again)
    alone = generate(tiny_model, ["two squares"], [4], num_steps=4)
    torch.testing.assert_close(alone[0], first[1], rtol=0, atol=1e-5)
    other_seed = generate(tiny_model, ["a circle"], [5], num_steps=4)
    assert not torch.allclose(other_seed[0], first[0])
    assert first.min() >= 0 and first.max() <= 1 and first.shape == (2, 3, 32, 32)


def test_seeded_noise_rows_are_independent_of_batch():
    assert torch.equal(seeded_noise([7, 8], (3, 4, 4))[1], seeded_noise([8], (3, 4, 4))[0])


def test_guidance_changes_samples(tiny_model):
    plain = generate(tiny_model, ["a red circle"], [0], num_steps=4, guidance_scale=1.0)
    guided = generate(tiny_model, ["a red circle"], [0], num_steps=4, guidance_scale=5.0)
    assert not torch.allclose(plain, guided)


def test_sample_prediction_turns_the_clean_image_head_into_a_velocity(tiny_model):
    config = dataclasses.replace(tiny_model.config, prediction="sample")
    model = ShapesDiT(config)
    model.load_state_dict(tiny_model.state_dict())
    x, ids_mask = torch.randn(3, 3, 32, 32), model.encode_prompts(["a circle", "two squares", ""])
    t = torch.tensor([0.9, 0.5, 0.01])
    head = tiny_model(x, t, *ids_mask)  # the same weights read as a velocity head = the raw head
    expected = (x - head) / t.clamp(min=config.min_time)[:, None, None, None]
    torch.testing.assert_close(model(x, t, *ids_mask), expected)
    with pytest.raises(ValueError, match="unknown prediction 'noise'"):
        ShapesDiT(dataclasses.replace(tiny_model.config, prediction="noise"))


def test_text_contexts_are_reused_within_a_rollout_and_never_stale(tiny_model):
    from flowrl.models.shapes import ShapesFlowModel

    flow = ShapesFlowModel(tiny_model)
    cond = tiny_model.encode_prompts(["a red circle", "two blue squares"])
    other = tiny_model.encode_prompts(["three triangles", "a green square"])
    x, t = torch.randn(2, 3, 32, 32), torch.tensor([0.7, 0.3])
    with torch.no_grad():
        expected = [tiny_model(x, t, *cond), tiny_model(x * 0.5, t * 0.5, *cond), tiny_model(x, t, *other)]
    calls = []
    encode = tiny_model.encode_text
    tiny_model.encode_text = lambda ids, mask: calls.append(1) or encode(ids, mask)
    with torch.no_grad():
        assert torch.equal(flow.velocity(tiny_model, x, t, cond), expected[0])
        assert torch.equal(flow.velocity(tiny_model, x * 0.5, t * 0.5, cond), expected[1])
        assert len(calls) == 1  # one encoding served both steps
        assert torch.equal(flow.velocity(tiny_model, x, t, other), expected[2])
        assert len(calls) == 2
        next(tiny_model.text_encoder.parameters()).add_(0.1)  # the weights move (an optimizer or EMA step)
        moved = flow.velocity(tiny_model, x, t, cond)
        assert len(calls) == 3 and not torch.equal(moved, expected[0])
    # with gradients the text encoder runs every time, so that it trains
    flow.velocity(tiny_model, x, t, cond).sum().backward()
    assert len(calls) == 4 and next(tiny_model.text_encoder.parameters()).grad is not None


def test_a_neighbour_window_starts_as_the_same_function_and_then_reads_word_order(tiny_model, tmp_path):
    """``with_neighbour_window`` adds a zero convolution (the same velocity); with text positions zeroed the
    encoder without it is blind to word order (the same pooled vector for the colours swapped), with a trained
    convolution it is not; it round-trips through save and load."""
    x, t = torch.randn(2, 3, 32, 32), torch.rand(2)
    cond = tiny_model.encode_prompts(["a red circle and a blue square", "two squares"])
    mixed = tiny_model.with_neighbour_window(3).eval()
    assert mixed.config.text_neighbour_window == 3
    assert torch.equal(mixed(x, t, *cond), tiny_model(x, t, *cond))
    with pytest.raises(ValueError, match="already has text_neighbour_window=3"):
        mixed.with_neighbour_window(5)
    with pytest.raises(ValueError, match="text_neighbour_window=0 adds nothing"):
        tiny_model.with_neighbour_window(0)
    with torch.no_grad():
        for model in (tiny_model, mixed):
            model.text_encoder.position_embedding.zero_()
        mixed.text_encoder.neighbour_mixing.weight.normal_(std=0.1)
    prompts = ["a red circle and a blue square", "a blue circle and a red square"]
    for model, blind in ((tiny_model, True), (mixed, False)):
        pooled = model.encode_text(*model.encode_prompts(prompts)).pooled
        assert torch.allclose(pooled[0], pooled[1], atol=1e-5) == blind
    mixed.save_pretrained(tmp_path / "mixed")
    loaded = ShapesDiT.from_pretrained(tmp_path / "mixed").eval()
    assert torch.equal(loaded(x, t, *cond), mixed(x, t, *cond))


@pytest.mark.parametrize("window", [2, -1, 17, True])
def test_a_neighbour_window_must_be_zero_or_odd(window):
    with pytest.raises(ValueError, match=f"text_neighbour_window={window!r} is not allowed"):
        ShapesDiT(dataclasses.replace(tiny_config(), text_neighbour_window=window))
