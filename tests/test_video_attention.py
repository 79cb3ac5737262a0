"""The motion layers of factorized video models: temporal attention over a neighbourhood (``temporal_radius``),
its formula read directly, its window, and the per-frame condition (``frame_condition``); their start from
trained models, and pretraining with them."""

import math

import pytest
import torch
import torch.nn.functional as F
from video_world_helpers import FRAMES, TINY_SIZES, randomised, tiny_video_config

from flowrl.models import load_shapes_model
from flowrl.models.attention import BIAS_SCALE, TemporalAttention
from flowrl.models.shapes_dit import ShapesDiT, ShapesDiTConfig
from flowrl.pretrain import PretrainConfig, pretrain
from flowrl.shapes import grammar as image_grammar
from flowrl.video_shapes import grammar

TINY_PRETRAIN = dict(steps=2, batch_size=2, warmup_steps=1, num_frames=FRAMES, frame_patch=1)


def randomised_layer(
    radius: int, frames: int, grid: int, hidden: int = 8, heads: int = 2
) -> TemporalAttention:
    torch.manual_seed(3)
    layer = TemporalAttention(hidden, heads, radius, frames, grid)
    torch.nn.init.normal_(layer.out.weight)
    if radius:
        torch.nn.init.normal_(layer.relative_bias, std=0.2)
    return layer


def test_neighbourhood_attention_follows_its_formula():
    """x + W_o softmax_j(q_i k_j / sqrt(d) + 10 b_h(dt, dy, dx)) v_j over |dy|, |dx| <= R, read pair by pair."""
    frames, grid, radius, hidden, heads = 3, 4, 1, 8, 2
    layer = randomised_layer(radius, frames, grid, hidden, heads)
    x = torch.randn(2, frames * grid * grid, hidden)
    with torch.no_grad():
        got = layer(x, frames)
        q, k, v = layer.qkv(layer.norm(x)).chunk(3, -1)
    width, side = hidden // heads, 2 * radius + 1
    coordinates = [(t, y, c) for t in range(frames) for y in range(grid) for c in range(grid)]
    expected = torch.zeros_like(x)
    for b in range(2):
        for i, (ti, yi, xi) in enumerate(coordinates):
            for h in range(heads):
                part = slice(h * width, (h + 1) * width)
                scores, values = [], []
                for j, (tj, yj, xj) in enumerate(coordinates):
                    if abs(yj - yi) > radius or abs(xj - xi) > radius:
                        continue
                    row = ((tj - ti + frames - 1) * side + (yj - yi + radius)) * side + (xj - xi + radius)
                    bias = BIAS_SCALE * layer.relative_bias[h, row].item()
                    scores.append(float(q[b, i, part] @ k[b, j, part]) / math.sqrt(width) + bias)
                    values.append(v[b, j, part])
                weights = torch.softmax(torch.tensor(scores), 0)
                expected[b, i, part] = (weights[:, None] * torch.stack(values)).sum(0)
    with torch.no_grad():
        expected = x + layer.out(expected)
    torch.testing.assert_close(got, expected, rtol=1e-5, atol=1e-5)


def test_a_radius_that_covers_the_frame_with_zero_bias_is_attention_over_the_whole_clip():
    frames, grid = 3, 4
    layer = randomised_layer(grid - 1, frames, grid)
    torch.nn.init.zeros_(layer.relative_bias)
    x = torch.randn(2, frames * grid * grid, 8)
    with torch.no_grad():
        q, k, v = (part.view(2, -1, 2, 4).transpose(1, 2) for part in layer.qkv(layer.norm(x)).chunk(3, -1))
        joint = F.scaled_dot_product_attention(q, k, v).transpose(1, 2).reshape(x.shape)
        torch.testing.assert_close(layer(x, frames), x + layer.out(joint), rtol=1e-5, atol=1e-5)


def test_a_neighbourhood_layer_mixes_only_tokens_within_its_radius_in_every_frame():
    frames, grid, radius = 3, 5, 1
    layer = randomised_layer(radius, frames, grid)
    tokens = torch.randn(1, frames * grid * grid, 8)
    changed = tokens.clone()
    changed[0, 1 * grid * grid + 2 * grid + 3] += torch.randn(8)  # frame 1, patch row 2, column 3
    with torch.no_grad():
        moved = (layer(changed, frames) - layer(tokens, frames)).abs().sum(-1).view(frames, grid, grid) > 1e-6
    expected = torch.zeros(frames, grid, grid, dtype=torch.bool)
    expected[:, 1:4, 2:5] = True
    assert torch.equal(moved, expected)


def test_under_cpu_autocast_the_neighbourhood_layer_stays_close_to_float32():
    layer = randomised_layer(2, 3, 4)
    x = torch.randn(2, 48, 8)
    with torch.no_grad():
        full = layer(x, 3)
        with torch.autocast("cpu", dtype=torch.bfloat16):
            half = layer(x, 3)
    torch.testing.assert_close(half.float(), full, rtol=0.05, atol=0.05)


