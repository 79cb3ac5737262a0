#!/usr/bin/env bash
# Set up the environment if needed, then run the test suite.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
bash scripts/setup_browser.sh   # Debian chromium + chromium-driver for the app's browser test
exec .venv/bin/python -m pytest "$@"
