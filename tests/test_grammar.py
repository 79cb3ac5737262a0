import collections

import numpy as np
import pytest

from flowrl.shapes import grammar
from rewards.world_spec import PALETTE, RELATIONS, SHAPE_CLASSES


@pytest.mark.parametrize("task", grammar.TASKS)
def test_every_task_makes_valid_prompts(task):
    records = grammar.task_prompts(task)
    assert records, task
    for record in records:
        assert record["tag"] == task
        assert record["prompt"] and record["prompt"] == record["prompt"].strip()
        for entry in record["include"]:
            assert entry["class"] in SHAPE_CLASSES
            assert 1 <= entry["count"] <= 4
            assert entry.get("color", "red") in PALETTE
            if "position" in entry:
                relation, reference = entry["position"]
                assert relation in RELATIONS
                assert record["include"][reference]["class"] != entry["class"]
    prompts = [record["prompt"] for record in records]
    assert len(prompts) == len(set(prompts)), "prompts of a task must be distinct"


def test_task_contents_match_geneval():
    counts = {r["include"][0]["count"] for r in grammar.task_prompts("counting")}
    assert counts == {1, 2, 3, 4}
    relations = {r["include"][1]["position"][0] for r in grammar.task_prompts("position")}
    assert relations == set(RELATIONS)
    assert all(len(r["include"]) == 2 for r in grammar.task_prompts("color_attr"))
    assert all(
        r["include"][0]["color"] != r["include"][1]["color"] for r in grammar.task_prompts("color_attr")
    )
    assert len(SHAPE_CLASSES) >= 3 and len(PALETTE) >= 5


def test_prompt_words_spell_the_metadata():
    record = next(r for r in grammar.task_prompts("position") if r["prompt"] == "a circle left of a square")
    assert record["include"] == [
        {"class": "square", "count": 1},
        {"class": "circle", "count": 1, "position": ["left of", 0]},
    ]
    record = next(r for r in grammar.task_prompts("counting") if r["prompt"] == "three triangles")
    assert record["include"] == [{"class": "triangle", "count": 3}]


def test_split_is_disjoint_and_covers_every_task():
    train, test = grammar.split_prompts()
    train_prompts = {r["prompt"] for r in train}
    test_prompts = {r["prompt"] for r in test}
    assert not train_prompts & test_prompts
    assert len(train) + len(test) == len(grammar.all_prompts())
    assert set(collections.Counter(r["tag"] for r in test)) == set(grammar.TASKS)
    assert set(collections.Counter(r["tag"] for r in train)) == set(grammar.TASKS)


def test_shipped_prompt_files_are_the_documented_split():
    train, test = grammar.split_prompts(seed=grammar.SPLIT_SEED)
    assert grammar.shipped_prompts("train") == train
    assert grammar.shipped_prompts("test") == test


def test_split_depends_on_seed():
    assert grammar.split_prompts(seed=1)[1] != grammar.split_prompts(seed=0)[1]


def test_sample_prompt_covers_all_tasks():
    rng = np.random.default_rng(0)
    tags = {grammar.sample_prompt(rng)["tag"] for _ in range(300)}
    assert tags == set(grammar.TASKS)


def test_load_prompts_rejects_records_without_metadata(tmp_path):
    path = tmp_path / "bad.jsonl"
    path.write_text('{"prompt": "a circle"}\n')
    with pytest.raises(ValueError, match="lacks"):
        grammar.load_prompts(path)
    with pytest.raises(ValueError, match="unknown prompt split"):
        grammar.shipped_prompts("validation")
