"""Advantages from a step's rewards (``flowrl.advantages``): group normalisation, GDPO, zero-std groups,
and the algorithms' default ``advantages`` hook over a MultiReward's scores."""

import torch

from flowrl.advantages import (
    RewardBatch,
    gdpo_advantages,
    group_advantages,
    reward_advantages,
    zero_std_groups,
)
from flowrl.algorithms import build_algorithm
from flowrl.config import load_config
from rewards import MultiReward


def test_group_advantages_center_per_prompt():
    rewards_ = torch.tensor([1.0, 1.0, 0.0, 2.0])
    groups = torch.tensor([0, 0, 1, 1])
    batch_std = rewards_.std(unbiased=False)
    torch.testing.assert_close(
        group_advantages(rewards_, groups), torch.tensor([0, 0, -1, 1]) / (batch_std + 1e-4)
    )
    torch.testing.assert_close(
        group_advantages(rewards_, groups, std_scope="group"), torch.tensor([0, 0, -1, 1]) / (1 + 1e-4)
    )


def test_gdpo_keeps_reward_combinations_distinct_where_sum_collapses_them():
    # Group A: reward 1 separates the samples, reward 2 is flat. Group B: both separate them.
    groups = torch.tensor([0, 0, 1, 1])
    first = torch.tensor([0.0, 1.0, 0.0, 1.0])
    second = torch.tensor([0.0, 0.0, 0.0, 1.0])
    summed = group_advantages(first + second, groups, std_scope="group")
    assert torch.allclose(summed[:2], summed[2:], atol=1e-3)  # (0,1) and (0,2) look the same
    gdpo = gdpo_advantages({"a": first, "b": second}, {"a": 1.0, "b": 1.0}, groups)
    assert gdpo[3] > 1.5 * gdpo[1] and gdpo[2] < 1.5 * gdpo[0]
    assert abs(gdpo.mean()) < 1e-5 and abs(gdpo.std(unbiased=False) - 1) < 1e-3


def reward_batch(aggregation_weights=None):
    multi = MultiReward(aggregation_weights or {"jpeg_compressibility": 1.0, "jpeg_incompressibility": 0.5})
    media = torch.rand(4, 3, 32, 32, generator=torch.Generator().manual_seed(0))
    scores = multi(media, ["a"] * 4, [{}] * 4)
    groups = torch.tensor([0, 0, 1, 1])
    return multi, scores, RewardBatch(multi.components(scores), multi.weights, multi.total(scores), groups)


def test_the_default_hook_normalises_the_weighted_total_or_each_reward():
    multi, scores, batch = reward_batch()
    for aggregation in ("sum", "gdpo"):
        config = load_config(None, [f"reward_aggregation={aggregation}"])
        hook = build_algorithm(config).advantages(batch)
        torch.testing.assert_close(hook, reward_advantages(batch, aggregation))
    torch.testing.assert_close(
        reward_advantages(batch, "sum"), group_advantages(multi.total(scores), batch.group_ids)
    )
    torch.testing.assert_close(
        reward_advantages(batch, "gdpo"),
        gdpo_advantages(
            {
                "jpeg_compressibility": scores["jpeg_compressibility"],
                "jpeg_incompressibility": scores["jpeg_incompressibility"],
            },
            {"jpeg_compressibility": 1.0, "jpeg_incompressibility": 0.5},
            batch.group_ids,
        ),
    )
    assert not torch.allclose(reward_advantages(batch, "gdpo"), reward_advantages(batch, "sum"))


def test_zero_std_groups_are_groups_of_equal_totals():
    total = torch.tensor([0.5, 0.5, 0.5, 0.5, 0.0, 1.0, 0.0, 1.0])
    assert zero_std_groups(total, 4).tolist() == [True, False]
    batch = RewardBatch({"r": total}, {"r": 1.0}, total, torch.arange(8) // 4)
    assert batch.zero_std_groups().tolist() == [True, False]
