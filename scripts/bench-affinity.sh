#!/usr/bin/env bash
# `make bench-affinity`: the cache-affinity benchmark (benches/affinity). Installs what it compares
# against and draws with — Debian's nginx and gnuplot-nox — when missing, then runs it in release.
# Extra arguments go to the benchmark: --hosts N --conversations C --turns T, --workload agents
# (docs/BENCHMARKS.md lists them all).
set -euo pipefail
cd "$(dirname "$0")/.."

need=()
[[ -x "${NGINX:-/usr/sbin/nginx}" ]] || need+=(nginx)
command -v gnuplot >/dev/null 2>&1 || need+=(gnuplot-nox)
if ((${#need[@]})); then
  echo "bench-affinity: installing ${need[*]}"
  sudo=""
  [[ "$(id -u)" == 0 ]] || sudo="sudo"
  $sudo apt-get update -qq
  $sudo env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${need[@]}"
fi
exec cargo bench --bench affinity -- "$@"
