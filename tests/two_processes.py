"""Training in two real CPU processes (gloo) through ``accelerate launch``, for the tests that compare it
with one process."""

import os
import subprocess
import sys
from pathlib import Path


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
