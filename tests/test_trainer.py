"""The trainer end to end on a tiny random-weight model: exact resume, two real processes, checkpoints."""

import warnings
from pathlib import Path

import pytest
import torch
from two_processes import train_in_two_processes

from flowrl.checkpoint import CheckpointError, read_checkpoint, resumable_checkpoint, write_checkpoint
from flowrl.config import ConfigError, load_config
from flowrl.learning_rate import learning_rate_factor
from flowrl.prompts import prompt_weights, step_samples
from flowrl.run_log import read_metrics
from flowrl.shapes.grammar import shipped_prompts
from flowrl.step_metrics import task_rewards
from flowrl.trainer import Trainer

TINY_RUN = [
    "training.prompts_per_step=2",
    "training.group_size=4",
    "training.micro_batch_size=2",
    "training.updates_per_step=1",
    "training.learning_rate=0.001",
    "sampler.num_steps=4",
    "algorithm.train_timesteps=2",
    "evaluation.images_per_task=1",
    "evaluation.num_steps=2",
    "evaluation.base_guidance_scales=[1.0]",
    "logging.sample_every=0",
    "logging.checkpoint_every=2",
    "logging.progress=false",
]


def run(model_dir, output_dir, *overrides):
    config = load_config(
        "configs/shapes_nft.yaml",
        [*TINY_RUN, f"model.name={model_dir}", f"logging.output_dir={output_dir}", *overrides],
    )
    return Trainer(config).train()


def final_weights(output_dir):
    step, payload = read_checkpoint(
        Path(output_dir) / "checkpoints" / (Path(output_dir) / "checkpoints" / "latest").read_text().strip()
    )
    return step, payload["policy"]


COMPARED = ("reward/mean", "loss", "grad_norm", "nft/positive_loss", "nft/negative_loss")


def test_resume_continues_exactly(tmp_path, tiny_model_dir):
    run(tiny_model_dir, tmp_path / "straight", "training.steps=4")
    run(tiny_model_dir, tmp_path / "split", "training.steps=2")
    run(tiny_model_dir, tmp_path / "split", "training.steps=4", "resume=latest")
    step_a, weights_a = final_weights(tmp_path / "straight")
    step_b, weights_b = final_weights(tmp_path / "split")
    assert step_a == step_b == 4
    for copy in ("model", "old"):
        for name, value in weights_a[copy].items():
            torch.testing.assert_close(weights_b[copy][name], value, rtol=0, atol=1e-7, msg=f"{copy}.{name}")
    rows_a, rows_b = (
        read_metrics(tmp_path / "straight" / "metrics.jsonl"),
        read_metrics(tmp_path / "split" / "metrics.jsonl"),
    )
    assert [r["step"] for r in rows_b] == [0, 1, 2, 3, 4]  # step 0: the base model's evaluation
    rows_a, rows_b = rows_a[1:], rows_b[1:]
    assert all(any(key.startswith("reward/task/") for key in row) for row in rows_a)
    for row_a, row_b in zip(rows_a, rows_b):
        for key in COMPARED:
            assert row_a[key] == pytest.approx(row_b[key], rel=1e-6, abs=1e-9), (row_a["step"], key)


def test_task_rewards_are_the_mean_reward_of_each_task():
    total = torch.tensor([1.0, 0.0, 0.5, 0.25])
    records = [{"tag": "counting"}, {"tag": "position"}, {"tag": "counting"}, {"tag": "position"}]
    assert task_rewards(total, records) == {"reward/task/counting": 0.75, "reward/task/position": 0.125}
    assert task_rewards(total, [{"prompt": "a cat"}] * 4) == {}


def test_learning_rate_factor_warms_up_then_holds_or_decays():
    assert [learning_rate_factor(i, 2, 10, "constant") for i in (0, 1, 2, 9)] == [0.5, 1.0, 1.0, 1.0]
    cosine = [learning_rate_factor(i, 2, 10, "cosine", 0.2) for i in (1, 2, 6, 10, 20)]
    assert cosine == pytest.approx([1.0, 1.0, 0.6, 0.2, 0.2])
    with pytest.raises(ValueError, match="'linear'.*allowed"):
        learning_rate_factor(3, 0, 10, "linear")
    with pytest.raises(ConfigError, match="training.lr_schedule='linear'"):
        load_config("configs/shapes_nft.yaml", ["training.lr_schedule=linear"])


