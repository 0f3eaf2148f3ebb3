# crossbar — make targets. `make gate` is what every commit must pass.
CARGO ?= cargo

.PHONY: build test test-browser test-clients test-install gate fmt clippy run demo static bench bench-affinity soak fuzz drill-wal clean

build:
	$(CARGO) build --release

test:
	$(CARGO) test --all-targets

# Issue 27: the status page's sign-in in headless Chromium (Debian's, installed if missing), and
# docs/OPERATIONS.md's install steps run as written in a scratch root directory (as root).
test-browser:
	scripts/browser-test.sh

test-install:
	scripts/install-test.sh

# Issue 48: docs/CLIENTS.md's snippets against a real crossbar: the openai and anthropic SDKs, the
# configs of Open WebUI, aider and Codex as the requests they make, Claude Code and Codex
# themselves (installed outside the repository if missing; run in a loopback-only namespace).
test-clients:
	scripts/client-test.sh

fmt:
	$(CARGO) fmt --all

clippy:
	$(CARGO) clippy --all-targets -- -D warnings

gate:
	$(CARGO) fmt --all -- --check
	$(CARGO) clippy --all-targets -- -D warnings
	$(CARGO) test --all-targets
	@echo "gate: ok"

# `make run CONFIG=my.toml` serves another config. Two binaries (crossbar, crossbar-sim): name one.
CONFIG ?= crossbar.toml
run:
	$(CARGO) run --release --bin crossbar -- serve -c $(CONFIG)

demo:
	scripts/demo.sh

static:
	scripts/static.sh

bench:
	scripts/bench.sh

bench-affinity:
	scripts/bench-affinity.sh

# Issue 14: real `crossbar serve` + three `crossbar-sim` processes under faults for SOAK_S seconds
# (default 600); one line per check, then the `soak seconds=..` summary; exit 0 only if all pass.
soak:
	$(CARGO) bench --bench soak

# Issue 24: the WAL fills a 24 MiB tmpfs behind a reader left open, then crossbar must recover by
# itself and start again on that disk (root: it mounts the tmpfs; about 3 minutes).
drill-wal:
	$(CARGO) build --release --bins
	scripts/wal-full-drill.sh

# The connection layer's seeded mutation runner (no nightly here for cargo-fuzz): CASES cases,
# SEED to replay a failure it printed.
CASES ?= 200000
fuzz:
	$(CARGO) run --release --example fuzz_conn -- $(CASES) $(SEED)

clean:
	$(CARGO) clean
