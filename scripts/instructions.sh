#!/usr/bin/env bash
# What a request costs crossbar in user-space instructions (issue 26), counted by valgrind's
# callgrind: a count that does not move with the machine, where CPU time on this 2-core VM swings
# by a third between runs. The binary runs as `make bench` runs it (`cargo bench --bench overhead
# -- --load`: its log, a client key, the fixed-answer nginx upstream), under valgrind.
#
#   scripts/instructions.sh BINARY [CLIENTS=1]
#
# Counts are zeroed after a warm-up and dumped 20 s later; the requests in between are the rows
# the db gained. What the gateway spends idle in 20 s (health polls, the sweeper: measured first,
# with no load) is taken out. Valgrind hides SHA-NI, so SHA-256 is counted in software (about 16 %
# of the total; natively a few hundred instructions a hash). Valgrind runs one thread at a time:
# at 32 clients the count is right, the contention is not there. Needs valgrind (installed when
# missing) and nginx (`make bench` installs it); about two minutes.
set -euo pipefail
cd "$(dirname "$0")/.."
BINARY=$(realpath "$1"); CLIENTS=${2:-1}
if ! command -v valgrind >/dev/null; then
  echo "instructions: installing valgrind"
  apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq valgrind
fi
NAME=instructions
# shellcheck source=scripts/lib.sh
source scripts/lib.sh
BENCH=$(overhead_bench)
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
cat > "$work/crossbar" <<WRAP
#!/bin/sh
exec valgrind -q --tool=callgrind --callgrind-out-file=$work/out.%p --dump-instr=no "$BINARY" "\$@"
WRAP
chmod +x "$work/crossbar"

# The instructions and the db's rows of one window: "INSTRUCTIONS ROWS".
window() {
  rm -f "$work"/out.*
  BENCH_CROSSBAR="$work/crossbar" "$BENCH" --bench --load "$1" 40 > "$work/load" 2>&1 &
  local load=$! pid db r0 r1 out
  for _ in $(seq 100); do grep -q pid= "$work/load" && break; sleep 0.2; done
  pid=$(grep -o 'pid=[0-9]*' "$work/load" | cut -d= -f2)
  db=$(ls -l "/proc/$pid/fd" | grep -o '/[^ ]*\.db$' | head -1)
  rows() { python3 -c "import sqlite3,sys; print(sqlite3.connect('file:'+sys.argv[1]+'?mode=ro', uri=True).execute('select count(*) from requests').fetchone()[0])" "$db"; }
  sleep 12
  callgrind_control -z "$pid" >/dev/null 2>&1
  r0=$(rows)
  sleep 20
  callgrind_control -d "$pid" >/dev/null 2>&1
  r1=$(rows)
  sleep 1
  out=$(ls -t "$work"/out.* | head -1)
  echo "$(grep -m1 '^summary:' "$out" | awk '{print $2}') $((r1 - r0))"
  wait "$load" || true
}
read -r idle _ < <(window 0)
read -r busy requests < <(window "$CLIENTS")
echo "instructions binary=$(basename "$BINARY") clients=$CLIENTS requests=$requests" \
  "per_request=$(( (busy - idle) / requests )) idle_per_20s=$idle"
