"""Every shipped recipe loads, validates, and splits its global batch over the processes of each launch
command written in its header (with that command's overrides)."""

import shlex
from pathlib import Path

import pytest
import yaml

from flowrl.batches import check_batches
from flowrl.config import load_config

CONFIGS = sorted(Path("configs").glob("*.yaml"))


def launches(path: Path) -> list[tuple[int, list[str]]]:
    """``(processes, overrides)`` of each ``flowrl train`` / ``accelerate launch`` line of the header."""
    found = []
    for line in path.read_text().splitlines():
        if not line.startswith("#") or ("flowrl train" not in line and "accelerate launch" not in line):
            continue
        start = min(line.find(marker) for marker in ("flowrl train", "accelerate launch") if marker in line)
        words = shlex.split(line[start:].split(" (")[0])
        if str(path) not in words:
            continue  # a line about another recipe
        processes = 1
        if "--config_file" in words:
            launch = Path(words[words.index("--config_file") + 1])
            assert launch.is_file(), f"{path}: {launch} does not exist"
            processes = yaml.safe_load(launch.read_text())["num_processes"]
        if "--num_processes" in words:
            processes = int(words[words.index("--num_processes") + 1])
        overrides = [word for word in words[words.index(str(path)) + 1 :] if "=" in word]
        found.append((processes, overrides))
    return found


def test_the_real_model_recipes_are_shipped():
    names = {path.stem for path in CONFIGS}
    assert {
        "sd35m_nft_geneval",
        "sd35m_nft_multireward",
        "sd35m_flowgrpo_pickscore",
        "flux_branchgrpo_hps",
    } <= names


@pytest.mark.parametrize("path", CONFIGS, ids=lambda path: path.stem)
def test_a_recipe_validates_for_each_launch_in_its_header(path, tmp_path):
    commands = launches(path)
    assert commands, f"{path} documents no launch command for itself"
    stand_in = []
    raw = yaml.safe_load(path.read_text()).get("data", {}).get("prompts")
    if raw and raw != "shapes-train" and not Path(raw).is_file():
        # Real recipes name the reference papers' prompt files, which users download; any file stands in.
        file = tmp_path / "prompts.txt"
        file.write_text("".join(f"prompt {i}\n" for i in range(64)))
        stand_in = [f"data.prompts={file}"]
    for processes, overrides in commands:
        config = load_config(path, [*stand_in, *overrides])
        check_batches(config, processes)
