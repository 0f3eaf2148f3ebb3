#!/usr/bin/env bash
# `make test-clients` (issue 48): docs/CLIENTS.md's snippets against a real crossbar in front of a
# crossbar-sim on 127.0.0.1 (scripts/client_test.py does the checks). Installs what it needs
# outside the repository when missing, saying so: the openai and anthropic SDKs into a venv, and
# Claude Code and Codex from the npm registry, at the versions docs/CLIENTS.md names (a newer one
# may talk to more than crossbar), in $CLIENTS_DIR (default ~/.cache/crossbar-clients).
# The checks run in a network namespace of loopback only (as root, with unshare), so nothing the
# clients do can leave the machine; without one, Claude Code and Codex are not run.
set -euo pipefail
cd "$(dirname "$0")/.."
TARGET_DIR="${CARGO_TARGET_DIR:-target}"
CLIENTS_DIR="${CLIENTS_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/crossbar-clients}"
PY_PACKAGES=(openai==3.63.0 anthropic==2.17.0)
NPM_PACKAGES=(@anthropic-ai/claude-code@2.1.197 @openai/codex@0.171.0)

mkdir -p "$CLIENTS_DIR"
VENV="$CLIENTS_DIR/venv"
if ! "$VENV/bin/python" -c 'import openai, anthropic' 2>/dev/null; then
  echo "test-clients: installing ${PY_PACKAGES[*]} into $VENV"
  python3 -m venv "$VENV"
  "$VENV/bin/pip" install -q "${PY_PACKAGES[@]}"
fi
NPM_DIR="$CLIENTS_DIR/npm"
if command -v npm >/dev/null 2>&1; then
  if [[ ! -e "$NPM_DIR/node_modules/@openai/codex/bin/codex.js" ||
        ! -e "$NPM_DIR/node_modules/@anthropic-ai/claude-code/cli-wrapper.cjs" ]]; then
    echo "test-clients: installing ${NPM_PACKAGES[*]} into $NPM_DIR"
    npm install -q --no-audit --no-fund --prefix "$NPM_DIR" "${NPM_PACKAGES[@]}" >/dev/null
  fi
else
  echo "test-clients: no npm: Claude Code and Codex not installed"
  NPM_DIR=-
fi
# The same build as the README's and the demo's: nothing rebuilds after either.
cargo build --release --bins
BIN="$TARGET_DIR/release"
if [[ $(id -u) -eq 0 ]] && unshare -n true 2>/dev/null; then
  exec unshare -n -- bash -c 'ip link set lo up && exec python3 scripts/client_test.py "$@"' _ \
    "$BIN" "$VENV/bin/python" "$NPM_DIR" 1
fi
exec python3 scripts/client_test.py "$BIN" "$VENV/bin/python" "$NPM_DIR" 0
