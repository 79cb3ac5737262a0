"""Evaluation of clips (ground truth, black clips, the CLI picking the video world) and their grids and
tracker images."""

import json
import sys
import types

import numpy as np
import pytest
import torch
from PIL import Image, ImageSequence
from video_world_helpers import (
    FRAMES,
    VIDEO,
    clips_of,
    gif_frames,
    ground_truth_sampler,
    tiny_video_model,
)

from flowrl.cli import main
from flowrl.evaluation import colour_drift, evaluate, evaluation_items, write_evaluation
from flowrl.grid import FRAME_MILLISECONDS, save_grid
from flowrl.run_log import grid_pixels, log_grid_to_trackers
from flowrl.video_shapes.render import (
    NUM_FRAMES,
)

# --- evaluation -----------------------------------------------------------------------------------


def test_ground_truth_clips_score_one_and_do_not_drift(tmp_path):
    scores, clips, items, rewards = evaluate(
        ground_truth_sampler(), VIDEO.prompts("test"), images_per_task=2, num_steps=1, world=VIDEO
    )
    assert clips.shape == (2 * len(VIDEO.tasks), NUM_FRAMES, 3, 32, 32)
    assert scores["videoeval/overall"] == 1.0 and scores["partial/overall"] == 1.0
    assert all(scores[f"videoeval/{task}"] == 1.0 for task in VIDEO.tasks)
    assert scores["drift/colour_tv"] == 0.0 and scores["num_images"] == 2 * len(VIDEO.tasks)
    assert not any(key.startswith("geneval/") for key in scores)
    json_path, grid_path = write_evaluation(tmp_path, "truth", scores, clips, items, rewards, world=VIDEO)
    assert json_path == tmp_path / "truth.json" and grid_path == tmp_path / "truth.gif"
    assert json.loads(json_path.read_text())["videoeval/overall"] == 1.0
    assert gif_frames(grid_path) == NUM_FRAMES and not (tmp_path / "truth.png").exists()


def test_black_clips_score_zero_and_image_samples_are_a_clear_error():
    def black(prompts, seeds, num_steps, guidance_scale):
        return torch.zeros(len(prompts), NUM_FRAMES, 3, 32, 32)

    scores, *_ = evaluate(black, VIDEO.prompts("test"), images_per_task=1, num_steps=1, world=VIDEO)
    assert scores["videoeval/overall"] == 0.0 and scores["partial/overall"] == 0.0
    assert scores["drift/colour_tv"] > 0.0

    def images(prompts, seeds, num_steps, guidance_scale):
        return torch.zeros(len(prompts), 3, 32, 32)

    with pytest.raises(
        ValueError, match=r"video_shapes world evaluates clips \[B, T, 3, H, W\]; .*\(5, 3, 32, 32\)"
    ):
        evaluate(images, VIDEO.prompts("test"), images_per_task=1, num_steps=1, world=VIDEO)


def test_ground_truth_of_another_clip_length_does_not_drift():
    items = evaluation_items(VIDEO.prompts("test"), 4, 0, VIDEO.tasks)
    assert colour_drift(clips_of(items, FRAMES), items, VIDEO) == 0.0


def test_cli_eval_picks_the_video_world_from_the_model(tmp_path, one_thread):
    tiny_video_model().save_pretrained(tmp_path / "video")
    out = tmp_path / "eval"
    assert (
        main(
            [
                "eval",
                "--model",
                str(tmp_path / "video"),
                "--images-per-task",
                "1",
                "--steps",
                "1",
                "--out",
                str(out),
            ]
        )
        == 0
    )
    scores = json.loads((out / "eval_cfg_free.json").read_text())
    assert {"videoeval/overall", *(f"videoeval/{task}" for task in VIDEO.tasks)} <= set(scores)
    assert gif_frames(out / "eval_cfg_free.gif") == FRAMES


# --- grids and trackers ---------------------------------------------------------------------------


def distinct_frames(batch: int = 3, frames: int = FRAMES) -> torch.Tensor:
    """Clips whose every frame differs from the one before (a GIF keeps them all)."""
    return torch.rand(batch, frames, 3, 8, 8, generator=torch.Generator().manual_seed(0))


