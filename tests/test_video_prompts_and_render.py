"""The moving-shapes world's prompts (grammar, tokenizer, shipped split) and its renderer (motion,
appearance, errors, determinism)."""

import numpy as np
import pytest
from video_world_helpers import (
    centroids,
)

from flowrl.models.shapes_dit import ShapesDiTConfig
from flowrl.prompts import load_prompts
from flowrl.shapes.grammar import write_prompts
from flowrl.shapes.tokenizer import ShapesTokenizer
from flowrl.video_shapes import grammar
from flowrl.video_shapes.render import (
    NUM_FRAMES,
    appear_frame,
    draw_clip,
    render_clip,
    sample_motion_layout,
)
from rewards.world_spec import DIRECTION_VECTORS, SPEED_PIXELS

# --- grammar --------------------------------------------------------------------------------------


def test_every_task_has_train_and_test_prompts_and_the_phrases_are_disjoint():
    train_records, test_records = grammar.shipped_prompts("train"), grammar.shipped_prompts("test")
    assert {r["tag"] for r in train_records} == {r["tag"] for r in test_records} == set(grammar.TASKS)

    def phrase(record):
        return record["prompt"].removeprefix("a video of ")

    train_phrases, test_phrases = {phrase(r) for r in train_records}, {phrase(r) for r in test_records}
    assert train_phrases and test_phrases and not train_phrases & test_phrases
    # every phrase of the grammar is on exactly one side, with every template
    assert train_phrases | test_phrases == {p for t in grammar.TASKS for p, _ in grammar.task_phrases(t)}
    assert len(train_records) + len(test_records) == len(grammar.all_prompts())
    with pytest.raises(ValueError, match="unknown prompt split 'dev'"):
        grammar.shipped_prompts("dev")


def test_every_prompt_fits_the_tokenizer():
    prompts = [record["prompt"] for record in grammar.all_prompts()]
    tokenizer = ShapesTokenizer(grammar.vocabulary(), ShapesDiTConfig.max_prompt_tokens)
    ids, mask = tokenizer.encode(prompts)  # raises on an unknown word or a prompt that is too long
    assert ids.shape == (len(prompts), 16)
    assert max(len(p.split()) for p in prompts) + 1 <= 16  # + the begin token
    assert int(mask.sum(1).max()) == max(len(p.split()) for p in prompts) + 1


def test_the_shipped_jsonl_files_are_the_deterministic_split(tmp_path):
    train_records, test_records = grammar.split_prompts()
    assert (train_records, test_records) == grammar.split_prompts()
    assert grammar.shipped_prompts("train") == train_records
    assert grammar.shipped_prompts("test") == test_records
    for split, records in (("train", train_records), ("test", test_records)):
        write_prompts(tmp_path / f"{split}.jsonl", records)
        assert (tmp_path / f"{split}.jsonl").read_bytes() == (
            grammar.PROMPT_DIR / f"{split}.jsonl"
        ).read_bytes()
    assert load_prompts("video-shapes-train") == train_records
    assert grammar.split_prompts(seed=1) != (train_records, test_records)


# --- renderer -------------------------------------------------------------------------------------


@pytest.mark.parametrize("num_frames, image_size", [(NUM_FRAMES, 32), (4, 64)])
def test_a_clip_is_float32_frames_in_the_unit_range(num_frames, image_size):
    record = grammar.task_phrases("two_motion")[0][1]
    clip = render_clip({"include": record}, np.random.default_rng(0), num_frames, image_size)
    assert clip.shape == (num_frames, image_size, image_size, 3) and clip.dtype == np.float32
    assert clip.min() >= 0.0 and clip.max() <= 1.0 and clip.max() > 0.5


#: the fitted speed (least squares over frames) and every frame-to-frame step of the centroid are
#: within these many pixels (per frame) of the named velocity
CENTROID_TOLERANCE = 0.05
STEP_TOLERANCE = 0.1


