"""scripts/gpu_check.sh, the GPU check of the learning benchmark, runs its whole path on the CPU with --tiny
and writes what the device tool brings back (at most 8 files in $OUT)."""

import json
import os
import subprocess
import sys
from pathlib import Path


def test_the_gpu_check_runs_tiny_on_the_cpu(tmp_path):
    environment = {**os.environ, "OUT": str(tmp_path), "PYTHON": sys.executable, "OMP_NUM_THREADS": "1"}
    result = subprocess.run(
        ["bash", "scripts/gpu_check.sh", "--tiny"],
        capture_output=True,
        text=True,
        env=environment,
        timeout=600,
    )
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-2000:]
    report = json.loads((tmp_path / "gpu_check.json").read_text())
    assert report["device"].startswith("cpu") and report["images_per_step"] == 64
    assert [point["images"] for point in report["curve"]] == [0, 64, 128]
    assert (tmp_path / "gpu_check.png").read_bytes()[:4] == b"\x89PNG"
    assert len(list(Path(tmp_path).iterdir())) <= 8