def test_save_grid_writes_an_animated_gif_for_clips_and_a_png_for_images(tmp_path):
    path = save_grid(tmp_path / "grid.png", distinct_frames(), ["a", "b", "c"], columns=2)
    assert path == tmp_path / "grid.gif" and gif_frames(path) == FRAMES
    assert not (tmp_path / "grid.png").exists()
    with Image.open(path) as image:
        assert image.info.get("loop") == 0 and image.size == (2 * 128, 2 * (128 + 3 * 13 + 4))
    image_path = save_grid(tmp_path / "images.png", torch.rand(3, 3, 8, 8))
    assert image_path == tmp_path / "images.png"
    with Image.open(image_path) as image:
        assert image.format == "PNG"
    with pytest.raises(
        ValueError, match=r"images \[B, 3, H, W\] or clips \[B, T, 3, H, W\], got \(3, 8, 8\)"
    ):
        save_grid(tmp_path / "bad.png", torch.rand(3, 8, 8))


def test_a_grid_of_still_clips_plays_for_the_whole_clip(tmp_path):
    """Pillow stores repeated GIF frames once with their durations summed (documented in save_grid)."""
    path = save_grid(tmp_path / "still.png", torch.zeros(2, FRAMES, 3, 8, 8))
    with Image.open(path) as image:
        durations = [frame.info["duration"] for frame in ImageSequence.Iterator(image)]
    assert sum(durations) == FRAMES * FRAME_MILLISECONDS


def test_grid_pixels_puts_the_frames_of_a_gif_side_by_side(tmp_path):
    path = save_grid(tmp_path / "grid.gif", distinct_frames(batch=2), columns=2)
    pixels = grid_pixels(path)
    with Image.open(path) as image:
        width, height = image.size
        frames = []
        for index in range(image.n_frames):
            image.seek(index)
            frames.append(np.asarray(image.convert("RGB")))
    assert pixels.shape == (height, FRAMES * width, 3) and pixels.dtype == np.uint8
    np.testing.assert_array_equal(pixels, np.concatenate(frames, axis=1))
    assert not np.array_equal(pixels[:, :width], pixels[:, width : 2 * width])
    png = save_grid(tmp_path / "images.png", torch.rand(2, 3, 8, 8))
    assert grid_pixels(png).shape == (128, 256, 3)


class _FakeWriter:
    def __init__(self):
        self.calls = []

    def add_image(self, tag, image, step, dataformats="CHW"):
        self.calls.append((tag, image, step, dataformats))


def test_log_grid_to_trackers_sends_tensorboard_the_frames_in_hwc(tmp_path, monkeypatch):
    gif = save_grid(tmp_path / "samples.png", distinct_frames(batch=2), columns=2)
    tensorboard = types.SimpleNamespace(name="tensorboard", writer=_FakeWriter())
    logged = []
    wandb_tracker = types.SimpleNamespace(name="wandb", log=lambda data, step: logged.append((data, step)))
    fake_wandb = types.SimpleNamespace(
        Video=lambda path, format: ("video", path, format), Image=lambda path: ("image", path)
    )
    monkeypatch.setitem(sys.modules, "wandb", fake_wandb)
    accelerator = types.SimpleNamespace(trackers=[tensorboard, wandb_tracker])
    log_grid_to_trackers(accelerator, "samples", gif, 3)
    ((tag, image, step, dataformats),) = tensorboard.writer.calls
    assert (tag, step, dataformats) == ("samples", 3, "HWC")
    np.testing.assert_array_equal(image, grid_pixels(gif))
    assert image.shape[1] == FRAMES * Image.open(gif).size[0]
    assert logged == [({"samples": ("video", str(gif), "gif")}, 3)]
    png = save_grid(tmp_path / "eval.png", torch.rand(2, 3, 8, 8))
    log_grid_to_trackers(accelerator, "eval", png, 4)
    assert tensorboard.writer.calls[-1][1].shape == (128, 256, 3)
    assert logged[-1] == ({"eval": ("image", str(png))}, 4)