@pytest.mark.parametrize("direction", list(DIRECTION_VECTORS))
@pytest.mark.parametrize("speed", list(SPEED_PIXELS))
def test_a_moving_object_moves_in_the_named_direction_at_the_named_speed(direction, speed):
    for shape, seed, image_size in (("circle", 0, 32), ("square", 1, 32), ("triangle", 2, 64)):
        record = {"include": [{"class": shape, "count": 1, "motion": direction, "speed": speed}]}
        clip = render_clip(record, np.random.default_rng(seed), NUM_FRAMES, image_size)
        expected = np.array(DIRECTION_VECTORS[direction]) * SPEED_PIXELS[speed] * image_size / 32
        points = centroids(clip)
        fitted = np.polyfit(np.arange(NUM_FRAMES), points, 1)[0]
        assert np.abs(fitted - expected).max() < CENTROID_TOLERANCE * image_size / 32, (shape, fitted)
        assert np.abs(np.diff(points, axis=0) - expected).max() < STEP_TOLERANCE * image_size / 32, shape


@pytest.mark.parametrize("num_frames", [4, 8, 9])
def test_an_appearing_object_is_absent_before_the_appear_frame_and_still_from_it_on(num_frames):
    include = [
        {"class": "circle", "count": 1, "motion": "right"},
        {"class": "square", "count": 1, "color": "red", "appears": True},
    ]
    clip = render_clip({"include": include}, np.random.default_rng(3), num_frames)
    mover, newcomer = sample_motion_layout(include, np.random.default_rng(3), num_frames)
    np.testing.assert_array_equal(clip, draw_clip([mover, newcomer], num_frames))
    alone = draw_clip([newcomer], num_frames)
    first = appear_frame(num_frames)
    assert first == num_frames // 2 and newcomer.first_frame == first
    assert (newcomer.velocity_x, newcomer.velocity_y) == (0.0, 0.0)
    for frame in range(num_frames):
        assert (alone[frame].max() > 0) == (frame >= first), frame
    np.testing.assert_array_equal(alone[first:], np.broadcast_to(alone[first], alone[first:].shape))
    # the clip is the mover alone before the appear frame, and differs from it from then on
    without = draw_clip([mover], num_frames)
    np.testing.assert_array_equal(clip[:first], without[:first])
    assert all(not np.array_equal(clip[k], without[k]) for k in range(first, num_frames))


def test_a_clip_too_long_for_its_frame_is_a_clear_error():
    record = {"include": [{"class": "circle", "count": 1, "motion": "left", "speed": "quickly"}]}
    with pytest.raises(ValueError, match=r"num_frames=16 frames, more than a 32-pixel frame allows"):
        render_clip(record, np.random.default_rng(0), num_frames=16)
    with pytest.raises(ValueError, match=r"num_frames=16 frames, more than a 128-pixel frame"):
        render_clip(record, np.random.default_rng(0), num_frames=16, image_size=128)  # speed scales too
    assert render_clip(record, np.random.default_rng(0), num_frames=8).shape[0] == 8
    with pytest.raises(ValueError, match="at least 3 frames .*, got num_frames=2"):
        render_clip(record, np.random.default_rng(0), num_frames=2)


@pytest.mark.parametrize(
    "entry, message",
    [
        (
            {"class": "circle", "count": 1, "motion": "sideways"},
            "unknown motion 'sideways'; allowed: .*'left'",
        ),
        (
            {"class": "circle", "count": 1, "motion": "up", "speed": "fast"},
            "unknown speed 'fast'; allowed: .*'slowly'",
        ),
        ({"class": "star", "count": 1, "motion": "up"}, "unknown shape class 'star'"),
        ({"class": "circle", "count": 1, "color": "pink", "motion": "up"}, "unknown colour 'pink'"),
    ],
)
def test_unknown_words_are_clear_errors(entry, message):
    with pytest.raises(ValueError, match=message):
        render_clip({"include": [entry]}, np.random.default_rng(0))


def test_the_same_seed_gives_the_same_clip():
    record = grammar.shipped_prompts("test")[0]
    first = render_clip(record, np.random.default_rng(7))
    np.testing.assert_array_equal(first, render_clip(record, np.random.default_rng(7)))
    assert not np.array_equal(first, render_clip(record, np.random.default_rng(8)))
