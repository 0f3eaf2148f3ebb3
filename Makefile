# crossbar — make targets. `make gate` is what every commit must pass.
CARGO ?= cargo

.PHONY: build test gate fmt clippy run demo static bench bench-affinity soak clean

build:
	$(CARGO) build --release

test:
	$(CARGO) test --all-targets

fmt:
	$(CARGO) fmt --all

clippy:
	$(CARGO) clippy --all-targets -- -D warnings

gate:
	$(CARGO) fmt --all -- --check
	$(CARGO) clippy --all-targets -- -D warnings
	$(CARGO) test --all-targets
	@echo "gate: ok"

run:
	$(CARGO) run --release -- serve -c crossbar.toml

demo:
	scripts/demo.sh

static:
	scripts/static.sh

bench:
	$(CARGO) bench --bench overhead

bench-affinity:
	scripts/bench-affinity.sh

# Issue 14: real `crossbar serve` + three `crossbar-sim` processes under faults for SOAK_S seconds
# (default 600); one line per check, then the `soak seconds=..` summary; exit 0 only if all pass.
soak:
	$(CARGO) bench --bench soak

clean:
	$(CARGO) clean
