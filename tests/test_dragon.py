"""DRAGON and its set-level reward: the positive/negative set construction and the loss against pair-by-pair
re-derivations, the exemplar Fréchet distance against FID's formula (scipy's matrix square root), tied pairs,
settings, on-policy rollouts, a set-level run, and two real processes against one."""

import numpy as np
import pytest
import scipy.linalg
import torch
from test_seppo import LinearPolicy
from test_trainer import TINY_RUN
from two_processes import assert_runs_match, train_in_two_processes

from flowrl.advantages import RewardBatch
from flowrl.algorithms import DRAGON
from flowrl.algorithms.base import RolloutChunk, TrainBatch
from flowrl.algorithms.dragon import preference_pairs
from flowrl.config import ConfigError, load_config
from flowrl.policy import ROLLOUT
from flowrl.run_log import read_metrics
from flowrl.trainer import Trainer
from rewards import build_reward
from rewards.exemplar_fd import ExemplarFD

TINY_DRAGON = [*TINY_RUN, "algorithm.pairs_per_group=1"]


def dragon_for(*overrides) -> DRAGON:
    return DRAGON(load_config("configs/shapes_dragon.yaml", [*TINY_DRAGON, *overrides]))


def typed_pairs(rewards, group_size, k):
    """Each group's k best with its k worst, i-th best with i-th worst; equal rewards: the earlier first."""
    positives, negatives = [], []
    for start in range(0, len(rewards), group_size):
        ranked = sorted(range(start, start + group_size), key=lambda i: (-rewards[i], i))
        positives += ranked[:k]
        negatives += ranked[::-1][:k]
    return positives, negatives


@pytest.mark.parametrize("k", [1, 2, 3])
def test_the_positive_and_negative_sets_are_each_groups_best_and_worst(k):
    rewards = torch.tensor([0.1, 0.9, 0.5, 0.5, 0.3, 0.0, 0.7, 0.7, 0.2, 0.2, 0.2, 0.2, 1.0, 0.4, 0.6, 0.8])
    positives, negatives = preference_pairs(rewards, 8, k)
    assert (positives.tolist(), negatives.tolist()) == typed_pairs(rewards.tolist(), 8, k)
    assert set(positives.tolist()).isdisjoint(negatives.tolist())


