#!/usr/bin/env bash
# Set up (or refresh) the project's virtual environment in .venv.
# torch and torchvision go in first, pinned to the builds this machine keeps on
# disk, so that no later dependency pulls another torch; then flowrl itself.
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON=${PYTHON:-python3}
if [ ! -x .venv/bin/python ]; then
  "$PYTHON" -m venv .venv
fi
stamp=.venv/.flowrl-installed
wanted="$(sha256sum pyproject.toml scripts/setup.sh | sha256sum | cut -d' ' -f1)"
if [ -f "$stamp" ] && [ "$(cat "$stamp")" = "$wanted" ]; then
  exit 0
fi
.venv/bin/python -m pip install --quiet --upgrade pip
.venv/bin/python -m pip install --quiet torch==2.14.1 torchvision==0.29.1
.venv/bin/python -m pip install --quiet -e ".[dev,ocr]"
echo "$wanted" > "$stamp"
