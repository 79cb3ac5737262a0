"""The moving-shapes video verifier: ground-truth clips pass, clips of another prompt fail, the reward contract.

Most rates reuse one set of rendered ground-truth clips and their per-frame
detections: the verdict is a function of the detections and the metadata
(:func:`score_frames`), so judging the clip rendered for prompt P against a
prompt P' that differs from P in one attribute is judging a clip with the
wrong attribute; every such pair (P, P') of the grammar is judged.
"""

import copy
import time

import numpy as np
import pytest
import torch

from flowrl.shapes.grammar import COLORS
from flowrl.video_shapes import render
from flowrl.video_shapes.grammar import TASKS, all_prompts, sample_prompt
from rewards import MultiReward, RewardError, build_reward, score
from rewards.base import modality_of
from rewards.shapes_verifier import detect_objects
from rewards.video_shapes_verifier import VideoShapesVerifier, score_frames, verify_clip
from rewards.world_spec import DIRECTIONS, SHAPE_CLASSES, SPEED_PIXELS, appear_frame

GROUND_TRUTH_CLIPS = 1000
MIN_RATE = 0.99


@pytest.fixture(scope="module")
def ground_truth():
    """``(record, clip, per-frame detections)`` for every prompt of the grammar (both templates, seed 0),
    then sampled prompts (seed 1) up to ``GROUND_TRUTH_CLIPS``; prints the verifier's time per clip."""
    records = all_prompts()
    rngs = [np.random.default_rng(0)] * len(records)
    sampler = np.random.default_rng(1)
    while len(records) < GROUND_TRUTH_CLIPS:
        records.append(sample_prompt(sampler))
        rngs.append(sampler)
    clips = [render.render_clip(record, rng) for record, rng in zip(records, rngs)]
    start = time.perf_counter()
    detections = [[detect_objects(frame) for frame in clip] for clip in clips]
    per_clip = (time.perf_counter() - start) / len(clips)
    print(f"\nvideo_shapes_verifier: {1e3 * per_clip:.1f} ms per 8-frame 32x32 clip (detection)")
    return list(zip(records, clips, detections))


def _with(record, index, **changes):
    wrong = copy.deepcopy(record)
    wrong["include"][index].update(changes)
    return wrong


def _differing_prompts(record, attribute):
    """Every prompt that differs from ``record`` in one entry's ``attribute`` (another value of it)."""
    named = {entry["class"] for entry in record["include"]}
    values = {
        "motion": DIRECTIONS,
        "color": COLORS,
        "speed": tuple(SPEED_PIXELS),
        "class": tuple(shape for shape in SHAPE_CLASSES if shape not in named),
    }[attribute]
    return [
        _with(record, index, **{attribute: value})
        for index, entry in enumerate(record["include"])
        if attribute in entry
        for value in values
        if value != entry[attribute]
    ]


def _strict_rate(pairs):
    verdicts = [score_frames(frames, record, 1.0)[0] for frames, record in pairs]
    return float(np.mean(verdicts)), len(verdicts)


def test_the_verifier_and_renderer_agree_on_the_appear_frame():
    assert [appear_frame(t) for t in range(2, 33)] == [render.appear_frame(t) for t in range(2, 33)]


def test_ground_truth_clips_pass(ground_truth):
    assert len(ground_truth) >= GROUND_TRUTH_CLIPS
    for task in TASKS:
        rate, count = _strict_rate((frames, r) for r, _, frames in ground_truth if r["tag"] == task)
        print(f"ground truth {task}: strict 1 on {rate:.4f} of {count} clips")
        assert rate >= MIN_RATE, (task, rate, count)
    failures = [r["prompt"] for r, _, frames in ground_truth if score_frames(frames, r, 1.0) != (1.0, 1.0)]
    rate = 1 - len(failures) / len(ground_truth)
    print(f"ground truth: strict and partial 1 on {rate:.4f} of {len(ground_truth)} clips")
    assert rate >= MIN_RATE, failures


