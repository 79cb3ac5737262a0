"""Failures found by probing flowrl, each reproduced the way it was found: a failing reward doesn't kill a run unless
told to, and bad input or a failure during a run is one clear line."""

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from test_reliability import TINY_RUN, train

from flowrl.checkpoint import list_checkpoints
from flowrl.cli import main
from flowrl.config import ConfigError, load_config
from flowrl.run_log import read_metrics
from rewards import MultiReward, RewardError, SkippedBatch

# --- faults in rewards -----------------------------------------------------------------------------

CALLS = {"count": 0}


def failing_every_other_call(media, prompts, metadata):
    """A plugin reward that raises on every second call and scores 1 otherwise."""
    CALLS["count"] += 1
    if CALLS["count"] % 2 == 0:
        raise RuntimeError("flaky reward")
    return torch.ones(media.shape[0])


def slow_reward(media, prompts, metadata):
    time.sleep(5)
    return torch.ones(media.shape[0])


def _media(batch=2):
    return torch.rand(batch, 3, 8, 8)


def test_on_error_decides_what_a_failing_reward_does():
    CALLS["count"] = 1  # the next call fails
    spec = {"reward": f"{__name__}:failing_every_other_call"}
    with pytest.raises(RewardError, match="flaky reward"):
        MultiReward({"r": spec})(_media(), ["a", "b"], [{}, {}])
    CALLS["count"] = 1
    with pytest.raises(SkippedBatch, match="skip_batch"):
        MultiReward({"r": {**spec, "on_error": "skip_batch"}})(_media(), ["a", "b"], [{}, {}])
    CALLS["count"] = 0
    reward = MultiReward({"r": {**spec, "on_error": "zero"}})
    assert reward(_media(), ["a", "b"], [{}, {}])["r"].tolist() == [1.0, 1.0]
    assert reward(_media(), ["a", "b"], [{}, {}])["r"].tolist() == [0.0, 0.0]
    assert reward.failures == {"r": 1}


def test_an_in_process_reward_that_overruns_its_timeout_is_a_failure():
    reward = MultiReward({"slow": {"reward": f"{__name__}:slow_reward", "timeout": 0.2, "on_error": "zero"}})
    assert reward(_media(), ["a", "b"], [{}, {}])["slow"].tolist() == [0.0, 0.0]
    with pytest.raises(ConfigError, match="timeout -1"):
        load_config("configs/shapes_nft.yaml", ["rewards={slow: {reward: shapes_verifier, timeout: -1}}"])


def test_a_run_survives_a_reward_that_fails_with_skip_batch(tmp_path, tiny_model_dir):
    CALLS["count"] = 0
    rewards = f"rewards={{r: {{reward: '{__name__}:failing_every_other_call', on_error: skip_batch}}}}"
    train(tiny_model_dir, tmp_path / "run", "training.steps=3", "training.micro_batch_size=8", rewards)
    rows = [row for row in read_metrics(tmp_path / "run" / "metrics.jsonl") if row["step"] > 0]
    assert [row.get("skipped/reward_batch", 0) for row in rows] == [0, 1, 0]


# --- one clear line for bad input ------------------------------------------------------------------


def _one_line_error(capsys, argv, expected):
    assert main(argv) == 2
    error = capsys.readouterr().err.strip()
    assert "Traceback" not in error and len(error.splitlines()) == 1, error
    assert expected in error, error


@pytest.mark.parametrize(
    "text, expected",
    [
        ("training: {steps: 3\n", "is not valid YAML (line 2"),
        ("training:\n  steps: 3\n  steps: 4\n", "duplicate key 'steps'"),
        (
            "rewards:\n  shapes_verifier: {settings: {strictness: 2}}\n",
            "does not take settings ['strictness']",
        ),
    ],
)
def test_bad_config_files_are_one_line(tmp_path, capsys, text, expected):
    path = tmp_path / "bad.yaml"
    path.write_text(text)
    _one_line_error(capsys, ["train", str(path)], expected)


def test_bad_files_and_overrides_are_one_line(tmp_path, capsys):
    (tmp_path / "latin1.yaml").write_bytes("name: caf\xe9\n".encode("latin-1"))
    _one_line_error(capsys, ["train", str(tmp_path / "latin1.yaml")], "is not UTF-8 text")
    _one_line_error(capsys, ["train", str(tmp_path)], "is a directory")
    _one_line_error(capsys, ["train", "configs/shapes_nft.yaml", "training.steps=[1,"], "is not valid YAML")
    _one_line_error(
        capsys, ["train", "configs/shapes_nft.yaml", "training.steps.x=1"], "training.steps is a value"
    )
    _one_line_error(
        capsys,
        ["train", "configs/shapes_nft.yaml", f"logging.output_dir={tmp_path / 'r'}", "resume=/nonexistent"],
        "no such checkpoint directory",
    )
    (tmp_path / "file").write_text("")
    _one_line_error(
        capsys, ["train", "configs/shapes_nft.yaml", f"logging.output_dir={tmp_path / 'file'}"], "is a file"
    )


@pytest.mark.skipif(os.geteuid() == 0, reason="root writes into read-only folders")
def test_a_read_only_output_folder_is_one_line(tmp_path, capsys):
    folder = tmp_path / "read-only"
    folder.mkdir()
    folder.chmod(0o555)
    _one_line_error(
        capsys, ["train", "configs/shapes_nft.yaml", f"logging.output_dir={folder}"], "cannot be written"
    )


