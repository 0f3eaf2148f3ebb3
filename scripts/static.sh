#!/usr/bin/env bash
# `make static`: a statically linked `crossbar` to copy onto a gateway box with no Rust toolchain.
#
# musl if the x86_64-unknown-linux-musl target is installed (or can be added now); otherwise, or if
# the musl build fails (e.g. no C compiler for musl for the bundled SQLite), glibc with
# `+crt-static`. Prints which it built, `file` and `ldd` of the result and its size.
set -euo pipefail
cd "$(dirname "$0")/.."

MUSL=x86_64-unknown-linux-musl
GNU=x86_64-unknown-linux-gnu
TARGET_DIR="${CARGO_TARGET_DIR:-target}"

has_musl() { rustup target list --installed 2>/dev/null | grep -qx "$MUSL"; }

built=""
if command -v rustup >/dev/null 2>&1; then
  if ! has_musl; then
    echo "static: adding the $MUSL target (needs the network; falls back to glibc if it fails)"
    timeout 120 rustup target add "$MUSL" || true
  fi
  if has_musl; then
    echo "static: building for $MUSL"
    if cargo build --release --bin crossbar --target "$MUSL"; then
      built=$MUSL
    else
      echo "static: the musl build failed; falling back to glibc +crt-static" >&2
    fi
  fi
fi
if [[ -z "$built" ]]; then
  echo "static: building for $GNU with -C target-feature=+crt-static"
  RUSTFLAGS='-C target-feature=+crt-static' \
    cargo build --release --bin crossbar --target "$GNU"
  built=$GNU
fi

BIN="$TARGET_DIR/$built/release/crossbar"
echo
echo "static: built $BIN ($built)"
file "$BIN"
# ldd exits 1 on a static binary; what it says is the point.
ldd "$BIN" || true
echo "size: $(du -h "$BIN" | cut -f1) ($(stat -c %s "$BIN") bytes)"
"$BIN" --help | head -n 1
