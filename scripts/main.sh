#!/usr/bin/env bash
# The main job: set up the environment if needed, then align the shipped shapes base model with
# DiffusionNFT and the exact verifier reward (configs/shapes_nft.yaml), evaluating base and tuned
# models on the held-out prompts. Outputs go to runs/main/; extra arguments are config overrides.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
exec .venv/bin/flowrl train configs/shapes_nft.yaml logging.output_dir=runs/main "$@"
