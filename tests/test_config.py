"""Config loading: defaults files, overrides, and errors that name the key, the value and what is allowed."""

import pytest

from flowrl.config import ConfigError, TrainConfig, load_config


def test_defaults_files_merge_and_overrides_win(tmp_path):
    (tmp_path / "base.yaml").write_text("training:\n  steps: 7\n  group_size: 4\nsampler:\n  num_steps: 6\n")
    (tmp_path / "run.yaml").write_text("defaults: [base.yaml]\ntraining:\n  steps: 9\n")
    config = load_config(
        tmp_path / "run.yaml", ["training.learning_rate=1e-4", "evaluation.guidance_scales=[1, 4.5]"]
    )
    assert (config.training.steps, config.training.group_size, config.sampler.num_steps) == (9, 4, 6)
    assert config.training.learning_rate == 1e-4 and config.evaluation.guidance_scales == [1.0, 4.5]


def test_shipped_recipes_are_valid():
    for name in ("shapes_nft", "shapes_nft_main", "shapes_nft_long"):
        assert isinstance(load_config(f"configs/{name}.yaml"), TrainConfig)


@pytest.mark.parametrize(
    "override, message",
    [
        ("training.steps=0", r"training.steps=0 is not allowed; it must be >= 1"),
        ("training.stepz=3", r"unknown config key training.stepz; allowed under training: \[.*'steps'"),
        ("sampler.solver=rk4", r"sampler.solver='rk4' is not allowed; allowed: \['euler', 'heun', 'dpm2m'\]"),
        ("training.group_size=two", r"training.group_size='two' is not allowed; expected an integer"),
        ("algorithm.beta=0", r"algorithm.beta=0.0 is not allowed; it must be > 0.0"),
        ("rewards={nope: 1}", r"reward entry 'nope' names unknown reward 'nope'"),
        ("data.prompts=missing.jsonl", r"data.prompts='missing.jsonl' is not allowed"),
        ("algorithm.train_timesteps=30", r"algorithm.train_timesteps=30 is more than the 10 steps"),
        (
            "logging.tracker=mlflow",
            r"logging.tracker='mlflow' is not allowed; allowed: \['none', 'tensorboard', 'wandb'\]",
        ),
        ("training.steps", r"override 'training.steps' is not key=value"),
        ("data.task_weights.colors=2", r"data.task_weights: task_weights need sampling='balanced'"),
        ("data.task_weights=[1, 2]", r"data.task_weights=\[1, 2\] is not allowed; expected a mapping"),
        (
            "data.task_weights.colors=lots",
            r"data.task_weights.colors='lots' is not allowed; expected a number",
        ),
    ],
)
def test_bad_values_are_named(override, message):
    with pytest.raises(ConfigError, match=message):
        load_config(None, [override])


def test_global_batch_must_divide_over_processes_and_micro_batches():
    config = load_config(
        None, ["training.prompts_per_step=3", "training.group_size=3", "training.micro_batch_size=3"]
    )
    assert config.per_process(1) == (9, 3)
    with pytest.raises(ConfigError, match="9 images per step does not divide over 2 processes"):
        config.per_process(2)
    config = load_config(
        None, ["training.prompts_per_step=4", "training.group_size=4", "training.micro_batch_size=3"]
    )
    with pytest.raises(ConfigError, match="micro_batch_size=3 does not divide the 8 images per process"):
        config.per_process(2)


def test_defaults_cycles_and_missing_files_are_errors(tmp_path):
    (tmp_path / "a.yaml").write_text("defaults: [b.yaml]\n")
    (tmp_path / "b.yaml").write_text("defaults: [a.yaml]\n")
    with pytest.raises(ConfigError, match="cycle"):
        load_config(tmp_path / "a.yaml")
    with pytest.raises(ConfigError, match="does not exist"):
        load_config(tmp_path / "nope.yaml")


def test_a_misspelt_reward_key_is_refused_at_config_time():
    """A sub-score the reward does not return, named before any model loads."""
    with pytest.raises(
        ConfigError, match=r"key='partal' is not allowed; expected one of \['partial', 'strict'\]"
    ):
        load_config("configs/shapes_nft.yaml", ["rewards={v: {reward: shapes_verifier, key: partal}}"])
    assert load_config("configs/shapes_nft.yaml", ["rewards={v: {reward: shapes_verifier, key: strict}}"])


def test_an_optional_bounded_key_may_be_written_null():
    """``sampler.time_shift: null`` (its default, written out as ``flowrl config`` prints it) was a TypeError."""
    assert load_config(None, ["sampler.time_shift=null"]).sampler.time_shift is None
    with pytest.raises(ConfigError, match=r"sampler.time_shift=0.0 is not allowed; it must be > 0"):
        load_config(None, ["sampler.time_shift=0"])
