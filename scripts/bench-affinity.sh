#!/usr/bin/env bash
# `make bench-affinity`: the cache-affinity benchmark (benches/affinity). Installs what it compares
# against and draws with — Debian's nginx and gnuplot-nox, and smg (SGLang's cache-aware router,
# PyPI, into a venv outside the repo: $SMG_VENV, default ~/.cache/smg-venv) — when missing, then
# runs it in release. smg failing to install is a warning: its rows then say why, the rest runs.
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
SMG_VERSION=1.13.0
if [[ -z "${SMG:-}" ]]; then
  venv="${SMG_VENV:-$HOME/.cache/smg-venv}"
  export SMG="$venv/bin/smg"
  if [[ ! -x "$SMG" ]]; then
    echo "bench-affinity: installing smg $SMG_VERSION into $venv"
    if ! { python3 -m venv "$venv" && "$venv/bin/pip" install -q "smg==$SMG_VERSION"; }; then
      echo "bench-affinity: smg not installed (python3-venv and PyPI needed); its rows will say so" >&2
    fi
  fi
fi
exec cargo bench --bench affinity -- "$@"
