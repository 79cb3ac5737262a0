#!/usr/bin/env bash
# The main job. Sets up the environment if needed, then evaluates the shipped
# shapes base model on the held-out prompts (without and with CFG) and writes a
# sample grid. Outputs go to runs/main/.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
.venv/bin/flowrl eval --model shapes-base --cfg 1 3 --out runs/main/eval
.venv/bin/flowrl sample --model shapes-base --cfg 3 --seeds 0 1 2 3 \
  --prompt "a red circle" --prompt "three squares" --prompt "a triangle left of a circle" \
  --prompt "a blue square and a yellow triangle" --out runs/main/samples.png