def test_the_trainer_follows_the_cosine_schedule(tmp_path, tiny_model_dir):
    schedule = [
        "training.lr_schedule=cosine",
        "training.min_learning_rate_ratio=0.2",
        "training.warmup_steps=1",
    ]
    run(tiny_model_dir, tmp_path / "run", "training.steps=4", *schedule)
    logged = [row["lr"] for row in read_metrics(tmp_path / "run" / "metrics.jsonl") if row["step"] > 0]
    # the lr logged after step k is the one the next update uses: factor(k) of the peak
    assert logged == pytest.approx(
        [1e-3 * learning_rate_factor(k, 1, 4, "cosine", 0.2) for k in (1, 2, 3, 4)]
    )
    assert logged[-1] == pytest.approx(2e-4)


def test_two_processes_match_one_process(tmp_path, tiny_model_dir):
    overrides = ["training.steps=2", "training.threads=1", f"model.name={tiny_model_dir}", *TINY_RUN]
    run(tiny_model_dir, tmp_path / "one", "training.steps=2", "training.threads=1")
    train_in_two_processes("configs/shapes_nft.yaml", [*overrides, f"logging.output_dir={tmp_path / 'two'}"])
    rows_one = [row for row in read_metrics(tmp_path / "one" / "metrics.jsonl") if row["step"] > 0]
    rows_two = [row for row in read_metrics(tmp_path / "two" / "metrics.jsonl") if row["step"] > 0]
    # Two processes really ran: each wrote its RNG state into the checkpoint, and the run says so.
    _, payload = read_checkpoint(tmp_path / "two" / "checkpoints" / "step_000002")
    assert len(payload["rng"]) == 2 and all(row["num_processes"] == 2 for row in rows_two)
    assert all(row["num_processes"] == 1 for row in rows_one)
    # Same global batch, same noise: equal up to float reordering in the gradient all-reduce.
    for row_one, row_two in zip(rows_one, rows_two, strict=True):
        for key in COMPARED:
            assert row_one[key] == pytest.approx(row_two[key], rel=1e-4, abs=1e-6), (row_one["step"], key)
    _, weights_one = final_weights(tmp_path / "one")
    _, weights_two = final_weights(tmp_path / "two")
    for name, value in weights_one["model"].items():
        torch.testing.assert_close(weights_two["model"][name], value, rtol=1e-4, atol=1e-5)


def test_a_corrupted_or_truncated_checkpoint_is_refused_and_the_previous_one_used(tmp_path):
    directory = tmp_path / "checkpoints"
    for step in (2, 4, 6):
        write_checkpoint(directory, step, {"state": {"w": torch.full((100,), float(step))}}, keep=3)
    newest = directory / "step_000006" / "state.pt"
    newest.write_bytes(newest.read_bytes()[:50])  # truncated
    with pytest.raises(CheckpointError, match="truncated"):
        read_checkpoint(directory / "step_000006")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        assert resumable_checkpoint("latest", directory) == directory / "step_000004"
    assert any("step_000006" in str(w.message) and "truncated" in str(w.message) for w in caught)
    middle = directory / "step_000004" / "state.pt"
    data = bytearray(middle.read_bytes())
    data[-10] ^= 0xFF  # same size, flipped bits
    middle.write_bytes(bytes(data))
    with pytest.raises(CheckpointError, match="SHA-256"):
        read_checkpoint(directory / "step_000004")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        assert resumable_checkpoint("latest", directory) == directory / "step_000002"
    with pytest.raises(CheckpointError, match="SHA-256"):
        resumable_checkpoint(str(directory / "step_000004"), directory)
    assert read_checkpoint(directory / "step_000002")[1]["state"]["w"][0] == 2.0


def test_checkpoints_are_pruned_and_latest_points_at_the_newest(tmp_path):
    directory = tmp_path / "checkpoints"
    for step in (1, 2, 3):
        write_checkpoint(directory, step, {"x": torch.tensor(step)}, keep=2)
    assert sorted(p.name for p in directory.iterdir()) == ["latest", "step_000002", "step_000003"]
    assert (directory / "latest").read_text().strip() == "step_000003"


