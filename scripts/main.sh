#!/usr/bin/env bash
# The main job: set up the environment if needed, then align the shipped shapes base model with
# DiffusionNFT and the exact verifier reward (configs/shapes_nft_main.yaml), evaluating base and tuned
# models on the held-out prompts. Outputs go to runs/main/; extra arguments are config overrides.
# A previous run in runs/main/ is kept as runs/main-<date>/ (pass resume=latest to continue it instead).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
if [[ -e runs/main && " $* " != *" resume="* ]]; then
    kept="runs/main-$(date -r runs/main +%Y%m%d-%H%M%S)"
    mv runs/main "$kept"
    echo "kept the previous run as $kept"
fi
exec .venv/bin/flowrl train configs/shapes_nft_main.yaml logging.output_dir=runs/main "$@"
