"""The first rung of the sanity ladder (scripts/sanity_ladder.py) for every algorithm, on a tiny model.

Each algorithm trains its shapes recipe, shrunk to a tiny random-weight model, for 24 steps on the mean
brightness of its samples; the training brightness must climb. The same run with the reward's weight
flipped to -1 (which flips every group advantage, and makes RAFT keep the darkest samples) must fall. An
update with the wrong sign fails the first, a detached gradient or a zero advantage fails one of the two
(nothing that ignores the advantage moves both ways), and both demand a rise of at least ``MARGIN`` in
brightness, several times the start's noise.
"""

import sys
from pathlib import Path

import pytest

from flowrl.algorithms import ALGORITHMS
from flowrl.config import load_config
from flowrl.trainer import Trainer

SCRIPTS = Path(__file__).resolve().parent.parent / "scripts"
sys.path.insert(0, str(SCRIPTS))
from sanity_ladder import RECIPES, REWARD_FREE, rise_and_noise, rung_curve, verdict  # noqa: E402

#: the least rise (and fall) in mean brightness over 24 steps; the start's noise is about 0.001
MARGIN = 0.01

TINY = [
    "training.prompts_per_step=2",
    "training.group_size=4",
    "training.micro_batch_size=8",
    "training.learning_rate=0.003",
    "training.steps=24",
    "sampler.num_steps=4",
    "evaluation.base_guidance_scales=[]",
    "evaluation.images_per_task=1",
    "evaluation.num_steps=2",
    "logging.sample_every=0",
    "logging.checkpoint_every=0",
    "logging.progress=false",
]

#: what the tiny model needs beyond TINY: trees of 4 leaves on 4 steps, the best quarter of a group of 4
TINY_SHAPES = {
    "nft": ["training.updates_per_step=2"],
    "crd": ["training.updates_per_step=2"],
    "meanflow_nft": ["training.updates_per_step=2"],
    # FPO's pull toward the base (its shapes recipe's stabiliser) holds a tiny model still as RAFT's does
    "fpo": ["training.updates_per_step=2", "algorithm.reference_weight=0.0"],
    "branch_grpo": ["algorithm.split_steps=[0,1]"],
    "branch_grpo_mix": ["algorithm.split_steps=[0,1]", "algorithm.sde_window_size=2"],
    # RAFT's threshold is in the verifier's units, and its pull toward the base holds a tiny model still at
    # this learning rate: the rung checks the direction of the fit itself
    "raft": ["algorithm.keep_per_group=1", "algorithm.min_reward=null", "algorithm.reference_weight=0.0"],
}


def test_the_ladder_covers_every_registered_algorithm():
    assert set(ALGORITHMS) - set(REWARD_FREE) <= {recipe.removesuffix("_mix") for recipe in RECIPES}


def brightness_rise(model_dir: Path, output_dir: Path, algorithm: str, weight: float) -> tuple[float, str]:
    overrides = [
        *TINY,
        *TINY_SHAPES.get(algorithm, []),
        f"rewards={{brightness: {weight}}}",
        f"model.name={model_dir}",
        f"logging.output_dir={output_dir}",
    ]
    Trainer(load_config(RECIPES[algorithm], overrides)).train()
    curve = rung_curve(output_dir / "metrics.jsonl", "reward/brightness")
    assert len(curve) == 24
    rise, noise = rise_and_noise(curve)
    return rise, verdict([rise], [noise])


@pytest.mark.parametrize("algorithm", list(RECIPES))
def test_every_algorithm_climbs_brightness_and_falls_when_the_sign_is_flipped(
    algorithm, tiny_model, tmp_path, one_thread
):
    model_dir = tmp_path / "model"
    (tiny_model.as_mean_flow() if algorithm == "meanflow_nft" else tiny_model).save_pretrained(model_dir)
    rise, seen = brightness_rise(model_dir, tmp_path / "up", algorithm, 1.0)
    assert seen == "climbs" and rise >= MARGIN, f"{algorithm}: brightness rose {rise:+.4f} ({seen})"
    fall, seen = brightness_rise(model_dir, tmp_path / "down", algorithm, -1.0)
    assert seen == "falls" and fall <= -MARGIN, f"{algorithm} with the sign flipped: {fall:+.4f} ({seen})"


@pytest.mark.parametrize("algorithm", ["nft", "flow_grpo", "fpo", "prdp", "dragon", "tagrpo"])
def test_the_ladder_catches_an_advantage_whose_sign_is_flipped_inside_the_library(
    algorithm, tiny_model, tmp_path, one_thread, monkeypatch
):
    """The same reward, the advantage negated where the algorithms compute it (PRDP: its raw rewards; DRAGON:
    its positive and negative sets swapped; TAGRPO: its anchors' advantages too): the rung must fall, not climb."""
    import flowrl.algorithms.base as base
    import flowrl.algorithms.dragon as dragon
    import flowrl.algorithms.tagrpo as tagrpo
    from flowrl.algorithms import PRDP

    if algorithm == "dragon":
        correct_pairs = dragon.preference_pairs
        monkeypatch.setattr(dragon, "preference_pairs", lambda *args: correct_pairs(*args)[::-1])
    elif algorithm == "prdp":
        correct_rewards = PRDP.advantages
        monkeypatch.setattr(PRDP, "advantages", lambda self, rewards: -correct_rewards(self, rewards))
    else:
        correct = base.reward_advantages
        monkeypatch.setattr(base, "reward_advantages", lambda *args, **kwargs: -correct(*args, **kwargs))
    if algorithm == "tagrpo":
        correct_anchors = tagrpo.pool_anchors

        def flipped_anchors(*args):
            best, worst, plus, minus = correct_anchors(*args)
            return best, worst, -plus, -minus

        monkeypatch.setattr(tagrpo, "pool_anchors", flipped_anchors)
    tiny_model.save_pretrained(tmp_path / "model")
    rise, seen = brightness_rise(tmp_path / "model", tmp_path / "run", algorithm, 1.0)
    assert seen == "falls" and rise <= -MARGIN, f"{algorithm} with a flipped advantage: {rise:+.4f} ({seen})"


def test_tagrpos_alignment_term_alone_climbs(tiny_model, tmp_path, one_thread, monkeypatch):
    """TAGRPO with every GRPO advantage zeroed (its own-ratio term gives no gradient): the pull toward the
    best and away from the worst trajectory must raise brightness by itself."""
    import flowrl.algorithms.base as base

    monkeypatch.setattr(base, "reward_advantages", lambda *args, **kwargs: 0 * args[0].total.float())
    tiny_model.save_pretrained(tmp_path / "model")
    rise, seen = brightness_rise(tmp_path / "model", tmp_path / "run", "tagrpo", 1.0)
    assert seen == "climbs" and rise >= MARGIN, f"tagrpo's alignment alone: {rise:+.4f} ({seen})"
