#!/usr/bin/env bash
# `make bench`: the overhead benchmark (benches/overhead). Installs Debian's nginx — the second front
# end it measures beside crossbar — when missing, then runs it in release.
set -euo pipefail
cd "$(dirname "$0")/.."

if [[ ! -x "${NGINX:-/usr/sbin/nginx}" ]]; then
  echo "bench: installing nginx"
  sudo=""
  [[ "$(id -u)" == 0 ]] || sudo="sudo"
  $sudo apt-get update -qq
  $sudo env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq nginx
fi
exec cargo bench --bench overhead -- "$@"