def test_the_loss_and_its_gradient_are_diffusion_dpos_against_the_base():
    g = torch.Generator().manual_seed(3)
    positives, negatives, cond, eps = (
        torch.randn(5, 3, 4, 4, generator=g, dtype=torch.float64) for _ in range(4)
    )
    t = torch.rand(5, generator=g, dtype=torch.float64)
    policy = LinearPolicy(0.3, 0.2)
    policy.velocity_of = lambda role: lambda x, tt, c: policy._v(policy.ref, x, tt, c)  # the base here
    weights = torch.tensor([1.25, 1.25, 0.0, 1.25, 1.25])  # one tied pair out, the others renormalised
    batch = TrainBatch(
        {"x0": positives, "loser": negatives},
        cond,
        torch.zeros(5),
        {"t": t[None], "noise": eps[None]},
        weights,
    )
    loss, stats = dragon_for("algorithm.beta=3.0").loss(policy, batch, 0, step=1)
    expected = 0.0
    for i in range(5):
        d = {}
        for name, x in (("w", positives[i]), ("l", negatives[i])):
            x_t, target = (1 - t[i]) * x + t[i] * eps[i], eps[i] - x
            d[name] = ((policy.a * x_t + t[i] * cond[i] - target) ** 2).mean() - (
                (policy.ref * x_t + t[i] * cond[i] - target) ** 2
            ).mean()
        expected = expected + weights[i] * -torch.log(torch.sigmoid(-3.0 * (d["w"] - d["l"])))
    expected = expected / 5
    torch.testing.assert_close(loss.double(), expected, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(
        torch.autograd.grad(loss, policy.a)[0].double(),
        torch.autograd.grad(expected, policy.a)[0],
        rtol=1e-5,
        atol=1e-6,
    )
    assert stats["dragon/preference_accuracy"].shape == (5,)


def test_tied_pairs_weigh_nothing_and_the_others_carry_the_batch():
    algorithm = dragon_for("training.group_size=4")
    rewards = torch.tensor([0.2, 0.8, 0.5, 0.1, 0.4, 0.4, 0.4, 0.4])  # the second group is all equal
    batch = RewardBatch({"r": rewards}, {"r": 1.0}, rewards, torch.tensor([0] * 4 + [1] * 4))
    algorithm.advantages(batch)
    assert algorithm.kept_share == 0.5 and algorithm.reward_gap == pytest.approx((0.8 - 0.1) / 2)
    x0 = torch.arange(8.0).reshape(8, 1, 1, 1)
    rows = algorithm.training_rows([RolloutChunk(x0)], torch.zeros(8), rewards, step=1)
    assert rows.cond_index.tolist() == [1, 4] and rows.data["loser"].flatten().tolist() == [3.0, 7.0]
    assert rows.weights.tolist() == [2.0, 0.0]


def test_dragon_settings_are_checked():
    with pytest.raises(ConfigError, match=r"algorithm.pairs_per_group=3 is not allowed.*at most 2"):
        load_config("configs/shapes_dragon.yaml", [*TINY_RUN, "algorithm.pairs_per_group=3"])
    with pytest.raises(ConfigError, match=r"algorithm.reference='old' is not allowed"):
        load_config("configs/shapes_dragon.yaml", [*TINY_DRAGON, "algorithm.reference=old"])


def typed_fd(a, b):
    """FID's formula with scipy's matrix square root, on two feature sets."""
    mu_a, mu_b = a.mean(0), b.mean(0)
    cov_a, cov_b = np.cov(a, rowvar=False), np.cov(b, rowvar=False)
    root = scipy.linalg.sqrtm(cov_a @ cov_b).real
    return float(((mu_a - mu_b) ** 2).sum() + np.trace(cov_a + cov_b - 2 * root))


def test_the_exemplar_distance_and_each_samples_contribution_are_the_frechet_distances(tmp_path):
    rng = np.random.default_rng(0)
    exemplars = (rng.random((40, 8, 8, 3)) ** 2 * 255).round().astype(np.uint8)
    np.savez(tmp_path / "exemplars.npz", images=exemplars)
    reward = ExemplarFD(str(tmp_path / "exemplars.npz"), grid=2)
    images = torch.from_numpy(rng.random((20, 3, 8, 8))).float()
    scores = reward(images, ["p"] * 20, [{}] * 20)

    def features(x):  # 2x2 cells of 4x4 pixels per channel, averaged
        return x.reshape(len(x), 3, 2, 4, 2, 4).mean(axis=(3, 5)).reshape(len(x), -1)

    reference = features(exemplars.transpose(0, 3, 1, 2).astype(np.float64) / 255)
    generated = features(images.double().numpy())
    whole = typed_fd(generated, reference)
    assert scores["distance"].tolist() == pytest.approx([whole] * 20, rel=1e-4)
    without = [typed_fd(np.delete(generated, i, axis=0), reference) for i in range(20)]
    assert scores["contribution"].tolist() == pytest.approx([w - whole for w in without], rel=1e-3, abs=1e-5)


def test_the_shipped_exemplars_are_close_to_renders_and_far_from_noise():
    reward = build_reward("exemplar_fd")
    renders = np.load("rewards/assets/shapes_exemplars.npz")["images"]
    assert renders.shape == (364, 32, 32, 3)
    subset = torch.from_numpy(renders[::6][:32]).permute(0, 3, 1, 2).float() / 255
    noise = torch.rand(32, 3, 32, 32, generator=torch.Generator().manual_seed(0))
    close, far = (float(reward(x, [""] * 32, [{}] * 32)["distance"][0]) for x in (subset, noise))
    assert close < 0.5 < 5 < far
    with pytest.raises(ValueError, match=r"exemplars='nowhere' is not allowed"):
        ExemplarFD("nowhere")
    with pytest.raises(ValueError, match=r"needs at least 3 images per batch, got 2"):
        reward(noise[:2], ["", ""], [{}, {}])


def test_dragon_trains_on_policy_and_two_processes_match_one(tmp_path, tiny_model_dir):
    overrides = [*TINY_DRAGON, "training.steps=2", "training.threads=1", f"model.name={tiny_model_dir}"]
    overrides.append("algorithm.beta=10.0")  # beta 2500 scales the float32 noise of D (1e-7) past 1e-4
    config = load_config("configs/shapes_dragon.yaml", [*overrides, f"logging.output_dir={tmp_path / 'one'}"])
    trainer = Trainer(config)
    trainer.train()
    trained = dict(trainer.policy.copies.unwrapped.named_parameters())
    for name, value in trainer.policy.copies.copies[ROLLOUT].named_parameters():
        torch.testing.assert_close(value, trained[name])
    train_in_two_processes(
        "configs/shapes_dragon.yaml", [*overrides, f"logging.output_dir={tmp_path / 'two'}"]
    )
    assert_runs_match(tmp_path / "one", tmp_path / "two", ("reward/mean", "loss", "dragon/positive_margin"))


def test_a_set_level_reward_trains_and_logs_its_distance(tmp_path, tiny_model_dir):
    config = load_config(
        "configs/shapes_dragon_fd.yaml",
        [
            *TINY_DRAGON,
            "training.micro_batch_size=4",
            "training.steps=2",
            f"model.name={tiny_model_dir}",
            f"logging.output_dir={tmp_path / 'run'}",
        ],
    )
    Trainer(config).train()
    rows = [row for row in read_metrics(tmp_path / "run" / "metrics.jsonl") if row["step"] > 0]
    assert all(row["reward/exemplar_fd/distance"] > 0 and np.isfinite(row["loss"]) for row in rows)
    assert all(
        row["reward/mean"] == row["reward/exemplar_fd/contribution"] for row in rows
    )  # verifier: weight 0


@pytest.mark.parametrize("kind", ["sd3", "flux"])
def test_a_dragon_step_on_a_tiny_diffusers_pipeline_moves_only_the_trained_lora(kind, tmp_path):
    """The base stays, the trained adapter moves, and the rollout adapter follows it (on-policy)."""
    from test_diffusers_backends import PROMPTS, base_weights, overrides_for

    from flowrl.testing import save_tiny_pipeline

    save_tiny_pipeline(kind, tmp_path / "pipeline")
    prompts = tmp_path / "prompts.txt"
    prompts.write_text("\n".join(PROMPTS) + "\n")
    overrides = overrides_for(kind, tmp_path / "pipeline", prompts, tmp_path / "run", "algorithm.name=dragon")
    trainer = Trainer(load_config(None, [*overrides, "algorithm.pairs_per_group=2"]))
    policy = trainer.policy
    before, adapters_before = base_weights(policy.flow_model.transformer), policy.state_dict()
    trainer.train()
    after_base = base_weights(policy.flow_model.transformer)
    assert all(torch.equal(value, after_base[key]) for key, value in before.items())
    after = policy.state_dict()
    assert any(not torch.equal(adapters_before["default"][k], v) for k, v in after["default"].items())
    for key, value in after["default"].items():
        assert torch.equal(after["rollout"][key], value)
    assert np.isfinite(read_metrics(tmp_path / "run" / "metrics.jsonl")[-1]["loss"])


def test_the_exemplar_distance_script_scores_a_model(tmp_path, tiny_model_dir):
    import json
    import subprocess
    import sys

    out = tmp_path / "distance.json"
    command = [sys.executable, "scripts/exemplar_distance.py", "--models", str(tiny_model_dir)]
    result = subprocess.run(
        [*command, "--images-per-task", "1", "--out", str(out)], capture_output=True, text=True, timeout=300
    )
    assert result.returncode == 0, result.stderr[-2000:]
    (row,) = json.loads(out.read_text())["rows"]
    assert row["images"] == 6 and row["distance"] > 0 and 0 <= row["held_out"] <= 1


def test_the_set_size_script_ranks_against_the_population_and_refuses_uneven_sets(tmp_path, tiny_model_dir):
    import json
    import subprocess
    import sys

    out = tmp_path / "set_size.json"
    command = [sys.executable, "scripts/exemplar_set_size.py", "--model", str(tiny_model_dir)]
    command += ["--prompts", "4", "--group", "2", "--num-steps", "2", "--out", str(out)]
    result = subprocess.run([*command, "--set-sizes", "4", "8"], capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr[-2000:]
    report = json.loads(out.read_text())
    assert report["population"] == 8 and [row["set_size"] for row in report["rows"]] == [4, 8]
    assert [row["groups"] for row in report["rows"]] == [4, 4]
    assert report["rows"][1]["spearman"] == pytest.approx(1.0)  # the whole population ranks as itself
    refused = subprocess.run([*command, "--set-sizes", "3"], capture_output=True, text=True, timeout=300)
    assert refused.returncode != 0 and "--set-sizes [3] are not allowed" in refused.stderr