@pytest.mark.parametrize("attribute", ["motion", "color", "class", "speed"])
def test_a_clip_fails_a_prompt_that_differs_in_one_attribute(ground_truth, attribute):
    pairs = [(frames, wrong) for r, _, frames in ground_truth for wrong in _differing_prompts(r, attribute)]
    rate, count = _strict_rate(pairs)
    print(f"wrong {attribute}: rejected {1 - rate:.4f} of {count} clip-prompt pairs")
    assert count >= 100 and 1 - rate >= MIN_RATE, (rate, count)


def test_reversed_clips_fail(ground_truth):
    rate, count = _strict_rate((frames[::-1], r) for r, _, frames in ground_truth)
    print(f"reversed: rejected {1 - rate:.4f} of {count} clips")
    assert 1 - rate >= MIN_RATE, rate


def test_an_object_there_from_the_start_does_not_appear():
    rng = np.random.default_rng(2)
    records = [r for r in all_prompts() if r["tag"] == "appear" and not r["prompt"].startswith("a video")]
    verdicts = []
    for record in records:
        present = copy.deepcopy(record)
        del present["include"][1]["appears"]
        strict, partial = verify_clip(render.render_clip(present, rng), record)
        verdicts.append(strict == 0.0 and partial == pytest.approx(4 / 5))  # only `appears` fails
    print(f"there from the start: rejected {np.mean(verdicts):.4f} of {len(verdicts)} clips")
    assert len(verdicts) >= 100 and np.mean(verdicts) >= MIN_RATE


def test_rendered_clips_of_a_wrong_prompt_fail_through_the_reward():
    rng = np.random.default_rng(3)
    pick = {r["prompt"]: r for r in all_prompts()}
    cases = [
        (pick["a circle moving left"], _with(pick["a circle moving left"], 0, motion="up")),
        (pick["a red square moving down"], _with(pick["a red square moving down"], 0, color="blue")),
        (pick["a triangle moving right"], _with(pick["a triangle moving right"], 0, **{"class": "circle"})),
        (pick["a circle moving up slowly"], _with(pick["a circle moving up slowly"], 0, speed="quickly")),
        (
            pick["a square moving left quickly"],
            _with(pick["a square moving left quickly"], 0, speed="slowly"),
        ),
        (
            pick["a circle moving left and a square moving up"],
            _with(pick["a circle moving left and a square moving up"], 1, motion="down"),
        ),
    ]
    videos = torch.from_numpy(np.stack([render.render_clip(wrong, rng) for _, wrong in cases]))
    scores = VideoShapesVerifier()(
        videos.permute(0, 1, 4, 2, 3), [r["prompt"] for r, _ in cases], [r for r, _ in cases]
    )
    assert scores["strict"].tolist() == [0.0] * len(cases)
    # direction: presence passes; colour and speed: presence and motion pass; class: nothing passes
    expected = [1 / 2, 2 / 3, 0.0, 2 / 3, 2 / 3, 3 / 4]
    assert scores["partial"].tolist() == pytest.approx(expected)


def test_clips_scale_with_frame_size_and_length():
    rng = np.random.default_rng(4)
    records = [sample_prompt(rng) for _ in range(24)]
    for record in records:
        clip = render.render_clip(record, rng, num_frames=10, image_size=48)
        assert verify_clip(clip, record) == (1.0, 1.0), record["prompt"]
        assert verify_clip(clip[::-1], record)[0] == 0.0, record["prompt"]


def test_a_static_clip_fails_motion_and_speed():
    rng = np.random.default_rng(5)
    pick = {r["prompt"]: r for r in all_prompts()}
    for prompt, partial in [("a circle moving left", 1 / 2), ("a triangle moving up quickly", 1 / 3)]:
        record = pick[prompt]
        still = np.repeat(render.render_clip(record, rng)[:1], 8, axis=0)
        assert verify_clip(still, record) == (0.0, pytest.approx(partial))  # presence alone passes