def test_step_samples_are_groups_and_shards_take_whole_groups():
    prompts = shipped_prompts("train")
    samples = step_samples(prompts, step=3, prompts_per_step=4, group_size=3, seed=0)
    assert samples.group_ids == [0, 0, 0, 1, 1, 1, 2, 2, 2, 3, 3, 3]
    assert all(len({samples.records[i]["prompt"] for i in range(g * 3, g * 3 + 3)}) == 1 for g in range(4))
    assert len({r["prompt"] for r in samples.records}) == 4
    assert step_samples(prompts, 3, 4, 3, 0) == samples and step_samples(prompts, 4, 4, 3, 0) != samples
    first, second = samples.shard(0, 2), samples.shard(1, 2)
    assert first.group_ids == [0, 0, 0, 1, 1, 1] and second.group_ids == [2, 2, 2, 3, 3, 3]
    assert first.seeds + second.seeds == samples.seeds


def test_balanced_sampling_gives_every_task_the_same_share():
    prompts = shipped_prompts("train")
    weights = prompt_weights(prompts, "balanced")
    shares = {}
    for record, weight in zip(prompts, weights):
        shares[record["tag"]] = shares.get(record["tag"], 0.0) + weight
    assert shares == pytest.approx({tag: 1 / 6 for tag in shares}) and len(shares) == 6
    drawn = [r["tag"] for step in range(200) for r in step_samples(prompts, step, 6, 1, 0, weights).records]
    assert drawn.count("single_object") > 100  # 4 of 364 prompts, ~1/6 of 1200 draws (uniform: ~13)
    with pytest.raises(ValueError, match="needs a 'tag'"):
        prompt_weights([{"prompt": "a red circle"}], "balanced")


def test_task_weights_set_each_tasks_share_of_the_draws():
    """Balanced sampling with ``task_weights``: a task's share is its weight over the sum (unnamed tasks 1)."""
    prompts = shipped_prompts("train")
    weights = prompt_weights(prompts, "balanced", {"single_object": 0.5, "colors": 0, "position": 2.5})
    shares = {}
    for record, weight in zip(prompts, weights):
        shares[record["tag"]] = shares.get(record["tag"], 0.0) + weight
    expected = {"single_object": 0.5, "colors": 0.0, "position": 2.5, "two_object": 1, "counting": 1}
    expected["color_attr"] = 1
    assert shares == pytest.approx({tag: weight / 6 for tag, weight in expected.items()})
    drawn = [r["tag"] for step in range(100) for r in step_samples(prompts, step, 6, 1, 0, weights).records]
    assert "colors" not in drawn and drawn.count("position") > drawn.count("counting")
    with pytest.raises(
        ValueError, match=r"name tags \['posture'\] that no prompt has; the prompts' tags: \["
    ):
        prompt_weights(prompts, "balanced", {"posture": 2})
    with pytest.raises(ValueError, match="leave no task to draw"):
        prompt_weights(prompts, "balanced", dict.fromkeys(shares, 0.0))


@pytest.mark.parametrize(
    "override, message",
    [
        ("data.task_weights.posture=2", r"data.task_weights: task_weights name tags \['posture'\]"),
        (
            "data.task_weights.colors=-1",
            r"data.task_weights \{'colors': -1.0\} are not allowed; every weight",
        ),
    ],
)
def test_bad_task_weights_are_config_errors(override, message):
    with pytest.raises(ConfigError, match=message):
        load_config("configs/shapes_nft_main.yaml", [override])


def test_config_errors_stop_before_any_model_loads(tmp_path):
    config = load_config(
        "configs/shapes_nft.yaml",
        [
            "training.prompts_per_step=3",
            "training.group_size=3",
            "model.name=/nonexistent",
            f"logging.output_dir={tmp_path / 'run'}",
        ],
    )
    with pytest.raises(Exception, match="does not divide"):
        Trainer(config, accelerator=_FakeAccelerator(num_processes=2))


class _FakeAccelerator:
    """Just enough of an Accelerator for the set-up checks that precede model loading."""

    def __init__(self, num_processes):
        self.num_processes = num_processes


def test_a_tracker_that_is_not_installed_is_a_clear_error(monkeypatch):
    import importlib.util

    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name: None if name == "wandb" else real(name))
    config = load_config("configs/shapes_nft.yaml", ["logging.tracker=wandb"])
    with pytest.raises(ValueError, match=r"logging.tracker='wandb' needs the wandb package: pip install"):
        Trainer(config)
