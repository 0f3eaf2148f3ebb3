#!/usr/bin/env bash
# Two crossbar builds under the same steady load at the same time (issue 26): each gets its own
# fixed-answer upstream and CLIENTS clients (`cargo bench --bench overhead -- --load`), so both
# see the same machine — the same steal, the same frequency, the same neighbours. On this 2-core
# machine, rounds run one after the other swing by a third; side by side, the two builds' CPU per
# request moves together, and which is lower is the finding.
#
#   scripts/side-by-side.sh A_BINARY B_BINARY [CLIENTS=16] [SECS=8] [ROUNDS=4]
#
# Each round starts A first, then B; give the builds in both orders (an A/A run shows the start
# order's own bias: 0 to 1.6 us in four rounds). Prints one line a round.
set -euo pipefail
cd "$(dirname "$0")/.."
A=$(realpath "$1"); B=$(realpath "$2")
CLIENTS=${3:-16}; SECS=${4:-8}; ROUNDS=${5:-4}
NAME=side-by-side
# shellcheck source=scripts/lib.sh
source scripts/lib.sh
BENCH=$(overhead_bench)
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT
field() { grep -o "$1=[0-9.]*" "$2" | cut -d= -f2; }
for round in $(seq "$ROUNDS"); do
  BENCH_CROSSBAR=$A "$BENCH" --bench --load "$CLIENTS" "$SECS" > "$out/a" 2>&1 &
  a=$!
  BENCH_CROSSBAR=$B "$BENCH" --bench --load "$CLIENTS" "$SECS" > "$out/b" 2>&1 &
  b=$!
  wait "$a" "$b"
  echo "round $round: A $(field cpu_us_per_request "$out/a") us a request ($(field req_per_s "$out/a")/s)," \
    "B $(field cpu_us_per_request "$out/b") us ($(field req_per_s "$out/b")/s)"
done
