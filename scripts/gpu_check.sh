#!/usr/bin/env bash
# The GPU check of the learning benchmark: the quality recipe (configs/shapes_nft_long.yaml) at GPU scale —
# 4x the images per step, bf16 autocast of the trained network — for at most 8 minutes, recording the
# held-out CFG-free score against training images and wall-clock (gpu_check.json, gpu_check.png).
#
#   bash scripts/gpu_check.sh            # on a GPU machine: writes into $OUT (the device tool's folder) or outputs/gpu_check
#   bash scripts/gpu_check.sh --tiny     # 2 steps, a tiny evaluation: the same path on a CPU in about a minute
#
# It installs nothing: it runs with the python that has torch (PYTHON, default .venv/bin/python if present,
# else python3) and the repository on PYTHONPATH. Never part of CI.
set -euo pipefail
cd "$(dirname "$0")/.."
out="${OUT:-outputs/gpu_check}"
run="/tmp/gpu_check_run"   # the run folder stays outside $OUT: only the few files below come back
rm -rf "$run"
python="${PYTHON:-$([[ -x .venv/bin/python ]] && echo .venv/bin/python || echo python3)}"
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1
if "$python" -c "import torch, sys; sys.exit(0 if torch.cuda.is_available() else 1)"; then
    export ACCELERATE_MIXED_PRECISION=bf16
    device="$("$python" -c "import torch; print(torch.cuda.get_device_name(0))")"
else
    device="cpu: $(nproc) cores"
fi
if [[ "${1:-}" == "--tiny" ]]; then
    scale=(training.steps=2 training.prompts_per_step=4 training.micro_batch_size=32 evaluation.every=1
           evaluation.images_per_task=2 evaluation.num_steps=4)
else
    # 256 images per step (16 prompts x 16); 120 steps = 30,720 images (the CPU recipe's 300 steps see 19,200)
    scale=(training.steps=120 training.prompts_per_step=16 training.micro_batch_size=128 evaluation.every=20
           evaluation.images_per_task=64 evaluation.num_steps=20)
fi
mkdir -p "$out"
echo "gpu_check on $device (mixed precision: ${ACCELERATE_MIXED_PRECISION:-no})"
start=$(date +%s)
timeout 480 "$python" -m flowrl.train configs/shapes_nft_long.yaml "${scale[@]}" \
    logging.output_dir="$run" logging.progress=false logging.sample_every=0 logging.checkpoint_every=0 \
    evaluation.base_guidance_scales="[1.0]" 2>&1 | tee "$out/train.log" || echo "the run stopped early (exit $?)"
cp "$run/metrics.jsonl" "$run/summary.json" "$run/curves.png" "$run/config.yaml" "$out/" 2>/dev/null || true
"$python" - "$out" "$device" "$(( $(date +%s) - start ))" <<'PY'
import json, sys
from pathlib import Path

import matplotlib
import yaml

matplotlib.use("Agg")
import matplotlib.pyplot as plt

out, device, wall = Path(sys.argv[1]), sys.argv[2], int(sys.argv[3])
config = yaml.safe_load((out / "config.yaml").read_text())
per_step = config["training"]["prompts_per_step"] * config["training"]["group_size"]
seconds, points = 0.0, []
for line in (out / "metrics.jsonl").read_text().splitlines():
    row = json.loads(line)
    seconds += row.get("time/step", 0.0)
    if "eval/geneval/overall" in row:
        points.append({"step": row["step"], "images": row["step"] * per_step, "training_seconds": round(seconds, 1),
                       "held_out": row["eval/geneval/overall"]})
report = {"device": device, "wall_seconds": wall, "images_per_step": per_step, "curve": points}
(out / "gpu_check.json").write_text(json.dumps(report, indent=2) + "\n")
figure, axes = plt.subplots(1, 2, figsize=(10, 4))
for axis, key, label in ((axes[0], "images", "training images"), (axes[1], "training_seconds", "training seconds")):
    axis.plot([p[key] for p in points], [p["held_out"] for p in points], marker="o")
    axis.set_xlabel(label)
    axis.set_ylabel("held-out CFG-free score")
figure.suptitle(f"shapes_nft_long at GPU scale on {device}")
figure.tight_layout()
figure.savefig(out / "gpu_check.png", dpi=120)
for p in points:
    print(f"step {p['step']:4d}  images {p['images']:6d}  training s {p['training_seconds']:7.1f}  held-out {p['held_out']:.3f}")
print(f"wrote {out / 'gpu_check.json'} and {out / 'gpu_check.png'} ({wall} s in all)")
PY
