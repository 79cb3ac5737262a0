#!/usr/bin/env bash
# Install the headless browser the app's browser test drives (Debian's chromium and chromium-driver),
# only when it is missing; a no-op otherwise. Needs root (apt-get).
set -euo pipefail
if [ -x /usr/bin/chromium ] && [ -x /usr/bin/chromedriver ]; then
  exit 0
fi
export DEBIAN_FRONTEND=noninteractive
apt-get update -qq
apt-get install -y -qq chromium chromium-driver > /dev/null
