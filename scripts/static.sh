#!/usr/bin/env bash
# `make static`: a statically linked `crossbar` to copy onto a gateway box with no Rust toolchain.
#
# musl is the normal path: the rustup target x86_64-unknown-linux-musl, and Debian's `musl-tools`
# (musl-gcc, which the bundled SQLite's C code needs). Whichever is missing is installed, after a line
# saying so. Only when that cannot be done (no rustup, no apt-get, not root, no network) or the musl
# build fails does it build glibc with `+crt-static` instead, and it says so plainly: such a binary
# cannot load NSS modules, so host names resolve only from /etc/hosts and DNS. Prints `file`, `ldd`
# and the size of what it built.
set -euo pipefail
cd "$(dirname "$0")/.."

MUSL=x86_64-unknown-linux-musl
GNU=x86_64-unknown-linux-gnu
TARGET_DIR="${CARGO_TARGET_DIR:-target}"

say() { echo "static: $*"; }
has_target() { rustup target list --installed 2>/dev/null | grep -qx "$MUSL"; }
as_root() { if [[ $(id -u) -eq 0 ]]; then "$@"; elif command -v sudo >/dev/null; then sudo "$@"; else return 1; fi; }

# The musl toolchain: the Rust target and a musl C compiler. Returns 1 with the reason when it
# cannot have them.
musl_ready() {
  if ! command -v rustup >/dev/null 2>&1; then
    say "no rustup here, so no $MUSL target can be added"
    return 1
  fi
  if ! has_target; then
    say "adding the Rust target $MUSL (rustup target add; needs the network)"
    timeout 300 rustup target add "$MUSL" || { say "rustup could not add $MUSL"; return 1; }
  fi
  if ! command -v musl-gcc >/dev/null 2>&1; then
    if ! command -v apt-get >/dev/null 2>&1; then
      say "no musl-gcc and no apt-get to install it (on other systems: install musl's gcc wrapper)"
      return 1
    fi
    say "installing Debian's musl-tools (musl-gcc, for the bundled SQLite): apt-get install -y musl-tools"
    { as_root apt-get update -qq && as_root env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq musl-tools; } \
      || { say "could not install musl-tools"; return 1; }
  fi
}

built=""
if musl_ready; then
  say "building for $MUSL"
  if CC_x86_64_unknown_linux_musl=musl-gcc cargo build --release --bin crossbar --target "$MUSL"; then
    built=$MUSL
  else
    say "the musl build failed (its errors are above)"
  fi
fi
if [[ -z "$built" ]]; then
  say "FALLBACK: building glibc with +crt-static instead of musl. It runs on any x86-64 Linux, but a"
  say "static glibc cannot load NSS modules: host names in the config resolve from /etc/hosts and DNS only."
  RUSTFLAGS='-C target-feature=+crt-static' \
    cargo build --release --bin crossbar --target "$GNU"
  built=$GNU
fi

BIN="$TARGET_DIR/$built/release/crossbar"
echo
say "built $BIN ($built)"
file "$BIN"
if [[ $built == "$MUSL" ]]; then
  file "$BIN" | grep -o 'static-pie linked' || file "$BIN" | grep -o 'statically linked'
fi
# ldd exits 1 on a static binary; what it says is the point.
ldd "$BIN" || true
echo "size: $(du -h "$BIN" | cut -f1) ($(stat -c %s "$BIN") bytes)"
"$BIN" --version
