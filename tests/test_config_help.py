"""Every setting is discoverable: each field of every config dataclass has help text, ``flowrl config`` prints
a config that reads back as the same config, and docs/settings.md is the generated reference."""

import dataclasses
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path

import pytest
import yaml

from flowrl.config import build_config, load_config
from flowrl.config_help import field_help, render_config, section_classes, settings_markdown
from flowrl.train_config import TrainConfig

ROOT = Path(__file__).resolve().parent.parent
RECIPES = sorted(str(path.relative_to(ROOT)) for path in (ROOT / "configs").glob("*.yaml"))


@pytest.mark.parametrize("where", ["top level", *section_classes()])
def test_every_config_field_has_help(where):
    cls = TrainConfig if where == "top level" else section_classes()[where]
    helps = field_help(cls)
    missing = [item.name for item in dataclasses.fields(cls) if not helps.get(item.name)]
    assert not missing, f"{cls.__qualname__} fields without a #: comment: {missing}"


def test_help_is_the_comment_above_a_field_and_a_subclass_may_replace_it():
    @dataclass
    class Base:
        #: the first
        #: and its second line
        first: int = 1
        second: int = field(default=2, metadata={"min": 0})
        #: the third
        third: str = "x"

    @dataclass
    class Child(Base):
        #: the child's own third
        third: str = "y"
        fourth: bool = False

    assert field_help(Base) == {"first": "the first and its second line", "third": "the third"}
    assert field_help(Child) == {"first": "the first and its second line", "third": "the child's own third"}


@pytest.mark.parametrize("diff", [False, True])
@pytest.mark.parametrize("recipe", ["configs/shapes_nft_main.yaml", "configs/shapes_branchgrpo_mix.yaml"])
def test_the_printed_config_reads_back_as_the_same_config(recipe, diff):
    config = load_config(ROOT / recipe, ["training.steps=7"])
    text = render_config(config, diff=diff)
    assert build_config(yaml.safe_load(text)) == config
    if diff:
        assert "steps: 7  # default: 100" in text and "adam_beta2" not in text
    else:
        assert "  # AdamW's beta2" in text and "adam_beta2: 0.999\n" in text


def test_flowrl_config_prints_the_resolved_config(tmp_path):
    shown = subprocess.run(
        [
            sys.executable,
            "-m",
            "flowrl.cli",
            "config",
            "configs/shapes_crd.yaml",
            "training.seed=3",
            "--diff",
        ],
        capture_output=True,
        text=True,
        cwd=ROOT,
    )
    assert shown.returncode == 0, shown.stderr
    assert "  seed: 3  # default: 0" in shown.stdout and "algorithm:  # CRDConfig" in shown.stdout
    refused = subprocess.run(
        [sys.executable, "-m", "flowrl.cli", "config", "configs/shapes_crd.yaml", "training.sed=3"],
        capture_output=True,
        text=True,
        cwd=ROOT,
    )
    assert refused.returncode == 2 and "unknown config key training.sed" in refused.stderr


def test_the_settings_reference_is_generated():
    assert (ROOT / "docs" / "settings.md").read_text() == settings_markdown(), (
        "docs/settings.md is stale: flowrl config --markdown > docs/settings.md"
    )
