"""scripts/video_motion.py: the motion read off a clip, the summary arithmetic, and a run on a tiny model."""

import math
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from video_world_helpers import VIDEO, tiny_video_model

SCRIPTS = Path(__file__).resolve().parent.parent / "scripts"
sys.path.insert(0, str(SCRIPTS))
from video_motion import clip_motion, motion_of, named_drift, summarise  # noqa: E402

from flowrl.models.shapes import images_to_model_space  # noqa: E402


def record_moving(direction: str, speed: str = "quickly") -> dict:
    return next(
        record
        for record in VIDEO.prompts("train")
        if record["tag"] == "speed"
        and record["include"][0]["motion"] == direction
        and record["include"][0].get("speed") == speed
    )


@pytest.mark.parametrize("direction", ["left", "right", "up", "down"])
def test_a_render_moves_the_named_way_its_reverse_the_other_and_a_still_clip_not_at_all(direction):
    record = record_moving(direction)
    clip = VIDEO.render(record, np.random.default_rng(0), (8, 3, 32, 32))
    forward = clip_motion(clip, record)
    assert forward["tracked"] == 1.0 and forward["holds"] == 1.0
    assert forward["cos"] == pytest.approx(1.0, abs=0.02)
    assert forward["speed"] == pytest.approx(2.25, abs=0.3)
    backward = clip_motion(clip[::-1].copy(), record)
    assert backward["cos"] == pytest.approx(-1.0, abs=0.02) and backward["holds"] == 0.0
    still = clip_motion(np.repeat(clip[:1], 8, axis=0), record)
    assert still["speed"] == pytest.approx(0.0, abs=1e-9) and still["holds"] == 0.0


def test_summarise_takes_medians_over_tracked_clips_and_directions_over_moving_ones():
    rows = [
        {"tracked": 1.0, "speed": 2.0, "cos": 1.0, "holds": 1.0},
        {"tracked": 1.0, "speed": 1.0, "cos": -1.0, "holds": 0.0},
        {"tracked": 1.0, "speed": 0.1, "cos": 1.0, "holds": 0.0},  # below MIN_SPEED: not moving
        {"tracked": 0.0, "speed": math.nan, "cos": math.nan, "holds": 0.0},
    ]
    summary = summarise(rows)
    assert summary == {
        "clips": 4,
        "tracked": 0.75,
        "speed": 1.0,
        "moving": 0.5,
        "direction_cos": 0.0,
        "motion_holds": 0.25,
    }


def test_a_tiny_run_reports_renders_generations_and_every_level(tmp_path):
    directory = tmp_path / "tiny_video"
    tiny_video_model(num_frames=8).save_pretrained(directory)
    result = motion_of(str(directory), clips_per_task=1, num_steps=2, levels=(0.5, 1.0))
    assert result["rendered"]["clips"] == result["generated"]["clips"] == 3
    assert result["rendered"]["motion_holds"] == 1.0 and result["rendered"]["direction_cos"] > 0.98
    assert set(result["renoised"]) == {"0.5", "1.0"}
    assert all("kept_speed" in row for row in result["renoised"].values())
    probe = result["mean_probe"]
    assert probe["prompts"] == 3 and probe["render_drift"] > 0.5 and math.isfinite(probe["drift_ratio"])


@pytest.mark.parametrize("direction", ["left", "right", "up", "down"])
def test_the_drift_of_a_mean_clip_is_its_speed_along_the_named_way_and_zero_for_a_still_one(direction):
    """Renders of one quick prompt, averaged: their mean moves 2.25 px/frame the named way; reversed, the
    other way; a clip repeating its first frame not at all."""
    record = record_moving(direction)
    clips = np.stack([VIDEO.render(record, np.random.default_rng(k), (8, 3, 32, 32)) for k in range(6)])
    clips = images_to_model_space(torch.from_numpy(clips).movedim(-1, -3))
    assert named_drift(clips, direction) == pytest.approx(2.25, abs=0.3)
    assert named_drift(clips.flip(1), direction) == pytest.approx(-2.25, abs=0.3)
    assert named_drift(clips[:, :1].expand_as(clips), direction) == pytest.approx(0.0, abs=1e-5)