def test_an_empty_clip_scores_zero():
    blank = np.zeros((8, 32, 32, 3), dtype=np.float32)
    for task in TASKS:
        record = next(r for r in all_prompts() if r["tag"] == task)
        assert verify_clip(blank, record) == (0.0, 0.0), task


def test_a_flickering_object_loses_presence_and_a_second_one_fails_motion():
    record = next(r for r in all_prompts() if r["prompt"] == "a red circle moving right")
    mover = render.MovingObject("circle", "red", 6.0, 8.0, 2.0, 0.0, 8.0)
    flicker = render.draw_clip([mover])
    flicker[[2, 5]] = 0.0
    # 6 of 8 frames hold the circle, enough for the fit: only presence falls short
    assert verify_clip(flicker, record) == (0.0, pytest.approx((6 / 8 + 1 + 1) / 3))
    twin = render.MovingObject("circle", "red", 6.0, 24.0, 2.0, 0.0, 8.0)
    # two red circles in every frame: no frame holds exactly one, so presence and motion fail
    assert verify_clip(render.draw_clip([mover, twin]), record) == (0.0, pytest.approx(1 / 3))


def test_wrong_shapes_lengths_and_metadata_are_clear_errors():
    verifier = VideoShapesVerifier()
    record = all_prompts()[0]
    with pytest.raises(ValueError, match=r"expects videos \[B, T, 3, H, W\], got shape \(2, 3, 32, 32\)"):
        verifier(torch.zeros(2, 3, 32, 32), ["p"] * 2, [record] * 2)
    with pytest.raises(ValueError, match=r"expects videos \[B, T, 3, H, W\], got shape \(1, 8, 4, 32, 32\)"):
        verifier(torch.zeros(1, 8, 4, 32, 32), ["p"], [record])
    with pytest.raises(ValueError, match=r"needs at least 3 frames \(a motion fit\), got 2"):
        verifier(torch.zeros(1, 2, 3, 32, 32), ["p"], [record])
    with pytest.raises(ValueError, match="got 2 videos but 1 metadata entries"):
        verifier(torch.zeros(2, 8, 3, 32, 32), ["p"] * 2, [record])
    with pytest.raises(ValueError, match="entries of count 1"):
        verify_clip(np.zeros((8, 32, 32, 3)), {"include": [{"class": "circle", "count": 2}]})
    with pytest.raises(ValueError, match="unknown motion 'sideways'"):
        verify_clip(np.zeros((8, 32, 32, 3)), {"include": [{"class": "circle", "motion": "sideways"}]})
    with pytest.raises(ValueError, match="unknown speed 'fast'"):
        verify_clip(np.zeros((8, 32, 32, 3)), {"include": [{"class": "circle", "speed": "fast"}]})
    assert verifier(torch.zeros(0, 8, 3, 32, 32), [], [])["strict"].shape == (0,)


def test_the_registry_builds_it_and_it_passes_the_boundary_checks(ground_truth):
    verifier = build_reward("video_shapes_verifier")
    assert isinstance(verifier, VideoShapesVerifier)
    assert modality_of(verifier) == "video"
    records = [r for r, _, _ in ground_truth[::100]]
    videos = torch.from_numpy(np.stack([clip for _, clip, _ in ground_truth[::100]])).permute(0, 1, 4, 2, 3)
    prompts = [r["prompt"] for r in records]
    scores = score("video_shapes_verifier", verifier, videos, prompts, records)
    assert set(scores) == {"partial", "strict"}
    assert all(
        value.dtype == torch.float32 and value.tolist() == [1.0] * len(records) for value in scores.values()
    )
    multi = MultiReward({"video_shapes_verifier": 1.0})
    assert multi.total(multi(videos, prompts, records)).tolist() == [1.0] * len(records)
    with pytest.raises(RewardError, match=r"expects media \[B, T, 3, H, W\]"):
        score("video_shapes_verifier", verifier, videos[:, 0], prompts, records)
    with pytest.raises(RewardError, match="'video_shapes_verifier' raised ValueError: .*at least 3 frames"):
        score("video_shapes_verifier", verifier, videos[:, :1], prompts, records)
