"""What a file describes is bounded before it is built. YAML everywhere flowrl
reads it (a config, an override, a run's config.yaml in the demo): no aliases, a size and a depth cap, plain
keys, typed tags that fail as one line; a model's config.json: known fields within limits and an
architecture counted before it is allocated."""

import json
import re
import shutil
import time

import pytest
from app_runs import make_run

from app.runs import Catalog, find_runs, load_model, run_config
from flowrl.cli import main
from flowrl.config import ConfigError, load_config
from flowrl.models import load_shapes_model
from flowrl.yaml_reading import MAX_YAML_CHARS, parse_yaml

#: the 565-byte alias bomb of the issue's probe, one level short of exhausting the host: 9 ** 8 strings
ALIAS_BOMB = "\n".join(
    ['a0: &a0 ["lol", "lol", "lol", "lol", "lol", "lol", "lol", "lol", "lol"]']
    + [f"a{i}: &a{i} [{', '.join([f'*a{i - 1}'] * 9)}]" for i in range(1, 8)]
)

REFUSED = {
    "alias bomb": (ALIAS_BOMB, "aliases (*name) are not allowed"),
    "50,000 deep": ("x: " + "[" * 50_000 + "]" * 50_000, "nested more than 32 levels deep"),
    "complex key": ("? [training, steps]\n: 3\n", "a key must be a plain value"),
    "oversized": ("x: " + "1" * MAX_YAML_CHARS, f"flowrl reads at most {MAX_YAML_CHARS:,}"),
    "typed tag": ("training: {steps: !!int x}\n", "a tagged value cannot be read"),
}


@pytest.mark.parametrize("case", list(REFUSED))
def test_refused_yaml_is_one_line_and_fast(case):
    text, message = REFUSED[case]
    start = time.perf_counter()
    with pytest.raises(ConfigError, match=re.escape(message)) as refused:
        parse_yaml(text, "config file x.yaml")
    assert time.perf_counter() - start < 2.0
    assert "\n" not in str(refused.value)


@pytest.mark.parametrize("case", list(REFUSED))
def test_flowrl_train_exits_2_in_one_line_before_writing(case, tmp_path, capsys):
    config = tmp_path / "config.yaml"
    config.write_text(REFUSED[case][0])
    assert main(["train", str(config), f"logging.output_dir={tmp_path / 'run'}"]) == 2
    error = capsys.readouterr().err.strip().splitlines()
    assert len(error) == 1 and REFUSED[case][1].split(" (")[0] in error[0]
    assert not (tmp_path / "run").exists()


@pytest.mark.parametrize("override", ["training.steps=!!float", "training.steps=!!int x", "rewards=*a"])
def test_an_override_that_cannot_be_read_is_one_line(override):
    with pytest.raises(ConfigError, match="is not valid YAML"):
        load_config("configs/shapes_nft.yaml", [override])


def test_a_run_with_an_alias_bomb_neither_stalls_nor_hides_the_others(tmp_path, tiny_model, tiny_model_dir):
    root = tmp_path / "runs"
    good = make_run(root / "good", tiny_model_dir, tiny_model)
    bomb = make_run(root / "bomb", tiny_model_dir, tiny_model)
    (bomb / "config.yaml").write_text(ALIAS_BOMB)
    start = time.perf_counter()
    assert find_runs(root) == [good]
    with pytest.raises(ValueError, match="aliases"):
        run_config(bomb)
    assert time.perf_counter() - start < 2.0
    assert str(good) in Catalog(root, str(tiny_model_dir)).tuned_choices()


HUGE = {"hidden_size": 8192, "depth": 128}


@pytest.mark.parametrize(
    "change, message",
    [
        (HUGE, "parameters; flowrl loads shapes models of at most 500,000,000"),
        ({"hidden_size": 10**9}, "hidden_size=1000000000 is not allowed"),
        ({"depth": "6"}, "depth='6' is not allowed"),
        ({"mlp_ratio": -1}, "mlp_ratio=-1 is not allowed"),
        ({"evil": 1}, "unknown fields ['evil']"),
    ],
)
def test_a_model_config_is_bounded_before_anything_is_allocated(tmp_path, tiny_model_dir, change, message):
    """A 1 KB ``config.json`` cannot make the loader allocate gigabytes (the architecture
    is counted on the meta device and refused above the bound) or fail with a traceback."""
    model = tmp_path / "model"
    shutil.copytree(tiny_model_dir, model)
    config = json.loads((model / "config.json").read_text())
    (model / "config.json").write_text(json.dumps({**config, **change}))
    start = time.perf_counter()
    with pytest.raises(ValueError, match=re.escape(message)) as refused:
        load_shapes_model(str(model))
    assert time.perf_counter() - start < 5.0 and "\n" not in str(refused.value)


def test_the_demo_lists_the_good_runs_beside_a_run_with_a_huge_model(tmp_path, tiny_model, tiny_model_dir):
    root = tmp_path / "runs"
    good = make_run(root / "good", tiny_model_dir, tiny_model)
    huge = make_run(root / "huge", tiny_model_dir, tiny_model)
    config = json.loads((huge / "model" / "config.json").read_text())
    (huge / "model" / "config.json").write_text(json.dumps({**config, **HUGE}))
    assert str(good) in Catalog(root, str(tiny_model_dir)).tuned_choices()
    with pytest.raises(ValueError, match="parameters; flowrl loads shapes models of at most"):
        load_model(str(huge))


def test_only_true_and_false_are_booleans_so_no_stays_a_word():
    """YAML 1.1 reads no/yes/on/off as booleans, so ``training.mixed_precision=no`` became False; flowrl
    reads YAML 1.2's booleans only. A bool field given ``yes`` is a one-line error, not a silent True."""
    config = load_config("configs/shapes_nft.yaml", ["training.mixed_precision=no", "logging.progress=false"])
    assert config.training.mixed_precision == "no" and config.logging.progress is False
    with pytest.raises(ConfigError, match=r"logging.progress='yes' is not allowed; expected true or false"):
        load_config("configs/shapes_nft.yaml", ["logging.progress=yes"])
