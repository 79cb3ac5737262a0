"""Video configs (the world of the prompts and of the model) and the trainer end to end on a tiny video model,
with exact resume; the verifier itself has its own tests (tests/test_video_shapes_verifier.py)."""

import json
import types
from dataclasses import asdict
from pathlib import Path

import numpy as np
import pytest
import torch
from video_world_helpers import (
    FRAMES,
    VIDEO,
    gif_frames,
    ground_truth_sampler,
    tiny_video_model,
)

from flowrl.checkpoint import read_checkpoint
from flowrl.config import ConfigError, load_config
from flowrl.evaluation import evaluation_world
from flowrl.generate import generate
from flowrl.models import load_shapes_model
from flowrl.run_log import read_metrics
from flowrl.shapes.grammar import write_prompts
from flowrl.trainer import train
from flowrl.video_shapes import grammar
from flowrl.video_shapes.render import (
    render_clip,
)
from flowrl.worlds import get_world

# --- config ---------------------------------------------------------------------------------------


def test_video_prompts_pick_the_video_world_and_mismatches_are_config_errors(tmp_path):
    config = load_config(None, ["data.prompts=video-shapes-train"])
    assert config.evaluation_world == "video_shapes" and get_world(config.evaluation_world) is VIDEO
    assert load_config(None, []).evaluation_world == "shapes"
    with pytest.raises(
        ConfigError, match=r"evaluation.world='shapes' does not match data.prompts='video-shapes-train'"
    ):
        load_config(None, ["data.prompts=video-shapes-train", "evaluation.world=shapes"])
    with pytest.raises(
        ConfigError, match=r"evaluation.world='video_shapes' does not match data.prompts='shapes-train'"
    ):
        load_config(None, ["evaluation.world=video_shapes"])
    with pytest.raises(
        ConfigError,
        match=r"evaluation.world='video' is not allowed; allowed: \[None, 'shapes', 'video_shapes', 'video_shapes_i2v'\]",
    ):
        load_config(None, ["evaluation.world=video"])
    prompt_file = tmp_path / "mine.jsonl"
    write_prompts(prompt_file, grammar.shipped_prompts("train")[:4])
    own = load_config(None, [f"data.prompts={prompt_file}", "evaluation.world=video_shapes"])
    assert own.evaluation_world == "video_shapes"
    assert load_config(None, [f"data.prompts={prompt_file}"]).evaluation_world is None  # the model decides


@pytest.mark.parametrize("makes_clips", [False, True])
def test_the_trainer_takes_the_world_of_the_model_and_refuses_the_other_kind(tmp_path, makes_clips):
    prompt_file = tmp_path / "mine.jsonl"
    write_prompts(prompt_file, grammar.shipped_prompts("train")[:4])
    policy = types.SimpleNamespace(flow_model=types.SimpleNamespace(renders_world=True, is_video=makes_clips))
    own_prompts = load_config(None, [f"data.prompts={prompt_file}"])
    assert evaluation_world(own_prompts, policy) is (VIDEO if makes_clips else get_world("shapes"))
    other = "shapes-train" if makes_clips else "video-shapes-train"
    with pytest.raises(
        ValueError, match=f"makes {'clips' if makes_clips else 'images'}, but the evaluation world"
    ):
        evaluation_world(load_config(None, [f"data.prompts={other}"]), policy)


def test_evaluation_is_a_config_error_for_diffusers_backends():
    with pytest.raises(
        ConfigError, match="runs on shapes models only; set both to \\[\\] for model.backend='wan'"
    ):
        load_config(None, ["model.backend=wan", "model.name=somewhere", "model.num_frames=5"])


def test_the_shipped_video_config_validates():
    config = load_config("configs/video_shapes_nft.yaml")
    assert config.data.prompts == "video-shapes-train" and config.evaluation_world == "video_shapes"
    assert config.rewards == {"video_shapes_verifier": 1.0} and config.model.backend == "shapes"


# --- the trainer end to end -----------------------------------------------------------------------

VIDEO_RUN = [
    "training.prompts_per_step=2",
    "training.group_size=2",
    "training.micro_batch_size=4",
    "training.updates_per_step=1",
    "training.learning_rate=0.001",
    "evaluation.images_per_task=1",
    "evaluation.num_steps=2",
    "evaluation.base_guidance_scales=[1.0]",
    "evaluation.every=0",
    "sampler.num_steps=2",
    "algorithm.train_timesteps=1",
    "logging.sample_every=1",
    "logging.checkpoint_every=1",
    "logging.progress=false",
]


def run_video(model_dir, output_dir, *overrides):
    config = load_config(
        "configs/video_shapes_nft.yaml",
        [*VIDEO_RUN, f"model.name={model_dir}", f"logging.output_dir={output_dir}", *overrides],
    )
    return train(config)


def final_weights(output_dir):
    checkpoints = Path(output_dir) / "checkpoints"
    return read_checkpoint(checkpoints / (checkpoints / "latest").read_text().strip())


