#!/usr/bin/env bash
# `make test-browser` (issue 27): the status page's sign-in in a real browser — headless Chromium
# from Debian's packages (installed if missing, saying so) against a crossbar and a crossbar-sim on
# 127.0.0.1. scripts/browser_test.py does the steps; only Python's standard library is needed.
# The screenshot goes to $SCREENSHOT (default target/status-page-signed-in.png;
# SCREENSHOT=docs/status-page-signed-in.png refreshes the one in the docs); those at 1400 and
# 1900 px wide (issue 48) to target/release/../status-page-1400.png and -1900.png.
set -euo pipefail
cd "$(dirname "$0")/.."
TARGET_DIR="${CARGO_TARGET_DIR:-target}"
SCREENSHOT="${SCREENSHOT:-$TARGET_DIR/status-page-signed-in.png}"

if ! command -v chromium >/dev/null 2>&1; then
  echo "test-browser: installing Debian's chromium: apt-get install -y chromium"
  as_root() { if [[ $(id -u) -eq 0 ]]; then "$@"; else sudo "$@"; fi; }
  as_root apt-get update -qq
  as_root env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium >/dev/null
fi
# The same build as the README's and the demo's: nothing rebuilds after either.
cargo build --release --bins
mkdir -p "$(dirname "$SCREENSHOT")"
python3 scripts/browser_test.py "$TARGET_DIR/release" "$SCREENSHOT"
