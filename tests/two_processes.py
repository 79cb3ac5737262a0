"""Training in two real CPU processes (gloo) through ``accelerate launch``, for the tests that compare it
with one process."""

import os
import subprocess
import sys
from pathlib import Path

import pytest

from flowrl.run_log import read_metrics


def train_in_two_processes(config: str | Path, overrides: list[str]) -> None:
    """``accelerate launch --multi_gpu --num_processes 2 -m flowrl.train CONFIG OVERRIDES`` on the CPU (one
    thread each); fails the test with the end of stderr when the launch fails."""
    command = [
        sys.executable,
        *("-m", "accelerate.commands.launch", "--multi_gpu", "--num_processes", "2", "--num_machines", "1"),
        *("--mixed_precision", "no", "--dynamo_backend", "no", "-m", "flowrl.train", str(config)),
        *overrides,
    ]
    environment = {**os.environ, "CUDA_VISIBLE_DEVICES": "", "OMP_NUM_THREADS": "1"}
    result = subprocess.run(command, capture_output=True, text=True, timeout=300, env=environment)
    assert result.returncode == 0, result.stderr[-3000:]


def assert_runs_match(one: Path, two: Path, keys: tuple[str, ...], steps: int = 2) -> None:
    """The training rows of the one-process run in ``one`` and the two-process run in ``two`` agree on every
    ``key`` (to float32 reduction-order noise), step by step."""
    rows_one = [row for row in read_metrics(one / "metrics.jsonl") if row["step"] > 0]
    rows_two = [row for row in read_metrics(two / "metrics.jsonl") if row["step"] > 0]
    assert [row["num_processes"] for row in rows_two] == [2] * steps
    for row_one, row_two in zip(rows_one, rows_two, strict=True):
        for key in keys:
            assert row_one[key] == pytest.approx(row_two[key], rel=1e-4, abs=1e-6), (row_one["step"], key)
