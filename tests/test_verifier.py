import numpy as np
import pytest
import torch

from flowrl.shapes.grammar import TASKS, all_prompts, task_prompts
from flowrl.shapes.render import SceneObject, draw_scene, render_prompt, sample_layout
from rewards import build_reward
from rewards.shapes_verifier import detect_objects, verify_image
from rewards.world_spec import PALETTE, SHAPE_CLASSES


def test_renderer_and_verifier_agree_on_ground_truth():
    rng = np.random.default_rng(123)
    records = all_prompts()
    correct = {task: [] for task in TASKS}
    for record in records:
        strict, partial = verify_image(render_prompt(record, rng), record)
        correct[record["tag"]].append(strict == 1.0 and partial == 1.0)
    overall = np.mean([c for task in TASKS for c in correct[task]])
    assert overall >= 0.99, overall
    for task in TASKS:
        assert np.mean(correct[task]) >= 0.97, (task, np.mean(correct[task]))


def test_layouts_keep_objects_apart_and_relations_true():
    rng = np.random.default_rng(1)
    for record in all_prompts():
        for _ in range(3):
            objects = sample_layout(record["include"], rng)
            assert len(objects) == sum(entry["count"] for entry in record["include"])
            for i, a in enumerate(objects):
                assert a.size / 2 < a.center_x < 32 - a.size / 2 and a.size / 2 < a.center_y < 32 - a.size / 2
                for b in objects[i + 1 :]:
                    gap = (
                        max(abs(a.center_x - b.center_x), abs(a.center_y - b.center_y))
                        - (a.size + b.size) / 2
                    )
                    assert gap >= 2.0
            if record["tag"] == "position":
                reference, placed = objects
                relation = record["include"][1]["position"][0]
                dx, dy = placed.center_x - reference.center_x, placed.center_y - reference.center_y
                offset = {"left of": -dx, "right of": dx, "above": -dy, "below": dy}[relation]
                assert offset >= (placed.size + reference.size) / 2 + 2.0
            for entry, obj in zip(record["include"], objects):
                if "color" in entry:
                    assert obj.color == entry["color"]


@pytest.mark.parametrize("shape", SHAPE_CLASSES)
@pytest.mark.parametrize("color", list(PALETTE))
def test_single_shapes_are_read_back(shape, color):
    rng = np.random.default_rng(0)
    for _ in range(10):
        size = rng.uniform(7.5, 10)
        obj = SceneObject(shape, color, rng.uniform(6, 26), rng.uniform(6, 26), size)
        (found,) = detect_objects(draw_scene([obj]))
        assert (found.shape, found.color) == (shape, color)
        assert abs(found.center_x - obj.center_x) < 1.0 and abs(found.center_y - obj.center_y) < 1.5


def _record(task, prompt):
    return next(r for r in task_prompts(task) if r["prompt"] == prompt)


def test_wrong_count_is_rejected():
    record = _record("counting", "three circles")
    rng = np.random.default_rng(0)
    for wrong in (2, 4):
        image = draw_scene(sample_layout([{"class": "circle", "count": wrong}], rng))
        strict, partial = verify_image(image, record)
        assert strict == 0.0 and 0.0 < partial < 1.0


def test_wrong_color_and_shape_are_rejected():
    record = _record("colors", "a red circle")
    rng = np.random.default_rng(0)
    blue_circle = draw_scene(sample_layout([{"class": "circle", "color": "blue"}], rng))
    assert verify_image(blue_circle, record) == (0.0, 0.5)  # count right, colour wrong
    red_square = draw_scene(sample_layout([{"class": "square", "color": "red"}], rng))
    assert verify_image(red_square, record) == (0.0, 0.0)