def test_a_factorized_video_model_with_a_radius_starts_as_the_image_model_on_every_frame():
    torch.manual_seed(0)
    image = randomised(ShapesDiT(ShapesDiTConfig(vocabulary=image_grammar.vocabulary(), **TINY_SIZES)))
    video = image.as_video(grammar.vocabulary(), FRAMES, 1, "factorized", temporal_radius=2).eval()
    assert video.config.temporal_radius == 2 and all(block.temporal.radius == 2 for block in video.blocks)
    clip, t, prompts = torch.randn(2, FRAMES, 3, 32, 32), torch.tensor([0.3, 0.8]), ["a red circle", ""]
    with torch.no_grad():
        got = video(clip, t, *video.encode_prompts(prompts))
        expected = torch.stack(
            [image(clip[:, k], t, *image.encode_prompts(prompts)) for k in range(FRAMES)], 1
        )
    torch.testing.assert_close(got, expected, rtol=1e-5, atol=1e-5)


def test_with_video_layers_keeps_every_trained_weight_and_starts_the_new_ones_at_zero():
    torch.manual_seed(0)
    video = randomised(ShapesDiT(tiny_video_config(frame_patch=1, video_attention="factorized")))
    wider = video.with_video_layers(temporal_radius=2, frame_condition=True)
    assert wider.config.temporal_radius == 2 and wider.config.frame_condition
    state = wider.state_dict()
    for name, value in video.state_dict().items():
        assert torch.equal(state[name], value), name
    added = sorted(set(state) - set(video.state_dict()))
    biases = [f"blocks.{i}.temporal.relative_bias" for i in range(len(wider.blocks))]
    assert added == sorted(["frame_condition", *biases])
    assert all(not state[name].any() for name in added)
    with pytest.raises(ValueError, match="needs a factorized video model without them; .*temporal_radius=2"):
        wider.with_video_layers(temporal_radius=1)


def test_a_per_frame_condition_starts_as_the_model_without_it_and_then_tells_frames_apart():
    """At zero it changes nothing; trained, it makes the model's output depend on the frame index even on
    a clip whose frames are all the same noise (where the frame embedding alone is swamped)."""
    torch.manual_seed(0)
    video = randomised(ShapesDiT(tiny_video_config(frame_patch=1, video_attention="factorized"))).eval()
    conditioned = video.with_video_layers(frame_condition=True).eval()
    frame = torch.randn(2, 1, 3, 32, 32)
    still, t = frame.expand(2, FRAMES, 3, 32, 32), torch.tensor([1.0, 0.9])
    ids, mask = video.encode_prompts(["a circle moving left", ""])
    with torch.no_grad():
        torch.testing.assert_close(conditioned(still, t, ids, mask), video(still, t, ids, mask))
        torch.nn.init.normal_(conditioned.frame_condition)
        torch.nn.init.zeros_(conditioned.frame_embedding)
        per_frame = conditioned(still, t, ids, mask)
    assert (per_frame[:, 0] - per_frame[:, -1]).abs().max() > 1e-3


@pytest.mark.parametrize(
    ("changes", "message"),
    [
        ({"temporal_radius": -1}, "temporal_radius=-1 is not allowed; expected an integer in \\[0, 31\\]"),
        ({"temporal_radius": True}, "temporal_radius=True is not allowed"),
        (
            {"temporal_radius": 1, "video_attention": "joint"},
            "temporal_radius=1 needs video_attention='factorized'",
        ),
        ({"frame_condition": "yes"}, "frame_condition='yes' is not allowed for num_frames=4"),
        ({"frame_condition": True, "num_frames": 1}, "frame_condition=True is not allowed for num_frames=1"),
    ],
)
def test_a_bad_temporal_radius_is_a_clear_error(changes, message):
    with pytest.raises(ValueError, match=message):
        ShapesDiT(tiny_video_config(frame_patch=1, **{"video_attention": "factorized", **changes}))


def test_a_saved_model_with_a_radius_loads_back_the_same(tmp_path):
    model = randomised(
        ShapesDiT(tiny_video_config(frame_patch=1, video_attention="factorized", temporal_radius=1))
    )
    model.save_pretrained(tmp_path / "model")
    loaded = load_shapes_model(str(tmp_path / "model"))
    assert loaded.config.temporal_radius == 1
    for (name, value), again in zip(model.state_dict().items(), loaded.state_dict().values()):
        assert torch.equal(value, again), name


def test_pretraining_builds_or_adds_a_temporal_radius_and_trains_its_bias(
    tmp_path, tiny_model_dir, one_thread
):
    settings = dict(TINY_PRETRAIN, world="video_shapes", video_attention="factorized")
    from_image = pretrain(
        PretrainConfig(**settings, init_from=str(tiny_model_dir), temporal_radius=1), tmp_path / "from_image"
    )
    assert from_image.config.temporal_radius == 1
    assert any(block.temporal.relative_bias.abs().sum() > 0 for block in from_image.blocks)
    plain = pretrain(PretrainConfig(**settings, init_from=str(tiny_model_dir)), tmp_path / "plain")
    assert plain.config.temporal_radius == 0
    added = pretrain(
        PretrainConfig(**settings, init_from=str(tmp_path / "plain"), temporal_radius=2), tmp_path / "added"
    )
    assert load_shapes_model(str(tmp_path / "added")).config.temporal_radius == 2 and added.is_factorized
    conditioned = pretrain(
        PretrainConfig(**settings, init_from=str(tmp_path / "added"), frame_condition=True), tmp_path / "cond"
    )
    assert conditioned.config.frame_condition and conditioned.frame_condition.abs().sum() > 0
    assert conditioned.config.temporal_radius == 2
    with pytest.raises(ValueError, match="has temporal_radius=2; this run asks for 1"):
        pretrain(
            PretrainConfig(**settings, init_from=str(tmp_path / "added"), temporal_radius=1), tmp_path / "x"
        )