def test_the_installed_command_imports_a_dotted_path_reward_from_the_working_directory(tmp_path):
    (tmp_path / "myreward.py").write_text(
        "import torch\ndef score(media, prompts, metadata):\n    return torch.ones(media.shape[0])\n"
    )
    (tmp_path / "config.yaml").write_text(
        f"defaults: [{Path('configs/shapes_nft.yaml').resolve()}]\nrewards: {{mine: {{reward: 'myreward:score'}}}}\n"
        "model: {name: /nonexistent-model}\n"
    )
    flowrl = Path(sys.executable).parent / "flowrl"
    result = subprocess.run(
        [str(flowrl), "train", "config.yaml", "logging.output_dir=run"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert "myreward" not in result.stderr, result.stderr  # the reward imported; the model is what is missing
    assert "/nonexistent-model" in result.stderr, result.stderr


def test_ctrl_c_exits_130_with_a_resume_hint(tmp_path, tiny_model_dir):
    output = tmp_path / "run"
    process = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "flowrl.cli",
            "train",
            "configs/shapes_nft.yaml",
            *TINY_RUN,
            "training.steps=100000",
            f"model.name={tiny_model_dir}",
            f"logging.output_dir={output}",
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        # as from a terminal: under a suite started in the background (bash `&`) SIGINT is inherited
        # ignored, and Python installs no Ctrl-C handler when it starts with SIGINT ignored
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
    )
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline and not list_checkpoints(output / "checkpoints"):
        time.sleep(0.2)
    process.send_signal(2)  # SIGINT, as Ctrl-C sends
    _, stderr = process.communicate(timeout=60)
    assert process.returncode == 130, stderr
    assert "interrupted at step" in stderr and "resume=latest" in stderr and "Traceback" not in stderr


def test_a_config_error_in_a_two_process_launch_is_printed_once(tmp_path):
    torchrun = Path(sys.executable).parent / "torchrun"
    result = subprocess.run(
        [
            str(torchrun),
            "--nproc_per_node",
            "2",
            "-m",
            "flowrl.train",
            "configs/shapes_nft.yaml",
            "training.steps=0",
        ],
        capture_output=True,
        text=True,
        timeout=180,
        env={**os.environ, "OMP_NUM_THREADS": "1"},
    )
    assert result.returncode != 0
    assert result.stderr.count("training.steps=0 is not allowed") == 1, result.stderr


def test_a_full_disk_during_a_run_is_one_line_and_exit_1(tmp_path, tiny_model_dir, monkeypatch, capsys):
    real_save = torch.save

    def disk_full(value, handle):
        real_save(value, handle)
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(torch, "save", disk_full)
    from flowrl import busy

    monkeypatch.setattr(busy.OtherProcesses, "busy_cores", lambda self: 0.0)  # no busy-CPU warning on stderr
    argv = ["train", "configs/shapes_nft.yaml", *TINY_RUN, "training.steps=1", f"model.name={tiny_model_dir}"]
    assert main([*argv, f"logging.output_dir={tmp_path / 'run'}"]) == 1
    error = capsys.readouterr().err.strip()
    assert error.endswith("No space left on device") and len(error.splitlines()) == 1, error
    assert not list((tmp_path / "run" / "checkpoints").glob(".tmp-*"))


@pytest.mark.parametrize(
    "prompts, override, message",
    [
        ("", None, "holds no prompts"),
        ('{"prompt": 5}\n', None, "have no 'prompt' string"),
        ('{"prompt": ["a"]}\n', None, "have no 'prompt' string"),
        ('["a"]\n', None, "record 1 is list; expected an object"),
        (None, "rewards={x: {reward: 5}}", "reward=5 is not allowed"),
        (None, "training.seed=-1", "training.seed=-1 is not allowed"),
    ],
)
def test_bad_inputs_are_one_line_before_any_file_is_written(tmp_path, capsys, prompts, override, message):
    """Checked before the run folder exists or a model loads."""
    overrides = [f"logging.output_dir={tmp_path / 'run'}"]
    if prompts is not None:
        path = tmp_path / ("prompts.txt" if prompts == "" else "prompts.jsonl")
        path.write_text(prompts)
        overrides.append(f"data.prompts={path}")
    if override is not None:
        overrides.append(override)
    assert main(["train", "configs/shapes_nft.yaml", *overrides]) == 2
    error = capsys.readouterr().err.strip().splitlines()
    assert len(error) == 1 and message in error[0], error
    assert not (tmp_path / "run").exists()


@pytest.mark.parametrize(
    "argv",
    [
        ["sample", "--prompt", "a red circle", "--cfg", "nan"],
        ["sample", "--prompt", "a red circle", "--cfg", "1e308"],
        ["eval", "--cfg", "inf"],
        ["eval", "--steps", "0"],
        ["pretrain-shapes", "--steps", "0"],
    ],
)
def test_the_other_subcommands_refuse_non_finite_or_empty_work(tmp_path, capsys, argv):
    """No black images with NaN scores, no untrained model written."""
    out = tmp_path / "out"
    try:
        code = main([*argv, "--out", str(out)])
    except SystemExit as exited:  # argparse's own check of a flag
        code = exited.code
    assert code == 2
    assert "is not allowed" in capsys.readouterr().err
    assert not out.exists()
