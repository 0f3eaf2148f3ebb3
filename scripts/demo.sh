#!/usr/bin/env bash
# `make demo`: crossbar in front of two simulated llama-servers, on loopback only. A few seconds once
# built; the first run builds the release binaries and downloads the crates (~5 min on 2 cores).
#
# Builds the release binaries, starts two `crossbar-sim` hosts (different contexts, a simulated
# prefill cost so cache hits show in the timings), writes a temporary config, runs `crossbar serve`,
# plays a few multi-turn conversations (examples/demo_client.rs, one streamed), then prints crossbar's
# log lines and `crossbar report`. It ends with the prefill saved, and plays the same script round
# robin straight to two fresh, identical sims to show what it would have cost without stickiness.
# Everything it starts is stopped and its temp dir removed, whatever happens.
set -euo pipefail
cd "$(dirname "$0")/.."

TARGET_DIR="${CARGO_TARGET_DIR:-target}"
BIN="$TARGET_DIR/release"
WORK="$(mktemp -d "${TMPDIR:-/tmp}/crossbar-demo.XXXXXX")"
PIDS=()
CROSSBAR_PID=""

cleanup() {
  local rc=$?
  if [[ -n "$CROSSBAR_PID" ]] && kill -0 "$CROSSBAR_PID" 2>/dev/null; then
    kill -TERM "$CROSSBAR_PID" 2>/dev/null || true
    wait "$CROSSBAR_PID" 2>/dev/null || true
  fi
  for pid in "${PIDS[@]}"; do
    kill "$pid" 2>/dev/null || true
    wait "$pid" 2>/dev/null || true
  done
  rm -rf "$WORK"
  exit "$rc"
}
trap cleanup EXIT INT TERM

say() { printf '\n== %s\n' "$*"; }

NAME=demo
# shellcheck source=scripts/lib.sh
source scripts/lib.sh

say "building release binaries"
cargo build --release --bins --example demo_client

say "starting two simulated llama-servers"
# titan: 2 slots of 16k context; mini: 1 slot of 8k. 300 us per uncached prompt token.
# Started in this shell (not in a `$(...)` subshell), so their pids reach PIDS and the cleanup.
start_sim() {
  local name=$1; shift
  "$BIN/crossbar-sim" --listen 127.0.0.1:0 --alias qwen-coder --prefill-us 300 --decode-us 2000 \
    --max-tokens 16 "$@" >"$WORK/$name.out" 2>&1 &
  PIDS+=($!)
}
sim_url() { wait_line "$WORK/$1.out" '^sim listening on ' | sed -e 's/^sim listening on //'; }
start_sim titan --ctx 32768 --slots 2
start_sim mini --ctx 8192 --slots 1
TITAN_URL="$(sim_url titan)"
MINI_URL="$(sim_url mini)"
echo "titan: $TITAN_URL (2 slots x 16384 ctx)"
echo "mini:  $MINI_URL (1 slot x 8192 ctx)"

CFG="$WORK/crossbar.toml"
cat >"$CFG" <<EOF
listen = "127.0.0.1:0"        # the OS picks free ports; the "crossbar listening" line names them
admin_listen = "127.0.0.1:0"
db = "$WORK/crossbar.db"
workers = 8
health_interval = "1s"
shutdown_grace = "5s"

[hosts.titan]
url = "$TITAN_URL"
weight = 2
[hosts.titan.models.qwen-coder]
parallel = 2

[hosts.mini]
url = "$MINI_URL"
[hosts.mini.models.qwen-coder]
parallel = 1

[routes.projA]
hosts = ["titan", "mini"]
model = "qwen-coder"

[routes.projB]
hosts = ["mini"]
model = "qwen-coder"
EOF
say "config ($CFG)"
cat "$CFG"
"$BIN/crossbar" check -c "$CFG"

say "starting crossbar"
"$BIN/crossbar" serve -c "$CFG" 2>"$WORK/crossbar.log" &
CROSSBAR_PID=$!
LISTENING="$(wait_line "$WORK/crossbar.log" 'crossbar listening clients=')"
GW="http://$(sed -E 's/.*clients=([^ ]+).*/\1/' <<<"$LISTENING")"
ADMIN="$(sed -E 's/.*admin=([^ ]+).*/\1/' <<<"$LISTENING")"
echo "$LISTENING"

say "three conversations, one per API (chat, messages, responses), four turns each; cached grows turn by turn"
"$BIN/examples/demo_client" "$GW" | tee "$WORK/sticky.out"

say "crossbar's log"
cat "$WORK/crossbar.log"

say "crossbar report --since 1h"
"$BIN/crossbar" report --since 1h -c "$CFG"

say "summary"
echo "leases reused: $(grep -c 'lease=reused' "$WORK/crossbar.log" || true) of $(grep -c ' status=' "$WORK/crossbar.log" || true) requests"

say "the same script without stickiness: round robin straight to two fresh, identical sims"
start_sim titan2 --ctx 32768 --slots 2
start_sim mini2 --ctx 8192 --slots 1
"$BIN/examples/demo_client" --direct "$(sim_url titan2)" "$(sim_url mini2)" | tee "$WORK/rr.out"

# `totals: requests=N prompt=N cached=N prefilled=N prefill_ms=N` -> the value of key $2 in file $1.
total() { grep '^totals:' "$1" | tr ' ' '\n' | sed -n "s/^$2=//p"; }
HEADLINE="$("$BIN/crossbar" status --admin "$ADMIN" | grep '^served from cache')"
STICKY=$(total "$WORK/sticky.out" prefilled); RR=$(total "$WORK/rr.out" prefilled)
CONTRAST="$(
  echo "with crossbar:            prefilled $STICKY of $(total "$WORK/sticky.out" prompt) prompt tokens ($(total "$WORK/sticky.out" prefill_ms) ms of prefill)"
  echo "round robin, not sticky:  prefilled $RR of $(total "$WORK/rr.out" prompt) prompt tokens ($(total "$WORK/rr.out" prefill_ms) ms of prefill)"
  awk -v s="$STICKY" -v r="$RR" 'BEGIN { if (s > 0) printf "without stickiness the hosts would have prefilled %.1fx the tokens\n", r / s }'
  # What crossbar saved is this difference; the status line above counts every cache hit.
  echo "prefill saved against round robin: $((RR - STICKY)) tokens"
)"

say "stopping"
kill -TERM "$CROSSBAR_PID"
wait "$CROSSBAR_PID"
echo "crossbar exited $?"
tail -n 2 "$WORK/crossbar.log"
CROSSBAR_PID=""

# The saving last, where a newcomer's eye lands.
say "prefill saved"
echo "$HEADLINE"
echo "$CONTRAST"