def test_the_trainer_aligns_a_video_model_and_resumes_exactly(tmp_path, one_thread):
    base = tiny_video_model()
    base.save_pretrained(tmp_path / "base")
    straight = tmp_path / "straight"
    summary = run_video(tmp_path / "base", straight, "training.steps=2")

    assert summary["steps"] == 2
    for side in ("base", "tuned"):
        scores = summary[side]["1"]
        assert 0.0 <= scores["videoeval/overall"] <= 1.0 and "drift/colour_tv" in scores
        assert not any(key.startswith("geneval/") for key in scores)
    for step in (1, 2):
        assert gif_frames(straight / "samples" / f"step_{step:06d}.gif") == FRAMES
    assert not (straight / "samples" / "step_000001.png").exists()
    for name in ("base_cfg1", "tuned_cfg1"):
        assert gif_frames(straight / "eval" / f"{name}.gif") == FRAMES
        assert "videoeval/overall" in json.loads((straight / "eval" / f"{name}.json").read_text())
    rows = read_metrics(straight / "metrics.jsonl")
    assert [row["step"] for row in rows] == [0, 1, 2]
    assert "eval/videoeval/overall" in rows[0] and "eval/videoeval/overall" in rows[-1]
    for row in rows[1:]:
        assert {"reward/video_shapes_verifier/partial", "reward/video_shapes_verifier/strict"} <= set(row)
        assert 0.0 <= row["reward/video_shapes_verifier/partial"] <= 1.0
    tuned = load_shapes_model(str(straight / "model"))
    assert tuned.is_video and asdict(tuned.config) == asdict(base.config)
    assert any(not torch.equal(p, q) for p, q in zip(base.state_dict().values(), tuned.state_dict().values()))

    # 1 step, then a resumed 2nd step, ends on the same weights as 2 straight steps
    split = tmp_path / "split"
    run_video(tmp_path / "base", split, "training.steps=1")
    run_video(tmp_path / "base", split, "training.steps=2", "resume=latest")
    step_a, payload_a = final_weights(straight)
    step_b, payload_b = final_weights(split)
    assert step_a == step_b == 2
    for copy in ("model", "old"):
        for name, value in payload_a["policy"][copy].items():
            torch.testing.assert_close(
                payload_b["policy"][copy][name], value, rtol=0, atol=1e-7, msg=f"{copy}.{name}"
            )
    rows_split = read_metrics(split / "metrics.jsonl")
    assert [row["step"] for row in rows_split] == [0, 1, 2]
    for row_a, row_b in zip(rows[1:], rows_split[1:]):
        for key in ("reward/mean", "loss", "grad_norm"):
            assert row_a[key] == pytest.approx(row_b[key], rel=1e-6, abs=1e-9), (row_a["step"], key)


def test_the_ground_truth_sampler_renders_each_prompt_and_seed():
    sampler = ground_truth_sampler(FRAMES)
    record = VIDEO.prompts("test")[0]
    clips = sampler([record["prompt"]], [3], 1, 1.0)
    assert clips.shape == (1, FRAMES, 3, 32, 32)
    np.testing.assert_array_equal(
        clips[0].movedim(-3, -1).numpy(), render_clip(record, np.random.default_rng(3), FRAMES)
    )


def test_the_shipped_video_model_is_factorized_and_draws_clips():
    model = load_shapes_model("shapes-video")
    assert model.is_factorized and model.config.num_frames == 8
    clips = generate(model, ["a red circle moving left"], [0], num_steps=10)
    assert clips.shape == (1, 8, 3, 32, 32) and torch.isfinite(clips).all()
    red, blue = clips[0, :, 0].amax(dim=(1, 2)), clips[0, :, 2].amax(dim=(1, 2))
    assert (red > 0.8).all() and (blue < 0.4).all()  # a red object in every frame, nothing blue


def test_the_shipped_moving_base_moves_its_object_the_named_way():
    """shapes-video-v2 (its model card): a red circle asked to move left moves left in most seeds, one asked
    to move right moves right; the brightness centroid's least-squares slope over the 8 frames."""
    model = load_shapes_model("shapes-video-v2")
    assert model.is_factorized and model.config.frame_condition
    seeds = [0, 1, 2, 3]
    for direction, sign in (("left", -1.0), ("right", 1.0)):
        clips = generate(model, [f"a red circle moving {direction}"] * len(seeds), seeds, num_steps=10)
        ink = clips[:, :, 0].clamp(min=0)  # red channel [B, T, H, W]
        columns = torch.arange(32, dtype=torch.float32)
        centroid = (ink.sum(2) * columns).sum(-1) / ink.sum((2, 3)).clamp(min=1e-6)  # [B, T]
        frames = torch.arange(8, dtype=torch.float32) - 3.5
        slope = ((centroid - centroid.mean(1, keepdim=True)) * frames).sum(1) / frames.pow(2).sum()
        assert (sign * slope > 0.4).sum() >= 3, (direction, slope)
