"""scripts/bench_peers.py reads its peers strictly and skips a checkout that is not there (no timing here)."""

import importlib.util
import sys
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parent.parent / "scripts" / "bench_peers.py"
spec = importlib.util.spec_from_file_location("bench_peers", SCRIPT)
bench_peers = importlib.util.module_from_spec(spec)
sys.modules["bench_peers"] = bench_peers  # its dataclass looks its module up there
spec.loader.exec_module(bench_peers)


def test_a_peer_is_name_checkout_and_a_command_with_every_placeholder(tmp_path):
    peer = bench_peers.parse_peer(
        f"flow_grpo={tmp_path}::python train.py --model {{pipeline}} -n {{steps}} -o {{out}}"
    )
    assert peer.name == "flow_grpo" and peer.folder == tmp_path
    assert peer.command(Path("/p"), 3, Path("/o")) == [
        "python",
        "train.py",
        "--model",
        "/p",
        "-n",
        "3",
        "-o",
        "/o",
    ]


@pytest.mark.parametrize(
    "text, message",
    [
        ("flow_grpo=/x", "is not name=checkout::command"),
        (
            "ddpo=/x::run {pipeline} {steps} {out}",
            "is not allowed; allowed: \\['diffusion_nft', 'flow_grpo'\\]",
        ),
        ("flow_grpo=/x::run {pipeline} {steps}", "lacks \\['{out}'\\]"),
    ],
)
def test_bad_peers_are_named(text, message):
    with pytest.raises(ValueError, match=message):
        bench_peers.parse_peer(text)


def test_flowrl_side_is_a_valid_config(tmp_path):
    from flowrl.config import load_config

    empty = tmp_path / "defaults.yaml"
    empty.write_text("{}\n")
    prompts = tmp_path / "prompts.txt"
    prompts.write_text("a cat\n")
    for algorithm in bench_peers.ALGORITHM_SETTINGS:
        command = bench_peers.flowrl_trainer(algorithm, prompts, empty).command(tmp_path, 2, tmp_path / "out")
        overrides = command[command.index(str(empty)) + 1 :]
        config = load_config(empty, overrides)
        assert config.algorithm.name == algorithm and config.model.lora_rank == 32
