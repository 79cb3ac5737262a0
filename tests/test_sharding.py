"""Scaling out, exercised: FSDP2 (``torch.distributed.fsdp.fully_shard``) over gloo on two real CPU processes
trains the shapes model to the same parameters as DDP.

Accelerate's FSDP does not run on CPU: under ``accelerate launch --use_fsdp`` without a GPU,
``Accelerator(cpu=True)`` falls back to ``MULTI_CPU`` (DDP) and ``Accelerator()`` to a single process, so
this tests the closest real path, torch's FSDP2 that Accelerate's ``fsdp_version: 2`` drives on GPUs.
"""

import os
import subprocess
import sys
from pathlib import Path

import torch

WORKER = Path(__file__).with_name("sharded_worker.py")


def _train(mode: str, output: Path) -> dict:
    torchrun = Path(sys.executable).parent / "torchrun"
    environment = {
        **os.environ,
        "OMP_NUM_THREADS": "1",
        "CUDA_VISIBLE_DEVICES": "",
        "PYTHONPATH": os.pathsep.join([str(WORKER.parent), str(WORKER.parent.parent)]),
    }
    result = subprocess.run(
        [str(torchrun), "--nproc_per_node", "2", str(WORKER), mode, str(output)],
        capture_output=True,
        text=True,
        timeout=300,
        env=environment,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    return torch.load(output, weights_only=True)


def test_fsdp2_on_two_cpu_processes_matches_ddp(tmp_path):
    ddp = _train("ddp", tmp_path / "ddp.pt")
    fsdp = _train("fsdp", tmp_path / "fsdp.pt")
    assert ddp["sharded_parameters"] == 0 and fsdp["sharded_parameters"] == len(fsdp["parameters"])
    assert ddp["parameters"].keys() == fsdp["parameters"].keys()
    moved = [
        name for name, value in ddp["initial"].items() if not torch.equal(value, ddp["parameters"][name])
    ]
    assert len(moved) == len(ddp["initial"])  # two steps changed every parameter
    for name, value in ddp["parameters"].items():
        # Same global batch and weights; the gradient reduction differs (all-reduce vs reduce-scatter),
        # so they agree to float32 rounding.
        torch.testing.assert_close(fsdp["parameters"][name], value, rtol=1e-5, atol=1e-6, msg=name)