def test_a_distractor_of_another_colour_is_not_ignored():
    record = _record("colors", "a red circle")
    image = draw_scene([SceneObject("circle", "red", 8, 16, 9), SceneObject("circle", "blue", 24, 16, 9)])
    assert verify_image(image, record) == (0.0, 0.25)  # two circles for one, half of them red
    record = _record("color_attr", "a red circle and a blue square")
    image = draw_scene(
        [
            SceneObject("circle", "red", 7, 7, 8),
            SceneObject("circle", "blue", 24, 7, 8),
            SceneObject("square", "red", 7, 24, 8),
            SceneObject("square", "blue", 24, 24, 8),
        ]
    )
    strict, partial = verify_image(image, record)
    assert strict == 0.0 and partial == 0.25


def test_objects_the_prompt_does_not_mention_are_ignored():
    record = _record("colors", "a red circle")
    image = draw_scene([SceneObject("circle", "red", 8, 16, 9), SceneObject("triangle", "blue", 24, 16, 9)])
    assert verify_image(image, record) == (1.0, 1.0)


def test_swapped_attributes_are_rejected():
    record = _record("color_attr", "a red circle and a blue square")
    image = draw_scene([SceneObject("circle", "blue", 8, 16, 9), SceneObject("square", "red", 24, 16, 9)])
    assert verify_image(image, record) == (0.0, 0.5)
    image = draw_scene([SceneObject("circle", "red", 8, 16, 9), SceneObject("square", "green", 24, 16, 9)])
    assert verify_image(image, record) == (0.0, 0.75)


@pytest.mark.parametrize(
    "relation, circle_at, square_at",
    [
        ("left of", (8, 16), (24, 16)),
        ("right of", (24, 16), (8, 16)),
        ("above", (16, 8), (16, 24)),
        ("below", (16, 24), (16, 8)),
    ],
)
def test_positions_are_checked(relation, circle_at, square_at):
    record = _record("position", f"a circle {relation} a square")
    right = draw_scene(
        [SceneObject("circle", "red", *circle_at, 9), SceneObject("square", "blue", *square_at, 9)]
    )
    wrong = draw_scene(
        [SceneObject("circle", "red", *square_at, 9), SceneObject("square", "blue", *circle_at, 9)]
    )
    assert verify_image(right, record) == (1.0, 1.0)
    strict, partial = verify_image(wrong, record)
    assert strict == 0.0 and partial == pytest.approx(2 / 3)


def test_degenerate_images_score_without_crashing():
    record = _record("counting", "two squares")
    rng = np.random.default_rng(0)
    degenerate = {
        "noise": rng.random((32, 32, 3)),
        "blank": np.zeros((32, 32, 3)),
        "white": np.ones((32, 32, 3)),
        "out of range": rng.normal(0.5, 3.0, (32, 32, 3)),
        "nan": np.full((32, 32, 3), np.nan),
    }
    for name, image in degenerate.items():
        strict, partial = verify_image(image, record)
        assert strict == 0.0 and 0.0 <= partial <= 1.0, name


def test_reward_from_registry_scores_a_batch():
    reward = build_reward("shapes_verifier")
    rng = np.random.default_rng(0)
    records = [_record("colors", "a red circle"), _record("counting", "two squares")]
    images = torch.from_numpy(np.stack([render_prompt(r, rng) for r in records])).permute(0, 3, 1, 2)
    images[1] = 0.0
    scores = reward(images, [r["prompt"] for r in records], records)
    assert set(scores) == {"strict", "partial"}
    assert scores["strict"].tolist() == [1.0, 0.0]
    assert scores["strict"].dtype == torch.float32 and scores["partial"].shape == (2,)


def test_reward_rejects_bad_shapes():
    reward = build_reward("shapes_verifier")
    with pytest.raises(ValueError, match=r"\[B, 3, H, W\]"):
        reward(torch.zeros(2, 32, 32), ["a", "b"], [{}, {}])
    with pytest.raises(ValueError, match="metadata"):
        reward(torch.zeros(2, 3, 32, 32), ["a", "b"], [{}])
