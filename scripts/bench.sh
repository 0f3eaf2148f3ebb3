#!/usr/bin/env bash
# `make bench`: the overhead benchmark (benches/overhead). Installs Debian's nginx — the second front
# end it measures beside crossbar — when missing, then runs it in release (glibc; BENCH_MUSL=1: musl).
set -euo pipefail
cd "$(dirname "$0")/.."

if [[ ! -x "${NGINX:-/usr/sbin/nginx}" ]]; then
  echo "bench: installing nginx"
  sudo=""
  [[ "$(id -u)" == 0 ]] || sudo="sudo"
  $sudo apt-get update -qq
  $sudo env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq nginx
fi
if [[ -n "${BENCH_MUSL:-}" ]]; then
  # The binary users copy to their gateway is musl (`make static`): BENCH_MUSL=1 measures that
  # build (crossbar on jemalloc as users run it, the sim beside it on musl's allocator), needing
  # what `make static` needs.
  MUSL=x86_64-unknown-linux-musl
  if ! rustup target list --installed 2>/dev/null | grep -qx "$MUSL" || ! command -v musl-gcc >/dev/null; then
    echo "bench: BENCH_MUSL needs the rustup target $MUSL and musl-gcc (run make static once)" >&2
    exit 1
  fi
  exec env CC_x86_64_unknown_linux_musl=musl-gcc cargo bench --bench overhead --target "$MUSL" -- "$@"
fi
exec cargo bench --bench overhead -- "$@"
