"""scripts/bench_peers.py reads its peers strictly and skips a checkout that is not there (no timing here)."""

import importlib.util
import subprocess
import sys
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parent.parent / "scripts" / "bench_peers.py"
sys.path.insert(0, str(SCRIPT.parent))  # it imports op_profile beside it
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
        for fast_path, precision in ((False, "no"), (True, "bf16")):
            trainer = bench_peers.flowrl_trainer(algorithm, prompts, empty, fast_path)
            command = trainer.command(tmp_path, 2, tmp_path / "out")
            overrides = command[command.index(str(empty)) + 1 :]
            config = load_config(empty, overrides)
            assert config.algorithm.name == algorithm and config.model.lora_rank == 32
            assert config.training.mixed_precision == precision
            assert trainer.name.endswith("_bf16") == fast_path


def test_the_profiler_hook_reaches_a_process_whose_command_sets_its_own_pythonpath(tmp_path):
    """The hook rides on PYTHONPATH, also where the command replaces it (``env PYTHONPATH=...``): each
    operator's calls and the process's wall clock are recorded."""
    import op_profile

    script = tmp_path / "work.py"
    script.write_text(
        "import time, torch\n"
        "for _ in range(3):\n"
        "    torch.mm(torch.ones(64, 64), torch.ones(64, 64))\n"
        "time.sleep(0.2)\n"
    )
    out = tmp_path / "profile"
    out.mkdir()
    command = ["env", f"PYTHONPATH={tmp_path / 'elsewhere'}", sys.executable, str(script)]
    words, environment = op_profile.hooked(command, op_profile.write_hook(tmp_path / "hook"), out)
    subprocess.run(words, env=environment, check=True)
    times = op_profile.operator_times(out)
    assert len(list(out.glob("*.json"))) == 1
    assert times["aten::mm"][1] == 3 and times[op_profile.WALL][0] >= 0.2


def test_a_step_is_the_difference_of_two_runs_and_families_add_up():
    import op_profile

    short = {"aten::mm": (1.0, 10), "aten::add": (0.5, 4), "aten::cat": (0.3, 2), op_profile.WALL: (3.0, 1)}
    long = {"aten::mm": (2.0, 20), "aten::add": (0.9, 8), "aten::cat": (0.2, 2), op_profile.WALL: (5.0, 1)}
    step = op_profile.per_step(short, long, 2)
    assert step["aten::mm"] == (0.5, 5) and step["aten::add"] == pytest.approx((0.2, 2))
    assert "aten::cat" not in step  # no time grew
    assert step[op_profile.WALL] == (1.0, 0)
    assert op_profile.by_category(step) == pytest.approx({"GEMM": 0.5, "element-wise": 0.2})
