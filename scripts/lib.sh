# Shared by the scripts that start crossbar and its simulated hosts (demo.sh, wal-full-drill.sh)
# and by the bench's helpers (instructions.sh, side-by-side.sh): source it after setting NAME, the
# script's name for its messages.

# Waits (up to 10 s) until file $1 has a line matching $2; prints that line.
wait_line() {
  local file=$1 pattern=$2 i
  for i in $(seq 1 200); do
    if grep -m1 -E "$pattern" "$file" 2>/dev/null; then
      return 0
    fi
    sleep 0.05
  done
  echo "${NAME:-script}: timed out waiting for /$pattern/ in $file:" >&2
  cat "$file" >&2
  return 1
}

# Builds the overhead bench (release) and prints its executable's path.
overhead_bench() {
  cargo bench --bench overhead --no-run 2>&1 | sed -n 's/.*Executable .*(\(.*\))/\1/p' | tail -1
}
