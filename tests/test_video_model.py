"""The video ShapesDiT (tubelets, clips, its start from the image model, temporal attention, save and load,
generation) and video pretraining."""

import json
from dataclasses import asdict

import numpy as np
import pytest
import torch
from video_world_helpers import (
    FRAMES,
    TINY_SIZES,
    randomised,
    tiny_video_config,
    tiny_video_model,
)

from flowrl.generate import generate
from flowrl.models import load_shapes_model
from flowrl.models.attention import TemporalAttention
from flowrl.models.shapes_dit import ShapesDiT, ShapesDiTConfig
from flowrl.pretrain import PretrainConfig, initial_model, pretrain, training_batch
from flowrl.shapes import grammar as image_grammar
from flowrl.shapes.tokenizer import ShapesTokenizer
from flowrl.video_shapes import grammar
from flowrl.worlds import get_world

# --- model ----------------------------------------------------------------------------------------


@pytest.mark.parametrize("frame_patch", [1, 2])
def test_patchify_makes_tubelets_and_unpatchify_inverts_it(frame_patch):
    model = ShapesDiT(tiny_video_config(frame_patch=frame_patch))
    x = torch.randn(2, FRAMES, 3, 32, 32)
    tokens = model._patchify(x)
    assert tokens.shape == (2, FRAMES // frame_patch * 64, frame_patch * 3 * 16)
    group, row, column = FRAMES // frame_patch - 1, 2, 5  # token = (frame group, patch row, patch column)
    expected = x[
        1,
        group * frame_patch : (group + 1) * frame_patch,
        :,
        4 * row : 4 * row + 4,
        4 * column : 4 * column + 4,
    ]
    assert torch.equal(tokens[1, group * 64 + row * 8 + column], expected.reshape(-1))
    assert torch.equal(model._unpatchify(tokens), x)


@pytest.mark.parametrize("prediction", ["velocity", "sample"])
def test_a_video_model_returns_clips(prediction):
    model = tiny_video_model(prediction=prediction)
    assert model.is_video and model.sample_shape == (FRAMES, 3, 32, 32)
    x = torch.randn(2, FRAMES, 3, 32, 32)
    with torch.no_grad():
        v = model(x, torch.tensor([0.3, 0.9]), *model.encode_prompts(["a circle moving left", ""]))
    assert v.shape == (2, FRAMES, 3, 32, 32) and v.dtype == torch.float32 and torch.isfinite(v).all()


@pytest.mark.parametrize("frame_patch", [1, 2])
@pytest.mark.parametrize("prediction", ["velocity", "sample"])
def test_as_video_denoises_a_still_clip_as_the_image_model_does(frame_patch, prediction):
    torch.manual_seed(0)
    image = randomised(
        ShapesDiT(ShapesDiTConfig(vocabulary=image_grammar.vocabulary(), prediction=prediction, **TINY_SIZES))
    )
    video = image.as_video(grammar.vocabulary(), FRAMES, frame_patch).eval()
    assert video.is_video and video.config.frame_patch == frame_patch and not image.is_video
    assert video.config.vocabulary == grammar.vocabulary()
    old_rows = image.text_encoder.token_embedding.weight
    new_rows = video.text_encoder.token_embedding.weight
    shared = sorted(set(grammar.vocabulary()) & set(image_grammar.vocabulary()))
    assert {"a", "red", "circle", "and"} <= set(shared)
    assert torch.equal(new_rows[:2], old_rows[:2])  # padding and begin
    for word in shared:
        assert torch.equal(new_rows[video.tokenizer.token_id(word)], old_rows[image.tokenizer.token_id(word)])
    prompts = ["a red circle", "a blue square and a green triangle", ""]
    x = torch.randn(3, 3, 32, 32)
    t = torch.tensor([0.2, 0.5, 0.95])
    with torch.no_grad():
        expected = image(x, t, *image.encode_prompts(prompts))
        still = x[:, None].expand(3, FRAMES, 3, 32, 32).contiguous()
        got = video(still, t, *video.encode_prompts(prompts))
    assert got.shape == still.shape
    torch.testing.assert_close(got, expected[:, None].expand_as(got), rtol=1e-5, atol=1e-5)
    with pytest.raises(ValueError, match="already a video model"):
        video.as_video(grammar.vocabulary(), FRAMES)


@pytest.mark.parametrize("prediction", ["velocity", "sample"])
def test_a_factorized_video_model_starts_as_the_image_model_on_every_frame_of_any_clip(prediction):
    torch.manual_seed(0)
    image = randomised(
        ShapesDiT(ShapesDiTConfig(vocabulary=image_grammar.vocabulary(), prediction=prediction, **TINY_SIZES))
    )
    video = image.as_video(grammar.vocabulary(), FRAMES, 1, attention="factorized").eval()
    assert video.is_factorized and video.config.video_attention == "factorized"
    assert all(block.temporal is not None for block in video.blocks)
    prompts = ["a red circle", "a blue square and a green triangle"]
    clip = torch.randn(2, FRAMES, 3, 32, 32)  # every frame different: joint attention would mix them
    t = torch.tensor([0.3, 0.8])
    with torch.no_grad():
        got = video(clip, t, *video.encode_prompts(prompts))
        expected = torch.stack(
            [image(clip[:, k], t, *image.encode_prompts(prompts)) for k in range(FRAMES)], dim=1
        )
    torch.testing.assert_close(got, expected, rtol=1e-5, atol=1e-5)
    # once the temporal layers are trained, frames inform each other
    randomised(video, seed=1)
    changed = clip.clone()
    changed[:, 1] += 1.0
    with torch.no_grad():
        before = video(clip, t, *video.encode_prompts(prompts))
        after = video(changed, t, *video.encode_prompts(prompts))
    assert not torch.allclose(before[:, 0], after[:, 0])


def test_temporal_attention_mixes_the_frames_of_one_position_only():
    torch.manual_seed(0)
    layer = TemporalAttention(hidden=16, heads=2)
    torch.nn.init.normal_(layer.out.weight)
    frames, positions = 3, 5
    tokens = torch.randn(2, frames * positions, 16)
    changed = tokens.clone()
    changed[0, 1 * positions + 2] += torch.randn(
        16
    )  # frame 1, position 2 of the first clip (not all-equal: LN)
    with torch.no_grad():
        difference = (layer(changed, frames) - layer(tokens, frames)).abs().sum(-1)
    moved = difference.view(2, frames, positions) > 1e-6
    expected = torch.zeros(2, frames, positions, dtype=torch.bool)
    expected[0, :, 2] = True
    assert torch.equal(moved, expected)


def test_an_unknown_video_attention_is_a_clear_error():
    with pytest.raises(
        ValueError, match="unknown video_attention 'spatial'; allowed: \\('joint', 'factorized'\\)"
    ):
        ShapesDiT(tiny_video_config(video_attention="spatial"))


@pytest.mark.parametrize("num_frames, frame_patch", [(3, 2), (4, 3), (0, 1), (4, 0)])
def test_num_frames_not_a_multiple_of_frame_patch_is_a_clear_error(num_frames, frame_patch):
    with pytest.raises(
        ValueError, match=f"num_frames={num_frames} must be a positive multiple of frame_patch={frame_patch}"
    ):
        ShapesDiT(tiny_video_config(num_frames=num_frames, frame_patch=frame_patch))


def test_a_video_model_round_trips_through_save_and_load(tmp_path):
    model = tiny_video_model(frame_patch=2)
    model.save_pretrained(tmp_path / "video")
    loaded = load_shapes_model(str(tmp_path / "video")).eval()
    assert asdict(loaded.config) == asdict(model.config) and loaded.is_video
    for (name, value), other in zip(model.state_dict().items(), loaded.state_dict().values()):
        assert torch.equal(value, other), name
    x = torch.randn(1, FRAMES, 3, 32, 32)
    cond = model.encode_prompts(["a red square moving up"])
    with torch.no_grad():
        assert torch.equal(model(x, torch.tensor(0.5), *cond), loaded(x, torch.tensor(0.5), *cond))


def test_generate_returns_clips_reproducible_per_prompt_and_seed(one_thread):
    model = tiny_video_model()
    prompts = ["a circle moving left", "a red square moving up quickly", "a circle moving left"]
    batch = generate(model, prompts, [0, 1, 5], num_steps=2)
    assert batch.shape == (3, FRAMES, 3, 32, 32) and batch.min() >= 0 and batch.max() <= 1
    alone = generate(model, prompts[1:2], [1], num_steps=2)
    torch.testing.assert_close(alone[0], batch[1], rtol=0, atol=1e-5)
    small_batches = generate(model, prompts, [0, 1, 5], num_steps=2, batch_size=2)
    torch.testing.assert_close(small_batches, batch, rtol=0, atol=1e-5)
    assert not torch.allclose(batch[0], batch[2])  # same prompt, other seed
    assert not torch.allclose(batch[0, 0], batch[0, 1])  # frames differ (per-frame noise)


# --- pretraining ----------------------------------------------------------------------------------

TINY_PRETRAIN = dict(steps=2, batch_size=2, warmup_steps=1, num_frames=FRAMES, frame_patch=2, **TINY_SIZES)


def test_video_pretraining_writes_a_loadable_video_model(tmp_path, one_thread):
    returned = pretrain(PretrainConfig(world="video_shapes", **TINY_PRETRAIN), tmp_path / "video")
    model = load_shapes_model(str(tmp_path / "video"))
    assert model.is_video and model.config.num_frames == FRAMES and model.config.frame_patch == 2
    assert model.config.vocabulary == grammar.vocabulary() and model.config.hidden_size == 32
    for (name, value), other in zip(returned.state_dict().items(), model.state_dict().values()):
        assert torch.equal(value, other), name
    record = json.loads((tmp_path / "video" / "pretrain.json").read_text())
    assert record["config"]["world"] == "video_shapes" and record["config"]["num_frames"] == FRAMES


def test_factorized_pretraining_saves_loadable_weights_along_the_way(tmp_path, tiny_model_dir, one_thread):
    config = PretrainConfig(
        world="video_shapes",
        init_from=str(tiny_model_dir),
        video_attention="factorized",
        save_every=2,
        **{**TINY_PRETRAIN, "steps": 5, "frame_patch": 1},
    )
    pretrain(config, tmp_path / "video")
    assert sorted(path.name for path in (tmp_path / "video").iterdir() if path.is_dir()) == [
        "step_000002",
        "step_000004",
    ]
    for directory in (tmp_path / "video", tmp_path / "video" / "step_000002"):
        model = load_shapes_model(str(directory))
        assert model.is_factorized and model.config.frame_patch == 1


def test_training_batch_renders_clips_in_model_space():
    clips, prompts = training_batch(np.random.default_rng(0), 3, 0.0, world="video_shapes", num_frames=FRAMES)
    assert clips.shape == (3, FRAMES, 3, 32, 32) and clips.dtype == torch.float32
    assert clips.min() >= -1.0 and clips.max() <= 1.0 and clips.min() == -1.0  # black background
    tokenizer = ShapesTokenizer(grammar.vocabulary(), 16)
    assert all(prompt and not tokenizer.unknown_words(prompt) for prompt in prompts)
    again, same_prompts = training_batch(
        np.random.default_rng(0), 3, 0.0, world="video_shapes", num_frames=FRAMES
    )
    assert torch.equal(again, clips) and same_prompts == prompts
    _, dropped = training_batch(np.random.default_rng(0), 3, 1.0, world="video_shapes", num_frames=FRAMES)
    assert dropped == ["", "", ""]
    images, _ = training_batch(np.random.default_rng(0), 2, 0.0)
    assert images.shape == (2, 3, 32, 32)


def test_initial_model_from_an_image_model_is_its_video_model(tiny_model, tiny_model_dir):
    config = PretrainConfig(
        world="video_shapes", init_from=str(tiny_model_dir), num_frames=FRAMES, frame_patch=2
    )
    model = initial_model(config)
    assert model.is_video and model.config.num_frames == FRAMES and model.config.frame_patch == 2
    assert model.config.vocabulary == grammar.vocabulary() and model.config.hidden_size == 32
    assert torch.equal(model.blocks[0].qkv.weight, tiny_model.blocks[0].qkv.weight)
    assert not model.frame_embedding.any()
    meanflow = initial_model(PretrainConfig(**{**asdict(config), "objective": "meanflow"}))
    assert meanflow.is_video and meanflow.config.mean_flow
    scratch = initial_model(PretrainConfig(world="video_shapes", **TINY_PRETRAIN))
    assert scratch.is_video and scratch.config.vocabulary == grammar.vocabulary()


def test_a_bad_world_is_a_clear_error(tmp_path):
    with pytest.raises(
        ValueError, match=r"unknown world 'videos'; allowed: \('shapes', 'video_shapes', 'video_shapes_i2v'\)"
    ):
        pretrain(PretrainConfig(world="videos", **TINY_PRETRAIN), tmp_path / "x")
    assert not (tmp_path / "x").exists()
    with pytest.raises(
        ValueError, match=r"unknown world 'videos'; allowed: \['shapes', 'video_shapes', 'video_shapes_i2v'\]"
    ):
        get_world("videos")


def test_meanflow_pretraining_of_a_video_model(tmp_path, one_thread):
    config = PretrainConfig(world="video_shapes", objective="meanflow", **{**TINY_PRETRAIN, "steps": 1})
    assert pretrain(config, tmp_path / "meanflow").config.mean_flow


def test_init_from_a_video_model_of_another_length_is_a_clear_error(tmp_path, one_thread):
    tiny_video_model().save_pretrained(tmp_path / "four_frames")
    config = PretrainConfig(
        world="video_shapes", init_from=str(tmp_path / "four_frames"), **{**TINY_PRETRAIN, "num_frames": 8}
    )
    with pytest.raises(ValueError, match="num_frames"):
        pretrain(config, tmp_path / "out")
